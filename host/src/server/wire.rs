//! The Tinker wire's request and answer bodies, and their conversion to and from the op API:
//! JSON requests (`serde`, unknown fields refused by name where the SDK sends a closed set),
//! protobuf for `forward_backward` requests and for `forward_backward` and sample results.

use std::collections::BTreeMap;

use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};

use super::proto;
use crate::api::{
    AdamParams, ApiError, Chunk, Datum, ForwardBackwardInput, ForwardBackwardOutput, LoraConfig,
    ModelId, ModelInput, SampleResponse, SamplingParams, StopReason, TensorData, TensorValues,
};

/// The logprob the SDK reads as "no entry" in a top-k row.
const MASK_LOGPROB: f32 = -99999.0;

#[derive(Deserialize)]
pub struct CreateSession {}

#[derive(Deserialize)]
pub struct CreateModel {
    pub session_id: String,
    pub model_seq_id: u64,
    pub base_model: String,
    pub lora_config: Option<LoraConfig>,
    #[serde(default)]
    pub optimizer_config: Option<OptimizerConfig>,
}

/// The optimizer of a new model: AdamW is the one served.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum OptimizerConfig {
    Adamw {},
    Adam {},
}

#[derive(Deserialize)]
pub struct GetInfo {
    pub model_id: ModelId,
}

#[derive(Deserialize)]
pub struct OptimStep {
    pub model_id: ModelId,
    pub seq_id: Option<u64>,
    #[serde(alias = "optim_params", alias = "optimizer_params")]
    pub adam_params: AdamParams,
}

#[derive(Deserialize)]
pub struct SaveWeights {
    pub model_id: ModelId,
    pub path: Option<String>,
    pub seq_id: Option<u64>,
}

#[derive(Deserialize)]
pub struct SaveWeightsForSampler {
    pub model_id: ModelId,
    pub path: Option<String>,
    pub sampling_session_seq_id: Option<u64>,
    pub seq_id: Option<u64>,
}

#[derive(Deserialize)]
pub struct LoadWeights {
    pub model_id: Option<ModelId>,
    pub seq_id: Option<u64>,
    pub session_id: Option<String>,
    pub model_seq_id: Option<u64>,
    pub path: String,
    #[serde(default)]
    pub optimizer: bool,
}

#[derive(Deserialize)]
pub struct CreateSamplingSession {
    pub session_id: String,
    pub sampling_session_seq_id: u64,
    pub base_model: Option<String>,
    pub model_path: Option<String>,
}

#[derive(Deserialize)]
pub struct Sample {
    #[serde(default = "one")]
    pub num_samples: usize,
    pub prompt: ModelInput,
    pub sampling_params: SamplingParams,
    pub base_model: Option<String>,
    pub model_path: Option<String>,
    pub sampling_session_id: Option<String>,
    pub seq_id: Option<u64>,
    #[serde(default)]
    pub prompt_logprobs: Option<bool>,
    #[serde(default)]
    pub topk_prompt_logprobs: usize,
    #[serde(default)]
    pub topk_sample_logprobs: usize,
    #[serde(default)]
    pub prompt_alt_tokens_k: usize,
    pub target_prompt_logprobs: Option<Value>,
    pub prompt_logprobs_last_n: Option<usize>,
}

fn one() -> usize {
    1
}

#[derive(Deserialize)]
pub struct RetrieveFuture {
    pub request_id: String,
}

/// A `forward_backward` request, decoded from protobuf.
pub struct ForwardBackward {
    pub model_id: ModelId,
    pub seq_id: Option<u64>,
    pub input: ForwardBackwardInput,
    pub forward_only: bool,
}

