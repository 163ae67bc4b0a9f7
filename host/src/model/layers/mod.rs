//! The transformer's layers, written once over the op boundary of `opentinker_kernels`
//! ([`Backend`]): the same definition runs on the CPU kernels and on the CUDA ones.
//!
//! A forward call takes the new tokens of many sequences at once (prompts being prefilled and
//! sequences decoding one token), each through its own adapter or the base model:
//!
//! ```text
//! embed ─▶ for each layer: x += attention(norm(x)); x += mlp(norm(x)) ─▶ norm ─▶ unembed
//! ```
//!
//! What sets one family apart is the config's [`Features`](super::Features), read here: biases,
//! query/key norms, a norm of each block's output before the `+=` (Gemma), the gate's
//! activation, the embedding's scale, and the sliding window and RoPE tables of local layers.
//!
//! - [`DecoderWeights`] borrows the weights in the backend's storage (`B::Matrix<'_>`,
//!   `&B::Vector`): a layer never copies or owns them.
//! - Every projection goes through an [`Adapters`] hook with its [`Site`](super::Site), so LoRA
//!   (in the `lora` module, a layer above) adds its deltas without the model knowing adapters;
//!   [`NoAdapters`] is the base model.
//! - The backend's [`Backend::Batch`] knows where each row sits and holds the sequences' KV
//!   caches; [`forward`] appends to them.
//!
//! [`Backend`]: opentinker_kernels::Backend
//! [`Backend::Batch`]: opentinker_kernels::Backend::Batch

mod attention;
mod decoder;
mod mlp;
mod projection;

pub use attention::{AttentionGrads, AttentionWeights, Rope};
pub use decoder::{
    DecoderWeights, ForwardError, LayerGrads, LayerWeights, Sequence, Tape, TrainOutput,
    TrainSequence, WeightGrads, forward, train_backward, train_forward, train_values_per_token,
};
pub use mlp::{MlpGrads, MlpWeights};
pub use projection::{AdapterGrads, Adapters, Linear, LinearGrads, NoAdapters, Run};
