//! The model's tokenizer (`tokenizer.json`, through the `tokenizers` crate) and its special
//! tokens from `tokenizer_config.json`.

use std::path::Path;

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("loading {path}: {message}")]
    Load { path: String, message: String },
    #[error("tokenizing: {0}")]
    Encode(String),
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    OutOfVocabulary { id: u32, vocab: usize },
}

/// A loaded tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Its vocabulary's size, special tokens included, counted once: the `tokenizers` crate
    /// counts by copying the whole vocabulary into a new map, which every decode's id check
    /// paid per id (13% of an RL step's time on SmolLM2).
    vocab: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Self::from_inner(inner))
    }

    pub fn from_inner(inner: tokenizers::Tokenizer) -> Self {
        let vocab = inner.get_vocab_size(true);
        Tokenizer { inner, vocab }
    }

    /// Token ids of `text`, with the special tokens its post-processor adds (if any).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Token ids of `text` as they stand, nothing added: for a rendered chat template, which
    /// writes its own special tokens.
    pub fn encode_without_special_tokens(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The text of one token, as it reads in context.
    pub fn piece(&self, id: u32) -> Result<String, TokenizerError> {
        self.check(id)?;
        self.inner
            .decode(&[id], false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The text of a run of tokens (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_with(ids, false)
    }

    /// The text of a run of tokens as a reader sees it: special tokens (an end of turn such
    /// as `<|im_end|>`, which ends a chat model's answer) left out, as OpenAI's API and vLLM
    /// show a completion.
    pub fn decode_text(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_with(ids, true)
    }

    fn decode_with(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            self.check(id)?;
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The id of a token given by its text (special tokens included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokens the tokenizer knows, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Refuse an id the tokenizer does not know.
    pub fn check(&self, id: u32) -> Result<(), TokenizerError> {
        let vocab = self.vocab;
        if id as usize >= vocab {
            return Err(TokenizerError::OutOfVocabulary { id, vocab });
        }
        Ok(())
    }
}

/// The text of a special token in `tokenizer_config.json`: a string, or an object with `content`.
pub fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(text) => Some(text.clone()),
        Value::Object(object) => object.get("content")?.as_str().map(String::from),
        _ => None,
    }
}
