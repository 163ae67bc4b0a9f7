//! The Tinker wire's protobuf messages and binary encodings, shared by the server that speaks it
//! (`server`) and the client that speaks it to a remote server (`client::remote`). Only the op
//! API's types cross: this module knows nothing of the engine.
//!
//! [`proto`] holds the messages of the SDK's binary routes (`forward_backward`, `sample`) as
//! prost structs. The codec turns them into the op API's values and back: a request's datums
//! into [`crate::api::Datum`]s ([`decode_tokens`], [`decode_tensor`], [`decode_spans`]), the
//! engine's answers into the SDK's messages ([`encode_forward_backward_output`],
//! [`encode_sample_response`]), and the reverse of each for the remote client. Before any
//! message is built, [`decoded_size`] walks a body and reckons what decoding it would allocate
//! (a body of empty repeated messages can ask for a hundred times its size), so the server can
//! refuse it against the request's budget.

mod codec;
pub mod proto;
mod scan;

pub use codec::{
    TEMPERATURE_KEY, decode_forward_backward_output, decode_sample_response, decode_spans,
    decode_tensor, decode_tokens, encode_forward_backward_output, encode_forward_backward_request,
    encode_sample_response, encode_spans, encode_tensor,
};
pub use scan::{FORWARD_BACKWARD_REQUEST, Shape, decoded_size};
