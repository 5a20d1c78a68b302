//! Generates the ONNX protobuf types from the vendored `onnx-ml.proto`.
//!
//! `protox` compiles the schema in pure Rust, so no `protoc` install is needed.
//! The schema is proto2, so every scalar field is an `Option` and presence
//! survives a round trip. `bytes(["."])` makes every `bytes` field a
//! `bytes::Bytes`: decoding from a memory-mapped buffer then leaves
//! `raw_data` pointing into the file (zero copy).

fn main() {
    println!("cargo:rerun-if-changed=onnx-ml.proto");
    let fds = protox::compile(["onnx-ml.proto"], ["."]).expect("onnx-ml.proto compiles");
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(fds)
        .expect("prost-build generates the ONNX types");
}
