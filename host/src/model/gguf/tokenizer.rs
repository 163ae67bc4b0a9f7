//! The tokenizer a GGUF's metadata describes, built as `transformers` builds it from the same
//! file, so that both give the same ids: byte-level BPE (`tokenizer.ggml.model = gpt2`) over the
//! vocabulary and merges, the text split first by the expression that `tokenizer.ggml.pre`
//! names (GPT-2's byte-level split for a name without one), the tokens the file marks as control
//! tokens kept whole as special tokens and the user-defined ones as added tokens, and BOS put
//! first where `tokenizer.ggml.add_bos_token` says so.

use serde_json::{Value, json};

use super::{GgufError, GgufFile, read_error};
use crate::text::Tokenizer;

/// The tokenizer models the reader builds, by `tokenizer.ggml.model`.
const MODELS: &[&str] = &["gpt2"];

/// llama.cpp's token types: a control token (`<|im_end|>`) and a user-defined one (`<think>`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split expression of a pre-tokenizer name (`tokenizer.ggml.pre`), as `transformers` has
/// them for the architectures read here.
fn split_of(pre: &str) -> Option<&'static str> {
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "dbrx" => Some(LLAMA3_SPLIT),
        "qwen2" | "deepseek-r1-qwen" => Some(QWEN2_SPLIT),
        _ => None,
    }
}

pub(super) fn build(gguf: &GgufFile) -> Result<Tokenizer, GgufError> {
    let inner: tokenizers::Tokenizer = serde_json::from_value(tokenizer_json(gguf)?)
        .map_err(|e| read_error(&gguf.path, format!("building its tokenizer: {e}")))?;
    Ok(Tokenizer::from_inner(inner))
}

/// The `tokenizer.json` (the `tokenizers` library's serialization) of the file's tokenizer.
pub(super) fn tokenizer_json(gguf: &GgufFile) -> Result<Value, GgufError> {
    let model = gguf.string("tokenizer.ggml.model").unwrap_or_default();
    if !MODELS.contains(&model) {
        return Err(gguf.unsupported(format!("tokenizer model {model:?}"), MODELS));
    }
    byte_level_bpe(gguf)
}

/// The `tokenizer.json` of a byte-level BPE vocabulary.
fn byte_level_bpe(gguf: &GgufFile) -> Result<Value, GgufError> {
    let tokens = gguf.strings("tokenizer.ggml.tokens")?;
    let merges = gguf.strings("tokenizer.ggml.merges")?;
    let types = gguf
        .integers("tokenizer.ggml.token_type")?
        .unwrap_or_default();
    let alphabet = byte_alphabet();
    let in_alphabet = |token: &str| token.chars().all(|c| alphabet.contains(&c));
    // A token outside the byte alphabet is spelled in it, byte by byte.
    let spelled: Vec<String> = tokens
        .iter()
        .map(|token| match in_alphabet(token) {
            true => token.to_string(),
            false => token.bytes().map(|b| alphabet[b as usize]).collect(),
        })
        .collect();
    let vocab: serde_json::Map<String, Value> = spelled
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), json!(id)))
        .collect();
    let merges: Vec<Value> = merges
        .iter()
        .map(|merge| {
            let (left, right) = merge.split_once(' ').unwrap_or((merge, ""));
            json!([left, right])
        })
        .collect();
    // Control tokens outside the byte alphabet are llama.cpp's mislabels (`transformers` skips
    // them too); user-defined ones are added as they are.
    let added: Vec<Value> = types
        .iter()
        .enumerate()
        .filter_map(|(id, &kind)| {
            let token = tokens.get(id)?;
            let special = match kind {
                CONTROL if in_alphabet(token) => true,
                USER_DEFINED => false,
                _ => return None,
            };
            Some(json!({
                "id": id, "content": spelled[id], "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }))
        })
        .collect();
    let pre_tokenizer = match gguf.string("tokenizer.ggml.pre").and_then(split_of) {
        Some(split) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]}),
        None => {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
        }
    };
    let bos = match gguf.boolean("tokenizer.ggml.add_bos_token") {
        Some(true) => {
            let id = gguf
                .integer("tokenizer.ggml.bos_token_id")
                .ok_or_else(|| gguf.metadata_error("tokenizer.ggml.bos_token_id", "an integer"))?;
            let token = usize::try_from(id)
                .ok()
                .and_then(|id| spelled.get(id))
                .ok_or_else(|| {
                    gguf.metadata_error(
                        "tokenizer.ggml.bos_token_id",
                        "a token id of the vocabulary",
                    )
                })?;
            Some((token.clone(), id))
        }
        _ => None,
    };
    let post_processor = match bos {
        Some((token, id)) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {token.clone(): {"id": token, "ids": [id], "tokens": [token]}},
        }),
        None => {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true})
        }
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// GPT-2's byte alphabet: the character each byte is spelled with in a byte-level vocabulary
/// (printable bytes as themselves, the others from U+0100 on).
fn byte_alphabet() -> Vec<char> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| match printable(b) {
            true => char::from(b),
            false => {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        let alphabet = byte_alphabet();
        assert_eq!(alphabet[b' ' as usize], 'Ġ');
        assert_eq!(alphabet[b'\n' as usize], 'Ċ');
        assert_eq!(alphabet[b'a' as usize], 'a');
        let distinct: std::collections::HashSet<char> = alphabet.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
