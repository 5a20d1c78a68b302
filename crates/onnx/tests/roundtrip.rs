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
    graphopt_text::print_model(
        m,
        &graphopt_text::PrintOptions {
            elide_above: Some(0),
        },
    )
}

#[test]
fn real_models_round_trip_losslessly() {
    let models = models();
    assert!(
        models.len() >= 5,
        "testdata/models is missing (run testdata/models/make_models.py)"
    );
    for path in models {
        let name = path.display().to_string();
        let a = graphopt_onnx::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let bytes = graphopt_onnx::encode(&a.model).unwrap();
        let b = graphopt_onnx::decode(Bytes::from(bytes.clone()), None)
            .unwrap_or_else(|e| panic!("{name}: re-import: {e}"));
        assert_eq!(
            fingerprint(&a.model),
            fingerprint(&b.model),
            "{name}: IR changed through export"
        );
        assert_eq!(a.model.metadata_props, b.model.metadata_props, "{name}");
        assert_eq!(a.model.functions.len(), b.model.functions.len(), "{name}");
        // Export is a fixed point after one round trip.
        assert_eq!(
            graphopt_onnx::encode(&b.model).unwrap(),
            bytes,
            "{name}: export is not stable"
        );
        // Every ModelProto field the original set is still set.
        let orig = graphopt_proto::ModelProto::decode(&std::fs::read(&path).unwrap()[..]).unwrap();
        let back = graphopt_proto::ModelProto::decode(&bytes[..]).unwrap();
        let opsets = |m: &graphopt_proto::ModelProto| -> Vec<(String, i64)> {
            m.opset_import
                .iter()
                .map(|o| (o.domain.clone().unwrap_or_default(), o.version.unwrap_or(0)))
                .collect()
        };
        assert_eq!(opsets(&orig), opsets(&back), "{name}");
        assert_eq!(orig.producer_name, back.producer_name, "{name}");
        assert_eq!(orig.ir_version, back.ir_version, "{name}");
        let (og, bg) = (orig.graph.unwrap(), back.graph.unwrap());
        assert_eq!(og.node.len(), bg.node.len(), "{name}");
        assert_eq!(og.input, bg.input, "{name}: inputs");
        assert_eq!(og.output, bg.output, "{name}: outputs");
        assert_eq!(
            og.value_info.len(),
            bg.value_info.len(),
            "{name}: value_info"
        );
        assert_eq!(
            og.initializer.len(),
            bg.initializer.len(),
            "{name}: initializers"
        );
        for (x, y) in og.node.iter().zip(&bg.node) {
            assert_eq!(
                (&x.op_type, &x.input, &x.output, x.attribute.len()),
                (&y.op_type, &y.input, &y.output, y.attribute.len()),
                "{name}"
            );
        }
    }
}

#[test]
fn external_data_is_zero_copy_and_round_trips() {
    let Some(path) = models()
        .into_iter()
        .find(|p| p.with_extension("onnx.data").exists())
    else {
        panic!("no model with external data in testdata/models");
    };
    let a = graphopt_onnx::load(&path).unwrap();
    assert!(a.info.used_external_data);
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m.onnx");
    let opts = graphopt_onnx::SaveOptions {
        external: graphopt_onnx::ExternalData::Auto {
            input_used_external: true,
        },
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
        .filter(|p| {
            std::fs::metadata(p)
                .map(|m| m.len() < 100_000)
                .unwrap_or(false)
        })
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

fn kv(k: &str, v: &str) -> graphopt_proto::StringStringEntryProto {
    graphopt_proto::StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v.into()),
    }
}

