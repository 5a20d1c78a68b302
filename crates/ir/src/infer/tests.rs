//! Unit tests: one module per op family, plus the driver and robustness.

use super::*;
use crate::{AttrValue, Attribute, DType, Graph, NewNode, Tensor, Type};

/// A small graph builder addressing values by name.
pub(super) struct B {
    pub g: Graph,
}

/// Parses `"batch,3,?"` into dims: integers are known, `?` unknown, other symbols.
pub(super) fn dims_of(spec: &str) -> Vec<Dim> {
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| match s.parse::<i64>() {
            Ok(v) => Dim::Known(v),
            Err(_) if s == "?" => Dim::Unknown,
            Err(_) => Dim::Sym(s.to_string()),
        })
        .collect()
}

pub(super) fn ai(name: &str, v: i64) -> Attribute {
    Attribute::new(name, AttrValue::Int(v))
}
pub(super) fn ais(name: &str, v: &[i64]) -> Attribute {
    Attribute::new(name, AttrValue::Ints(v.to_vec()))
}
pub(super) fn af(name: &str, v: f32) -> Attribute {
    Attribute::new(name, AttrValue::Float(v))
}
pub(super) fn afs(name: &str, v: &[f32]) -> Attribute {
    Attribute::new(name, AttrValue::Floats(v.to_vec()))
}
pub(super) fn astr(name: &str, v: &str) -> Attribute {
    Attribute::new(name, AttrValue::String(v.as_bytes().to_vec()))
}
pub(super) fn at(name: &str, t: Tensor) -> Attribute {
    Attribute::new(name, AttrValue::Tensor(t))
}
pub(super) fn ag(name: &str, g: Graph) -> Attribute {
    Attribute::new(name, AttrValue::Graph(Box::new(g)))
}

impl B {
    pub fn new() -> B {
        B { g: Graph::new("g") }
    }
    /// A graph input; `spec` is `None` for unknown rank.
    pub fn input(&mut self, name: &str, elem: DType, spec: Option<&str>) -> ValueId {
        let ty = Type::tensor(elem, spec.map(|s| Shape::new(dims_of(s))));
        let v = self.g.add_value(name, Some(ty)).unwrap();
        self.g.inputs.push(v);
        v
    }
    pub fn init_i64(&mut self, name: &str, dims: &[i64], vals: &[i64]) -> ValueId {
        let v = self.g.add_value(name, None).unwrap();
        self.g
            .set_initializer(v, Tensor::from_i64(dims.to_vec(), vals).unwrap());
        v
    }
    pub fn init_f32(&mut self, name: &str, dims: &[i64], vals: &[f32]) -> ValueId {
        let v = self.g.add_value(name, None).unwrap();
        self.g
            .set_initializer(v, Tensor::from_f32(dims.to_vec(), vals).unwrap());
        v
    }
    /// Adds a node; input `""` is an absent optional input; outputs are created.
    pub fn node(&mut self, op: &str, ins: &[&str], outs: &[&str], attrs: Vec<Attribute>) {
        let inputs = ins
            .iter()
            .map(|n| {
                if n.is_empty() {
                    None
                } else {
                    Some(self.g.value_or_outer(n))
                }
            })
            .collect();
        let outputs = outs
            .iter()
            .map(|n| {
                if n.is_empty() {
                    None
                } else {
                    Some(
                        self.g
                            .value_by_name(n)
                            .unwrap_or_else(|| self.g.add_value(*n, None).unwrap()),
                    )
                }
            })
            .collect();
        let mut nn = NewNode::new(op);
        nn.inputs = inputs;
        nn.outputs = outputs;
        nn.attributes = attrs;
        self.g.add_node(nn).unwrap();
    }
    pub fn output(&mut self, name: &str) {
        let v = self.g.value_by_name(name).unwrap();
        self.g.outputs.push(v);
    }
    pub fn run(&mut self, opset: i64) -> InferReport {
        infer_graph(&mut self.g, opset, &InferOptions::default())
    }
    /// The type of `name` as text (`float[batch,3]`), or `none`.
    pub fn ty(&self, name: &str) -> String {
        let v = self.g.value_by_name(name).unwrap();
        self.g.ty(v).map_or("none".to_string(), |t| t.to_string())
    }
    pub fn val(&self, r: &InferReport, name: &str) -> Option<String> {
        let v = self.g.value_by_name(name).unwrap();
        r.shape_values.get(&v).map(|d| {
            d.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
    }
}

mod elementwise {
    use super::*;

    #[test]
    fn unary_and_binary() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("batch,1,4"));
        b.input("y", DType::F32, Some("3,1"));
        b.input("z", DType::F32, Some("seq"));
        b.node("Relu", &["x"], &["r"], vec![]);
        b.node("Add", &["x", "y"], &["a"], vec![]);
        b.node("Mul", &["a", "z"], &["m"], vec![]);
        b.node("Less", &["x", "y"], &["l"], vec![]);
        b.node("Not", &["l"], &["n"], vec![]);
        b.node("Sum", &["x", "y", "x"], &["s"], vec![]);
        b.node("Cast", &["x"], &["c"], vec![ai("to", 10)]);
        b.node("CastLike", &["x", "c"], &["cl"], vec![]);
        b.node("Where", &["l", "x", "y"], &["w"], vec![]);
        b.node("IsNaN", &["x"], &["nan"], vec![]);
        b.node("Dropout", &["x"], &["d", "dm"], vec![]);
        b.node("Pow", &["x", "c"], &["p"], vec![]);
        b.node("Clip", &["x", "", ""], &["cp"], vec![]);
        let r = b.run(17);
        assert_eq!(b.ty("r"), "float[batch,1,4]");
        assert_eq!(b.ty("a"), "float[batch,3,4]");
        assert_eq!(b.ty("m"), "float[batch,3,4]");
        assert_eq!(b.ty("l"), "bool[batch,3,4]");
        assert_eq!(b.ty("n"), "bool[batch,3,4]");
        assert_eq!(b.ty("s"), "float[batch,3,4]");
        assert_eq!(b.ty("c"), "float16[batch,1,4]");
        assert_eq!(b.ty("cl"), "float16[batch,1,4]");
        assert_eq!(b.ty("w"), "float[batch,3,4]");
        assert_eq!(b.ty("nan"), "bool[batch,1,4]");
        assert_eq!(b.ty("d"), "float[batch,1,4]");
        assert_eq!(b.ty("dm"), "bool[batch,1,4]");
        assert_eq!(b.ty("p"), "float[batch,1,4]");
        assert_eq!(b.ty("cp"), "float[batch,1,4]");
        assert!(r.unknown_ops.is_empty());
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn incompatible_broadcast_keeps_rank() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("2,3"));
        b.input("y", DType::F32, Some("4"));
        b.node("Add", &["x", "y"], &["a"], vec![]);
        b.input("m", DType::F32, Some("4,5"));
        b.node("MatMul", &["x", "m"], &["mm"], vec![]);
        b.init_i64("t", &[1], &[7]);
        b.node("Reshape", &["x", "t"], &["r"], vec![]);
        let r = b.run(17);
        assert_eq!(b.ty("a"), "float[?,?]");
        assert_eq!(b.ty("mm"), "float[2,5]");
        assert_eq!(b.ty("r"), "float[7]");
        assert_eq!(r.warnings.len(), 3, "{:?}", r.warnings);
        assert!(r.warnings[0].contains("(Add)"));
    }

    #[test]
    fn unknown_rank_propagates() {
        let mut b = B::new();
        b.input("x", DType::F32, None);
        b.input("y", DType::F32, Some("4"));
        b.node("Add", &["x", "y"], &["a"], vec![]);
        b.node("Sigmoid", &["x"], &["s"], vec![]);
        b.run(17);
        assert_eq!(b.ty("a"), "float");
        assert_eq!(b.ty("s"), "float");
    }
}

