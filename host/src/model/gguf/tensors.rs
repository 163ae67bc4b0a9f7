//! A GGUF's tensors under their Hugging Face names, dequantized to f32.
//!
//! llama.cpp names a layer's tensors `blk.N.<part>` and stores Llama's query and key projections
//! with each head's rows interleaved for its RoPE (the halves of a head's rotary pairs one after
//! the other); the Hugging Face layout keeps them in two halves, as `transformers` restores them
//! when it loads a GGUF. candle-core reads the tensors (shapes in row-major order, as Hugging
//! Face's) and dequantizes each block type as ggml does.

use std::collections::HashMap;
use std::io::BufReader;

use candle_core::{Device, Tensor};

use super::{GgufError, GgufFile, config, read_error};

/// The Hugging Face name of the GGUF tensor `name` in a file of architecture `arch`, `None` for
/// a tensor the reader does not know. Gemma has four norms per layer where Llama has two, and
/// names its MLP's input norm otherwise.
fn hf_name(arch: &str, name: &str) -> Option<String> {
    let global = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(global) = global {
        return Some(global.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = part.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" if arch == "gemma3" => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" if arch == "gemma3" => "post_attention_layernorm",
        "post_ffw_norm" if arch == "gemma3" => "post_feedforward_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// Refuse a file with a tensor the reader does not know (a part of the model the transformer
/// would leave out), or one whose shape the file cannot hold (a count of elements past what a
/// number holds, a shape not in whole blocks, bytes past the file's end): checked here, before
/// any tensor is read, with arithmetic that cannot wrap.
pub(super) fn check_tensors(gguf: &GgufFile, file_size: u64) -> Result<(), GgufError> {
    let (arch, _) = config::architecture(gguf)?;
    let mut names: Vec<&String> = gguf.content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        if hf_name(arch, name).is_none() {
            return Err(gguf.unsupported(format!("tensor `{name}`"), &[]));
        }
        let info = &gguf.content.tensor_infos[name];
        let damaged = |why: &str| read_error(&gguf.path, format!("tensor `{name}`: {why}"));
        let elements = info
            .shape
            .dims()
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| damaged("its shape has more elements than a file can hold"))?;
        // candle reads a tensor's blocks in place, which an empty one's buffer cannot hold.
        if elements == 0 {
            return Err(damaged("its shape has no elements"));
        }
        let block = info.ggml_dtype.block_size();
        if !elements.is_multiple_of(block) {
            return Err(damaged("its elements are not whole blocks of its type"));
        }
        let end = (elements / block)
            .checked_mul(info.ggml_dtype.type_size())
            .and_then(|bytes| u64::try_from(bytes).ok())
            .and_then(|bytes| bytes.checked_add(info.offset))
            .and_then(|end| end.checked_add(gguf.content.tensor_data_offset));
        if end.is_none_or(|end| end > file_size) {
            return Err(damaged("its data runs past the end of the file"));
        }
    }
    Ok(())
}

/// Every tensor, dequantized, by its Hugging Face name.
pub(super) fn read_all(gguf: &GgufFile) -> Result<HashMap<String, Tensor>, GgufError> {
    let (arch, _) = config::architecture(gguf)?;
    let llama = arch == "llama";
    let heads = gguf.integer(&format!("{arch}.attention.head_count"));
    let kv_heads = gguf
        .integer(&format!("{arch}.attention.head_count_kv"))
        .or(heads);
    let file = std::fs::File::open(&gguf.path).map_err(|e| read_error(&gguf.path, e))?;
    let mut reader = BufReader::new(file);
    let mut tensors = HashMap::with_capacity(gguf.content.tensor_infos.len());
    for name in gguf.content.tensor_infos.keys() {
        let failed =
            |e: candle_core::Error| read_error(&gguf.path, format!("tensor `{name}`: {e}"));
        let tensor = gguf
            .content
            .tensor(&mut reader, name, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .map_err(failed)?;
        let rope_heads = match name.rsplit('.').nth(1) {
            Some("attn_q") if llama => heads,
            Some("attn_k") if llama => kv_heads,
            _ => None,
        };
        let tensor = match rope_heads {
            Some(heads) => halves_of_heads(&tensor, heads as usize).map_err(failed)?,
            None => tensor,
        };
        let hf =
            hf_name(arch, name).ok_or_else(|| gguf.unsupported(format!("tensor `{name}`"), &[]))?;
        tensors.insert(hf, tensor);
    }
    Ok(tensors)
}

/// Llama's query or key rows (or bias) of `heads` heads from llama.cpp's order, where each
/// head's rows alternate between the two halves of its rotary pairs, to Hugging Face's, where
/// each head's first half comes before its second.
fn halves_of_heads(tensor: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let dims = tensor.dims().to_vec();
    let rows = dims[0];
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        candle_core::bail!("{rows} rows do not split into {heads} heads of rotary pairs");
    }
    let half = rows / heads / 2;
    let mut shape = vec![heads, half, 2];
    shape.extend_from_slice(&dims[1..]);
    tensor
        .reshape(shape)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_map_to_hugging_face_names_and_others_are_unknown() {
        assert_eq!(
            hf_name("llama", "blk.12.attn_q.weight").as_deref(),
            Some("model.layers.12.self_attn.q_proj.weight")
        );
        assert_eq!(
            hf_name("llama", "blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_name("gemma3", "blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            hf_name("gemma3", "blk.0.post_ffw_norm.weight").as_deref(),
            Some("model.layers.0.post_feedforward_layernorm.weight")
        );
        assert_eq!(hf_name("llama", "blk.0.post_ffw_norm.weight"), None);
        assert_eq!(
            hf_name("llama", "output.weight").as_deref(),
            Some("lm_head.weight")
        );
        for unknown in [
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk.0.attn_qkv.weight",
        ] {
            assert_eq!(hf_name("llama", unknown), None, "{unknown}");
        }
    }

    #[test]
    fn interleaved_rotary_rows_become_two_halves_per_head() {
        // Two heads of four rows: llama.cpp's order is (a0 b0 a1 b1) per head, pairs interleaved.
        let rows: Vec<f32> = vec![0., 2., 1., 3., 4., 6., 5., 7.];
        let tensor = Tensor::from_vec(rows, (8, 1), &Device::Cpu).unwrap();
        let back = halves_of_heads(&tensor, 2).unwrap();
        let back: Vec<f32> = back.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(back, [0., 1., 2., 3., 4., 5., 6., 7.]);
    }
}
