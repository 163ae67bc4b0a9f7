//! The binary parts of the Tinker wire, both ways: little-endian token and value bytes, tensors,
//! the protobuf `forward_backward` request, and the protobuf `forward_backward` and sample
//! results. The server decodes requests and encodes results; the remote client
//! (`client::remote`) does the opposite, with the same functions' other halves, so the two can
//! only disagree where a round-trip test would see it.

use std::collections::BTreeMap;

use prost::Message;

use super::proto;
use crate::api::{
    ApiError, Chunk, ForwardBackwardInput, ForwardBackwardOutput, PromptAltTokens, ProvenanceSpan,
    SampleResponse, SampledSequence, SequenceId, SpanSource, StopReason, TensorData, TensorValues,
    TopLogprobs, UNIT_TEMPERATURE,
};

/// The logprob the SDK reads as "no entry" in a top-k row.
const MASK_LOGPROB: f32 = -99999.0;

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

pub fn decode_tokens(bytes: &[u8], what: &str) -> Result<Vec<u32>, ApiError> {
    little_endian(bytes, what, "int32", i32::from_le_bytes)?
        .into_iter()
        .map(|t| {
            u32::try_from(t)
                .map_err(|_| ApiError::invalid(format!("{what}: token id {t} is negative")))
        })
        .collect()
}

pub fn decode_tensor(t: proto::Tensor, what: &str) -> Result<TensorData, ApiError> {
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

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn i32_bytes(values: impl IntoIterator<Item = u32>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|v| (v as i32).to_le_bytes())
        .collect()
}

/// Encode a `forward_backward` result: one record whose fields hold every datum's tensors.
pub fn encode_forward_backward_output(output: &ForwardBackwardOutput) -> Vec<u8> {
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

/// Rows of top tokens as the wire's dense `length × k` matrices, a short or missing row padded
/// with masked entries.
fn encode_topk<'a>(
    rows: impl ExactSizeIterator<Item = Option<&'a [(u32, f32)]>> + Clone,
) -> proto::TopkLogprobs {
    let length = rows.len();
    let k = rows.clone().flatten().map(<[_]>::len).max().unwrap_or(0);
    let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
    for row in rows {
        let row = row.unwrap_or(&[]);
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
        length: length as u32,
    }
}

/// The rows of [`encode_topk`]'s matrices (`None` for a row with every entry masked).
fn decode_topk(
    topk: &proto::TopkLogprobs,
    what: &str,
) -> Result<Vec<Option<TopLogprobs>>, ApiError> {
    let ids = decode_tokens(&topk.token_ids, what)?;
    let logprobs = little_endian(&topk.logprobs, what, "float32", f32::from_le_bytes)?;
    let (k, rows) = (topk.k as usize, topk.length as usize);
    if ids.len() != k * rows || logprobs.len() != k * rows {
        return Err(ApiError::invalid(format!(
            "{what}: {} ids and {} logprobs are not {rows} rows of {k}",
            ids.len(),
            logprobs.len()
        )));
    }
    Ok((0..rows)
        .map(|r| {
            let row: TopLogprobs = (r * k..(r + 1) * k)
                .filter(|&i| logprobs[i] != MASK_LOGPROB)
                .map(|i| (ids[i], logprobs[i]))
                .collect();
            (!row.is_empty()).then_some(row)
        })
        .collect())
}

/// Encode a sample result.
pub fn encode_sample_response(response: &SampleResponse) -> Vec<u8> {
    let topk = response
        .topk_prompt_logprobs
        .as_ref()
        .map(|rows| encode_topk(rows.iter().map(Option::as_deref)));
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
                topk_sampled_logprobs: s
                    .topk_logprobs
                    .as_ref()
                    .map(|rows| encode_topk(rows.iter().map(|row| Some(row.as_slice())))),
            })
            .collect(),
        prompt_logprobs: response.prompt_logprobs.as_ref().map(|l| {
            let values: Vec<f32> = l.iter().map(|v| v.unwrap_or(f32::NAN)).collect();
            f32_bytes(&values)
        }),
        topk_prompt_logprobs: topk,
        prompt_cache_hit_tokens: i32::try_from(response.prompt_cache_hit_tokens)
            .unwrap_or(i32::MAX),
        target_prompt_logprobs: response.target_prompt_logprobs.as_ref().map(encode_tensor),
        prompt_alt_tokens: response
            .prompt_alt_tokens
            .as_ref()
            .map(|alt| proto::PromptAltTokens {
                tokens: Some(encode_tensor(&alt.tokens)),
                logprobs: Some(encode_tensor(&alt.logprobs)),
            }),
    }
    .encode_to_vec()
}