mod shapes {
    use super::*;

    /// GPT-2 style head split: Reshape target computed from Shape().
    #[test]
    fn reshape_from_shape_chain() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("batch,seq,768"));
        b.init_i64("i0", &[], &[0]);
        b.init_i64("i1", &[], &[1]);
        b.init_i64("ax0", &[1], &[0]);
        b.init_i64("heads", &[2], &[12, 64]);
        b.node("Shape", &["x"], &["sh"], vec![]);
        b.node("Gather", &["sh", "i0"], &["b"], vec![ai("axis", 0)]);
        b.node("Gather", &["sh", "i1"], &["s"], vec![]);
        b.node("Unsqueeze", &["b", "ax0"], &["bu"], vec![]);
        b.node("Unsqueeze", &["s", "ax0"], &["su"], vec![]);
        b.node(
            "Concat",
            &["bu", "su", "heads"],
            &["tgt"],
            vec![ai("axis", 0)],
        );
        b.node("Reshape", &["x", "tgt"], &["y"], vec![]);
        b.node(
            "Transpose",
            &["y"],
            &["t"],
            vec![ais("perm", &[0, 2, 1, 3])],
        );
        b.init_i64("back", &[3], &[0, 0, -1]);
        b.node("Reshape", &["y", "back"], &["z"], vec![]);
        b.init_i64("flat", &[2], &[-1, 64]);
        b.node("Reshape", &["y", "flat"], &["f"], vec![]);
        let r = b.run(13);
        assert_eq!(b.ty("sh"), "int64[3]");
        assert_eq!(b.val(&r, "sh").unwrap(), "batch,seq,768");
        assert_eq!(b.ty("b"), "int64[]");
        assert_eq!(b.val(&r, "tgt").unwrap(), "batch,seq,12,64");
        assert_eq!(b.ty("y"), "float[batch,seq,12,64]");
        assert_eq!(b.ty("t"), "float[batch,12,seq,64]");
        assert_eq!(b.ty("z"), "float[batch,seq,768]");
        assert_eq!(b.ty("f"), "float[?,64]");
    }

    #[test]
    fn reshape_variants() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("2,3,4"));
        b.input("dyn", DType::I64, Some("3"));
        b.init_i64("t1", &[2], &[-1, 4]);
        b.init_i64("t0", &[3], &[0, 0, 0]);
        b.node("Reshape", &["x", "t1"], &["a"], vec![]);
        b.node("Reshape", &["x", "t0"], &["z"], vec![ai("allowzero", 1)]);
        b.node("Reshape", &["x", "t0"], &["c"], vec![]);
        b.node("Reshape", &["x", "dyn"], &["d"], vec![]);
        b.node("Flatten", &["x"], &["f"], vec![]);
        b.node("Flatten", &["x"], &["f0"], vec![ai("axis", 0)]);
        b.node("Flatten", &["x"], &["fm"], vec![ai("axis", -1)]);
        b.run(14);
        assert_eq!(b.ty("a"), "float[6,4]");
        assert_eq!(b.ty("z"), "float[0,0,0]");
        assert_eq!(b.ty("c"), "float[2,3,4]");
        assert_eq!(b.ty("d"), "float[?,?,?]");
        assert_eq!(b.ty("f"), "float[2,12]");
        assert_eq!(b.ty("f0"), "float[1,24]");
        assert_eq!(b.ty("fm"), "float[6,4]");
    }

    #[test]
    fn reshape_opset1_attr() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("2,3,4"));
        b.node("Reshape", &["x"], &["a"], vec![ais("shape", &[4, -1])]);
        b.run(4);
        assert_eq!(b.ty("a"), "float[4,6]");
    }

    #[test]
    fn squeeze_unsqueeze_forms() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("1,n,1,5"));
        b.init_i64("ax", &[1], &[2]);
        b.node("Squeeze", &["x"], &["a"], vec![ais("axes", &[0, -2])]);
        b.node("Unsqueeze", &["x"], &["u"], vec![ais("axes", &[0, 5])]);
        b.run(11);
        assert_eq!(b.ty("a"), "float[n,5]");
        assert_eq!(b.ty("u"), "float[1,1,n,1,5,1]");

        let mut b = B::new();
        b.input("x", DType::F32, Some("1,n,1,5"));
        b.input("k", DType::F32, Some("1,3,1"));
        b.init_i64("ax", &[1], &[2]);
        b.node("Squeeze", &["x", "ax"], &["a"], vec![]);
        b.node("Squeeze", &["x"], &["all"], vec![]);
        b.node("Squeeze", &["k"], &["allk"], vec![]);
        b.node("Unsqueeze", &["x", "ax"], &["u"], vec![]);
        b.run(13);
        assert_eq!(b.ty("a"), "float[1,n,5]");
        assert_eq!(b.ty("all"), "float");
        assert_eq!(b.ty("allk"), "float[3]");
        assert_eq!(b.ty("u"), "float[1,n,1,1,5]");
    }

    #[test]
    fn concat_split() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,3,8"));
        b.input("y", DType::F32, Some("?,5,8"));
        b.node("Concat", &["x", "y"], &["c"], vec![ai("axis", 1)]);
        b.node("Concat", &["x", "x"], &["c2"], vec![ai("axis", 0)]);
        b.node("Split", &["x"], &["s1", "s2"], vec![ai("axis", 2)]);
        b.node(
            "Split",
            &["x"],
            &["t1", "t2"],
            vec![ai("axis", -1), ais("split", &[3, 5])],
        );
        b.run(11);
        assert_eq!(b.ty("c"), "float[b,8,8]");
        assert_eq!(b.ty("c2"), "float[?,3,8]");
        assert_eq!(b.ty("s1"), "float[b,3,4]");
        assert_eq!(b.ty("t2"), "float[b,3,5]");

        let mut b = B::new();
        b.input("x", DType::F32, Some("b,3,10"));
        b.init_i64("sp", &[2], &[4, 6]);
        b.node("Split", &["x", "sp"], &["a", "c"], vec![ai("axis", 2)]);
        b.node(
            "Split",
            &["x"],
            &["p", "q", "r"],
            vec![ai("axis", 2), ai("num_outputs", 3)],
        );
        b.run(18);
        assert_eq!(b.ty("a"), "float[b,3,4]");
        assert_eq!(b.ty("c"), "float[b,3,6]");
        assert_eq!(b.ty("p"), "float[b,3,4]");
        assert_eq!(b.ty("r"), "float[b,3,2]");
    }

    #[test]
    fn slice_forms() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,10,20"));
        b.node(
            "Slice",
            &["x"],
            &["a"],
            vec![
                ais("starts", &[1, 0]),
                ais("ends", &[-1, 100]),
                ais("axes", &[1, 2]),
            ],
        );
        b.run(9);
        assert_eq!(b.ty("a"), "float[b,8,20]");

        let mut b = B::new();
        b.input("x", DType::F32, Some("b,10,20"));
        b.input("dyn", DType::I64, Some("1"));
        b.init_i64("st", &[2], &[0, 19]);
        b.init_i64("en", &[2], &[i64::MAX, -100]);
        b.init_i64("ax", &[2], &[0, 2]);
        b.init_i64("stp", &[2], &[1, -2]);
        b.init_i64("s1", &[1], &[2]);
        b.init_i64("e1", &[1], &[8]);
        b.init_i64("a1", &[1], &[-2]);
        b.init_i64("k3", &[1], &[3]);
        b.node("Slice", &["x", "st", "en", "ax", "stp"], &["a"], vec![]);
        b.node("Slice", &["x", "s1", "e1", "a1", "k3"], &["c"], vec![]);
        b.node("Slice", &["x", "s1", "dyn", "a1"], &["d"], vec![]);
        b.node("Slice", &["x", "s1", "e1"], &["e"], vec![]);
        b.run(13);
        assert_eq!(b.ty("a"), "float[b,10,10]");
        assert_eq!(b.ty("c"), "float[b,2,20]");
        assert_eq!(b.ty("d"), "float[b,?,20]");
        assert_eq!(b.ty("e"), "float[?,10,20]");
    }

    /// `bias[:, :, :seq]` where `seq` comes from Shape: a symbolic bound.
    #[test]
    fn slice_symbolic_end() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("batch,seq,64"));
        b.input("mask", DType::Bool, Some("1,1,1024,1024"));
        b.init_i64("i1", &[1], &[1]);
        b.init_i64("i2", &[1], &[2]);
        b.init_i64("z", &[1], &[0]);
        b.init_i64("ax", &[1], &[3]);
        b.node("Shape", &["x"], &["sh"], vec![]);
        b.node("Slice", &["sh", "i1", "i2"], &["s"], vec![]);
        b.node("Slice", &["mask", "z", "s", "ax"], &["m"], vec![]);
        let r = b.run(13);
        assert_eq!(b.val(&r, "s").unwrap(), "seq");
        assert_eq!(b.ty("m"), "bool[1,1,1024,seq]");
    }

    #[test]
    fn gathers_and_scatters() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("5,6,7"));
        b.input("i", DType::I64, Some("b,2"));
        b.input("ie", DType::I64, Some("5,2,7"));
        b.input("ind", DType::I64, Some("b,2"));
        b.input("u", DType::F32, Some("b,7"));
        b.node("Gather", &["x", "i"], &["g"], vec![ai("axis", 1)]);
        b.node("GatherElements", &["x", "ie"], &["ge"], vec![ai("axis", 1)]);
        b.node("GatherND", &["x", "ind"], &["gn"], vec![]);
        b.node("ScatterND", &["x", "ind", "u"], &["sn"], vec![]);
        b.node("ScatterElements", &["x", "ie", "ie"], &["se"], vec![]);
        b.run(16);
        assert_eq!(b.ty("g"), "float[5,b,2,7]");
        assert_eq!(b.ty("ge"), "float[5,2,7]");
        assert_eq!(b.ty("gn"), "float[b,7]");
        assert_eq!(b.ty("sn"), "float[5,6,7]");
        assert_eq!(b.ty("se"), "float[5,6,7]");
    }

    /// torch's `expand(-1, n)` export: ConstantOfShape, Mul, Equal, Where.
    #[test]
    fn expand_with_where_equal_pattern() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,1"));
        b.init_i64("tgt", &[2], &[-1, 8]);
        b.init_i64("two", &[1], &[2]);
        b.init_i64("m1", &[], &[-1]);
        b.node(
            "ConstantOfShape",
            &["two"],
            &["ones"],
            vec![at("value", Tensor::from_i64(vec![1], &[1]).unwrap())],
        );
        b.node("Mul", &["ones", "m1"], &["neg"], vec![]);
        b.node("Equal", &["tgt", "neg"], &["eq"], vec![]);
        b.node("Where", &["eq", "ones", "tgt"], &["shape"], vec![]);
        b.node("Expand", &["x", "shape"], &["y"], vec![]);
        b.node("Tile", &["x", "two"], &["bad"], vec![]);
        b.init_i64("reps", &[2], &[2, 3]);
        b.node("Tile", &["x", "reps"], &["t"], vec![]);
        let r = b.run(13);
        assert_eq!(b.val(&r, "shape").unwrap(), "1,8");
        assert_eq!(b.ty("ones"), "int64[2]");
        assert_eq!(b.ty("eq"), "bool[2]");
        assert_eq!(b.ty("y"), "float[b,8]");
        assert_eq!(b.ty("bad"), "float[?,?]");
        assert_eq!(b.ty("t"), "float[?,3]");
    }

    #[test]
    fn pad_shape_size_constants() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("n,3,32,32"));
        b.init_i64("pads", &[8], &[0, 0, 1, 2, 0, 0, 1, 2]);
        b.node("Pad", &["x", "pads"], &["p"], vec![]);
        b.node(
            "Shape",
            &["x"],
            &["sh"],
            vec![ai("start", 1), ai("end", -1)],
        );
        b.node("Size", &["x"], &["sz"], vec![]);
        b.node("ConstantOfShape", &["sh"], &["cos"], vec![]);
        b.node(
            "Constant",
            &[],
            &["k1"],
            vec![ais("value_ints", &[1, 2, 3])],
        );
        b.node("Constant", &[], &["k2"], vec![af("value_float", 1.0)]);
        b.node(
            "Constant",
            &[],
            &["k3"],
            vec![at(
                "value",
                Tensor::from_f32(vec![2, 2], &[0.0; 4]).unwrap(),
            )],
        );
        b.node("Constant", &[], &["k4"], vec![astr("value_string", "hi")]);
        b.node("Range", &["k0", "k5", "k6"], &["rg"], vec![]);
        b.node("NonZero", &["x"], &["nz"], vec![]);
        let r = b.run(18);
        assert_eq!(b.ty("p"), "float[n,3,34,36]");
        assert_eq!(b.ty("sh"), "int64[2]");
        assert_eq!(b.val(&r, "sh").unwrap(), "3,32");
        assert_eq!(b.ty("sz"), "int64[]");
        assert_eq!(b.ty("cos"), "float[3,32]");
        assert_eq!(b.ty("k1"), "int64[3]");
        assert_eq!(b.ty("k2"), "float[]");
        assert_eq!(b.ty("k3"), "float[2,2]");
        assert_eq!(b.ty("k4"), "string[]");
        assert_eq!(b.ty("rg"), "none");
        assert_eq!(b.ty("nz"), "int64[4,?]");
    }

    /// Shape values follow int and float arithmetic only where exact.
    #[test]
    fn shape_value_arithmetic() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,6,10"));
        b.init_i64("two", &[], &[2]);
        b.init_i64("i2", &[], &[2]);
        b.node("Shape", &["x"], &["sh"], vec![]);
        b.node("Gather", &["sh", "i2"], &["w"], vec![]);
        b.node("Div", &["w", "two"], &["half"], vec![]);
        b.node("Mul", &["sh", "two"], &["dbl"], vec![]);
        b.node("Cast", &["w"], &["wf"], vec![ai("to", 1)]);
        b.node("Cast", &["w"], &["wh"], vec![ai("to", 10)]);
        b.init_f32("three", &[], &[3.0]);
        b.node("Div", &["wf", "three"], &["third"], vec![]);
        b.node("Floor", &["third"], &["fl"], vec![]);
        b.node("Cast", &["half"], &["hb"], vec![ai("to", 9)]);
        b.node("ReduceProd", &["sh"], &["numel"], vec![ai("keepdims", 0)]);
        b.node("Equal", &["sh", "sh"], &["same"], vec![]);
        let r = b.run(13);
        assert_eq!(b.val(&r, "half").unwrap(), "5");
        assert_eq!(b.ty("half"), "int64[]");
        assert_eq!(b.val(&r, "dbl").unwrap(), "?,12,20");
        assert_eq!(b.val(&r, "wf").unwrap(), "10");
        assert_eq!(b.val(&r, "wh"), None);
        assert_eq!(b.val(&r, "third").unwrap(), "?");
        assert_eq!(b.val(&r, "hb").unwrap(), "1");
        assert_eq!(b.val(&r, "numel").unwrap(), "?");
        assert_eq!(b.val(&r, "same").unwrap(), "1,1,1");
    }

    #[test]
    fn pad_attr_form() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("1,3,5"));
        b.node(
            "Pad",
            &["x"],
            &["p"],
            vec![ais("pads", &[0, 1, 2, 0, 1, 2])],
        );
        b.run(9);
        assert_eq!(b.ty("p"), "float[1,5,9]");
    }

    #[test]
    fn range_and_onehot() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,seq"));
        b.init_i64("z", &[], &[0]);
        b.init_i64("one", &[], &[1]);
        b.init_i64("ten", &[], &[10]);
        b.init_i64("three", &[], &[3]);
        b.node("Range", &["z", "ten", "three"], &["r"], vec![]);
        b.node("Shape", &["x"], &["sh"], vec![]);
        b.node("Gather", &["sh", "one"], &["s"], vec![]);
        b.node("Range", &["z", "s", "one"], &["pos"], vec![]);
        b.input("idx", DType::I64, Some("b,4"));
        b.input("vals", DType::F32, Some("2"));
        b.node("OneHot", &["idx", "ten", "vals"], &["oh"], vec![]);
        b.node(
            "OneHot",
            &["idx", "ten", "vals"],
            &["oh1"],
            vec![ai("axis", 1)],
        );
        let r = b.run(13);
        assert_eq!(b.ty("r"), "int64[4]");
        assert_eq!(b.val(&r, "r").unwrap(), "0,3,6,9");
        assert_eq!(b.ty("pos"), "int64[seq]");
        assert_eq!(b.ty("oh"), "float[b,4,10]");
        assert_eq!(b.ty("oh1"), "float[b,10,4]");
    }

    #[test]
    fn resize_and_upsample() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("n,3,16,16"));
        b.init_f32("sc", &[4], &[1.0, 1.0, 2.0, 2.0]);
        b.init_i64("sz", &[4], &[1, 3, 5, 7]);
        b.init_f32("roi", &[0], &[]);
        b.node("Resize", &["x", "", "sc"], &["a"], vec![]);
        b.node("Resize", &["x", "roi", "", "sz"], &["c"], vec![]);
        b.node("Upsample", &["x", "sc"], &["u"], vec![]);
        b.run(13);
        assert_eq!(b.ty("a"), "float[n,3,32,32]");
        assert_eq!(b.ty("c"), "float[1,3,5,7]");
        assert_eq!(b.ty("u"), "float[n,3,32,32]");

        let mut b = B::new();
        b.input("x", DType::F32, Some("n,3,16,16"));
        b.node(
            "Upsample",
            &["x"],
            &["u"],
            vec![afs("scales", &[1.0, 1.0, 3.0, 3.0])],
        );
        b.run(7);
        assert_eq!(b.ty("u"), "float[n,3,48,48]");

        // keep_aspect_ratio_policy: one scale (min / max of sizes / input
        // over the axes), each length round_half_up(scale * input).
        let mut b = B::new();
        b.input("x", DType::F32, Some("n,3,20,30"));
        b.init_i64("sz", &[2], &[24, 10]);
        for (out, policy) in [("l", "not_larger"), ("s", "not_smaller")] {
            b.node(
                "Resize",
                &["x", "", "", "sz"],
                &[out],
                vec![
                    ais("axes", &[3, 2]),
                    astr("keep_aspect_ratio_policy", policy),
                ],
            );
        }
        b.run(18);
        assert_eq!(b.ty("l"), "float[n,3,10,15]");
        assert_eq!(b.ty("s"), "float[n,3,16,24]");
    }

    #[test]
    fn misc_movement() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("1,8,4,4"));
        b.node("DepthToSpace", &["x"], &["d"], vec![ai("blocksize", 2)]);
        b.node("SpaceToDepth", &["x"], &["s"], vec![ai("blocksize", 2)]);
        b.node("Trilu", &["x"], &["t"], vec![]);
        b.node("Transpose", &["x"], &["tr"], vec![]);
        b.node(
            "Transpose",
            &["x"],
            &["bad"],
            vec![ais("perm", &[0, 0, 1, 2])],
        );
        b.run(14);
        assert_eq!(b.ty("d"), "float[1,2,8,8]");
        assert_eq!(b.ty("s"), "float[1,32,2,2]");
        assert_eq!(b.ty("t"), "float[1,8,4,4]");
        assert_eq!(b.ty("tr"), "float[4,4,8,1]");
        assert_eq!(b.ty("bad"), "float");
    }

    #[test]
    fn col2im_and_affine_grid() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("2,12,20"));
        b.init_i64("img", &[2], &[5, 6]);
        b.init_i64("blk", &[2], &[2, 3]);
        b.node("Col2Im", &["x", "img", "blk"], &["c"], vec![]);
        b.input("img_in", DType::I64, Some("3"));
        b.node("Col2Im", &["x", "img_in", "blk"], &["cu"], vec![]);
        b.input("th", DType::F32, Some("2,2,3"));
        b.init_i64("sz", &[4], &[2, 3, 7, 9]);
        b.node(
            "AffineGrid",
            &["th", "sz"],
            &["g"],
            vec![ai("align_corners", 1)],
        );
        b.input("th3", DType::F32, Some("1,3,4"));
        b.init_i64("sz3", &[5], &[1, 1, 4, 5, 6]);
        b.node("AffineGrid", &["th3", "sz3"], &["g3"], vec![]);
        b.input("sz_in", DType::I64, Some("5"));
        b.node("AffineGrid", &["th3", "sz_in"], &["gu"], vec![]);
        b.run(20);
        assert_eq!(b.ty("c"), "float[2,2,5,6]");
        assert_eq!(b.ty("cu"), "float[2,2,?,?,?]");
        assert_eq!(b.ty("g"), "float[2,7,9,2]");
        assert_eq!(b.ty("g3"), "float[1,4,5,6,3]");
        assert_eq!(b.ty("gu"), "float[?,?,?,?,3]");
    }
}