/// Little-endian values of `N` bytes each, read with `read`; `dtype` names them in the error.
fn little_endian<T, const N: usize>(
    bytes: &[u8],
    what: &str,
    dtype: &str,
    read: fn([u8; N]) -> T,
) -> Result<Vec<T>, ApiError> {
    if !bytes.len().is_multiple_of(N) {
        return Err(ApiError::invalid(format!(
            "{what}: {} bytes is not a whole number of {dtype} values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|b| read(b.try_into().unwrap_or([0; N])))
        .collect())
}

fn int32_tokens(bytes: &[u8], what: &str) -> Result<Vec<u32>, ApiError> {
    little_endian(bytes, what, "int32", i32::from_le_bytes)?
        .into_iter()
        .map(|t| {
            u32::try_from(t)
                .map_err(|_| ApiError::invalid(format!("{what}: token id {t} is negative")))
        })
        .collect()
}

fn tensor(t: proto::Tensor, what: &str) -> Result<TensorData, ApiError> {
    let bytes = match t.encoding {
        Some(proto::tensor::Encoding::Dense(bytes)) => bytes,
        Some(proto::tensor::Encoding::SparseCsr(_)) => {
            return Err(ApiError::invalid(format!(
                "{what}: sparse tensors are not served; send it dense"
            )));
        }
        None => Vec::new(),
    };
    let values = match proto::DType::try_from(t.dtype) {
        Ok(proto::DType::Float32) => {
            TensorValues::Float32(little_endian(&bytes, what, "float32", f32::from_le_bytes)?)
        }
        Ok(proto::DType::Int64) => {
            TensorValues::Int64(little_endian(&bytes, what, "int64", i64::from_le_bytes)?)
        }
        _ => {
            return Err(ApiError::invalid(format!(
                "{what}: dtype {} is not served (float32 or int64)",
                t.dtype
            )));
        }
    };
    let len = match &values {
        TensorValues::Float32(v) => v.len(),
        TensorValues::Int64(v) => v.len(),
    };
    let shape = if t.shape.is_empty() {
        vec![len]
    } else {
        t.shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                ApiError::invalid(format!("{what}: negative dimension in {:?}", t.shape))
            })?
    };
    if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(len) {
        return Err(ApiError::invalid(format!(
            "{what}: shape {shape:?} does not hold {len} values"
        )));
    }
    Ok(TensorData { values, shape })
}

/// Decode a `forward_backward` request body.
pub fn forward_backward(body: &[u8]) -> Result<ForwardBackward, ApiError> {
    let request = proto::ForwardBackwardRequest::decode(body)
        .map_err(|e| ApiError::invalid(format!("forward_backward: malformed protobuf: {e}")))?;
    let model_id: ModelId = request.model_id.parse()?;
    let seq_id = match request.seq_id {
        0 => None,
        n => Some(
            u64::try_from(n).map_err(|_| ApiError::invalid(format!("seq_id {n} is negative")))?,
        ),
    };
    let mut config = request.loss_fn_config;
    for (key, value) in request.loss_fn_config_v2 {
        match value.value {
            Some(proto::loss_config_value::Value::Number(n)) => {
                config.insert(key, n);
            }
            Some(proto::loss_config_value::Value::Text(text)) => {
                return Err(ApiError::invalid(format!(
                    "loss_fn_config[{key:?}] = {text:?}: only numbers are accepted"
                )));
            }
            None => {}
        }
    }
    let mut data = Vec::with_capacity(request.data.len());
    for (i, datum) in request.data.into_iter().enumerate() {
        let mut chunks = Vec::with_capacity(datum.model_input.len());
        for chunk in datum.model_input {
            match chunk.chunk {
                Some(proto::chunk::Chunk::EncodedText(text)) => chunks.push(Chunk::EncodedText {
                    tokens: int32_tokens(&text.tokens, &format!("datum {i}"))?,
                }),
                Some(_) => {
                    return Err(ApiError::invalid(format!(
                        "datum {i}: only encoded_text chunks are served (no images)"
                    )));
                }
                None => {}
            }
        }
        let mut inputs = BTreeMap::new();
        for (key, value) in datum.loss_fn_inputs {
            let what = format!("datum {i}: loss_fn_inputs[{key:?}]");
            inputs.insert(key, tensor(value, &what)?);
        }
        data.push(Datum {
            model_input: ModelInput { chunks },
            loss_fn_inputs: inputs,
        });
    }
    Ok(ForwardBackward {
        model_id,
        seq_id,
        input: ForwardBackwardInput {
            data,
            loss_fn: request.loss_fn,
            loss_fn_config: config,
        },
        forward_only: request.forward_only,
    })
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i32_bytes(values: impl IntoIterator<Item = u32>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|v| (v as i32).to_le_bytes())
        .collect()
}

/// Encode a `forward_backward` result: one record whose fields hold every datum's tensors.
pub fn forward_backward_output(output: &ForwardBackwardOutput) -> Vec<u8> {
    let mut fields: BTreeMap<String, proto::BatchedTensor> = BTreeMap::new();
    for datum in &output.loss_fn_outputs {
        for (name, tensor) in datum {
            let field = fields
                .entry(name.clone())
                .or_insert_with(|| proto::BatchedTensor {
                    data: Vec::new(),
                    offsets: 0i64.to_le_bytes().to_vec(),
                    dtype: match tensor.values {
                        TensorValues::Float32(_) => proto::DType::Float32 as i32,
                        TensorValues::Int64(_) => proto::DType::Int64 as i32,
                    },
                    trailing_shape: tensor.shape.iter().skip(1).map(|&d| d as i64).collect(),
                });
            match &tensor.values {
                TensorValues::Float32(v) => field.data.extend(f32_bytes(v)),
                TensorValues::Int64(v) => field.data.extend(v.iter().flat_map(|x| x.to_le_bytes())),
            }
            field
                .offsets
                .extend((field.data.len() as i64).to_le_bytes());
        }
    }
    proto::ForwardBackwardOutput {
        loss_fn_output_type: output.loss_fn_output_type.clone(),
        loss_fn_outputs: vec![proto::ArrayRecord {
            type_tag: "TensorData".into(),
            fields,
            num_datums: output.loss_fn_outputs.len() as i64,
        }],
        metrics: output.metrics.clone(),
    }
    .encode_to_vec()
}

/// Encode a sample result.
pub fn sample_response(response: &SampleResponse) -> Vec<u8> {
    let topk = response.topk_prompt_logprobs.as_ref().map(|rows| {
        let k = rows
            .iter()
            .flatten()
            .map(|row| row.len())
            .max()
            .unwrap_or(0);
        let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
        for row in rows {
            let row = row.as_deref().unwrap_or(&[]);
            for i in 0..k {
                let (id, logprob) = row.get(i).copied().unwrap_or((0, MASK_LOGPROB));
                ids.push(id);
                logprobs.push(logprob);
            }
        }
        proto::TopkLogprobs {
            token_ids: i32_bytes(ids),
            logprobs: f32_bytes(&logprobs),
            k: k as u32,
            length: rows.len() as u32,
        }
    });
    proto::SampleResponse {
        sequences: response
            .sequences
            .iter()
            .map(|s| proto::SampledSequence {
                stop_reason: match s.stop_reason {
                    StopReason::Stop => proto::StopReason::Stop as i32,
                    StopReason::Length => proto::StopReason::Length as i32,
                },
                tokens: i32_bytes(s.tokens.iter().copied()),
                logprobs: Some(f32_bytes(&s.logprobs)),
            })
            .collect(),
        prompt_logprobs: response.prompt_logprobs.as_ref().map(|l| {
            let values: Vec<f32> = l.iter().map(|v| v.unwrap_or(f32::NAN)).collect();
            f32_bytes(&values)
        }),
        topk_prompt_logprobs: topk,
        prompt_cache_hit_tokens: i32::try_from(response.prompt_cache_hit_tokens)
            .unwrap_or(i32::MAX),
    }
    .encode_to_vec()
}

/// The answer to a future whose op is still queued or running.
pub fn try_again(request_id: &str) -> Value {
    json!({"type": "try_again", "request_id": request_id, "queue_state": "active"})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(datum: proto::Datum) -> Vec<u8> {
        proto::ForwardBackwardRequest {
            model_id: "s-1:train:0".into(),
            seq_id: 1,
            data: vec![datum],
            loss_fn: "cross_entropy".into(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn tokens(ids: &[i32]) -> proto::Chunk {
        proto::Chunk {
            chunk: Some(proto::chunk::Chunk::EncodedText(proto::EncodedTextChunk {
                tokens: ids.iter().flat_map(|t| t.to_le_bytes()).collect(),
            })),
        }
    }

    #[test]
    fn a_forward_backward_request_decodes_into_typed_datums() {
        let targets = proto::Tensor {
            encoding: Some(proto::tensor::Encoding::Dense(
                [2i64, 3].iter().flat_map(|t| t.to_le_bytes()).collect(),
            )),
            dtype: proto::DType::Int64 as i32,
            shape: vec![2],
        };
        let body = request(proto::Datum {
            model_input: vec![tokens(&[1, 2])],
            loss_fn_inputs: BTreeMap::from([("target_tokens".into(), targets)]),
        });
        let decoded = forward_backward(&body).unwrap();
        assert_eq!(decoded.seq_id, Some(1));
        assert_eq!(decoded.input.data[0].model_input.tokens(), vec![1, 2]);
        assert_eq!(
            decoded.input.data[0].loss_fn_inputs["target_tokens"],
            TensorData::i64(vec![2, 3])
        );
    }

    #[test]
    fn malformed_bodies_are_refused_with_a_reason() {
        let error = forward_backward(b"\xff\xff\xff").err().unwrap();
        assert!(error.message.contains("malformed protobuf"), "{error}");
        let body = request(proto::Datum {
            model_input: vec![tokens(&[1, -5])],
            loss_fn_inputs: BTreeMap::new(),
        });
        let error = forward_backward(&body).err().unwrap();
        assert!(error.message.contains("negative"), "{error}");
        let bad_shape = proto::Tensor {
            encoding: Some(proto::tensor::Encoding::Dense(vec![0; 8])),
            dtype: proto::DType::Float32 as i32,
            shape: vec![3],
        };
        let body = request(proto::Datum {
            model_input: vec![tokens(&[1, 2])],
            loss_fn_inputs: BTreeMap::from([("weights".into(), bad_shape)]),
        });
        let error = forward_backward(&body).err().unwrap();
        assert!(error.message.contains("does not hold 2 values"), "{error}");
    }

    #[test]
    fn outputs_concatenate_datums_with_byte_offsets() {
        let output = ForwardBackwardOutput {
            loss_fn_output_type: "cross_entropy".into(),
            loss_fn_outputs: vec![
                BTreeMap::from([("logprobs".into(), TensorData::f32(vec![-1.0]))]),
                BTreeMap::from([("logprobs".into(), TensorData::f32(vec![-2.0, -3.0]))]),
            ],
            metrics: BTreeMap::from([("loss:sum".into(), 6.0)]),
        };
        let decoded =
            proto::ForwardBackwardOutput::decode(&*forward_backward_output(&output)).unwrap();
        let field = &decoded.loss_fn_outputs[0].fields["logprobs"];
        let offsets: Vec<i64> = field
            .offsets
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(offsets, vec![0, 4, 12]);
        assert_eq!(decoded.loss_fn_outputs[0].num_datums, 2);
    }
}
