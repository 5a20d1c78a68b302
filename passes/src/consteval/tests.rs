use super::*;
use graphopt_ir::{Attribute, NewNode};

fn i64t(dims: &[i64], v: &[i64]) -> Tensor {
    Tensor::from_i64(dims.to_vec(), v).unwrap()
}
fn i32t(dims: &[i64], v: &[i32]) -> Tensor {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::from_raw(DType::I32, dims.to_vec(), raw.into()).unwrap()
}
fn f32t(dims: &[i64], v: &[f32]) -> Tensor {
    Tensor::from_f32(dims.to_vec(), v).unwrap()
}

fn node(op: &str, attrs: Vec<Attribute>, nin: usize) -> NodeData {
    // Build a NodeData through a scratch graph (its fields are private).
    let mut g = graphopt_ir::Graph::new("t");
    let ins: Vec<_> = (0..nin)
        .map(|i| g.add_value(format!("i{i}"), None).unwrap())
        .collect();
    let o = g.add_value("o", None).unwrap();
    let mut nn = NewNode::new(op).inputs(&ins).outputs(&[o]);
    nn.attributes = attrs;
    let n = g.add_node(nn).unwrap();
    g.node(n).clone()
}

fn run(op: &str, attrs: Vec<Attribute>, ins: &[Option<&Tensor>], opset: i64) -> EvalResult<Tensor> {
    let n = node(op, attrs, ins.len());
    eval(&n, ins, opset, 1 << 20).map(|mut v| v.remove(0))
}

fn ints(t: &Tensor) -> (Vec<i64>, Vec<i64>) {
    (t.dims.clone(), t.to_i64_vec().unwrap())
}

fn int_attr(n: &str, v: i64) -> Attribute {
    Attribute::new(n, AttrValue::Int(v))
}

#[test]
fn integer_arithmetic_wraps_and_truncates() {
    let a = i64t(&[3], &[7, -7, i64::MAX]);
    let b = i64t(&[], &[2]);
    let add = run("Add", vec![], &[Some(&a), Some(&b)], 17).unwrap();
    assert_eq!(ints(&add).1, vec![9, -5, i64::MIN + 1]);
    let div = run("Div", vec![], &[Some(&a), Some(&b)], 17).unwrap();
    assert_eq!(ints(&div).1, vec![3, -3, i64::MAX / 2]);
    let m = run("Mod", vec![], &[Some(&a), Some(&b)], 17).unwrap();
    assert_eq!(ints(&m).1, vec![1, 1, 1]);
    let m = run("Mod", vec![int_attr("fmod", 1)], &[Some(&a), Some(&b)], 17).unwrap();
    assert_eq!(ints(&m).1, vec![1, -1, 1]);
    // int32 wraps at 32 bits.
    let x = i32t(&[1], &[i32::MAX]);
    let y = i32t(&[1], &[1]);
    let s = run("Add", vec![], &[Some(&x), Some(&y)], 17).unwrap();
    assert_eq!(s.dtype, DType::I32);
    assert_eq!(s.to_i64_vec().unwrap(), vec![i32::MIN as i64]);
}

#[test]
fn division_by_zero_and_min_over_minus_one_are_not_folded() {
    let a = i64t(&[2], &[1, i64::MIN]);
    let z = i64t(&[], &[0]);
    let m1 = i64t(&[], &[-1]);
    assert_eq!(run("Div", vec![], &[Some(&a), Some(&z)], 17), Err(EvalError::Skip));
    assert_eq!(run("Div", vec![], &[Some(&a), Some(&m1)], 17), Err(EvalError::Skip));
    assert_eq!(run("Mod", vec![], &[Some(&a), Some(&z)], 17), Err(EvalError::Skip));
}