mod nn {
    use super::*;

    #[test]
    fn resnet_stem() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("N,3,224,224"));
        b.input("w", DType::F32, Some("64,3,7,7"));
        b.input("fw", DType::F32, Some("1000,512"));
        b.node(
            "Conv",
            &["x", "w"],
            &["c"],
            vec![
                ais("kernel_shape", &[7, 7]),
                ais("pads", &[3, 3, 3, 3]),
                ais("strides", &[2, 2]),
            ],
        );
        b.node(
            "BatchNormalization",
            &["c", "s", "bb", "m", "v"],
            &["bn"],
            vec![],
        );
        b.node("Relu", &["bn"], &["r"], vec![]);
        b.node(
            "MaxPool",
            &["r"],
            &["p"],
            vec![
                ais("kernel_shape", &[3, 3]),
                ais("pads", &[1, 1, 1, 1]),
                ais("strides", &[2, 2]),
            ],
        );
        b.node("GlobalAveragePool", &["p"], &["gap"], vec![]);
        b.node("Flatten", &["gap"], &["fl"], vec![]);
        b.node("Gemm", &["fl", "fw"], &["fc"], vec![ai("transB", 1)]);
        b.run(13);
        assert_eq!(b.ty("c"), "float[N,64,112,112]");
        assert_eq!(b.ty("bn"), "float[N,64,112,112]");
        assert_eq!(b.ty("p"), "float[N,64,56,56]");
        assert_eq!(b.ty("gap"), "float[N,64,1,1]");
        assert_eq!(b.ty("fl"), "float[N,64]");
        assert_eq!(b.ty("fc"), "float[N,1000]");
    }

    #[test]
    fn conv_variants() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("1,32,17,17"));
        b.input("dw", DType::F32, Some("32,1,3,3"));
        b.input("tw", DType::F32, Some("32,16,4,4"));
        b.node(
            "Conv",
            &["x", "dw"],
            &["same"],
            vec![
                ai("group", 32),
                astr("auto_pad", "SAME_UPPER"),
                ais("strides", &[2, 2]),
            ],
        );
        b.node(
            "Conv",
            &["x", "dw"],
            &["valid"],
            vec![ai("group", 32), ais("dilations", &[2, 2])],
        );
        b.node(
            "ConvTranspose",
            &["x", "tw"],
            &["ct"],
            vec![ais("strides", &[2, 2]), ais("pads", &[1, 1, 1, 1])],
        );
        b.node(
            "ConvTranspose",
            &["x", "tw"],
            &["cto"],
            vec![ais("output_shape", &[40, 40])],
        );
        b.node(
            "AveragePool",
            &["x"],
            &["ap"],
            vec![
                ais("kernel_shape", &[3, 3]),
                ais("strides", &[2, 2]),
                ai("ceil_mode", 1),
            ],
        );
        b.node(
            "MaxPool",
            &["x"],
            &["mp", "mi"],
            vec![ais("kernel_shape", &[2, 2])],
        );
        b.run(13);
        assert_eq!(b.ty("same"), "float[1,32,9,9]");
        assert_eq!(b.ty("valid"), "float[1,32,13,13]");
        assert_eq!(b.ty("ct"), "float[1,16,34,34]");
        assert_eq!(b.ty("cto"), "float[1,16,40,40]");
        assert_eq!(b.ty("ap"), "float[1,32,8,8]");
        assert_eq!(b.ty("mp"), "float[1,32,16,16]");
        assert_eq!(b.ty("mi"), "int64[1,32,16,16]");
    }

    #[test]
    fn norms() {
        let mut b = B::new();
        b.input("x", DType::F16, Some("b,s,768"));
        b.node(
            "LayerNormalization",
            &["x", "g", "bb"],
            &["y", "mean", "isd"],
            vec![ai("axis", -1)],
        );
        b.node("InstanceNormalization", &["x", "g", "bb"], &["i"], vec![]);
        b.node(
            "GroupNormalization",
            &["x", "g", "bb"],
            &["gn"],
            vec![ai("num_groups", 4)],
        );
        b.run(18);
        assert_eq!(b.ty("y"), "float16[b,s,768]");
        assert_eq!(b.ty("mean"), "float[b,s,1]");
        assert_eq!(b.ty("i"), "float16[b,s,768]");
        assert_eq!(b.ty("gn"), "float16[b,s,768]");
    }

    #[test]
    fn matmuls() {
        let mut b = B::new();
        b.input("a", DType::F32, Some("b,h,s,64"));
        b.input("k", DType::F32, Some("b,h,64,t"));
        b.input("w", DType::F32, Some("64,10"));
        b.input("v", DType::F32, Some("64"));
        b.node("MatMul", &["a", "k"], &["qk"], vec![]);
        b.node("MatMul", &["a", "w"], &["aw"], vec![]);
        b.node("MatMul", &["a", "v"], &["av"], vec![]);
        b.node("MatMul", &["v", "w"], &["vw"], vec![]);
        b.node("MatMul", &["v", "v"], &["vv"], vec![]);
        b.input("q8", DType::U8, Some("4,64"));
        b.input("w8", DType::I8, Some("64,10"));
        b.node("MatMulInteger", &["q8", "w8"], &["mi"], vec![]);
        b.run(13);
        assert_eq!(b.ty("qk"), "float[b,h,s,t]");
        assert_eq!(b.ty("aw"), "float[b,h,s,10]");
        assert_eq!(b.ty("av"), "float[b,h,s]");
        assert_eq!(b.ty("vw"), "float[10]");
        assert_eq!(b.ty("vv"), "float[]");
        assert_eq!(b.ty("mi"), "int32[4,10]");
    }

    #[test]
    fn einsum() {
        let mut b = B::new();
        b.input("a", DType::F32, Some("b,i,k"));
        b.input("c", DType::F32, Some("b,k,j"));
        b.input("x", DType::F32, Some("2,3,4,5"));
        b.node(
            "Einsum",
            &["a", "c"],
            &["o"],
            vec![astr("equation", "bik,bkj->bij")],
        );
        b.node(
            "Einsum",
            &["a", "c"],
            &["imp"],
            vec![astr("equation", "bik,bkj")],
        );
        b.node(
            "Einsum",
            &["x"],
            &["e"],
            vec![astr("equation", "...ij->...ji")],
        );
        b.node("Einsum", &["x"], &["tr"], vec![astr("equation", "abcd->")]);
        b.node("Einsum", &["x"], &["bad"], vec![astr("equation", "ab->a")]);
        b.run(13);
        assert_eq!(b.ty("o"), "float[b,i,j]");
        assert_eq!(b.ty("imp"), "float[i,j]");
        assert_eq!(b.ty("e"), "float[2,3,5,4]");
        assert_eq!(b.ty("tr"), "float[]");
        assert_eq!(b.ty("bad"), "float");
    }

    #[test]
    fn quantization() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("1,3,8,8"));
        b.input("zp", DType::I8, Some(""));
        b.input("sc", DType::F32, Some(""));
        b.input("w", DType::I8, Some("4,3,3,3"));
        b.node("QuantizeLinear", &["x", "sc", "zp"], &["q"], vec![]);
        b.node("QuantizeLinear", &["x", "sc"], &["qu"], vec![]);
        b.node("DequantizeLinear", &["q", "sc", "zp"], &["dq"], vec![]);
        b.node("DynamicQuantizeLinear", &["x"], &["y", "ys", "yz"], vec![]);
        b.node("ConvInteger", &["q", "w"], &["ci"], vec![]);
        b.node(
            "QLinearConv",
            &["q", "sc", "zp", "w", "sc", "zp", "sc", "zp"],
            &["qc"],
            vec![],
        );
        b.run(13);
        assert_eq!(b.ty("q"), "int8[1,3,8,8]");
        assert_eq!(b.ty("qu"), "uint8[1,3,8,8]");
        assert_eq!(b.ty("dq"), "float[1,3,8,8]");
        assert_eq!(b.ty("y"), "uint8[1,3,8,8]");
        assert_eq!(b.ty("ys"), "float[]");
        assert_eq!(b.ty("ci"), "int32[1,4,6,6]");
        assert_eq!(b.ty("qc"), "int8[1,4,6,6]");
    }

    #[test]
    fn recurrent_and_attention() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("seq,b,10"));
        b.input("w", DType::F32, Some("2,80,10"));
        b.input("r", DType::F32, Some("2,80,20"));
        b.node(
            "LSTM",
            &["x", "w", "r"],
            &["y", "yh", "yc"],
            vec![ai("hidden_size", 20), astr("direction", "bidirectional")],
        );
        b.input("q", DType::F32, Some("b,8,s,64"));
        b.input("k", DType::F32, Some("b,8,t,64"));
        b.input("v", DType::F32, Some("b,8,t,32"));
        b.node("Attention", &["q", "k", "v"], &["att"], vec![]);
        b.run(23);
        assert_eq!(b.ty("y"), "float[seq,2,b,20]");
        assert_eq!(b.ty("yc"), "float[2,b,20]");
        assert_eq!(b.ty("att"), "float[b,8,s,32]");
    }

    #[test]
    fn topk_argmax_cumsum_cumprod() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,100"));
        b.init_i64("k", &[1], &[5]);
        b.init_i64("ax", &[], &[1]);
        b.node("TopK", &["x", "k"], &["v", "i"], vec![]);
        b.node(
            "ArgMax",
            &["x"],
            &["am"],
            vec![ai("axis", 1), ai("keepdims", 0)],
        );
        b.node("ArgMin", &["x"], &["an"], vec![]);
        b.node("CumSum", &["x", "ax"], &["cs"], vec![]);
        b.node("CumProd", &["x", "ax"], &["cp"], vec![ai("exclusive", 1)]);
        b.node("Softmax", &["x"], &["sm"], vec![ai("axis", -1)]);
        b.run(13);
        assert_eq!(b.ty("v"), "float[b,5]");
        assert_eq!(b.ty("i"), "int64[b,5]");
        assert_eq!(b.ty("am"), "int64[b]");
        assert_eq!(b.ty("an"), "int64[1,100]");
        assert_eq!(b.ty("cs"), "float[b,100]");
        assert_eq!(b.ty("cp"), "float[b,100]");
        assert_eq!(b.ty("sm"), "float[b,100]");
    }
}

