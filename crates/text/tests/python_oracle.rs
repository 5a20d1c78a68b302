//! Cross-checks against Python's `onnx` package, the reference
//! implementation of the syntax: `onnx.parser` must accept our printed text
//! and read the same nodes and initializer values from it, and we must read
//! what `onnx.printer` writes. Runs in the pinned Python environment of
//! `graphopt-testutil`; skips (with a note) when it cannot be had, and fails
//! then under `GRAPHOPT_REQUIRE_PYTHON=1` or `CI=true`.

use graphopt_ir::{DType, Model};
use graphopt_text::*;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn run_python(python: &Path, script: &str, stdin: &str) -> String {
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "python failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const SEP: &str = "\n=====\n";

/// Parses each model with onnx.parser and prints one line per node and per
/// initializer with the values numpy reads.
const SUMMARIZE: &str = r#"
import sys, onnx, onnx.parser, onnx.numpy_helper as nh
for i, t in enumerate(sys.stdin.read().split("\n=====\n")):
    try:
        m = onnx.parser.parse_model(t)
    except Exception as e:
        print("error", i, str(e).replace("\n", " "))
        continue
    g = m.graph
    print("model", i, len(g.input), len(g.output), len(m.functions))
    for n in g.node:
        print("node", n.domain, n.op_type, "|".join(n.input), "|".join(n.output), ",".join(a.name for a in n.attribute))
    for init in g.initializer:
        vals = ""
        if init.data_type in (1, 2, 3, 5, 6, 7, 9, 10, 11) and init.data_location != 1:
            vals = " ".join(repr(float(v)) for v in nh.to_array(init).flatten().tolist())
        print("init", init.name, init.data_type, list(init.dims), vals)
"#;

fn summarize_ours(i: usize, m: &Model) -> Vec<String> {
    let g = &m.graph;
    let mut lines = vec![format!(
        "model {i} {} {} {}",
        g.inputs.len(),
        g.outputs.len(),
        m.functions.len()
    )];
    for n in g.nodes() {
        let d = g.node(n);
        let names = |vs: &[Option<graphopt_ir::ValueId>]| {
            vs.iter()
                .map(|v| v.map(|v| g.name(v)).unwrap_or(""))
                .collect::<Vec<_>>()
                .join("|")
        };
        let attrs: Vec<&str> = d.attributes.iter().map(|a| a.name.as_str()).collect();
        lines.push(format!(
            "node {} {} {} {} {}",
            d.domain,
            d.op_type,
            names(d.inputs()),
            names(d.outputs()),
            attrs.join(",")
        ));
    }
    lines
}

fn models() -> Vec<Model> {
    let texts = [
        r#"<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1], producer_name: "graphopt", doc_string: "a \"doc\"", metadata_props: ["k": "v"]>
mlp (float[N,4] X, float[4] B = {0.5, -1.0, 2.0, 1e-45}) => (float[N,2] Y)
   <float[4,2] W = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.1}, float[N,4] T>
{
   [n0] T = Add (X, B)
   Y = com.microsoft.FusedMatMul <alpha = 0.5, transA = 0, s = "x\\y", ints = [1, -2], empty: ints = []> (T, W)
}"#,
        r#"<ir_version: 9, opset_import: ["" : 19, "local" : 1]>
main (bool c, float[2] x) => (float[2] y) {
    late = local.Twice <k = 2> (x)
    y = If (c) <then_branch = then_g () => (float[2] a) {
        a = Add (x, late)
    }, else_branch = else_g () => (late) {
    }>
}
<domain: "local", opset_import: ["" : 19]>
Twice <k, scale: float = 2.0> (v) => (w) {
    s = Constant <value_float: float = @scale> ()
    w = Mul (v, s)
}"#,
        r#"<ir_version: 9, opset_import: ["" : 19]>
zoo (seq(float[N]) S, map(int64, float) M, optional(seq(float)) O, sparse_tensor(float[4,4]) SP, float[?,"a b"] Q, float[] U, float Z) => (float[2] Y)
   <float[2] Y = {nan, -inf}, double[3] d = {0.1, -0.0, inf}, float16[2] h = {15360, 48128}, int8[3] i8 = {-128, 0, 127},
    uint8[2] u8 = {0, 255}, int64[2] i64 = {-9223372036854775808, 9223372036854775807}, bool[2] b = {1, 0},
    uint64[1] u64 = {18446744073709551615}, string[2] st = {"a", "b\"c"}, int4[2] q = {-8, 7}, complex64[1] cx = {1.0, -2.0},
    float8e4m3fn[2] f8 = {0, 126}, bfloat16[1] bf = {16256}>
{
   "/layer/out:0", "" = "Split" <axis = 0> (Z, "", Q)
   k = Constant <value = float[2] named {1.0, 2.0}, tp = seq(float[3])> ()
}"#,
    ];
    let mut out: Vec<Model> = texts.iter().map(|t| parse_model(t).unwrap()).collect();
    // Large initializers print elided, still in standard syntax.
    let mut big = out[0].clone();
    let w = big.graph.value_by_name("W").unwrap();
    let t = graphopt_ir::Tensor::from_f32(vec![64, 64], &[0.25; 4096]).unwrap();
    big.graph.set_initializer(w, t);
    big.graph.value_mut(w).ty = None;
    out.push(big);
    out
}