#[test]
fn floats_round_once_in_their_own_width() {
    let a = f32t(&[2], &[1.0, 0.1]);
    let b = f32t(&[2], &[3.0, 0.2]);
    let d = run("Div", vec![], &[Some(&a), Some(&b)], 17).unwrap();
    let v = d.to_f64_vec().unwrap();
    assert_eq!(v[0] as f32, 1.0f32 / 3.0f32);
    assert_eq!(v[1] as f32, 0.1f32 / 0.2f32);
    let s = run("Add", vec![], &[Some(&a), Some(&b)], 17).unwrap();
    assert_eq!(s.to_f64_vec().unwrap()[1] as f32, 0.1f32 + 0.2f32);
    // Exp is not folded; NaN results are not either.
    assert_eq!(run("Exp", vec![], &[Some(&a)], 17), Err(EvalError::Skip));
    let z = f32t(&[1], &[0.0]);
    assert_eq!(run("Div", vec![], &[Some(&z), Some(&z)], 17), Err(EvalError::Skip));
    let sq = run("Sqrt", vec![], &[Some(&f32t(&[1], &[2.0]))], 17).unwrap();
    assert_eq!(sq.to_f64_vec().unwrap()[0] as f32, 2.0f32.sqrt());
}

#[test]
fn min_max_refuse_signed_zero_ties() {
    let a = f32t(&[1], &[0.0]);
    let b = f32t(&[1], &[-0.0]);
    assert_eq!(run("Max", vec![], &[Some(&a), Some(&b)], 17), Err(EvalError::Skip));
    let c = f32t(&[1], &[1.0]);
    let m = run("Max", vec![], &[Some(&a), Some(&c)], 17).unwrap();
    assert_eq!(m.to_f64_vec().unwrap(), vec![1.0]);
}

#[test]
fn casts() {
    let a = f32t(&[4], &[1.9, -1.9, 3e9, 0.5]);
    let to = |d: DType| int_attr("to", d.to_onnx() as i64);
    // 3e9 does not fit int32: not folded.
    assert_eq!(run("Cast", vec![to(DType::I32)], &[Some(&a)], 17), Err(EvalError::Skip));
    let r = run("Cast", vec![to(DType::I64)], &[Some(&a)], 17).unwrap();
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, -1, 3_000_000_000, 0]);
    let r = run("Cast", vec![to(DType::Bool)], &[Some(&a)], 17).unwrap();
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, 1, 1, 1]);
    let i = i64t(&[2], &[-1, 300]);
    let r = run("Cast", vec![to(DType::U8)], &[Some(&i)], 17).unwrap();
    assert_eq!(r.to_i64_vec().unwrap(), vec![255, 44]);
    let h = run("Cast", vec![to(DType::F16)], &[Some(&f32t(&[1], &[0.1]))], 17).unwrap();
    assert_eq!(h.raw().unwrap().as_ref(), &half::f16::from_f32(0.1).to_le_bytes());
    assert_eq!(
        run("Cast", vec![to(DType::BF16)], &[Some(&a)], 17),
        Err(EvalError::Skip)
    );
}

#[test]
fn shape_chain_ops() {
    let s = i64t(&[4], &[2, 3, 5, 7]);
    let idx = i64t(&[], &[-1]);
    let g = run("Gather", vec![], &[Some(&s), Some(&idx)], 17).unwrap();
    assert_eq!(ints(&g), (vec![], vec![7]));
    let ax = i64t(&[1], &[0]);
    let u = run("Unsqueeze", vec![], &[Some(&g), Some(&ax)], 17).unwrap();
    assert_eq!(ints(&u), (vec![1], vec![7]));
    let c = run(
        "Concat",
        vec![int_attr("axis", 0)],
        &[Some(&u), Some(&s)],
        17,
    )
    .unwrap();
    assert_eq!(ints(&c), (vec![5], vec![7, 2, 3, 5, 7]));
    let sl = run(
        "Slice",
        vec![],
        &[Some(&s), Some(&i64t(&[1], &[-1])), Some(&i64t(&[1], &[i64::MIN])), None, Some(&i64t(&[1], &[-2]))],
        17,
    )
    .unwrap();
    assert_eq!(ints(&sl), (vec![2], vec![7, 3]));
    let empty = run(
        "Slice",
        vec![],
        &[Some(&s), Some(&i64t(&[1], &[3])), Some(&i64t(&[1], &[1]))],
        17,
    )
    .unwrap();
    assert_eq!(ints(&empty), (vec![0], vec![]));
    let r = run(
        "Range",
        vec![],
        &[Some(&i64t(&[], &[0])), Some(&i64t(&[], &[10])), Some(&i64t(&[], &[3]))],
        17,
    )
    .unwrap();
    assert_eq!(ints(&r), (vec![4], vec![0, 3, 6, 9]));
    let r = run(
        "Range",
        vec![],
        &[Some(&i64t(&[], &[5])), Some(&i64t(&[], &[0])), Some(&i64t(&[], &[-2]))],
        17,
    )
    .unwrap();
    assert_eq!(ints(&r), (vec![3], vec![5, 3, 1]));
}

