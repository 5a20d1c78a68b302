//! Property tests: random graphs print → parse → print to identical text,
//! and the parser never panics on damaged text.
//!
//! Graphs come from a seed (proptest supplies and shrinks the seed), which
//! keeps the generator a plain function that can build valid IR step by
//! step: values must exist before nodes read them.

use bytes::Bytes;
use graphopt_ir::*;
use graphopt_text::*;
use proptest::prelude::*;

/// xorshift64*: small, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

const NAMES: &[&str] = &[
    "x",
    "y",
    "t",
    "W",
    "_b",
    "a1",
    "onnx::MatMul_0",
    "/layer/Add_output_0",
    "float",
    "seq",
    "int64",
    "nan_x",
    "inf",
    "with space",
    "quo\"te",
    "back\\slash",
    "ü",
    "1abc",
    "undefined",
    "opaque",
];

fn name(r: &mut Rng, g: &Graph) -> String {
    let base = r.pick(NAMES).to_string();
    g.fresh_name(&base)
}

fn dtype(r: &mut Rng) -> DType {
    let all: Vec<DType> = DType::all().filter(|d| *d != DType::Undefined).collect();
    *r.pick(&all)
}

fn ty(r: &mut Rng, depth: u32) -> Type {
    let dim = |r: &mut Rng| match r.below(4) {
        0 => Dim::Unknown,
        1 => Dim::Sym(r.pick(&["N", "batch", "seq len", "M_2"]).to_string()),
        _ => Dim::Known(r.below(5) as i64),
    };
    let tensor = |r: &mut Rng| {
        let shape = if r.chance(15) {
            None
        } else {
            Some(Shape::new((0..r.below(4)).map(|_| dim(r)).collect()))
        };
        TensorType::new(dtype(r), shape)
    };
    let kind = match if depth > 1 { 0 } else { r.below(10) } {
        0..=4 => TypeKind::Tensor(tensor(r)),
        5 => TypeKind::Sequence(Some(Box::new(ty(r, depth + 1)))),
        6 => TypeKind::Map(
            *r.pick(&[DType::I64, DType::String, DType::I32]),
            Box::new(ty(r, depth + 1)),
        ),
        7 => TypeKind::Optional(Box::new(ty(r, depth + 1))),
        8 => TypeKind::SparseTensor(tensor(r)),
        _ => TypeKind::Opaque {
            domain: r.pick(&["", "ai.onnx.ml", "com.x"]).to_string(),
            name: r.pick(&["RNG", "Thing"]).to_string(),
        },
    };
    Type {
        kind,
        denotation: None,
    }
}

fn tensor(r: &mut Rng) -> Tensor {
    let d = dtype(r);
    let dims: Vec<i64> = (0..r.below(3)).map(|_| r.below(4) as i64).collect();
    let n = numel(&dims).unwrap();
    let mut t = if d == DType::String {
        let pool: [&[u8]; 5] = [b"", b"abc", b"q\"uo", &[0xff, 0x00], "é".as_bytes()];
        Tensor::from_strings(
            dims,
            (0..n)
                .map(|_| {
                    let s: &[u8] = pool[r.below(pool.len())];
                    Bytes::copy_from_slice(s)
                })
                .collect(),
        )
        .unwrap()
    } else {
        let bytes = d.storage_bytes(n).unwrap() as usize;
        let raw: Vec<u8> = (0..bytes)
            .map(|_| {
                // Mostly small values, sometimes any bit pattern.
                if r.chance(30) {
                    r.next() as u8
                } else {
                    *r.pick(&[0u8, 1, 0x3f, 0x80, 0x40])
                }
            })
            .collect();
        Tensor::from_raw(d, dims, Bytes::from(raw)).unwrap()
    };
    if r.chance(20) {
        t.name = r.pick(&["tn", "a name", "k"]).to_string();
    }
    t
}