/// A tensor as the wire carries it: dense little-endian bytes with its dtype and shape.
pub fn encode_tensor(tensor: &TensorData) -> proto::Tensor {
    let (bytes, dtype) = match &tensor.values {
        TensorValues::Float32(v) => (f32_bytes(v), proto::DType::Float32),
        TensorValues::Int64(v) => (
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            proto::DType::Int64,
        ),
    };
    proto::Tensor {
        encoding: Some(proto::tensor::Encoding::Dense(bytes)),
        dtype: dtype as i32,
        shape: tensor.shape.iter().map(|&d| d as i64).collect(),
    }
}

/// Provenance runs as the wire writes them.
pub fn encode_spans(spans: &[ProvenanceSpan]) -> Vec<proto::ProvenanceSpan> {
    spans
        .iter()
        .map(|span| {
            let run = proto::SpanRun {
                sequence_id: span.sequence.to_string(),
                offset: span.offset as i64,
                length: span.length as i64,
            };
            proto::ProvenanceSpan {
                span: Some(match span.source {
                    SpanSource::Prompt => proto::provenance_span::Span::PromptTokens(run),
                    SpanSource::Sampled => proto::provenance_span::Span::SampledTokens(run),
                }),
            }
        })
        .collect()
}

/// The provenance runs of [`encode_spans`]; `what` names the field in errors. No runs: none.
pub fn decode_spans(
    spans: Vec<proto::ProvenanceSpan>,
    what: &str,
) -> Result<Option<Vec<ProvenanceSpan>>, ApiError> {
    if spans.is_empty() {
        return Ok(None);
    }
    let mut decoded = Vec::with_capacity(spans.len());
    for (i, span) in spans.into_iter().enumerate() {
        let bad = |problem: &str| ApiError::invalid(format!("{what}[{i}]: {problem}"));
        let (source, run) = match span.span {
            Some(proto::provenance_span::Span::PromptTokens(run)) => (SpanSource::Prompt, run),
            Some(proto::provenance_span::Span::SampledTokens(run)) => (SpanSource::Sampled, run),
            None => return Err(bad("neither prompt_tokens nor sampled_tokens")),
        };
        let count = |n: i64, name: &str| {
            usize::try_from(n).map_err(|_| bad(&format!("{name} {n} is negative")))
        };
        decoded.push(ProvenanceSpan {
            source,
            sequence: SequenceId::parse(&run.sequence_id).map_err(|e| bad(&e.message))?,
            offset: count(run.offset, "offset")?,
            length: count(run.length, "length")?,
        });
    }
    Ok(Some(decoded))
}

/// The `loss_fn_config` key that carries [`ForwardBackwardInput::temperature`] on the wire
/// (the Tinker SDK has no field of its own for it).
pub const TEMPERATURE_KEY: &str = "temperature";

/// Encode a `forward_backward` (or, with `forward_only`, a `forward`) request.
pub fn encode_forward_backward_request(
    model_id: &str,
    seq_id: i32,
    input: &ForwardBackwardInput,
    forward_only: bool,
) -> Vec<u8> {
    let data = input
        .data
        .iter()
        .map(|datum| proto::Datum {
            model_input: datum
                .model_input
                .chunks
                .iter()
                .map(|chunk| match chunk {
                    Chunk::EncodedText { tokens } => proto::Chunk {
                        chunk: Some(proto::chunk::Chunk::EncodedText(proto::EncodedTextChunk {
                            tokens: i32_bytes(tokens.iter().copied()),
                        })),
                    },
                })
                .collect(),
            loss_fn_inputs: datum
                .loss_fn_inputs
                .iter()
                .map(|(name, tensor)| (name.clone(), encode_tensor(tensor)))
                .collect(),
            model_input_spans: Vec::new(),
            loss_fn_input_spans: datum
                .loss_fn_input_spans
                .as_deref()
                .map(encode_spans)
                .unwrap_or_default(),
        })
        .collect();
    proto::ForwardBackwardRequest {
        model_id: model_id.to_string(),
        seq_id,
        data,
        loss_fn: input.loss_fn.clone(),
        loss_fn_config: {
            let mut config = input.loss_fn_config.clone();
            if input.temperature != UNIT_TEMPERATURE {
                config.insert(TEMPERATURE_KEY.into(), input.temperature);
            }
            config
        },
        forward_only,
        loss_fn_config_v2: input
            .custom_loss
            .iter()
            .map(|id| {
                let text = proto::loss_config_value::Value::Text(id.to_string());
                (
                    "loss_id".to_string(),
                    proto::LossConfigValue { value: Some(text) },
                )
            })
            .collect(),
    }
    .encode_to_vec()
}