#[test]
fn layout_ops() {
    let a = i64t(&[2, 3], &[0, 1, 2, 3, 4, 5]);
    let t = run("Transpose", vec![], &[Some(&a)], 17).unwrap();
    assert_eq!(ints(&t), (vec![3, 2], vec![0, 3, 1, 4, 2, 5]));
    let r = run("Reshape", vec![], &[Some(&a), Some(&i64t(&[2], &[0, -1]))], 17).unwrap();
    assert_eq!(ints(&r).0, vec![2, 3]);
    let bad = run("Reshape", vec![], &[Some(&a), Some(&i64t(&[1], &[4]))], 17);
    assert!(matches!(bad, Err(EvalError::Invalid(_))), "{bad:?}");
    let tl = run("Tile", vec![], &[Some(&a), Some(&i64t(&[2], &[1, 2]))], 17).unwrap();
    assert_eq!(ints(&tl), (vec![2, 6], vec![0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]));
    let e = run("Expand", vec![], &[Some(&i64t(&[1], &[9])), Some(&i64t(&[2], &[2, 2]))], 17).unwrap();
    assert_eq!(ints(&e), (vec![2, 2], vec![9, 9, 9, 9]));
    let sq = run("Squeeze", vec![], &[Some(&i64t(&[1, 2], &[4, 5]))], 17).unwrap();
    assert_eq!(ints(&sq), (vec![2], vec![4, 5]));
    let gi = run("Gather", vec![int_attr("axis", 1)], &[Some(&a), Some(&i64t(&[1], &[2]))], 17).unwrap();
    assert_eq!(ints(&gi), (vec![2, 1], vec![2, 5]));
    let oob = run("Gather", vec![], &[Some(&a), Some(&i64t(&[1], &[2]))], 17);
    assert!(matches!(oob, Err(EvalError::Invalid(_))));
    let red = run("ReduceProd", vec![int_attr("keepdims", 0)], &[Some(&a)], 17).unwrap();
    assert_eq!(ints(&red), (vec![], vec![0]));
    let red = run("ReduceSum", vec![], &[Some(&a), Some(&i64t(&[1], &[1]))], 17).unwrap();
    assert_eq!(ints(&red), (vec![2, 1], vec![3, 12]));
    let fl = f32t(&[2], &[1.0, 2.0]);
    assert_eq!(run("ReduceSum", vec![], &[Some(&fl)], 17), Err(EvalError::Skip));
}

#[test]
fn constant_of_shape_respects_the_limit() {
    let n = node("ConstantOfShape", vec![], 1);
    let s = i64t(&[2], &[1000, 1000]);
    assert_eq!(eval(&n, &[Some(&s)], 17, 1024), Err(EvalError::Skip));
    let s = i64t(&[1], &[3]);
    let out = eval(&n, &[Some(&s)], 17, 1024).unwrap();
    assert_eq!(out[0].dtype, DType::F32);
    assert_eq!(out[0].to_f64_vec().unwrap(), vec![0.0; 3]);
}

#[test]
fn where_and_compare() {
    let a = i64t(&[3], &[1, 5, 3]);
    let b = i64t(&[], &[3]);
    let lt = run("Less", vec![], &[Some(&a), Some(&b)], 17).unwrap();
    assert_eq!(lt.dtype, DType::Bool);
    let w = run("Where", vec![], &[Some(&lt), Some(&a), Some(&b)], 17).unwrap();
    assert_eq!(ints(&w).1, vec![1, 3, 3]);
}

