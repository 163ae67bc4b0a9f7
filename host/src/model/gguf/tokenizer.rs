//! The tokenizer a GGUF's metadata describes, built as `transformers` builds it from the same
//! file, so that both give the same ids:
//! - byte-level BPE (`tokenizer.ggml.model = gpt2`) over the vocabulary and merges, the text
//!   split first by the expression that `tokenizer.ggml.pre` names (GPT-2's byte-level split for
//!   a name without one);
//! - SentencePiece's BPE (`llama`) as Gemma files have it: spaces written `▁`, bytes outside the
//!   vocabulary as its `<0xNN>` tokens, and the merges (which the file does not list) rebuilt from
//!   the vocabulary, a token's merges ranked by its place in the file;
//!
//! the tokens the file marks as control tokens kept whole as special tokens and the user-defined
//! ones as added tokens, and BOS put first where `tokenizer.ggml.add_bos_token` says so.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{GgufError, GgufFile, read_error};
use crate::text::Tokenizer;

/// The tokenizer models the reader builds, by `tokenizer.ggml.model`.
const MODELS: &[&str] = &["gpt2", "llama"];

/// The architectures whose SentencePiece (`llama`) vocabularies the reader builds: each family
/// spells its spaces its own way, and only Gemma's is implemented.
const SENTENCEPIECE_ARCHITECTURES: &[&str] = &["gemma3"];

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
    match model {
        "gpt2" => byte_level_bpe(gguf),
        "llama" => {
            let arch = gguf.string("general.architecture").unwrap_or_default();
            if !SENTENCEPIECE_ARCHITECTURES.contains(&arch) {
                let what = format!("a SentencePiece (`llama`) tokenizer of architecture {arch:?}");
                return Err(gguf.unsupported(what, SENTENCEPIECE_ARCHITECTURES));
            }
            gemma_bpe(gguf)
        }
        _ => Err(gguf.unsupported(format!("tokenizer model {model:?}"), MODELS)),
    }
}

/// The `tokenizer.json` of a Gemma vocabulary, as `transformers`' `GemmaTokenizer` over the
/// file: a token of spaces alone is stored with real spaces and looked up as `▁`s, so it is
/// respelled first; the merges are every split of a token into two tokens of the vocabulary,
/// ranked by the token's place in the file (Gemma's scores do not follow its merge order), then
/// longer left parts first.
fn gemma_bpe(gguf: &GgufFile) -> Result<Value, GgufError> {
    let tokens = gguf.strings("tokenizer.ggml.tokens")?;
    let types = gguf
        .integers("tokenizer.ggml.token_type")?
        .unwrap_or_default();
    let spelled: Vec<String> = tokens
        .iter()
        .map(
            |token| match token.contains(' ') && token.chars().all(python_space) {
                true => "\u{2581}".repeat(token.chars().count()),
                false => token.to_string(),
            },
        )
        .collect();
    // A token spelled twice keeps its last id, as a Python dict of the vocabulary does.
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(spelled.len());
    for (id, token) in spelled.iter().enumerate() {
        ids.insert(token, id);
    }
    let mut ranked: Vec<(usize, usize, &str, &str)> = Vec::new();
    for (token, &id) in &ids {
        for (at, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(at);
            if ids.contains_key(left) && ids.contains_key(right) {
                ranked.push((id, at, left, right));
            }
        }
    }
    // By the merged token's id, then the longer left part first (its byte length orders the
    // splits of one token as its length in characters does).
    ranked.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let merges: Vec<Value> = ranked
        .iter()
        .map(|(_, _, left, right)| json!([left, right]))
        .collect();
    let vocab = vocabulary(&spelled);
    // Kept whole under their spelling in the file, where the vocabulary has it.
    let added = added_tokens(
        &tokens,
        &types,
        |_| true,
        |_, token| ids.get(token).map(|&id| (id, token.to_string())),
    );
    let unk = gguf
        .integer("tokenizer.ggml.unknown_token_id")
        .and_then(|id| usize::try_from(id).ok())
        .and_then(|id| spelled.get(id));
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
        "post_processor": bos_first(gguf, &spelled)?,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// The BPE model's vocabulary: each token's id by its spelling (a spelling given twice keeps its
/// last id).
fn vocabulary(spelled: &[String]) -> serde_json::Map<String, Value> {
    spelled
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), json!(id)))
        .collect()
}

/// Python's `str.isspace`, which `transformers` tests a token's characters with: Unicode's
/// white space and the four ASCII separators.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The tokens kept whole: control tokens as special tokens (where `control` accepts their
/// spelling), user-defined ones as added tokens, each under the id and text that `entry` gives
/// its place and spelling in the file (`None`: left out).
fn added_tokens(
    tokens: &[&str],
    types: &[i64],
    control: impl Fn(&str) -> bool,
    entry: impl Fn(usize, &str) -> Option<(usize, String)>,
) -> Vec<Value> {
    types
        .iter()
        .zip(tokens)
        .enumerate()
        .filter_map(|(place, (&kind, &token))| {
            let special = match kind {
                CONTROL if control(token) => true,
                USER_DEFINED => false,
                _ => return None,
            };
            let (id, token) = entry(place, token)?;
            Some(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }))
        })
        .collect()
}

/// The post-processor that puts BOS first where `tokenizer.ggml.add_bos_token` says so.
fn bos_first(gguf: &GgufFile, spelled: &[String]) -> Result<Option<Value>, GgufError> {
    if gguf.boolean("tokenizer.ggml.add_bos_token") != Some(true) {
        return Ok(None);
    }
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
    Ok(Some(json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": token, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {token.clone(): {"id": token, "ids": [id], "tokens": [token]}},
    })))
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
    let vocab = vocabulary(&spelled);
    let merges: Vec<Value> = merges
        .iter()
        .map(|merge| {
            let (left, right) = merge.split_once(' ').unwrap_or((merge, ""));
            json!([left, right])
        })
        .collect();
    // Control tokens outside the byte alphabet are llama.cpp's mislabels (`transformers` skips
    // them too); user-defined ones are added as they are.
    let added = added_tokens(&tokens, &types, in_alphabet, |id, _| {
        Some((id, spelled[id].clone()))
    });
    let pre_tokenizer = match gguf.string("tokenizer.ggml.pre").and_then(split_of) {
        Some(split) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]}),
        None => {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
        }
    };
    let post_processor = bos_first(gguf, &spelled)?.unwrap_or_else(|| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true})
    });
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