/// A model that sets every ModelProto field graphopt must keep.
fn rich_model() -> graphopt_proto::ModelProto {
    use graphopt_proto as pb;
    let tensor = |name: &str, dt: i32, dims: Vec<i64>, raw: Vec<u8>| pb::TensorProto {
        name: Some(name.into()),
        data_type: Some(dt),
        dims,
        raw_data: Some(raw.into()),
        ..Default::default()
    };
    let tt = |elem: i32, dims: &[&str]| pb::TypeProto {
        value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
            elem_type: Some(elem),
            shape: Some(pb::TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|d| pb::tensor_shape_proto::Dimension {
                        value: Some(match d.parse::<i64>() {
                            Ok(v) => pb::tensor_shape_proto::dimension::Value::DimValue(v),
                            Err(_) => {
                                pb::tensor_shape_proto::dimension::Value::DimParam(d.to_string())
                            }
                        }),
                        denotation: if *d == "N" {
                            Some("DATA_BATCH".into())
                        } else {
                            None
                        },
                    })
                    .collect(),
            }),
        })),
        denotation: Some("TENSOR".into()),
    };
    let vi = |name: &str, t: pb::TypeProto| pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(t),
        doc_string: Some(format!("doc of {name}")),
        metadata_props: vec![kv("k", name)],
    };
    let node = |name: &str, op: &str, domain: &str, i: &[&str], o: &[&str]| pb::NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        // Empty strings are written as absent, as onnx.helper does.
        domain: if domain.is_empty() {
            None
        } else {
            Some(domain.into())
        },
        input: i.iter().map(|s| s.to_string()).collect(),
        output: o.iter().map(|s| s.to_string()).collect(),
        doc_string: Some("node doc".into()),
        metadata_props: vec![kv("origin", name)],
        ..Default::default()
    };
    let mut custom = node("custom", "MyOp", "com.example", &["x", "w"], &["c", ""]);
    custom.attribute = vec![
        pb::AttributeProto {
            name: Some("alpha".into()),
            r#type: Some(1),
            f: Some(0.5),
            doc_string: Some("attr doc".into()),
            ..Default::default()
        },
        pb::AttributeProto {
            name: Some("names".into()),
            r#type: Some(8),
            strings: vec![b"a".to_vec().into(), vec![0xff, 0x00].into()],
            ..Default::default()
        },
        pb::AttributeProto {
            name: Some("empty".into()),
            r#type: Some(7),
            ..Default::default()
        },
    ];
    custom.device_configurations = vec![pb::NodeDeviceConfigurationProto {
        configuration_id: Some("cfg".into()),
        pipeline_stage: Some(1),
        ..Default::default()
    }];
    let fbody = vec![node("fn_relu", "Relu", "", &["a"], &["b"])];
    pb::ModelProto {
        ir_version: Some(10),
        opset_import: vec![
            pb::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(18),
            },
            pb::OperatorSetIdProto {
                domain: Some("com.example".into()),
                version: Some(1),
            },
            pb::OperatorSetIdProto {
                domain: Some("local".into()),
                version: Some(1),
            },
        ],
        producer_name: Some("test".into()),
        producer_version: Some("1".into()),
        domain: Some("ai.test".into()),
        model_version: Some(3),
        doc_string: Some("model doc".into()),
        metadata_props: vec![kv("author", "me"), kv("license", "none")],
        graph: Some(pb::GraphProto {
            name: Some("main".into()),
            doc_string: Some("graph doc".into()),
            input: vec![vi("x", tt(1, &["N", "4"]))],
            output: vec![vi("y", tt(1, &["N", "4"]))],
            value_info: vec![vi("c", tt(1, &["N", "4"]))],
            initializer: vec![
                tensor(
                    "w",
                    1,
                    vec![4],
                    vec![0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64],
                ),
                tensor("h", 10, vec![2], vec![0, 60, 0, 0xbc]),
                tensor("b16", 16, vec![1], vec![0x80, 0x3f]),
                tensor("i4", 22, vec![3], vec![0x21, 0x03]),
                tensor("f8", 17, vec![2], vec![0x38, 0x40]),
                tensor("c64", 14, vec![1], vec![0, 0, 128, 63, 0, 0, 0, 64]),
                pb::TensorProto {
                    name: Some("s".into()),
                    data_type: Some(8),
                    dims: vec![2],
                    string_data: vec![b"hi".to_vec().into(), b"there".to_vec().into()],
                    ..Default::default()
                },
            ],
            sparse_initializer: vec![pb::SparseTensorProto {
                values: Some(tensor("sp", 1, vec![1], vec![0, 0, 128, 63])),
                indices: Some(pb::TensorProto {
                    name: None,
                    ..tensor("", 7, vec![1], vec![2, 0, 0, 0, 0, 0, 0, 0])
                }),
                dims: vec![4],
            }],
            node: vec![custom, node("call", "MyFn", "local", &["c"], &["y"])],
            quantization_annotation: vec![pb::TensorAnnotation {
                tensor_name: Some("c".into()),
                quant_parameter_tensor_names: vec![kv("SCALE_TENSOR", "w")],
            }],
            metadata_props: vec![kv("graph", "meta")],
        }),
        functions: vec![pb::FunctionProto {
            name: Some("MyFn".into()),
            domain: Some("local".into()),
            input: vec!["a".into()],
            output: vec!["b".into()],
            node: fbody,
            opset_import: vec![pb::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(18),
            }],
            doc_string: Some("fn doc".into()),
            attribute: vec!["unused_attr".into()],
            ..Default::default()
        }],
        training_info: vec![pb::TrainingInfoProto {
            initialization: Some(pb::GraphProto {
                name: Some("init".into()),
                ..Default::default()
            }),
            update_binding: vec![kv("w", "w_new")],
            ..Default::default()
        }],
        configuration: vec![pb::DeviceConfigurationProto {
            name: Some("cfg".into()),
            num_devices: Some(2),
            device: vec!["gpu0".into(), "gpu1".into()],
        }],
    }
}