mod reduce {
    use super::*;

    #[test]
    fn reductions() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,s,768"));
        b.init_i64("ax", &[1], &[-1]);
        b.init_i64("none", &[0], &[]);
        b.node("ReduceMean", &["x"], &["m"], vec![ais("axes", &[-1])]);
        b.node("ReduceMean", &["x"], &["all"], vec![ai("keepdims", 0)]);
        b.node("ReduceSum", &["x", "ax"], &["s"], vec![ai("keepdims", 0)]);
        b.node(
            "ReduceSum",
            &["x", "none"],
            &["noop"],
            vec![ai("noop_with_empty_axes", 1)],
        );
        b.node("ReduceMax", &["x", "dyn"], &["dk"], vec![]);
        b.node("ReduceMax", &["x", "dyn"], &["dn"], vec![ai("keepdims", 0)]);
        b.node("ReduceL2", &["x"], &["l2"], vec![ais("axes", &[0, 1])]);
        b.run(18);
        assert_eq!(b.ty("m"), "float[b,s,1]");
        assert_eq!(b.ty("all"), "float[]");
        assert_eq!(b.ty("s"), "float[b,s]");
        assert_eq!(b.ty("noop"), "float[b,s,768]");
        assert_eq!(b.ty("dk"), "float[?,?,?]");
        assert_eq!(b.ty("dn"), "float");
        assert_eq!(b.ty("l2"), "float[1,1,768]");
    }
}