#[test]
fn onnx_parser_reads_what_we_print() {
    let Some(python) = graphopt_testutil::python_or_skip("onnx_parser_reads_what_we_print") else {
        return;
    };
    let ms = models();
    let texts: Vec<String> = ms
        .iter()
        .map(|m| print_model(m, &PrintOptions::default()))
        .collect();
    let out = run_python(&python, SUMMARIZE, &texts.join(SEP));
    let mut got = out.lines().peekable();
    for (i, m) in ms.iter().enumerate() {
        let head = got.next().unwrap_or("");
        assert!(
            !head.starts_with("error"),
            "onnx.parser rejected model {i}: {head}\n{}",
            texts[i]
        );
        let ours = summarize_ours(i, m);
        assert_eq!(head, ours[0], "{}", texts[i]);
        for line in &ours[1..] {
            assert_eq!(got.next().unwrap_or(""), line.as_str(), "{}", texts[i]);
        }
        // Initializer values as numpy reads them.
        while got.peek().is_some_and(|l| l.starts_with("init ")) {
            let l = got.next().unwrap();
            let parts: Vec<&str> = l.splitn(4, ' ').collect();
            let name = parts[1];
            let v = m.graph.value_by_name(name).unwrap();
            let t = m.graph.initializer(v).unwrap();
            assert_eq!(parts[2], t.dtype.to_onnx().to_string(), "{l}");
            let Some(vals_text) = l.split("] ").nth(1) else {
                continue;
            };
            if vals_text.is_empty() || t.numel().unwrap() > 16 {
                continue;
            }
            let theirs: Vec<f64> = vals_text
                .split(' ')
                .map(|s| s.parse::<f64>().unwrap())
                .collect();
            let ours = t.to_f64_vec().unwrap();
            let same = |a: f64, b: f64| (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
            assert!(
                ours.len() == theirs.len() && ours.iter().zip(&theirs).all(|(a, b)| same(*a, *b)),
                "initializer {name}: ours {ours:?}, onnx {theirs:?}"
            );
            assert_ne!(t.dtype, DType::Undefined);
        }
    }
}

/// Models built with onnx.helper (raw data of many dtypes, subgraphs,
/// functions), written by onnx.printer: we parse them and agree with numpy.
const ONNX_PRINTED: &str = r#"
import numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
inits = [
    nh.from_array(np.array([0.1, -0.0, np.inf, 1e-45], dtype=np.float32), "f32"),
    nh.from_array(np.array([1.5, -2.25], dtype=np.float16), "f16"),
    nh.from_array(np.array([[1, -2], [3, 4]], dtype=np.int8), "i8"),
    nh.from_array(np.array([7, -9], dtype=np.int64), "i64"),
    nh.from_array(np.array([0.3], dtype=np.float64), "f64"),
    nh.from_array(np.array([True, False]), "b"),
    nh.from_array(np.array([4000000000], dtype=np.uint32), "u32"),
]
then_g = h.make_graph([h.make_node("Identity", ["f32"], ["o"])], "then_g", [], [h.make_tensor_value_info("o", T.FLOAT, [4])])
nodes = [
    h.make_node("Add", ["X", "f32"], ["t"], name="add0", alpha=1.5, axes=[1, 2], mode="m"),
    h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=then_g),
    h.make_node("Foo", ["t", "", "y"], ["z"], domain="com.microsoft"),
]
g = h.make_graph(nodes, "main", [h.make_tensor_value_info("X", T.FLOAT, ["N", 4]), h.make_tensor_value_info("c", T.BOOL, [])],
                 [h.make_tensor_value_info("z", T.FLOAT, None)], initializer=inits)
fn = h.make_function("local", "F", ["a"], ["b"], [h.make_node("Neg", ["a"], ["b"])], [h.make_opsetid("", 17)])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], functions=[fn])
print(onnx.printer.to_text(m))
print("=====")
for i in inits:
    print(i.name, " ".join(repr(float(v)) for v in nh.to_array(i).flatten().tolist()))
"#;

#[test]
fn we_read_what_onnx_printer_writes() {
    let Some(python) = graphopt_testutil::python_or_skip("we_read_what_onnx_printer_writes") else {
        return;
    };
    let out = run_python(&python, ONNX_PRINTED, "");
    let (text, values) = out.split_once("=====\n").unwrap();
    let m = parse_model(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let g = &m.graph;
    assert_eq!(g.node_count(), 3);
    assert_eq!(m.functions.len(), 1);
    let add = g.node(g.nodes().next().unwrap());
    assert_eq!(add.name, "add0");
    assert_eq!(add.attr_float("alpha"), Some(1.5));
    assert_eq!(add.attr_ints("axes"), Some(&[1i64, 2][..]));
    for line in values.lines().filter(|l| !l.is_empty()) {
        let (name, vals) = line.split_once(' ').unwrap_or((line, ""));
        let t = g.initializer(g.value_by_name(name).unwrap()).unwrap();
        let theirs: Vec<f64> = vals.split(' ').map(|s| s.parse::<f64>().unwrap()).collect();
        let ours = t.to_f64_vec().unwrap();
        assert_eq!(
            ours.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            theirs.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{name}"
        );
    }
    // And our printout of it is stable.
    let s = print_model(&m, &PrintOptions::full());
    assert_eq!(
        print_model(&parse_model(&s).unwrap(), &PrintOptions::full()),
        s
    );
}