fn attr_value(r: &mut Rng, g: &Graph, depth: u32) -> AttrValue {
    let f = |r: &mut Rng| match r.below(6) {
        0 => f32::from_bits(r.next() as u32),
        1 => -0.0,
        2 => f32::INFINITY,
        _ => (r.below(2000) as f32 - 1000.0) / 8.0,
    };
    match r.below(if depth > 0 { 12 } else { 14 }) {
        0 => AttrValue::Float(f(r)),
        1 => AttrValue::Int(r.next() as i64 >> r.below(64)),
        2 => AttrValue::String(r.pick(&[&b"s"[..], b"", b"a\"b", &[0xfe, b'x']]).to_vec()),
        3 => AttrValue::Tensor(tensor(r)),
        4 => AttrValue::Type(ty(r, 0)),
        5 => AttrValue::Floats((0..r.below(4)).map(|_| f(r)).collect()),
        6 => AttrValue::Ints((0..r.below(4)).map(|_| r.next() as i64 >> 40).collect()),
        7 => AttrValue::Strings(
            (0..r.below(3))
                .map(|i| format!("s{i}").into_bytes())
                .collect(),
        ),
        8 => AttrValue::Tensors((0..r.below(3)).map(|_| tensor(r)).collect()),
        9 => AttrValue::Types((0..r.below(3)).map(|_| ty(r, 0)).collect()),
        10 => AttrValue::Ref {
            attr: r.pick(&["alpha", "beta"]).to_string(),
            kind: *r.pick(&[AttrKind::Float, AttrKind::Ints, AttrKind::Undefined]),
        },
        11 => AttrValue::SparseTensor(SparseTensor {
            values: Tensor::from_f32(vec![2], &[1.0, f(r)]).unwrap(),
            indices: Tensor::from_i64(vec![2], &[0, 3]).unwrap(),
            dims: vec![2, 2],
        }),
        12 => AttrValue::Graph(Box::new(graph(r, depth + 1, Some(g)))),
        _ => AttrValue::Graphs(
            (0..r.below(3))
                .map(|_| graph(r, depth + 1, Some(g)))
                .collect(),
        ),
    }
}

/// A random graph; `outer` is the enclosing graph whose values a subgraph
/// may read.
fn graph(r: &mut Rng, depth: u32, outer: Option<&Graph>) -> Graph {
    let gname = r
        .pick(&[
            "main", "body", "then_g", "my graph", "nan_g", "float", "", "g_1",
        ])
        .to_string();
    let mut g = Graph::new(gname);
    let mut avail: Vec<ValueId> = Vec::new();
    for _ in 0..r.below(3) {
        let n = name(r, &g);
        let t = if r.chance(80) { Some(ty(r, 0)) } else { None };
        let v = g.add_value(n, t).unwrap();
        g.inputs.push(v);
        if r.chance(15) {
            let t = tensor(r);
            let shape = Shape::known(&t.dims);
            g.value_mut(v).ty = Some(Type::tensor(t.dtype, Some(shape)));
            g.set_initializer(v, t);
        }
        avail.push(v);
    }
    for _ in 0..r.below(3) {
        let n = name(r, &g);
        let t = tensor(r);
        let v = g.add_initializer(&n, t);
        avail.push(v);
    }
    if let Some(o) = outer {
        // Read some enclosing values by name.
        let outer_vals: Vec<ValueId> = o.values().collect();
        for _ in 0..r.below(3) {
            if outer_vals.is_empty() {
                break;
            }
            let n = o.name(*r.pick(&outer_vals)).to_string();
            if g.value_by_name(&n).is_none() {
                let v = g.value_or_outer(&n);
                avail.push(v);
            }
        }
    }
    let ops = [
        "Relu",
        "Add",
        "com.microsoft.FusedMatMul",
        "If",
        "Weird-Op",
        "local.F",
    ];
    for _ in 0..r.below(if depth > 1 { 2 } else { 5 }) {
        let op = *r.pick(&ops);
        let (domain, op_type) = match op.rsplit_once('.') {
            Some((d, o)) => (d.to_string(), o.to_string()),
            None => (String::new(), op.to_string()),
        };
        let inputs: Vec<Option<ValueId>> = (0..r.below(4))
            .map(|_| {
                if r.chance(15) || avail.is_empty() {
                    None
                } else {
                    Some(*r.pick(&avail))
                }
            })
            .collect();
        let mut outputs = Vec::new();
        for _ in 0..r.below(3) {
            if r.chance(10) {
                outputs.push(None);
            } else {
                let n = name(r, &g);
                let v = g.add_value(n, None).unwrap();
                outputs.push(Some(v));
            }
        }
        let mut attributes = Vec::new();
        for i in 0..r.below(4) {
            let an = r
                .pick(&["alpha", "axes", "to", "then_branch", "odd-name", "x"])
                .to_string();
            attributes.push(Attribute::new(format!("{an}{i}"), attr_value(r, &g, depth)));
        }
        let new = NewNode {
            name: if r.chance(30) {
                r.pick(&["n0", "node/1", "lbl"]).to_string()
            } else {
                String::new()
            },
            op_type,
            domain,
            overload: if r.chance(10) {
                "ov".into()
            } else {
                String::new()
            },
            inputs,
            outputs: outputs.clone(),
            attributes,
            ..NewNode::default()
        };
        g.add_node(new).unwrap();
        for o in outputs.into_iter().flatten() {
            avail.push(o);
            if r.chance(25) {
                g.value_mut(o).ty = Some(ty(r, 0));
                g.value_info.push(o);
            }
        }
    }
    for _ in 0..r.below(3) {
        if let Some(&v) = avail.get(r.below(avail.len())) {
            if !g.outputs.contains(&v) {
                g.outputs.push(v);
            }
        }
    }
    g
}