mod control {
    use super::*;

    fn branch(name: &str, op: &str, out_spec: Option<&str>) -> Graph {
        let mut b = B::new();
        b.g.name = name.into();
        b.node(op, &["x"], &["o"], vec![]);
        if let Some(s) = out_spec {
            let v = b.g.value_by_name("o").unwrap();
            b.g.value_mut(v).ty = Some(Type::tensor(DType::F32, Some(Shape::new(dims_of(s)))));
        }
        b.output("o");
        b.g
    }

    #[test]
    fn if_branches() {
        let mut b = B::new();
        b.input("c", DType::Bool, Some(""));
        b.input("x", DType::F32, Some("b,4"));
        b.node(
            "If",
            &["c"],
            &["y"],
            vec![
                ag("then_branch", branch("t", "Relu", None)),
                ag("else_branch", branch("e", "Neg", None)),
            ],
        );
        b.node(
            "If",
            &["c"],
            &["z"],
            vec![
                ag("then_branch", branch("t", "Relu", None)),
                ag("else_branch", branch("e", "ReduceMean", Some("?,?"))),
            ],
        );
        let r = b.run(13);
        assert_eq!(b.ty("y"), "float[b,4]");
        assert_eq!(b.ty("z"), "float[?,?]");
        assert!(r.unknown_ops.is_empty());
        // The body was inferred in place; the capture itself stays untyped.
        let n = b.g.order()[0];
        let then = b.g.node(n).attributes[0].graphs().next().unwrap();
        let o = then.value_by_name("o").unwrap();
        assert_eq!(then.ty(o).unwrap().to_string(), "float[b,4]");
        assert!(then.ty(then.value_by_name("x").unwrap()).is_none());
    }

