//! Lossless import/export on the real models in `testdata/models/`, and no
//! panic on damaged files.

use bytes::Bytes;
use graphopt_proto::Message;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn models() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "onnx"));
    v.sort();
    v
}

/// The IR printed with every tensor's content hashed in: equal text means
/// equal graphs, types and data.
fn fingerprint(m: &graphopt_ir::Model) -> String {
    graphopt_text::print_model(m, &graphopt_text::PrintOptions { elide_above: Some(0) })
}

#[test]
fn real_models_round_trip_losslessly() {
    let models = models();
    assert!(models.len() >= 5, "testdata/models is missing (run testdata/models/make_models.py)");
    for path in models {
        let name = path.display().to_string();
        let a = graphopt_onnx::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let bytes = graphopt_onnx::encode(&a.model).unwrap();
        let b = graphopt_onnx::decode(Bytes::from(bytes.clone()), None).unwrap_or_else(|e| panic!("{name}: re-import: {e}"));
        assert_eq!(fingerprint(&a.model), fingerprint(&b.model), "{name}: IR changed through export");
        assert_eq!(a.model.metadata_props, b.model.metadata_props, "{name}");
        assert_eq!(a.model.functions.len(), b.model.functions.len(), "{name}");
        // Export is a fixed point after one round trip.
        assert_eq!(graphopt_onnx::encode(&b.model).unwrap(), bytes, "{name}: export is not stable");
        // Every ModelProto field the original set is still set.
        let orig = graphopt_proto::ModelProto::decode(&std::fs::read(&path).unwrap()[..]).unwrap();
        let back = graphopt_proto::ModelProto::decode(&bytes[..]).unwrap();
        let opsets = |m: &graphopt_proto::ModelProto| -> Vec<(String, i64)> {
            m.opset_import.iter().map(|o| (o.domain.clone().unwrap_or_default(), o.version.unwrap_or(0))).collect()
        };
        assert_eq!(opsets(&orig), opsets(&back), "{name}");
        assert_eq!(orig.producer_name, back.producer_name, "{name}");
        assert_eq!(orig.ir_version, back.ir_version, "{name}");
        let (og, bg) = (orig.graph.unwrap(), back.graph.unwrap());
        assert_eq!(og.node.len(), bg.node.len(), "{name}");
        assert_eq!(og.input, bg.input, "{name}: inputs");
        assert_eq!(og.output, bg.output, "{name}: outputs");
        assert_eq!(og.value_info.len(), bg.value_info.len(), "{name}: value_info");
        assert_eq!(og.initializer.len(), bg.initializer.len(), "{name}: initializers");
        for (x, y) in og.node.iter().zip(&bg.node) {
            assert_eq!((&x.op_type, &x.input, &x.output, x.attribute.len()), (&y.op_type, &y.input, &y.output, y.attribute.len()), "{name}");
        }
    }
}

#[test]
fn external_data_is_zero_copy_and_round_trips() {
    let Some(path) = models().into_iter().find(|p| p.with_extension("onnx.data").exists()) else {
        panic!("no model with external data in testdata/models");
    };
    let a = graphopt_onnx::load(&path).unwrap();
    assert!(a.info.used_external_data);
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m.onnx");
    let opts = graphopt_onnx::SaveOptions {
        external: graphopt_onnx::ExternalData::Auto { input_used_external: true },
        location: None,
    };
    let r = graphopt_onnx::save(&a.model, &out, &opts).unwrap();
    assert!(r.external_bytes > 0);
    let b = graphopt_onnx::load(&out).unwrap();
    assert_eq!(fingerprint(&a.model), fingerprint(&b.model));
}

fn sample_bytes() -> Vec<u8> {
    let p = models()
        .into_iter()
        .filter(|p| std::fs::metadata(p).map(|m| m.len() < 100_000).unwrap_or(false))
        .min_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("a small model");
    std::fs::read(p).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Damaged files give an error or a model, never a panic.
    #[test]
    fn damaged_files_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
        let mut b = sample_bytes();
        for (i, x) in flips {
            let n = b.len();
            b[i % n] ^= x;
        }
        let n = b.len();
        b.truncate(cut % (n + 1));
        if let Ok(l) = graphopt_onnx::decode(Bytes::from(b), None) {
            let _ = graphopt_onnx::encode(&l.model);
        }
    }
}