/// Little-endian int64 byte offsets of a batched tensor: `datums + 1` of them, from 0, rising,
/// within `len` bytes.
fn offsets(bytes: &[u8], datums: usize, len: usize, what: &str) -> Result<Vec<usize>, ApiError> {
    let offsets = little_endian(bytes, what, "int64", i64::from_le_bytes)?;
    let fits = offsets.len() == datums + 1
        && offsets.first() == Some(&0)
        && offsets.windows(2).all(|w| w[0] <= w[1])
        && offsets.last().is_some_and(|&end| end as usize == len);
    if !fits {
        return Err(ApiError::invalid(format!(
            "{what}: offsets {offsets:?} do not split {len} bytes into {datums} datums"
        )));
    }
    Ok(offsets.into_iter().map(|o| o as usize).collect())
}

/// Decode a `forward_backward` result into per-datum tensors, datums of every record in order.
pub fn decode_forward_backward_output(bytes: &[u8]) -> Result<ForwardBackwardOutput, ApiError> {
    let output = proto::ForwardBackwardOutput::decode(bytes).map_err(|e| {
        ApiError::invalid(format!("forward_backward result: malformed protobuf: {e}"))
    })?;
    let mut datums: Vec<BTreeMap<String, TensorData>> = Vec::new();
    for record in output.loss_fn_outputs {
        let count = usize::try_from(record.num_datums).map_err(|_| {
            ApiError::invalid(format!("num_datums {} is negative", record.num_datums))
        })?;
        let first = datums.len();
        datums.resize_with(first + count, BTreeMap::new);
        for (name, field) in record.fields {
            let what = format!("forward_backward result field {name:?}");
            let ends = offsets(&field.offsets, count, field.data.len(), &what)?;
            let trailing: Vec<usize> = field.trailing_shape.iter().map(|&d| d as usize).collect();
            let per_row: usize = trailing.iter().product::<usize>().max(1);
            for (d, span) in ends.windows(2).enumerate() {
                let bytes = &field.data[span[0]..span[1]];
                let values = match proto::DType::try_from(field.dtype) {
                    Ok(proto::DType::Float32) => TensorValues::Float32(little_endian(
                        bytes,
                        &what,
                        "float32",
                        f32::from_le_bytes,
                    )?),
                    Ok(proto::DType::Int64) => TensorValues::Int64(little_endian(
                        bytes,
                        &what,
                        "int64",
                        i64::from_le_bytes,
                    )?),
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "{what}: dtype {} is not float32 or int64",
                            field.dtype
                        )));
                    }
                };
                let len = match &values {
                    TensorValues::Float32(v) => v.len(),
                    TensorValues::Int64(v) => v.len(),
                };
                let mut shape = vec![len / per_row];
                shape.extend(&trailing);
                datums[first + d].insert(name.clone(), TensorData { values, shape });
            }
        }
    }
    Ok(ForwardBackwardOutput {
        loss_fn_output_type: output.loss_fn_output_type,
        loss_fn_outputs: datums,
        metrics: output.metrics,
    })
}