    #[test]
    fn loop_and_scan() {
        let mut body = B::new();
        body.input("i", DType::I64, Some(""));
        body.input("cond", DType::Bool, Some(""));
        let acc = body.g.add_value("acc", None).unwrap();
        body.g.inputs.push(acc);
        body.node("Add", &["acc", "x"], &["acc2"], vec![]);
        body.node("Identity", &["cond"], &["cond2"], vec![]);
        body.node("Relu", &["x"], &["scan"], vec![]);
        body.output("cond2");
        body.output("acc2");
        body.output("scan");
        let mut b = B::new();
        b.input("x", DType::F32, Some("3,4"));
        b.init_i64("n", &[], &[5]);
        b.node(
            "Loop",
            &["n", "", "x"],
            &["fin", "stk"],
            vec![ag("body", body.g)],
        );
        let r = b.run(13);
        assert!(r.unknown_ops.is_empty());
        assert_eq!(b.ty("fin"), "float[3,4]");
        assert_eq!(b.ty("stk"), "float[5,3,4]");

        let mut sb = B::new();
        sb.input("st", DType::F32, Some("4"));
        sb.input("el", DType::F32, Some("4"));
        sb.node("Add", &["st", "el"], &["st2"], vec![]);
        sb.node("Neg", &["el"], &["o"], vec![]);
        sb.output("st2");
        sb.output("o");
        let mut b = B::new();
        b.input("s0", DType::F32, Some("4"));
        b.input("xs", DType::F32, Some("7,4"));
        b.node(
            "Scan",
            &["s0", "xs"],
            &["sf", "ys"],
            vec![ag("body", sb.g), ai("num_scan_inputs", 1)],
        );
        b.run(13);
        assert_eq!(b.ty("sf"), "float[4]");
        assert_eq!(b.ty("ys"), "float[7,4]");
    }

    /// A carried value that grows each iteration: the body must not assume
    /// the first iteration's shape.
    #[test]
    fn loop_growing_carry() {
        let mut body = B::new();
        body.input("i", DType::I64, Some(""));
        body.input("cond", DType::Bool, Some(""));
        let acc = body.g.add_value("acc", None).unwrap();
        body.g.inputs.push(acc);
        body.node("Concat", &["acc", "x"], &["acc2"], vec![ai("axis", 0)]);
        body.node("Identity", &["cond"], &["cond2"], vec![]);
        body.output("cond2");
        body.output("acc2");
        let mut b = B::new();
        b.input("x", DType::F32, Some("1,4"));
        b.input("n", DType::I64, Some(""));
        b.node("Loop", &["n", "", "x"], &["fin"], vec![ag("body", body.g)]);
        b.run(13);
        assert_eq!(b.ty("fin"), "float[?,4]");
        let n = b.g.order()[0];
        let body = b.g.node(n).attributes[0].graphs().next().unwrap();
        assert_eq!(
            body.ty(body.value_by_name("acc").unwrap())
                .unwrap()
                .to_string(),
            "float[?,4]"
        );
    }

