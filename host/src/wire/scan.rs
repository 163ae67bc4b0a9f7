//! A first pass over a protobuf body that reckons what decoding it would build, before anything
//! is built.
//!
//! Protobuf lets a sender repeat a message for two bytes (its tag and a zero length), and each
//! repeat decodes into a struct, a vector slot or a map node hundreds of bytes large: a 3 MiB
//! body of empty datums became 426 MiB. So the server walks the body's fields first (no
//! allocation, each byte read once), counts the messages and map entries that its [`Shape`]
//! says the decoder would make, and refuses the body when their reckoned size passes its
//! [`DecodeBudget`](crate::api::DecodeBudget). Fields that are not messages (numbers, strings,
//! bytes) decode to at most a few times their own bytes and are reckoned as such.

use crate::api::ApiError;

/// Bytes reckoned for one decoded message: its struct, its slot in a growing vector, and the
/// API value it becomes.
const MESSAGE_BYTES: usize = 128;
/// Bytes reckoned for one map entry: a map whose only entry it is allocates a whole node, both
/// in the decoded message and in the API value it becomes.
const MAP_ENTRY_BYTES: usize = 1024;
/// Bytes reckoned per byte of the body for what is not a message: a varint of one byte decodes
/// into eight.
const SCALAR_BYTES_PER_BYTE: usize = 8;

/// The fields of a message that hold messages, by field number; every other field is a scalar,
/// a string or bytes.
pub struct Shape {
    fields: &'static [(u32, Field)],
}

/// A field that decodes into a message.
#[derive(Clone, Copy)]
enum Field {
    Message(&'static Shape),
    /// An entry of a map field (itself a message: key 1, value 2).
    MapEntry(&'static Shape),
}

const LEAF: Shape = Shape { fields: &[] };
const TENSOR: Shape = Shape {
    fields: &[(2, Field::Message(&LEAF))],
};
const SPAN: Shape = Shape {
    fields: &[(1, Field::Message(&LEAF)), (2, Field::Message(&LEAF))],
};
const CHUNK: Shape = Shape {
    fields: &[(1, Field::Message(&LEAF))],
};
const TENSOR_ENTRY: Shape = Shape {
    fields: &[(2, Field::Message(&TENSOR))],
};
const DATUM: Shape = Shape {
    fields: &[
        (1, Field::Message(&CHUNK)),
        (2, Field::MapEntry(&TENSOR_ENTRY)),
        (3, Field::Message(&SPAN)),
        (4, Field::Message(&SPAN)),
    ],
};
const CONFIG_ENTRY: Shape = Shape {
    fields: &[(2, Field::Message(&LEAF))],
};

/// [`proto::ForwardBackwardRequest`](super::proto::ForwardBackwardRequest), field by field.
pub const FORWARD_BACKWARD_REQUEST: Shape = Shape {
    fields: &[
        (3, Field::Message(&DATUM)),
        (5, Field::MapEntry(&LEAF)),
        (7, Field::MapEntry(&CONFIG_ENTRY)),
    ],
};

/// What makes a body not well-formed protobuf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
enum Malformed {
    #[error("a field number out of range")]
    FieldNumber,
    #[error("a truncated fixed64")]
    TruncatedFixed64,
    #[error("a truncated fixed32")]
    TruncatedFixed32,
    #[error("a length too large")]
    Length,
    #[error("a truncated length-delimited field")]
    TruncatedField,
    #[error("a group or an unknown wire type")]
    WireType,
    #[error("a truncated or overlong varint")]
    Varint,
}

/// The bytes that decoding `body` as a message of `shape` would build, reckoned; a body that
/// is not well-formed protobuf is refused here, as the decoder would.
pub fn decoded_size(body: &[u8], shape: &Shape) -> Result<usize, ApiError> {
    let messages = walk(body, shape).map_err(|problem| {
        ApiError::invalid(format!("forward_backward: malformed protobuf: {problem}"))
    })?;
    Ok(body
        .len()
        .saturating_mul(SCALAR_BYTES_PER_BYTE)
        .saturating_add(messages))
}

/// The reckoned bytes of the messages inside `bytes`, a message of `shape`.
fn walk(mut bytes: &[u8], shape: &Shape) -> Result<usize, Malformed> {
    let mut reckoned = 0usize;
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let number = u32::try_from(key >> 3).map_err(|_| Malformed::FieldNumber)?;
        match key & 7 {
            0 => {
                varint(&mut bytes)?;
            }
            1 => bytes = bytes.get(8..).ok_or(Malformed::TruncatedFixed64)?,
            5 => bytes = bytes.get(4..).ok_or(Malformed::TruncatedFixed32)?,
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).map_err(|_| Malformed::Length)?;
                let inner = bytes.get(..len).ok_or(Malformed::TruncatedField)?;
                bytes = &bytes[len..];
                let field = shape.fields.iter().find(|(n, _)| *n == number);
                let cost = match field.map(|(_, field)| *field) {
                    Some(Field::Message(inner_shape)) => {
                        MESSAGE_BYTES.saturating_add(walk(inner, inner_shape)?)
                    }
                    Some(Field::MapEntry(inner_shape)) => {
                        MAP_ENTRY_BYTES.saturating_add(walk(inner, inner_shape)?)
                    }
                    None => 0,
                };
                reckoned = reckoned.saturating_add(cost);
            }
            _ => return Err(Malformed::WireType),
        }
    }
    Ok(reckoned)
}