fn model(r: &mut Rng) -> Model {
    let mut m = Model::new(graph(r, 0, None), 17);
    m.producer_name = r.pick(&["", "graphopt", "p\"q"]).to_string();
    m.model_version = r.below(3) as i64;
    if r.chance(30) {
        m.metadata_props.push(("k".into(), "v\\".into()));
    }
    for i in 0..r.below(3) {
        let mut body = graph(r, 1, None);
        body.name = format!("f{i}");
        m.functions.push(Function {
            name: format!("f{i}"),
            domain: "local".into(),
            overload: String::new(),
            attributes: vec!["alpha".into()],
            attribute_defaults: vec![Attribute::new("beta", AttrValue::Ints(vec![1]))],
            opset_imports: vec![OpsetImport {
                domain: String::new(),
                version: 17,
            }],
            doc_string: if r.chance(50) {
                "doc".into()
            } else {
                String::new()
            },
            metadata_props: Vec::new(),
            body,
        });
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn graphs_print_parse_print_stably(seed in 1u64..) {
        let mut r = Rng(seed);
        let m = model(&mut r);
        let opts = PrintOptions::full();
        let s = print_model(&m, &opts);
        let back = parse_model(&s).map_err(|e| TestCaseError::fail(format!("{e}\n{s}")))?;
        let s2 = print_model(&back, &opts);
        prop_assert_eq!(&s2, &s);
        // (IR equality is not checked: NaN attributes are never `==`.)
        // Elided text parses as well.
        let e = print_model(&m, &PrintOptions { elide_above: Some(2) });
        parse_model(&e).map_err(|err| TestCaseError::fail(format!("{err}\n{e}")))?;
    }

    #[test]
    fn parser_never_panics_on_damaged_text(seed in 1u64.., cuts in proptest::collection::vec((0usize..10_000, 0usize..40), 1..4)) {
        let mut r = Rng(seed);
        let m = model(&mut r);
        let mut s = print_model(&m, &PrintOptions::full());
        for (at, what) in cuts {
            let mut at = at % (s.len() + 1);
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            let ins = ["", "\"", "<", ">", "(", ")", "[", "]", "{", "}", ",", "=", "=>", "@", "-", "1e", "#", "\\", "seq(", "float[", ":", ".", "nan", "9999999999999999999999"];
            if what < ins.len() {
                s.insert_str(at, ins[what]);
            } else {
                let end = (at + what - ins.len()).min(s.len());
                let mut end = end;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s.replace_range(at..end, "");
            }
        }
        let _ = parse_model(&s);
        let _ = parse_graph(&s);
    }

    #[test]
    fn parser_never_panics_on_noise(s in "[a-z\"<>(){}\\[\\],=:@.#0-9 \n\\-?]{0,200}") {
        let _ = parse_model(&s);
        let _ = parse_graph(&s);
    }
}