#[test]
fn every_model_proto_field_survives() {
    let orig = rich_model();
    let bytes = orig.encode_to_vec();
    let l =
        graphopt_onnx::decode(Bytes::from(bytes.clone()), None).unwrap_or_else(|e| panic!("{e}"));
    let back =
        graphopt_proto::ModelProto::decode(&graphopt_onnx::encode(&l.model).unwrap()[..]).unwrap();
    assert_eq!(back, orig);
}

/// Typed data fields become ONNX's packed raw layout.
#[test]
fn typed_fields_become_raw_data() {
    use graphopt_proto as pb;
    let cases: Vec<(pb::TensorProto, Vec<u8>)> = vec![
        (
            pb::TensorProto {
                data_type: Some(1),
                dims: vec![2],
                float_data: vec![1.0, -2.0],
                ..Default::default()
            },
            [1.0f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat(),
        ),
        (
            pb::TensorProto {
                data_type: Some(10),
                dims: vec![2],
                int32_data: vec![0x3c00, 0xbc00],
                ..Default::default()
            },
            vec![0x00, 0x3c, 0x00, 0xbc],
        ),
        (
            pb::TensorProto {
                data_type: Some(22),
                dims: vec![3],
                int32_data: vec![0x21, 0x03],
                ..Default::default()
            },
            vec![0x21, 0x03],
        ),
        (
            pb::TensorProto {
                data_type: Some(12),
                dims: vec![1],
                uint64_data: vec![7],
                ..Default::default()
            },
            vec![7, 0, 0, 0],
        ),
        (
            pb::TensorProto {
                data_type: Some(9),
                dims: vec![2],
                int32_data: vec![1, 0],
                ..Default::default()
            },
            vec![1, 0],
        ),
        (
            pb::TensorProto {
                data_type: Some(15),
                dims: vec![1],
                double_data: vec![1.0, 2.0],
                ..Default::default()
            },
            [1.0f64.to_le_bytes(), 2.0f64.to_le_bytes()].concat(),
        ),
    ];
    for (mut t, want) in cases {
        t.name = Some("w".into());
        let m = pb::ModelProto {
            ir_version: Some(8),
            graph: Some(pb::GraphProto {
                initializer: vec![t.clone()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let l = graphopt_onnx::decode(Bytes::from(m.encode_to_vec()), None).unwrap();
        let g = &l.model.graph;
        let raw = g
            .initializer(g.initializers()[0])
            .unwrap()
            .raw()
            .unwrap()
            .to_vec();
        assert_eq!(raw, want, "{t:?}");
    }
    // A count that does not match the dims is an error naming the tensor.
    let bad = pb::TensorProto {
        name: Some("w".into()),
        data_type: Some(1),
        dims: vec![3],
        float_data: vec![1.0],
        ..Default::default()
    };
    let m = pb::ModelProto {
        graph: Some(pb::GraphProto {
            initializer: vec![bad],
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = graphopt_onnx::decode(Bytes::from(m.encode_to_vec()), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("initializer 'w'") && e.contains("expected 3"),
        "{e}"
    );
}

/// A value_info entry or a pass-through output never changes a graph
/// input's declared type.
#[test]
fn input_declarations_win_over_value_info() {
    use graphopt_proto as pb;
    let vi = |name: &str, dim: pb::tensor_shape_proto::dimension::Value| pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(pb::TensorShapeProto {
                    dim: vec![pb::tensor_shape_proto::Dimension {
                        value: Some(dim),
                        denotation: None,
                    }],
                }),
            })),
            denotation: None,
        }),
        ..Default::default()
    };
    use pb::tensor_shape_proto::dimension::Value::{DimParam, DimValue};
    let m = pb::ModelProto {
        ir_version: Some(8),
        graph: Some(pb::GraphProto {
            input: vec![vi("x", DimParam("N".into()))],
            output: vec![vi("x", DimValue(3))],
            value_info: vec![vi("x", DimValue(3))],
            ..Default::default()
        }),
        ..Default::default()
    };
    let l = graphopt_onnx::decode(Bytes::from(m.encode_to_vec()), None).unwrap();
    let back =
        graphopt_proto::ModelProto::decode(&graphopt_onnx::encode(&l.model).unwrap()[..]).unwrap();
    assert_eq!(back.graph.unwrap().input[0], vi("x", DimParam("N".into())));
}

/// IR versions below 4 require every main-graph initializer to be a graph
/// input too. Initializers that a pass adds (a folded constant, an fp16
/// copy) get an input declaration on export; those that already were
/// inputs are not declared twice; IR 4 and later are left as they are.
#[test]
fn ir3_initializers_are_exported_as_inputs() {
    let src = r#"
<ir_version: 3, opset_import: ["" : 8]>
g (float[2] x, float[2] a) => (float[2] y) <float[2] a = {1.0, 2.0}> {
  y = Add (x, a)
}
"#;
    for (ir, expect_declared) in [(3, true), (8, false)] {
        let mut m = graphopt_text::parse_model(src).unwrap();
        m.ir_version = ir;
        let t = graphopt_ir::Tensor::from_raw(
            graphopt_ir::DType::F32,
            vec![2],
            Bytes::from(vec![0u8; 8]),
        )
        .unwrap();
        let y = m.graph.outputs[0];
        let (add, _) = m.graph.producer(y).unwrap();
        let b = m.graph.add_initializer("b", t);
        m.graph.set_input(add, 0, Some(b));
        let bytes = graphopt_onnx::encode(&m).unwrap();
        let p = graphopt_proto::ModelProto::decode(Bytes::from(bytes)).unwrap();
        let g = p.graph.unwrap();
        let inputs: Vec<String> = g.input.iter().map(|i| i.name.clone().unwrap()).collect();
        let mut want = vec!["x".to_string(), "a".to_string()];
        if expect_declared {
            want.push("b".to_string());
        }
        assert_eq!(inputs, want, "ir_version {ir}");
        if expect_declared {
            let ty = g.input[2].r#type.as_ref().unwrap();
            assert!(format!("{ty:?}").contains("DimValue(2)"), "{ty:?}");
        }
    }
}
