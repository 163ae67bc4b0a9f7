//! The Tinker wire's protobuf messages and binary encodings, shared by the server that speaks it
//! (`server`) and the client that speaks it to a remote server (`client::remote`). Only the op
//! API's types cross: this module knows nothing of the engine.

pub mod codec;
pub mod proto;
pub mod scan;