/// One base-128 varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Result<u64, Malformed> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Ok(value);
        }
    }
    Err(Malformed::Varint)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prost::Message;

    use super::*;
    use crate::wire::proto;

    fn request(data: Vec<proto::Datum>) -> Vec<u8> {
        proto::ForwardBackwardRequest {
            model_id: "s-1:train:0".into(),
            seq_id: 1,
            data,
            loss_fn: "cross_entropy".into(),
            loss_fn_config: BTreeMap::from([("clip".into(), 0.2)]),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn datum(tokens: usize) -> proto::Datum {
        let tensor = proto::Tensor {
            encoding: Some(proto::tensor::Encoding::Dense(vec![0; tokens * 8])),
            dtype: proto::DType::Int64 as i32,
            shape: vec![tokens as i64],
        };
        proto::Datum {
            model_input: vec![proto::Chunk {
                chunk: Some(proto::chunk::Chunk::EncodedText(proto::EncodedTextChunk {
                    tokens: vec![1; tokens * 4],
                })),
            }],
            loss_fn_inputs: BTreeMap::from([("target_tokens".into(), tensor)]),
            ..Default::default()
        }
    }

    #[test]
    fn every_message_and_map_entry_is_counted() {
        let body = request(vec![datum(2), datum(2)]);
        // Per datum: itself, its chunk, the chunk's text, its input's entry and tensor; and the
        // request's one config entry.
        let messages = 2 * (4 * MESSAGE_BYTES + MAP_ENTRY_BYTES) + MAP_ENTRY_BYTES;
        assert_eq!(
            decoded_size(&body, &FORWARD_BACKWARD_REQUEST).unwrap(),
            body.len() * SCALAR_BYTES_PER_BYTE + messages
        );
    }

    #[test]
    fn empty_datums_are_reckoned_far_above_their_bytes_and_real_ones_near_them() {
        let empty = request(vec![proto::Datum::default(); 100_000]);
        let size = decoded_size(&empty, &FORWARD_BACKWARD_REQUEST).unwrap();
        assert!(size > 50 * empty.len(), "{size} for {} bytes", empty.len());
        let real = request(vec![datum(512); 8]);
        let size = decoded_size(&real, &FORWARD_BACKWARD_REQUEST).unwrap();
        assert!(size < 9 * real.len(), "{size} for {} bytes", real.len());
    }

    #[test]
    fn malformed_bodies_are_refused_as_the_decoder_would() {
        for body in [&b"\xff\xff\xff"[..], b"\x1a\x05ab", b"\x0b", b"\x09\x01"] {
            let error = decoded_size(body, &FORWARD_BACKWARD_REQUEST).unwrap_err();
            assert!(error.message.contains("malformed protobuf"), "{error}");
        }
    }
}