    #[test]
    fn sequences_and_optionals() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("2,3"));
        b.input("y", DType::F32, Some("2,5"));
        b.init_i64("z", &[], &[0]);
        b.node("SequenceConstruct", &["x", "y"], &["s"], vec![]);
        b.node("SequenceAt", &["s", "z"], &["a"], vec![]);
        b.node("SequenceLength", &["s"], &["l"], vec![]);
        b.node("SequenceEmpty", &[], &["e"], vec![ai("dtype", 7)]);
        b.node("SequenceInsert", &["s", "x"], &["si"], vec![]);
        b.node(
            "SplitToSequence",
            &["x"],
            &["ss"],
            vec![ai("axis", 1), ai("keepdims", 0)],
        );
        b.node("ConcatFromSequence", &["s"], &["cf"], vec![ai("axis", 0)]);
        b.node("Optional", &["x"], &["o"], vec![]);
        b.node("OptionalGetElement", &["o"], &["og"], vec![]);
        b.node("OptionalHasElement", &["o"], &["oh"], vec![]);
        b.run(18);
        assert_eq!(b.ty("s"), "seq(float[2,?])");
        assert_eq!(b.ty("a"), "float[2,?]");
        assert_eq!(b.ty("l"), "int64[]");
        assert_eq!(b.ty("e"), "seq(int64)");
        assert_eq!(b.ty("si"), "seq(float[2,?])");
        assert_eq!(b.ty("ss"), "seq(float[2])");
        assert_eq!(b.ty("cf"), "float[?,?]");
        assert_eq!(b.ty("o"), "optional(float[2,3])");
        assert_eq!(b.ty("og"), "float[2,3]");
        assert_eq!(b.ty("oh"), "bool[]");
    }
}

mod driver {
    use super::*;
    use crate::{Function, Model, OpsetImport};

    #[test]
    fn unknown_op_leaves_outputs_untouched() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("2"));
        b.node("FancyOp", &["x"], &["y"], vec![]);
        b.node("Relu", &["y"], &["z"], vec![]);
        let mut nn = NewNode::new("Other").domain("com.acme");
        nn.inputs = vec![b.g.value_by_name("x")];
        nn.outputs = vec![Some(b.g.add_value("w", None).unwrap())];
        b.g.add_node(nn).unwrap();
        b.node("FancyOp", &["x"], &["y2"], vec![]);
        let r = b.run(17);
        assert_eq!(b.ty("y"), "none");
        assert_eq!(b.ty("z"), "none");
        assert_eq!(b.ty("w"), "none");
        assert_eq!(
            r.unknown_ops,
            vec!["FancyOp".to_string(), "com.acme::Other".to_string()]
        );
    }

    #[test]
    fn refine_and_conflicts() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("b,3"));
        b.node("Relu", &["x"], &["y"], vec![]);
        b.node("Relu", &["x"], &["z"], vec![]);
        b.node("Relu", &["x"], &["u"], vec![]);
        let y = b.g.value_by_name("y").unwrap();
        b.g.value_mut(y).ty = Some(Type::tensor(DType::F32, Some(Shape::new(dims_of("?,?")))));
        let z = b.g.value_by_name("z").unwrap();
        b.g.value_mut(z).ty = Some(Type::tensor(DType::F32, Some(Shape::new(dims_of("b,4")))));
        let u = b.g.value_by_name("u").unwrap();
        b.g.value_mut(u).ty = Some(Type::tensor(DType::F32, None));
        let r = b.run(17);
        assert_eq!(b.ty("y"), "float[b,3]");
        assert_eq!(b.ty("z"), "float[b,4]");
        assert_eq!(b.ty("u"), "float[b,3]");
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(r.warnings[0].contains("'z'"));
        assert_eq!(r.inferred, 2);
        // Idempotent.
        let r2 = b.run(17);
        assert_eq!(r2.inferred, 0);
    }

    #[test]
    fn dim_binding() {
        let mut b = B::new();
        b.input("x", DType::F32, Some("batch,seq"));
        b.node("Shape", &["x"], &["sh"], vec![]);
        b.node("ConstantOfShape", &["sh"], &["c"], vec![]);
        b.node("Transpose", &["x"], &["t"], vec![]);
        let opts = InferOptions {
            dims: vec![("batch".into(), 2)],
            ..Default::default()
        };
        let r = infer_graph(&mut b.g, 17, &opts);
        assert_eq!(b.ty("x"), "float[2,seq]");
        assert_eq!(b.ty("c"), "float[2,seq]");
        assert_eq!(b.ty("t"), "float[seq,2]");
        assert_eq!(b.val(&r, "sh").unwrap(), "2,seq");
        let vals = const_shape_values(&b.g, 17, &InferOptions::default());
        assert_eq!(
            vals.get(&b.g.value_by_name("sh").unwrap()).unwrap().len(),
            2
        );
    }

    #[test]
    fn model_and_functions() {
        // A local function `Twice(X) = Add(X, X)` with an attribute ref.
        let mut body = B::new();
        let xi = body.g.add_value("X", None).unwrap();
        body.g.inputs.push(xi);
        body.node("Add", &["X", "X"], &["s"], vec![]);
        body.node(
            "Softmax",
            &["s"],
            &["Y"],
            vec![Attribute::new(
                "axis",
                AttrValue::Ref {
                    attr: "ax".into(),
                    kind: crate::AttrKind::Int,
                },
            )],
        );
        body.output("Y");
        let f = Function {
            name: "Twice".into(),
            domain: "local".into(),
            overload: String::new(),
            attributes: vec!["ax".into()],
            attribute_defaults: vec![],
            opset_imports: vec![OpsetImport {
                domain: String::new(),
                version: 18,
            }],
            doc_string: String::new(),
            metadata_props: vec![],
            body: body.g,
        };
        let mut b = B::new();
        b.input("x", DType::F16, Some("n,4"));
        let mut nn = NewNode::new("Twice").domain("local");
        nn.inputs = vec![b.g.value_by_name("x")];
        nn.outputs = vec![Some(b.g.add_value("y", None).unwrap())];
        nn.attributes = vec![ai("ax", 1)];
        b.g.add_node(nn).unwrap();
        b.node("Relu", &["y"], &["z"], vec![]);
        let mut m = Model::new(b.g, 18);
        m.functions.push(f);
        let r = infer_model(&mut m, &InferOptions::default());
        assert!(r.unknown_ops.is_empty(), "{:?}", r.unknown_ops);
        let z = m.graph.value_by_name("z").unwrap();
        assert_eq!(m.graph.ty(z).unwrap().to_string(), "float16[n,4]");
        // The function's own body is untouched.
        let s = m.functions[0].body.value_by_name("s").unwrap();
        assert!(m.functions[0].body.ty(s).is_none());
    }

    #[test]
    fn initializer_types_filled() {
        let mut b = B::new();
        b.init_f32("w", &[2, 2], &[0.0; 4]);
        b.node("Relu", &["w"], &["y"], vec![]);
        b.run(17);
        assert_eq!(b.ty("w"), "float[2,2]");
        assert_eq!(b.ty("y"), "float[2,2]");
    }
}

