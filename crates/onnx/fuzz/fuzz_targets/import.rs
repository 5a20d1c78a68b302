//! Fuzzes the ONNX importer: any bytes give an error or a model that
//! verifies, exports, re-imports and prints, never a panic.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run import --fuzz-dir crates/onnx/fuzz`
//! (seed corpus: the models in testdata/models).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(loaded) = graphopt_onnx::decode(bytes::Bytes::copy_from_slice(data), None) else {
        return;
    };
    graphopt_ir::verify::verify_model(&loaded.model).expect("imported models verify");
    let mut m = loaded.model;
    let _ = graphopt_ir::infer::infer_model(&mut m, &Default::default());
    let _ = graphopt_text::print_model(&m, &graphopt_text::PrintOptions::default());
    if let Ok(bytes) = graphopt_onnx::encode(&m) {
        graphopt_onnx::decode(bytes::Bytes::from(bytes), None).expect("exported models re-import");
    }
});
