//! Text and tokens: a model's tokenizer and its chat template. Below the model (which loads them
//! from its directory) and beside it for a client: the RL driver renders conversations with
//! these alone, as the tinker-cookbook's renderers hold a tokenizer and no model.

mod chat;
mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate};
pub use tokenizer::{Tokenizer, TokenizerError, special_token};
