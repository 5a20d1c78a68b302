//! Unit tests: snapshots of representative graphs, bit-exact data, types,
//! name resolution, and error messages.

use crate::*;
use bytes::Bytes;
use graphopt_ir::*;

fn full(g: &Graph) -> String {
    print_graph(g, &PrintOptions::full())
}

/// print → parse → print gives the same text; returns the parsed graph.
fn stable(g: &Graph) -> Graph {
    let s = full(g);
    let back = parse_graph(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    assert_eq!(full(&back), s);
    back
}

fn mlp() -> Model {
    let mut g = Graph::new("mlp");
    let n = || Dim::Sym("N".into());
    let x = g
        .add_value(
            "X",
            Some(Type::tensor(
                DType::F32,
                Some(Shape::new(vec![n(), Dim::Known(4)])),
            )),
        )
        .unwrap();
    g.inputs.push(x);
    let w = g.add_initializer("W", Tensor::from_f32(vec![4, 2], &[0.5; 8]).unwrap());
    let b = g.add_initializer("B", Tensor::from_f32(vec![2], &[1.0, -2.5]).unwrap());
    let t = g.add_value("T", None).unwrap();
    let y = g
        .add_value(
            "Y",
            Some(Type::tensor(
                DType::F32,
                Some(Shape::new(vec![n(), Dim::Known(2)])),
            )),
        )
        .unwrap();
    g.add_node(
        NewNode::new("MatMul")
            .name("mm")
            .inputs(&[x, w])
            .outputs(&[t]),
    )
    .unwrap();
    g.add_node(
        NewNode::new("FusedAdd")
            .domain("com.microsoft")
            .inputs(&[t, b])
            .outputs(&[y])
            .attr(Attribute::new("alpha", AttrValue::Float(1.0)))
            .attr(Attribute::new("axes", AttrValue::Ints(vec![0, -1])))
            .attr(Attribute::new("mode", AttrValue::String(b"fast".to_vec()))),
    )
    .unwrap();
    g.outputs.push(y);
    g.value_info.push(t);
    g.value_mut(t).ty = Some(Type::tensor(DType::F32, None));
    let mut m = Model::new(g, 17);
    m.opset_imports.push(OpsetImport {
        domain: "com.microsoft".into(),
        version: 1,
    });
    m.producer_name = "graphopt".into();
    m
}

#[test]
fn snapshot_mlp_elided() {
    let s = print_model(
        &mlp(),
        &PrintOptions {
            elide_above: Some(4),
        },
    );
    insta::assert_snapshot!(s, @r#"
    <
       ir_version: 8,
       opset_import: ["" : 17, "com.microsoft" : 1],
       producer_name: "graphopt"
    >
    mlp (float[N,4] X) => (float[N,2] Y)
       <float[4,2] W = ["elided": "8 elements, fnv1a64 bac9a6c893d99c65"],
        float[2] B = {1.0, -2.5},
        float[] T>
    {
       [mm] T = MatMul (X, W)
       Y = com.microsoft.FusedAdd <alpha = 1.0, axes = [0, -1], mode = "fast"> (T, B)
    }
    "#);
    // The elided text still parses; the elided data reads back as zeros.
    let m = parse_model(&s).unwrap();
    let w = m.graph.value_by_name("W").unwrap();
    assert_eq!(
        m.graph.initializer(w).unwrap().raw().unwrap().as_ref(),
        &[0u8; 32]
    );
}

#[test]
fn model_round_trips_exactly() {
    let m = mlp();
    let s = print_model(&m, &PrintOptions::full());
    let back = parse_model(&s).unwrap();
    assert_eq!(print_model(&back, &PrintOptions::full()), s);
    verify::verify_model(&back).unwrap();
    let w = back.graph.value_by_name("W").unwrap();
    assert_eq!(
        back.graph.initializer(w).unwrap().to_f64_vec().unwrap(),
        vec![0.5; 8]
    );
    assert_eq!(back.producer_name, "graphopt");
    assert_eq!(back.opset("com.microsoft"), Some(1));
}

/// `cond ? (x + outer) : outer`, a Loop-free If whose branches capture
/// values of the main graph, one of them defined by a later node in text.
fn if_model() -> Model {
    let src = r#"
<ir_version: 9, opset_import: ["" : 19, "local" : 1]>
main (bool c, float[2] x) => (float[2] y) {
    y = If (c) <then_branch = then_g () => (float[2] a) {
        a = Add (x, late)
    }, else_branch = else_g () => (late) {
    }>
    late = local.Twice <k = 2> (x)
}
<domain: "local", opset_import: ["" : 19]>
Twice <k, scale: float = 2.0> (v) => (w) {
    s = Constant <value_float: float = @scale> ()
    w = Mul (v, s)
}
"#;
    parse_model(src).unwrap()
}

#[test]
fn snapshot_subgraphs_and_functions() {
    let m = if_model();
    let s = print_model(&m, &PrintOptions::default());
    insta::assert_snapshot!(s, @r#"
    <
       ir_version: 9,
       opset_import: ["" : 19, "local" : 1]
    >
    main (bool c, float[2] x) => (float[2] y) {
       y = If (c) <then_branch = then_g () => (float[2] a) {
          a = Add (x, late)
       }, else_branch = else_g () => (late) {
       }>
       late = local.Twice <k = 2> (x)
    }

    <
       domain: "local",
       opset_import: ["" : 19]
    >
    Twice <k, scale = 2.0> (v) => (w) {
       s = Constant <value_float: float = @scale> ()
       w = Mul (v, s)
    }
    "#);
    let back = parse_model(&s).unwrap();
    assert_eq!(print_model(&back, &PrintOptions::default()), s);
}

#[test]
fn captures_resolve_to_outer_values() {
    let m = if_model();
    let g = &m.graph;
    let nodes: Vec<_> = g.nodes().collect();
    // Text order is kept even though `If` reads a value defined after it.
    assert_eq!(g.node(nodes[0]).op_type, "If");
    let caps: Vec<&str> = g
        .node(nodes[0])
        .captures()
        .iter()
        .map(|&v| g.name(v))
        .collect();
    assert_eq!(caps, ["x", "late"]);
    let then_g = g
        .node(nodes[0])
        .attr("then_branch")
        .unwrap()
        .graphs()
        .next()
        .unwrap();
    let x = then_g.value_by_name("x").unwrap();
    assert!(then_g.is_outer(x));
    let mut g2 = g.clone();
    g2.topo_sort().unwrap();
    verify::verify_graph(&g2, &[]).unwrap();
    let f = &m.functions[0];
    assert_eq!(f.attributes, ["k"]);
    assert_eq!(f.attribute_defaults[0].value, AttrValue::Float(2.0));
    let s = f.body.nodes().next().unwrap();
    assert_eq!(
        f.body.node(s).attributes[0].value,
        AttrValue::Ref {
            attr: "scale".into(),
            kind: AttrKind::Float
        }
    );
}

/// A tensor of each dtype with awkward values round-trips bit-exactly.
#[test]
fn every_dtype_round_trips_bit_exactly() {
    let mut g = Graph::new("dtypes");
    for (i, d) in DType::all().enumerate() {
        if d == DType::Undefined {
            continue;
        }
        let t = if d == DType::String {
            let s = vec![
                Bytes::from_static(b"a\"b\\c"),
                Bytes::from_static(b""),
                Bytes::from_static(&[0xff, b'x']),
            ];
            Tensor::from_strings(vec![3], s).unwrap()
        } else {
            let n = d.storage_bytes(3).unwrap() as usize;
            // Bit patterns 0x80.., 0x7f..: negative zero, NaN, max values.
            let mut raw: Vec<u8> = (0..n)
                .map(|j| [0x80u8, 0x7f, 0xff, 0x00, 0x3c][j % 5])
                .collect();
            // Padding bits of packed sub-byte types are not data.
            let used = 3 * d.bits().unwrap() % 8;
            if used != 0 {
                raw[n - 1] &= (1u8 << used) - 1;
            }
            Tensor::from_raw(d, vec![3], Bytes::from(raw)).unwrap()
        };
        let v = g.add_initializer(&format!("t{i}"), t);
        g.outputs.push(v);
    }
    let back = stable(&g);
    for &v in g.initializers() {
        let w = back.value_by_name(g.name(v)).unwrap();
        let (a, b) = (g.initializer(v).unwrap(), back.initializer(w).unwrap());
        let canon = |t: &Tensor| match (t.dtype, t.raw()) {
            // NaN payloads are not expressible; compare with NaNs canonical.
            (DType::F32, Some(r)) => r
                .chunks(4)
                .flat_map(|c| {
                    let f = f32::from_le_bytes(c.try_into().unwrap());
                    let f = if f.is_nan() { f32::NAN.copysign(f) } else { f };
                    f.to_le_bytes()
                })
                .collect::<Vec<u8>>(),
            (DType::F64 | DType::Complex64 | DType::Complex128, _) => Vec::new(),
            (_, Some(r)) => r.to_vec(),
            (_, None) => Vec::new(),
        };
        assert_eq!(a.dtype, b.dtype);
        assert_eq!(a.dims, b.dims);
        assert_eq!(canon(a), canon(b), "{}", a.dtype);
        if a.dtype == DType::String {
            assert_eq!(a.data, b.data);
        }
    }
}

#[test]
fn floats_print_shortest_and_parse_back_exactly() {
    let vals = [
        0.1f32,
        -0.0,
        1.0,
        1e-45,
        f32::MIN_POSITIVE,
        f32::MAX,
        -f32::MAX,
        16777217.0,
        1e20,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    let mut g = Graph::new("f");
    let x = g.add_value("x", None).unwrap();
    g.inputs.push(x);
    let y = g.add_value("y", None).unwrap();
    let c = g.add_initializer(
        "c",
        Tensor::from_f32(vec![vals.len() as i64], &vals).unwrap(),
    );
    g.add_node(
        NewNode::new("Op")
            .inputs(&[x, c])
            .outputs(&[y])
            .attr(Attribute::new("fs", AttrValue::Floats(vals.to_vec())))
            .attr(Attribute::new("n", AttrValue::Float(-f32::NAN))),
    )
    .unwrap();
    g.outputs.push(y);
    let s = full(&g);
    assert!(s.contains("{0.1, -0.0, 1.0, 1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 16777216.0, 1e20, inf, -inf}"), "{s}");
    assert!(s.contains("n = -nan"), "{s}");
    let back = stable(&g);
    let n = back.nodes().next().unwrap();
    let AttrValue::Floats(fs) = &back.node(n).attr("fs").unwrap().value else {
        panic!()
    };
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(fs), bits(&vals));
    let c2 = back.value_by_name("c").unwrap();
    assert_eq!(back.initializer(c2), g.initializer(c));
    let nan = back.node(n).attr_float("n").unwrap();
    assert!(nan.is_nan() && nan.is_sign_negative());
}

#[test]
fn types_round_trip() {
    let sym = |s: &str| Dim::Sym(s.into());
    let tys = vec![
        Type::tensor(DType::F32, Some(Shape::new(vec![]))),
        Type::tensor(DType::F32, None),
        Type::tensor(
            DType::BF16,
            Some(Shape::new(vec![
                sym("batch"),
                Dim::Unknown,
                Dim::Known(3),
                sym("a b"),
            ])),
        ),
        Type {
            kind: TypeKind::Sequence(Some(Box::new(Type::known(DType::I64, &[2])))),
            denotation: None,
        },
        Type {
            kind: TypeKind::Map(
                DType::String,
                Box::new(Type {
                    kind: TypeKind::Optional(Box::new(Type::tensor(DType::F8E4M3FN, None))),
                    denotation: None,
                }),
            ),
            denotation: None,
        },
        Type {
            kind: TypeKind::SparseTensor(TensorType::new(
                DType::F16,
                Some(Shape::known(&[10, 10])),
            )),
            denotation: None,
        },
        Type {
            kind: TypeKind::Opaque {
                domain: "ai.onnx.ml".into(),
                name: "RNG".into(),
            },
            denotation: None,
        },
        Type {
            kind: TypeKind::Opaque {
                domain: String::new(),
                name: "Thing".into(),
            },
            denotation: None,
        },
        Type {
            kind: TypeKind::Sequence(None),
            denotation: None,
        },
    ];
    let mut g = Graph::new("types");
    for (i, t) in tys.iter().enumerate() {
        let v = g.add_value(format!("v{i}"), Some(t.clone())).unwrap();
        g.inputs.push(v);
        g.outputs.push(v);
    }
    let back = stable(&g);
    for (i, t) in tys.iter().enumerate() {
        let v = back.value_by_name(&format!("v{i}")).unwrap();
        assert_eq!(back.ty(v), Some(t));
    }
    let s = full(&g);
    assert!(s.starts_with("types (float v0, float[] v1, bfloat16[batch,?,3,\"a b\"] v2, seq(int64[2]) v3, map(string, optional(float8e4m3fn[])) v4, sparse_tensor(float16[10,10]) v5, opaque(ai.onnx.ml,RNG) v6, opaque(Thing) v7"), "{s}");
}

#[test]
fn odd_names_are_quoted() {
    let src = r#"
"my graph" (float "/in:0", float[] "float", "seq") => ("out.1") {
    ["node/1"] "out.1", "" = "my-dom"."Op-x":"ov 1" <"attr-1" = 1, empty: strings = [], tp = seq(float)> ("/in:0", "", "float", seq)
}
"#;
    let g = parse_graph(src).unwrap();
    let n = g.node(g.nodes().next().unwrap());
    assert_eq!(
        (n.domain.as_str(), n.op_type.as_str(), n.overload.as_str()),
        ("my-dom", "Op-x", "ov 1")
    );
    assert_eq!(n.name, "node/1");
    assert_eq!(n.inputs().len(), 4);
    assert!(n.inputs()[1].is_none() && n.outputs()[1].is_none());
    let s = full(&g);
    insta::assert_snapshot!(s, @r#"
    "my graph" (float "/in:0", float[] "float", "seq") => ("out.1") {
       ["node/1"] "out.1", "" = "my-dom"."Op-x":"ov 1" <"attr-1" = 1, empty: strings = [], tp = seq(float)> ("/in:0", "", "float", "seq")
    }
    "#);
    stable(&g);
}

#[test]
fn onnx_printer_layout_is_accepted() {
    // As onnx.printer writes it: initializers of inputs in the `<>` block,
    // attribute type annotations everywhere, attributes after the inputs.
    let src = r#"
g (float[2] X) => (float[2] Y)
   <float[2] X = {1,2}, float[2] C = {3,4}, float[2] T>
{
   T = Add (X, C)
   Y = Mul (T, C) <alpha: float = 1, beta: ints = [1, 2], s: string = "x">
}
"#;
    let g = parse_graph(src).unwrap();
    let x = g.value_by_name("X").unwrap();
    assert!(g.is_input(x) && g.initializer(x).is_some());
    let n = g.node(g.nodes().nth(1).unwrap());
    assert_eq!(n.attr_float("alpha"), Some(1.0));
    assert_eq!(n.attr_ints("beta"), Some(&[1i64, 2][..]));
    let s = full(&g);
    assert!(s.contains("(float[2] X = {1.0, 2.0})"), "{s}");
}

#[test]
fn errors_say_where_and_what() {
    let e = |src: &str| parse_graph(src).unwrap_err().to_string();
    assert_eq!(
        e("g (float X) => (Y) {\n  Y = Relu(X\n}"),
        "3:1: expected ')', found '}'"
    );
    assert_eq!(
        e("g (float X) => (Y) {\n  Y = Relu(X)"),
        "2:14: expected a node or '}', found end of input"
    );
    assert_eq!(
        e("g (flot[2] X) => (Y) {}"),
        "1:4: 'flot' is not a type (expected float, int64, seq(...), ...)"
    );
    assert_eq!(
        e("g () => (Y) <float[2] c = {1.0}> {}"),
        "1:27: a float tensor of dims [2] needs 2 values, found 1"
    );
    assert_eq!(
        e("g () => (Y) <int8[1] c = {300}> {}"),
        "1:27: 300 is out of range for int8 (expected -128..=127)"
    );
    assert_eq!(
        e("g (X) => (Y) {\n Y = Relu (X)\n Y = Relu (X)\n}"),
        "3:2: node '' (Relu) redefines value 'Y'"
    );
    assert_eq!(
        e("g (X) => (Y) { Y = Op <a = []> (X) }"),
        "1:28: an empty list needs a type annotation, as in `axes: ints = []`"
    );
    assert_eq!(
        e("g (X, X) => () {}"),
        "1:7: value 'X' is defined more than once"
    );
    assert_eq!(
        e("g () => () <float[N] c = {1.0}> {}"),
        "1:13: a constant's dimensions must be numbers"
    );
    assert_eq!(
        e("g () => () <float[2] c = [\"location\": \"w.bin\"]> {}"),
        "1:26: external tensor data is not supported (only the \"elided\" marker)"
    );
    assert_eq!(e("g () => (\"y) {}"), "1:10: unterminated string");
    assert_eq!(
        e("g () => () { y = Op <t: ints = 1.5> () }"),
        "1:32: attribute 't' is declared ints but its value is float"
    );
    let deep = format!(
        "g ({}float{} x) => () {{}}",
        "seq(".repeat(100),
        ")".repeat(100)
    );
    assert!(e(&deep).contains("nesting deeper than 64 levels"));
    for msg in [e("g (X) => (Y) {\n\n Y = \"\u{e9}"), e("")] {
        assert!(!msg.contains('\n'), "{msg}");
    }
}

#[test]
fn parser_survives_every_prefix_and_byte_flip() {
    let s = print_model(&if_model(), &PrintOptions::full())
        + &print_model(&mlp(), &PrintOptions::full());
    for i in 0..s.len() {
        if s.is_char_boundary(i) {
            let _ = parse_model(&s[..i]);
            let mut t = s.clone();
            t.replace_range(i..i + 1, "\"");
            let _ = parse_model(&t);
            let mut t = s.clone();
            t.remove(i);
            let _ = parse_model(&t);
        }
    }
}

#[test]
fn half_floats_accept_float_literals() {
    let g =
        parse_graph("g () => () <float16[2] h = {1.5, 15360}, bfloat16 b = {-2.0}> {}").unwrap();
    let h = g.initializer(g.value_by_name("h").unwrap()).unwrap();
    assert_eq!(h.to_f64_vec().unwrap(), vec![1.5, 1.0]);
    let b = g.initializer(g.value_by_name("b").unwrap()).unwrap();
    assert_eq!(b.to_f64_vec().unwrap(), vec![-2.0]);
    assert!(full(&g).contains("float16[2] h = {15872, 15360}"));
}

#[test]
fn sparse_tensors_use_the_extension() {
    let src = "g () => () <sparse_tensor(float[3,4]) s = (float[2] {1.0, 2.0}, int64[2] {0, 7})> {\n   y = Op <sp = sparse_tensor(int32[5]) (int32[1] {9}, int64[1] {4})> ()\n}";
    let g = parse_graph(src).unwrap();
    let s = g.sparse_initializer(g.value_by_name("s").unwrap()).unwrap();
    assert_eq!(s.dims, vec![3, 4]);
    assert_eq!(s.indices.to_i64_vec().unwrap(), vec![0, 7]);
    stable(&g);
}