/// Decode a sample result.
pub fn decode_sample_response(bytes: &[u8]) -> Result<SampleResponse, ApiError> {
    let response = proto::SampleResponse::decode(bytes)
        .map_err(|e| ApiError::invalid(format!("sample result: malformed protobuf: {e}")))?;
    let floats =
        |bytes: &[u8], what: &str| little_endian(bytes, what, "float32", f32::from_le_bytes);
    let mut sequences = Vec::with_capacity(response.sequences.len());
    for (i, sequence) in response.sequences.into_iter().enumerate() {
        let what = format!("sample result sequence {i}");
        sequences.push(SampledSequence {
            stop_reason: match proto::StopReason::try_from(sequence.stop_reason) {
                Ok(proto::StopReason::Length) => StopReason::Length,
                _ => StopReason::Stop,
            },
            tokens: decode_tokens(&sequence.tokens, &what)?,
            logprobs: match &sequence.logprobs {
                Some(bytes) => floats(bytes, &what)?,
                None => Vec::new(),
            },
            topk_logprobs: match &sequence.topk_sampled_logprobs {
                Some(topk) => Some(
                    decode_topk(topk, &format!("{what} topk_sampled_logprobs"))?
                        .into_iter()
                        .map(Option::unwrap_or_default)
                        .collect(),
                ),
                None => None,
            },
        });
    }
    let prompt_logprobs = match &response.prompt_logprobs {
        Some(bytes) => Some(
            floats(bytes, "prompt_logprobs")?
                .into_iter()
                .map(|v| (!v.is_nan()).then_some(v))
                .collect(),
        ),
        None => None,
    };
    let topk_prompt_logprobs = match &response.topk_prompt_logprobs {
        Some(topk) => Some(decode_topk(topk, "topk_prompt_logprobs")?),
        None => None,
    };
    let target_prompt_logprobs = response
        .target_prompt_logprobs
        .map(|t| decode_tensor(t, "target_prompt_logprobs"))
        .transpose()?;
    let prompt_alt_tokens = match response.prompt_alt_tokens {
        Some(alt) => {
            let tensor = |t: Option<proto::Tensor>, what: &str| {
                t.ok_or_else(|| ApiError::invalid(format!("prompt_alt_tokens: no {what}")))
                    .and_then(|t| decode_tensor(t, &format!("prompt_alt_tokens.{what}")))
            };
            Some(PromptAltTokens {
                tokens: tensor(alt.tokens, "tokens")?,
                logprobs: tensor(alt.logprobs, "logprobs")?,
            })
        }
        None => None,
    };
    Ok(SampleResponse {
        sequences,
        prompt_logprobs,
        topk_prompt_logprobs,
        target_prompt_logprobs,
        prompt_alt_tokens,
        prompt_cache_hit_tokens: usize::try_from(response.prompt_cache_hit_tokens).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Datum, ModelInput};

    #[test]
    fn a_forward_backward_request_round_trips() {
        let input = ForwardBackwardInput {
            data: vec![Datum {
                model_input: ModelInput::from_tokens(vec![1, 2, 3]),
                loss_fn_inputs: BTreeMap::from([
                    ("target_tokens".into(), TensorData::i64(vec![2, 3, 4])),
                    ("weights".into(), TensorData::f32(vec![0.0, 1.0, 0.5])),
                ]),
                loss_fn_input_spans: Some(vec![
                    ProvenanceSpan {
                        source: SpanSource::Prompt,
                        sequence: SequenceId::parse("s:sample:0#1/0").unwrap(),
                        offset: 1,
                        length: 1,
                    },
                    ProvenanceSpan {
                        source: SpanSource::Sampled,
                        sequence: SequenceId::parse("s:sample:0#1/0").unwrap(),
                        offset: 0,
                        length: 2,
                    },
                ]),
            }],
            loss_fn: "ppo".into(),
            loss_fn_config: BTreeMap::from([("clip_low_threshold".into(), 0.7)]),
            custom_loss: Some("s-1:loss:2".parse().unwrap()),
            temperature: 0.7,
        };
        let bytes = encode_forward_backward_request("s-1:train:0", 4, &input, true);
        let request = proto::ForwardBackwardRequest::decode(&*bytes).unwrap();
        assert_eq!((request.seq_id, request.forward_only), (4, true));
        let datum = &request.data[0];
        let Some(proto::chunk::Chunk::EncodedText(text)) = &datum.model_input[0].chunk else {
            panic!("not a text chunk");
        };
        assert_eq!(decode_tokens(&text.tokens, "t").unwrap(), vec![1, 2, 3]);
        for (name, tensor) in &input.data[0].loss_fn_inputs {
            let wire = datum.loss_fn_inputs[name].clone();
            assert_eq!(&decode_tensor(wire, name).unwrap(), tensor);
        }
        let spans = decode_spans(datum.loss_fn_input_spans.clone(), "spans").unwrap();
        assert_eq!(spans, input.data[0].loss_fn_input_spans);
        let mut config = input.loss_fn_config.clone();
        config.insert("temperature".into(), 0.7);
        assert_eq!(request.loss_fn_config, config);
        let loss_id = request.loss_fn_config_v2["loss_id"].value.clone();
        let text = proto::loss_config_value::Value::Text("s-1:loss:2".into());
        assert_eq!(loss_id, Some(text));
    }

    #[test]
    fn a_forward_backward_result_round_trips() {
        let output = ForwardBackwardOutput {
            loss_fn_output_type: "cross_entropy".into(),
            loss_fn_outputs: vec![
                BTreeMap::from([("logprobs".into(), TensorData::f32(vec![-1.0]))]),
                BTreeMap::from([("logprobs".into(), TensorData::f32(vec![-2.0, -3.0]))]),
            ],
            metrics: BTreeMap::from([("loss:sum".into(), 6.0)]),
        };
        let bytes = encode_forward_backward_output(&output);
        let record = &proto::ForwardBackwardOutput::decode(&*bytes)
            .unwrap()
            .loss_fn_outputs[0];
        let offsets: Vec<i64> = record.fields["logprobs"]
            .offsets
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(offsets, vec![0, 4, 12]);
        assert_eq!(decode_forward_backward_output(&bytes).unwrap(), output);
    }

    #[test]
    fn a_sample_result_round_trips_with_every_prompt_answer() {
        let response = SampleResponse {
            sequences: vec![SampledSequence {
                stop_reason: StopReason::Length,
                tokens: vec![5, 6],
                logprobs: vec![-0.5, -1.5],
                topk_logprobs: Some(vec![vec![(5, -0.5), (9, -1.0)], vec![(2, -0.2)]]),
            }],
            prompt_logprobs: Some(vec![None, Some(-2.0), Some(-0.25)]),
            topk_prompt_logprobs: Some(vec![
                None,
                Some(vec![(3, -0.1), (4, -2.0)]),
                Some(vec![(7, -0.3)]),
            ]),
            target_prompt_logprobs: Some(TensorData {
                values: TensorValues::Float32(vec![-2.0, 0.0, -0.25, -4.0]),
                shape: vec![2, 2],
            }),
            prompt_alt_tokens: Some(PromptAltTokens {
                tokens: TensorData {
                    values: TensorValues::Int64(vec![3, 8]),
                    shape: vec![2, 1],
                },
                logprobs: TensorData {
                    values: TensorValues::Float32(vec![-0.1, -3.0]),
                    shape: vec![2, 1],
                },
            }),
            prompt_cache_hit_tokens: 2,
        };
        let decoded = decode_sample_response(&encode_sample_response(&response)).unwrap();
        assert_eq!(decoded, response);
    }

    #[test]
    fn results_that_do_not_add_up_are_refused_by_name() {
        let mut output = proto::ForwardBackwardOutput::default();
        output.loss_fn_outputs.push(proto::ArrayRecord {
            type_tag: "TensorData".into(),
            fields: BTreeMap::from([(
                "logprobs".into(),
                proto::BatchedTensor {
                    data: vec![0; 8],
                    offsets: [0i64, 12].iter().flat_map(|o| o.to_le_bytes()).collect(),
                    dtype: proto::DType::Float32 as i32,
                    trailing_shape: Vec::new(),
                },
            )]),
            num_datums: 1,
        });
        let error = decode_forward_backward_output(&output.encode_to_vec()).unwrap_err();
        assert!(error.message.contains("\"logprobs\""), "{error}");
        let error = decode_sample_response(b"\xff\xff").unwrap_err();
        assert!(error.message.contains("malformed protobuf"), "{error}");
    }
}
