//! Fuzzes the ONNX text parser: any text gives an error or a model, never a
//! panic; a parsed model prints and parses back to the same text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let Ok(m) = graphopt_text::parse_model(src) else { return };
    let opts = graphopt_text::PrintOptions::full();
    let a = graphopt_text::print_model(&m, &opts);
    if let Ok(m2) = graphopt_text::parse_model(&a) {
        assert_eq!(a, graphopt_text::print_model(&m2, &opts));
    }
});