#[test]
fn constant_forms() {
    let n = node("Constant", vec![Attribute::new("value_ints", AttrValue::Ints(vec![1, 2]))], 0);
    let t = constant_value(&n).unwrap().unwrap();
    assert_eq!(ints(&t), (vec![2], vec![1, 2]));
    let n = node("Constant", vec![], 0);
    assert!(constant_value(&n).is_err());
    let n = node(
        "Constant",
        vec![Attribute::new("value_string", AttrValue::String(b"hi".to_vec()))],
        0,
    );
    assert_eq!(constant_value(&n).unwrap().unwrap().dtype, DType::String);
}

#[test]
fn huge_shapes_never_panic() {
    let a = i64t(&[2], &[1, 2]);
    let big = i64t(&[2], &[i64::MAX, i64::MAX]);
    assert_eq!(run("Tile", vec![], &[Some(&a), Some(&i64t(&[1], &[i64::MAX]))], 17), Err(EvalError::Skip));
    assert!(matches!(
        run("Reshape", vec![], &[Some(&a), Some(&big)], 17),
        Err(EvalError::Invalid(_))
    ));
    assert_eq!(run("Expand", vec![], &[Some(&a), Some(&big)], 17).map(|_| ()), Err(EvalError::Invalid("shapes [[2], [9223372036854775807, 9223372036854775807]] do not broadcast".into())));
    assert_eq!(run("ConstantOfShape", vec![], &[Some(&big)], 17), Err(EvalError::Skip));
    assert_eq!(
        run("Range", vec![], &[Some(&i64t(&[], &[i64::MIN])), Some(&i64t(&[], &[i64::MAX])), Some(&i64t(&[], &[1]))], 17),
        Err(EvalError::Skip)
    );
    // Unknown ops, odd dtypes and missing inputs are no panic either.
    assert_eq!(run("Exp", vec![], &[Some(&a)], 17), Err(EvalError::Skip));
    assert!(matches!(run("Add", vec![], &[Some(&a)], 17), Err(EvalError::Invalid(_))));
    let s = Tensor::from_strings(vec![1], vec!["x".into()]).unwrap();
    assert_eq!(run("Identity", vec![], &[Some(&s)], 17), Err(EvalError::Skip));
    let sh = run("Shape", vec![], &[Some(&s)], 17).unwrap();
    assert_eq!(ints(&sh), (vec![1], vec![1]));
}

#[test]
fn gather_elements() {
    let a = i64t(&[2, 3], &[0, 1, 2, 3, 4, 5]);
    let idx = i64t(&[2, 2], &[2, 0, -1, 1]);
    let r = run("GatherElements", vec![int_attr("axis", 1)], &[Some(&a), Some(&idx)], 17).unwrap();
    assert_eq!(ints(&r), (vec![2, 2], vec![2, 0, 5, 4]));
    let r = run("GatherElements", vec![], &[Some(&a), Some(&i64t(&[1, 3], &[1, 0, 1]))], 17).unwrap();
    assert_eq!(ints(&r), (vec![1, 3], vec![3, 1, 5]));
    let bad = run("GatherElements", vec![], &[Some(&a), Some(&i64t(&[1, 1], &[2]))], 17);
    assert!(matches!(bad, Err(EvalError::Invalid(_))));
}

/// The result's size is checked against the cap before any input is
/// decoded, from the result dtype: a Cast of 256 int8 values to float32
/// (1 KiB) is refused under a 512-byte cap and computed under 1 KiB; ops
/// the evaluator lacks (DequantizeLinear) are refused up front.
#[test]
fn refuses_by_result_size_and_op_before_decoding() {
    let raw: Vec<u8> = (0..256).map(|i| i as u8).collect();
    let w = Tensor::from_raw(DType::I8, vec![256], raw.into()).unwrap();
    let cast = node("Cast", vec![int_attr("to", 1)], 1);
    assert_eq!(eval(&cast, &[Some(&w)], 17, 512), Err(EvalError::Skip));
    let out = eval(&cast, &[Some(&w)], 17, 1024).unwrap();
    assert_eq!(out[0].dtype, DType::F32);
    let scale = f32t(&[], &[0.5]);
    let dq = node("DequantizeLinear", vec![], 2);
    assert_eq!(
        eval(&dq, &[Some(&w), Some(&scale)], 17, 1 << 20),
        Err(EvalError::Skip)
    );
}