mod robustness {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn negative_and_huge_dims() {
        let big = i64::MAX.to_string();
        for spec in [
            "-3,4,5",
            "0,0,0",
            "9223372036854775807,2,3",
            "-9223372036854775808,-1,1",
        ] {
            let mut b = B::new();
            b.input("x", DType::F32, Some(spec));
            b.init_i64("st", &[1], &[i64::MIN]);
            b.init_i64("en", &[1], &[i64::MAX]);
            b.init_i64("ax", &[1], &[0]);
            b.init_i64("neg", &[1], &[-2]);
            b.init_i64("sh", &[2], &[-1, 2]);
            b.node(
                "Split",
                &["x"],
                &["a", "c", "d"],
                vec![ai("num_outputs", 3)],
            );
            b.node("Split", &["x"], &["e", "f"], vec![]);
            b.node("Slice", &["x", "st", "en", "ax", "neg"], &["s"], vec![]);
            b.node("Slice", &["x", "en", "st", "ax", "neg"], &["s2"], vec![]);
            b.node("Reshape", &["x", "sh"], &["r"], vec![]);
            b.node("Flatten", &["x"], &["fl"], vec![]);
            b.node("Tile", &["x", "en"], &["t"], vec![]);
            b.node("Pad", &["x", "sh"], &["p"], vec![]);
            b.node(
                "Conv",
                &["x", "x"],
                &["c1"],
                vec![ais("strides", &[i64::MIN])],
            );
            b.node(
                "MaxPool",
                &["x"],
                &["mp"],
                vec![ais("kernel_shape", &[i64::MAX]), ai("ceil_mode", 1)],
            );
            b.node(
                "ConvTranspose",
                &["x", "x"],
                &["ct"],
                vec![ais("output_padding", &[i64::MAX])],
            );
            b.node(
                "DepthToSpace",
                &["x"],
                &["ds"],
                vec![ai("blocksize", i64::MAX)],
            );
            b.node("Range", &["st", "en", "neg"], &["rg"], vec![]);
            b.node(
                "Shape",
                &["x"],
                &["shp"],
                vec![ai("start", i64::MIN), ai("end", i64::MAX)],
            );
            b.node("Resize", &["x", "", "", "sh"], &["rs"], vec![]);
            b.node("OneHot", &["x", "en", "x"], &["oh"], vec![]);
            b.node(
                "Einsum",
                &["x"],
                &["es"],
                vec![astr("equation", "...ab...->")],
            );
            let _ = b.run(18);
            let _ = big.len();
        }
    }

    const OPS: &[&str] = &[
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Concat",
        "Split",
        "Slice",
        "Gather",
        "GatherND",
        "Expand",
        "Tile",
        "Pad",
        "Shape",
        "ConstantOfShape",
        "Range",
        "OneHot",
        "Resize",
        "Upsample",
        "DepthToSpace",
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "Gemm",
        "MatMul",
        "Einsum",
        "TopK",
        "ArgMax",
        "ReduceSum",
        "ReduceMean",
        "LayerNormalization",
        "If",
        "Loop",
        "Scan",
        "SequenceAt",
        "SplitToSequence",
        "Add",
        "Where",
        "Cast",
        "Compress",
        "Unique",
        "CenterCropPad",
        "GridSample",
        "MaxUnpool",
        "RoiAlign",
        "Col2Im",
        "AffineGrid",
        "Constant",
        "QLinearConv",
        "BatchNormalization",
        "Size",
        "NonZero",
        "DFT",
        "STFT",
    ];
    const NAMES: &[&str] = &[
        "axis",
        "axes",
        "perm",
        "split",
        "num_outputs",
        "starts",
        "ends",
        "shape",
        "pads",
        "strides",
        "dilations",
        "kernel_shape",
        "group",
        "output_shape",
        "output_padding",
        "keepdims",
        "k",
        "to",
        "blocksize",
        "equation",
        "start",
        "end",
        "auto_pad",
        "ceil_mode",
        "batch_dims",
        "value",
        "scales",
        "allowzero",
        "transA",
        "num_scan_inputs",
        "scan_input_axes",
        "dtype",
    ];

    fn attr_strategy() -> impl Strategy<Value = Attribute> {
        let big = prop_oneof![
            Just(i64::MIN),
            Just(i64::MAX),
            Just(-1i64),
            Just(0i64),
            -10i64..10,
            Just(1i64 << 40)
        ];
        let val = prop_oneof![
            big.clone().prop_map(AttrValue::Int),
            prop::collection::vec(big, 0..6).prop_map(AttrValue::Ints),
            prop_oneof![
                Just("SAME_UPPER"),
                Just("ij,jk"),
                Just("...->"),
                Just(",->"),
                Just("a...a->")
            ]
            .prop_map(|s| AttrValue::String(s.as_bytes().to_vec())),
            any::<f32>().prop_map(AttrValue::Float),
            prop::collection::vec(any::<f32>(), 0..5).prop_map(AttrValue::Floats),
            Just(AttrValue::Tensor(
                Tensor::from_i64(vec![2], &[i64::MAX, -3]).unwrap()
            )),
            Just(AttrValue::Graph(Box::new(Graph::new("empty")))),
        ];
        (prop::sample::select(NAMES), val).prop_map(|(n, v)| Attribute::new(n, v))
    }

    fn dim_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            (0i64..6).prop_map(|v| v.to_string()),
            Just("-3".to_string()),
            Just("9223372036854775807".to_string()),
            Just("n".to_string()),
            Just("?".to_string()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]
        #[test]
        fn no_panic_on_random_nodes(
            op in prop::sample::select(OPS),
            attrs in prop::collection::vec(attr_strategy(), 0..4),
            shapes in prop::collection::vec(prop::option::of(prop::collection::vec(dim_strategy(), 0..5)), 0..5),
            ints in prop::collection::vec(prop_oneof![Just(i64::MIN), Just(i64::MAX), -5i64..300], 0..5),
            nout in 0usize..4,
        ) {
            let mut b = B::new();
            let mut names = Vec::new();
            for (i, s) in shapes.iter().enumerate() {
                let name = format!("in{i}");
                let spec = s.as_ref().map(|d| d.join(","));
                b.input(&name, if i % 2 == 0 { DType::F32 } else { DType::I64 }, spec.as_deref());
                names.push(name);
            }
            let sc = format!("c{}", names.len());
            let t = if ints.len() == 1 { Tensor::scalar_i64(ints[0]) } else { Tensor::from_i64(vec![ints.len() as i64], &ints).unwrap() };
            let v = b.g.add_value(sc.as_str(), None).unwrap();
            b.g.set_initializer(v, t);
            names.insert(1.min(names.len()), sc);
            let ins: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            let outs: Vec<String> = (0..nout).map(|i| format!("out{i}")).collect();
            let outs: Vec<&str> = outs.iter().map(|s| s.as_str()).collect();
            b.node(op, &ins, &outs, attrs.clone());
            b.node("Shape", &ins[..1.min(ins.len())], &["sh"], vec![]);
            b.node(op, &["sh", "sh", "sh"], &["o2"], attrs);
            for opset in [7, 11, 13, 18] {
                let mut g = b.g.clone();
                let _ = infer_graph(&mut g, opset, &InferOptions { dims: vec![("n".into(), -4)], ..Default::default() });
            }
        }
    }
}
