//! The Tinker wire's request and answer bodies, and their conversion to and from the op API:
//! JSON requests (`serde`, unknown fields refused by name where the SDK sends a closed set),
//! protobuf for `forward_backward` requests and for `forward_backward` and sample results.

use std::collections::BTreeMap;

use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{
    AdamParams, ApiError, Chunk, CustomLossInput, Datum, DecodeBudget, ForwardBackwardInput,
    LoraConfig, LossGraph, LossId, ModelId, ModelInput, SamplingParams, TensorData, TensorValues,
    UNIT_TEMPERATURE, UserMetadata,
};
use crate::wire::{FORWARD_BACKWARD_REQUEST, decoded_size};
use crate::wire::{TEMPERATURE_KEY, decode_spans, decode_tensor, decode_tokens, proto};

#[derive(Deserialize)]
pub struct CreateSession {}

#[derive(Deserialize)]
pub struct SessionHeartbeat {
    pub session_id: String,
}

#[derive(Deserialize)]
pub struct CreateModel {
    pub session_id: String,
    pub model_seq_id: u64,
    pub base_model: String,
    pub lora_config: Option<LoraConfig>,
    #[serde(default)]
    #[expect(
        dead_code,
        reason = "read so that an optimizer other than Adam(W) is refused"
    )]
    pub optimizer_config: Option<OptimizerConfig>,
    #[serde(default)]
    pub user_metadata: Option<UserMetadata>,
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
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub user_metadata: Option<UserMetadata>,
}

#[derive(Deserialize)]
pub struct SaveWeightsForSampler {
    pub model_id: ModelId,
    pub path: Option<String>,
    pub sampling_session_seq_id: Option<u64>,
    pub seq_id: Option<u64>,
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub user_metadata: Option<UserMetadata>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaveWeightsExternal {
    pub model_id: ModelId,
    pub path: String,
    pub seq_id: Option<u64>,
    pub ttl_seconds: Option<u64>,
    pub age_encryption_recipients: Option<Vec<String>>,
    #[serde(default)]
    #[allow(dead_code)]
    r#type: Option<String>,
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
    #[serde(default)]
    pub user_metadata: Option<UserMetadata>,
}

/// `create_custom_loss`: a traced per-datum loss of the session, its inputs in order.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCustomLoss {
    pub session_id: String,
    pub custom_loss_seq_id: u64,
    pub name: String,
    pub inputs: Vec<CustomLossInput>,
    pub graph: LossGraph,
    #[serde(default, rename = "type")]
    #[expect(
        dead_code,
        reason = "the SDK's request tag, allowed beside the denied unknown fields"
    )]
    pub kind: Option<String>,
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
    /// Its sampler (the SDK's `base_model` and `model_path` forms are not served: a sample names
    /// a sampling session made by `create_sampling_session`).
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
    pub target_prompt_logprobs: Option<JsonTensor>,
    pub prompt_logprobs_last_n: Option<usize>,
    /// Keep each sequence's tokens and logprobs for `stable_reinforce`.
    #[serde(default)]
    pub record_stability_info: Option<bool>,
}

fn one() -> usize {
    1
}

/// A tensor as the SDK's JSON carries it (its `TensorData`): `data` dense in row-major order, or
/// sparse CSR (`data` the listed cells' values, row pointers and column indices beside it).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonTensor {
    data: Vec<i64>,
    dtype: String,
    shape: Option<Vec<usize>>,
    sparse_crow_indices: Option<Vec<usize>>,
    sparse_col_indices: Option<Vec<usize>>,
}

