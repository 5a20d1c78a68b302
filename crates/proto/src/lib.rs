//! The ONNX protobuf schema (`onnx-ml.proto`, vendored from the `onnx`
//! package, Apache-2.0) as prost types.
//!
//! Only the ONNX import/export crate uses these; the IR knows nothing of them.

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/onnx.rs"));

pub use prost::Message;
