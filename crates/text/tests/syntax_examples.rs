//! Hand-written texts in the style of onnx `docs/Syntax.md` and onnx's
//! `parser_test.cc`: each parses, means what it says, and prints back to
//! text that parses to the same printout.

use graphopt_ir::{verify, AttrValue, DType, Dim, Graph, Model, TypeKind};
use graphopt_text::*;

fn stable_model(src: &str) -> Model {
    let m = parse_model(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let s = print_model(&m, &PrintOptions::full());
    let m2 = parse_model(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    assert_eq!(print_model(&m2, &PrintOptions::full()), s);
    m
}

fn stable_graph(src: &str) -> Graph {
    let g = parse_graph(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let s = print_graph(&g, &PrintOptions::full());
    let g2 = parse_graph(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    assert_eq!(print_graph(&g2, &PrintOptions::full()), s);
    g
}

#[test]
fn syntax_md_api_example() {
    let m = stable_model(
        r#"
<
  ir_version: 7,
  opset_import: [ "" : 10 ]
>
agraph (float[N, 128] X, float[128, 10] W, float[10] B) => (float[N, 10] C)
{
    T = MatMul(X, W)
    S = Add(T, B)
    C = Softmax(S)
}
"#,
    );
    assert_eq!(m.ir_version, 7);
    assert_eq!(m.onnx_opset(), Some(10));
    let g = &m.graph;
    assert_eq!(g.name, "agraph");
    assert_eq!(g.node_count(), 3);
    let x = g.ty(g.inputs[0]).unwrap().shape().unwrap();
    assert_eq!(x.dims, vec![Dim::Sym("N".into()), Dim::Known(128)]);
    verify::verify_model(&m).unwrap();
}

#[test]
fn model_local_functions() {
    let m = stable_model(
        r#"
<
  ir_version: 8,
  opset_import: [ "" : 10, "local" : 1 ]
>
agraph (float[N, 128] X, float[128,10] W, float[10] B) => (float[N] C)
{
  T = local.foo (X, W, B)
  C = local.square(T)
}

<
  opset_import: [ "" : 10 ],
  domain: "local",
  doc_string: "Function foo."
>
foo (x, w, b) => (c) {
  T = MatMul(x, w)
  S = Add(T, b)
  c = Softmax(S)
}

<
  opset_import: [ "" : 10 ],
  domain: "local",
  doc_string: "Function square."
>
square (x) => (y) {
  y = Mul (x, x)
}
"#,
    );
    assert_eq!(m.functions.len(), 2);
    assert_eq!(m.functions[0].doc_string, "Function foo.");
    assert!(m.function("local", "square").is_some());
    let n = m.graph.nodes().next().unwrap();
    assert_eq!(m.graph.node(n).domain, "local");
    verify::verify_model(&m).unwrap();
}

#[test]
fn function_with_attributes_and_references() {
    let m = stable_model(
        r#"
<ir_version: 9, opset_import: ["" : 18, "custom" : 1]>
main (float[3] X) => (float[3] Y) {
  Y = custom.Selu <alpha = 2.0> (X)
}
<opset_import: ["": 18], domain: "custom">
Selu <alpha, gamma: float = 1.05> (X) => (C) <float Alpha>
{
  Alpha = Constant <value_float: float = @alpha>()
  AlphaX = CastLike (Alpha, X)
  Gamma = Constant <value_float: float = @gamma>()
  GammaX = CastLike (Gamma, X)
  Zero = Constant <value_float = 0.0>()
  ZeroX = CastLike (Zero, X)
  Neg = Less (X, ZeroX)
  Exp = Exp (X)
  AlphaExp = Mul (AlphaX, Exp)
  AlphaExpMinus = Sub (AlphaExp, AlphaX)
  Pos = Where (Neg, AlphaExpMinus, X)
  C = Mul (GammaX, Pos)
}
"#,
    );
    let f = &m.functions[0];
    assert_eq!(f.attributes, ["alpha"]);
    assert_eq!(f.attribute_defaults[0].name, "gamma");
    assert_eq!(f.body.value_info.len(), 1);
    verify::verify_model(&m).unwrap();
}

#[test]
fn if_with_subgraphs_reading_outer_values() {
    let g = stable_graph(
        r#"
agraph (bool cond, float[N] y, float[N] z) => (float[N] w)
{
  x = Add(y, z)
  w = If (cond) <
    then_branch = g1 () => (float[N] z_then) { z_then = Identity(x) },
    else_branch = g2 () => (float[N] z_else) { z_else = Identity(y) }
  >
}
"#,
    );
    verify::verify_graph(&g, &[]).unwrap();
    let n = g.nodes().nth(1).unwrap();
    assert_eq!(g.node(n).captures().len(), 2);
}

#[test]
fn loop_body_and_scan() {
    let g = stable_graph(
        r#"
loop_graph (int64 M, bool cond, float[2] init) => (float[2] out, float[?,2] scan_out) {
  out, scan_out = Loop (M, cond, init) <body = body (int64 i, bool c, float[2] acc) => (bool c_out, float[2] acc_out, float[2] s) {
      c_out = Identity (c)
      acc_out = Add (acc, init)
      s = Identity (acc_out)
  }>
}
"#,
    );
    verify::verify_graph(&g, &[]).unwrap();
    let body = g.subgraphs().next().unwrap().1;
    assert_eq!(body.inputs.len(), 3);
    let init = body.value_by_name("init").unwrap();
    assert!(body.is_outer(init));
}

#[test]
fn attributes_of_every_kind() {
    let g = stable_graph(
        r#"
g (float[2,4] X) => (Y1, Y2) {
  # comments run to the end of the line
  Y1, Y2 = Split <axis = 1, num_outputs: int = 2> (X)   # trailing comment
  c = Constant <value = float[2] {1.0, 2.0}> ()
  d = Constant <value = int64[2] named = {3, 4}> ()
  e = Cast <to = 1> (d)
  f = Foo <fs = [1.5, -2, nan, inf, -inf], ss = ["a", "b\"c"], empty: floats = [], tp = seq(float[3]), tps = [float, int8[2]], ts = [float {1.0}, int64 {2}]> ()
  h = LeakyRelu <alpha = 1e-2> (X)
  k = Bar <i = -7, neg_zero: float = -0, big = 9223372036854775807> ()
}
"#,
    );
    let attr = |op: &str, name: &str| {
        let n = g.nodes().find(|&n| g.node(n).op_type == op).unwrap();
        g.node(n).attr(name).unwrap().value.clone()
    };
    assert_eq!(attr("Split", "num_outputs"), AttrValue::Int(2));
    let AttrValue::Tensor(t) = attr("Constant", "value") else {
        panic!()
    };
    assert_eq!(t.to_f64_vec().unwrap(), vec![1.0, 2.0]);
    let AttrValue::Floats(fs) = attr("Foo", "fs") else {
        panic!()
    };
    assert_eq!(fs[..2], [1.5, -2.0]);
    assert!(fs[2].is_nan() && fs[3] == f32::INFINITY && fs[4] == f32::NEG_INFINITY);
    assert_eq!(
        attr("Foo", "ss"),
        AttrValue::Strings(vec![b"a".to_vec(), b"b\"c".to_vec()])
    );
    assert_eq!(attr("Foo", "empty"), AttrValue::Floats(vec![]));
    let AttrValue::Types(tps) = attr("Foo", "tps") else {
        panic!()
    };
    assert_eq!(tps[1].elem(), Some(DType::I8));
    let AttrValue::Tensors(ts) = attr("Foo", "ts") else {
        panic!()
    };
    assert_eq!(ts[1].to_i64_vec().unwrap(), vec![2]);
    assert_eq!(attr("LeakyRelu", "alpha"), AttrValue::Float(0.01));
    assert_eq!(attr("Bar", "i"), AttrValue::Int(-7));
    let AttrValue::Float(z) = attr("Bar", "neg_zero") else {
        panic!()
    };
    assert!(z == 0.0 && z.is_sign_negative());
    assert_eq!(attr("Bar", "big"), AttrValue::Int(i64::MAX));
}

#[test]
fn missing_optional_inputs_and_outputs() {
    let g = stable_graph(
        r#"
g (float[1,3,8] X, float[1,12,3] W, float[1,12,4] R) => (Y_h) {
  , Y_h = GRU <hidden_size = 4> (X, W, R, , , )
  Z = Clip (X, "", )
}
"#,
    );
    let n = g.node(g.nodes().next().unwrap());
    assert_eq!(n.outputs().len(), 2);
    assert!(n.outputs()[0].is_none());
    // `(X, W, R, , , )`: two empty names, the trailing comma is ignored.
    assert_eq!(n.inputs().len(), 5);
    let clip = g.node(g.nodes().nth(1).unwrap());
    assert_eq!(clip.inputs().len(), 2);
}

#[test]
fn initializers_value_infos_and_types() {
    let g = stable_graph(
        r#"
g (float[2] X = {1.0, 2.0}, seq(float[N]) S, map(int64, float) M, optional(seq(float)) O, sparse_tensor(float[4,4]) SP)
  => (float[2] Y, float Z, float[] U)
  <int64[2] shape = {1, 2}, string[2] names = {"a", "b"}, bool[3] flags = {1, 0, 1}, float[2] T, uint4[3] q = {15, 0, 7}, int4[2] s4 = {-8, 7}>
{
  T = Relu (X)
  Y = Identity (T)
  Z = ReduceSum (T)
  U = Reshape (T, shape)
}
"#,
    );
    let x = g.value_by_name("X").unwrap();
    assert!(g.is_input(x) && g.initializer(x).is_some());
    let z = g.value_by_name("Z").unwrap();
    assert_eq!(g.ty(z).unwrap().shape().unwrap().rank(), 0);
    let u = g.value_by_name("U").unwrap();
    assert!(g.ty(u).unwrap().as_tensor().unwrap().shape.is_none());
    let m = g.value_by_name("M").unwrap();
    assert!(matches!(
        g.ty(m).unwrap().kind,
        TypeKind::Map(DType::I64, _)
    ));
    let q = g.initializer(g.value_by_name("q").unwrap()).unwrap();
    assert_eq!(q.raw().unwrap().as_ref(), &[0x0f, 0x07]);
    let s4 = g.initializer(g.value_by_name("s4").unwrap()).unwrap();
    assert_eq!(s4.raw().unwrap().as_ref(), &[0x78]);
    assert_eq!(g.value_info.len(), 1);
    verify::verify_graph(&g, &[]).unwrap();
}

#[test]
fn nodes_out_of_order_keep_text_order() {
    let g = stable_graph(
        r#"
g (float X) => (float Z) {
  Z = Neg (Y)
  Y = Abs (X)
}
"#,
    );
    let ops: Vec<&str> = g.nodes().map(|n| g.node(n).op_type.as_str()).collect();
    assert_eq!(ops, ["Neg", "Abs"]);
    let names: Vec<&str> = g.values().map(|v| g.name(v)).collect();
    assert_eq!(names, ["X", "Z", "Y"]);
}

#[test]
fn domains_overloads_and_labels() {
    let g = stable_graph(
        r#"
g (float[2,3] A, float[3,4] B) => (C) {
  [fused_0] C = com.microsoft.FusedMatMul <alpha = 1.0, transA = 0> (A, B)
  [""] D = ai.onnx.Relu (C)
  E = local.Foo:v2 (D)
}
"#,
    );
    let ns: Vec<_> = g.nodes().map(|n| g.node(n)).collect();
    assert_eq!(
        (ns[0].name.as_str(), ns[0].domain.as_str()),
        ("fused_0", "com.microsoft")
    );
    assert_eq!(ns[1].domain, "ai.onnx");
    assert_eq!(
        (ns[2].op_type.as_str(), ns[2].overload.as_str()),
        ("Foo", "v2")
    );
}