impl JsonTensor {
    /// The dense int64 tensor (`what` names it in errors), `pad` in the cells a sparse one
    /// does not list.
    pub fn dense_i64(
        self,
        what: &str,
        pad: i64,
        budget: &mut DecodeBudget,
    ) -> Result<TensorData, ApiError> {
        let bad = |why: String| ApiError::invalid(format!("{what}: {why}"));
        if self.dtype != "int64" {
            return Err(bad(format!("must be int64, not {}", self.dtype)));
        }
        let shape = self.shape.unwrap_or_else(|| vec![self.data.len()]);
        let size = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= MAX_JSON_TENSOR_CELLS)
            .ok_or_else(|| bad(format!("shape {shape:?} is too large")))?;
        // A sparse tensor of a few listed cells may name a large shape: its dense form is paid
        // for by the body that carries it.
        budget.charge(what, size.saturating_mul(size_of::<i64>()))?;
        let values = match (self.sparse_crow_indices, self.sparse_col_indices) {
            (None, None) if self.data.len() == size => self.data,
            (None, None) => {
                return Err(bad(format!(
                    "shape {shape:?} does not hold its {} values",
                    self.data.len()
                )));
            }
            (Some(rows), Some(columns)) => {
                let &[height, width] = shape.as_slice() else {
                    return Err(bad("a sparse tensor must be 2-D".into()));
                };
                let ordered = rows.windows(2).all(|w| w[0] <= w[1]);
                if rows.len() != height + 1
                    || !ordered
                    || rows.last() != Some(&self.data.len())
                    || columns.len() != self.data.len()
                {
                    return Err(bad("its sparse_crow_indices and sparse_col_indices do not match its data and shape".into()));
                }
                let mut dense = vec![pad; size];
                for (row, span) in rows.windows(2).enumerate() {
                    let listed = span[0]..span[1];
                    for (&column, &value) in columns[listed.clone()].iter().zip(&self.data[listed])
                    {
                        if column >= width {
                            return Err(bad(format!(
                                "column {column} is outside its width {width}"
                            )));
                        }
                        dense[row * width + column] = value;
                    }
                }
                dense
            }
            _ => {
                return Err(bad(
                    "sparse_crow_indices and sparse_col_indices come together".into(),
                ));
            }
        };
        Ok(TensorData {
            values: TensorValues::Int64(values),
            shape,
        })
    }
}

/// The most cells a JSON tensor may have (a `[len(prompt) - 1, K]` tensor of a long prompt).
const MAX_JSON_TENSOR_CELLS: usize = 1 << 24;

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

/// Decode a `forward_backward` request body.
pub fn forward_backward(body: &[u8]) -> Result<ForwardBackward, ApiError> {
    // Reckoned before anything is built: two bytes of body may make a datum.
    let reckoned = decoded_size(body, &FORWARD_BACKWARD_REQUEST)?;
    DecodeBudget::for_body(body.len()).charge("forward_backward", reckoned)?;
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
    let mut custom_loss = None;
    for (key, value) in request.loss_fn_config_v2 {
        match value.value {
            Some(proto::loss_config_value::Value::Number(n)) => {
                config.insert(key, n);
            }
            // The one text a loss takes: the id of a custom loss (`create_custom_loss`).
            Some(proto::loss_config_value::Value::Text(text)) if key == "loss_id" => {
                custom_loss = Some(text.parse::<LossId>()?);
            }
            Some(proto::loss_config_value::Value::Text(text)) => {
                return Err(ApiError::invalid(format!(
                    "loss_fn_config[{key:?}] = {text:?}: only numbers are accepted (and a custom loss's `loss_id`)"
                )));
            }
            None => {}
        }
    }
    let temperature = config.remove(TEMPERATURE_KEY).unwrap_or(UNIT_TEMPERATURE);
    let mut data = Vec::with_capacity(request.data.len());
    for (i, datum) in request.data.into_iter().enumerate() {
        let mut chunks = Vec::with_capacity(datum.model_input.len());
        for chunk in datum.model_input {
            match chunk.chunk {
                Some(proto::chunk::Chunk::EncodedText(text)) => chunks.push(Chunk::EncodedText {
                    tokens: decode_tokens(&text.tokens, &format!("datum {i}"))?,
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
            inputs.insert(key, decode_tensor(value, &what)?);
        }
        let spans = format!("datum {i}: loss_fn_input_spans");
        data.push(Datum {
            model_input: ModelInput { chunks },
            loss_fn_inputs: inputs,
            loss_fn_input_spans: decode_spans(datum.loss_fn_input_spans, &spans)?,
        });
    }
    Ok(ForwardBackward {
        model_id,
        seq_id,
        input: ForwardBackwardInput {
            data,
            loss_fn: request.loss_fn,
            loss_fn_config: config,
            custom_loss,
            temperature,
        },
        forward_only: request.forward_only,
    })
}

/// The answer to a future whose op is still queued or running.
pub fn try_again(request_id: &str) -> Value {
    json!({"type": "try_again", "request_id": request_id, "queue_state": "active"})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TensorData;

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
            ..Default::default()
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
            ..Default::default()
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
            ..Default::default()
        });
        let error = forward_backward(&body).err().unwrap();
        assert!(error.message.contains("does not hold 2 values"), "{error}");
    }
}
