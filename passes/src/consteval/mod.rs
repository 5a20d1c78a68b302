//! A small constant evaluator: computes one node's outputs from constant
//! inputs, for the ops that PyTorch exports put on constant paths (shape
//! arithmetic, index juggling, casts, a few float ops).
//!
//! It is a helper of `fold_constants`, not a pass. Its one promise is
//! **bit-identical results to onnxruntime**: every op here is either pure
//! data movement, integer arithmetic (wrapping like ORT's C++ does, Div
//! truncating toward zero, Mod per its `fmod` attribute), or a float op
//! that IEEE 754 rounds exactly once (`+ - * /`, `Sqrt`, `Reciprocal`,
//! `Floor`, `Ceil`, `Neg`, `Abs`, comparisons) computed in the tensor's own
//! precision. Whenever the exact result is in doubt the evaluator answers
//! [`EvalError::Skip`] and the node stays as it is:
//! 1. transcendental ops (`Exp`, `Log`, `Pow` other than `x^1` and `x^2`,
//!    ...) — ORT's vectorized kernels and Rust's libm differ in the last bit;
//! 2. float reductions (summation order) and arithmetic in fp16/bf16;
//! 3. results that are NaN (payload bits differ between implementations),
//!    `Min`/`Max`/`Clip` on `-0` vs `+0`, float→int casts out of range,
//!    integer division by zero or `MIN / -1` (undefined behaviour in C++);
//! 4. casts to bf16, float8 and packed 4/2-bit types, strings (except
//!    `Shape`/`Size`, which only read dims).
//!
//! Ops: Identity, Cast, CastLike, Shape, Size, Reshape, Transpose,
//! Unsqueeze, Squeeze, Flatten, Concat, Gather, GatherElements, Slice,
//! Expand, Tile, ConstantOfShape, Range (integer), Where, Add, Sub, Mul,
//! Div, Mod, Neg, Abs, Equal, Less(OrEqual), Greater(OrEqual), Not, And, Or,
//! Xor, Min, Max, Clip, Floor, Ceil, Sqrt, Reciprocal, Pow (x^1, x^2) and
//! integer ReduceSum/ReduceProd/ReduceMax/ReduceMin.
//!
//! Representation: every tensor is an `ndarray::ArrayD<u64>` of raw element
//! *bits* plus its [`DType`]. Data-movement ops (Gather, Slice, Concat,
//! Transpose, Tile, Expand, Where, ...) are then one generic implementation
//! that cannot change a value, whatever the dtype (fp16, bool, float8...);
//! arithmetic decodes the bits per element (integers as `i128`, so that
//! every int dtype, `u64` included, is exact, and floats in their own width).
//!
//! An input that breaks an op's contract (Reshape to a wrong element count,
//! Gather index out of range, ...) is [`EvalError::Invalid`] with a message
//! naming what is wrong.

mod arith;
mod layout;

use graphopt_ir::{AttrValue, DType, NodeData, Tensor, TensorData};
use ndarray::{ArrayD, IxDyn};

/// Why a node was not evaluated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EvalError {
    /// Not supported, too large, or not provably bit-identical to
    /// onnxruntime: leave the node alone.
    Skip,
    /// The inputs break the op's contract: the model is invalid.
    Invalid(String),
}

pub(crate) type EvalResult<T> = Result<T, EvalError>;

pub(crate) fn invalid<T>(msg: impl Into<String>) -> EvalResult<T> {
    Err(EvalError::Invalid(msg.into()))
}

/// A tensor as raw element bits (zero-extended to 64) plus its dtype.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Val {
    pub dtype: DType,
    pub a: ArrayD<u64>,
}

impl Val {
    pub fn new(dtype: DType, a: ArrayD<u64>) -> Val {
        Val { dtype, a }
    }

    pub fn shape(&self) -> &[usize] {
        self.a.shape()
    }

    pub fn rank(&self) -> usize {
        self.a.ndim()
    }

    /// A value from logical-order bits.
    pub fn from_vec(dtype: DType, shape: &[usize], bits: Vec<u64>) -> EvalResult<Val> {
        ArrayD::from_shape_vec(IxDyn(shape), bits)
            .map(|a| Val::new(dtype, a))
            .map_err(|e| EvalError::Invalid(format!("bad shape {shape:?}: {e}")))
    }

    /// The elements as i64, for integer (and bool) tensors.
    pub fn to_i64s(&self) -> EvalResult<Vec<i64>> {
        if !(self.dtype.is_int() || self.dtype == DType::Bool) {
            return invalid(format!("expected an integer tensor, got {}", self.dtype));
        }
        self.a
            .iter()
            .map(|&b| {
                i64::try_from(arith::int_of(b, self.dtype)).map_err(|_| EvalError::Skip)
            })
            .collect()
    }

    /// The elements of a rank-0 or one-element tensor.
    pub fn scalar_i64(&self) -> EvalResult<i64> {
        match self.to_i64s()?[..] {
            [v] => Ok(v),
            _ => invalid(format!("expected a scalar, got shape {:?}", self.shape())),
        }
    }
}

/// Bytes per element of the dtypes the evaluator handles (byte-aligned, at
/// most 64 bits).
pub(crate) fn elem_bytes(d: DType) -> Option<usize> {
    match d {
        DType::String | DType::Complex128 | DType::Undefined | DType::Other(_) => None,
        DType::U4 | DType::I4 | DType::F4E2M1 | DType::U2 | DType::I2 => None,
        // One per byte in int32_data; their raw layout is not specified.
        DType::F6E2M3 | DType::F6E3M2 => None,
        d => d.bits().map(|b| (b / 8) as usize),
    }
}

/// Decodes a tensor; `Skip` for dtypes the evaluator does not handle.
pub(crate) fn decode(t: &Tensor) -> EvalResult<Val> {
    let size = elem_bytes(t.dtype).ok_or(EvalError::Skip)?;
    let TensorData::Raw(raw) = &t.data else {
        return Err(EvalError::Skip);
    };
    t.check().map_err(|e| EvalError::Invalid(e.0))?;
    let shape = dims_usize(&t.dims)?;
    let bits: Vec<u64> = raw
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    Val::from_vec(t.dtype, &shape, bits)
}

/// Encodes a value as a tensor (elements in logical order).
pub(crate) fn encode(v: &Val) -> Tensor {
    let size = elem_bytes(v.dtype).expect("only handled dtypes are decoded");
    let mut raw = Vec::with_capacity(v.a.len() * size);
    for &b in v.a.iter() {
        raw.extend_from_slice(&b.to_le_bytes()[..size]);
    }
    let dims = v.shape().iter().map(|&d| d as i64).collect();
    Tensor::from_raw(v.dtype, dims, raw.into()).expect("sizes agree by construction")
}

pub(crate) fn dims_usize(dims: &[i64]) -> EvalResult<Vec<usize>> {
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| EvalError::Invalid(format!("negative dim {d}"))))
        .collect()
}

/// Fails with `Skip` when a result of `shape` and `dtype` would exceed
/// `limit` bytes (checked before allocating).
pub(crate) fn check_size(shape: &[usize], dtype: DType, limit: u64) -> EvalResult<()> {
    let mut n = elem_bytes(dtype).ok_or(EvalError::Skip)? as u64;
    for &d in shape {
        n = n.checked_mul(d as u64).ok_or(EvalError::Skip)?;
    }
    if n > limit {
        return Err(EvalError::Skip);
    }
    Ok(())
}

/// The tensor a `Constant` node produces: `Ok(None)` for `sparse_value`
/// (kept as a node), an error when the node holds no usable value.
pub(crate) fn constant_value(node: &NodeData) -> Result<Option<Tensor>, String> {
    let mut found = None;
    for a in &node.attributes {
        let t = match &a.value {
            AttrValue::Tensor(t) if a.name == "value" => t.clone(),
            AttrValue::Int(v) if a.name == "value_int" => Tensor::scalar_i64(*v),
            AttrValue::Ints(v) if a.name == "value_ints" => {
                Tensor::from_i64(vec![v.len() as i64], v).map_err(|e| e.0)?
            }
            AttrValue::Float(v) if a.name == "value_float" => Tensor::scalar_f32(*v),
            AttrValue::Floats(v) if a.name == "value_floats" => {
                Tensor::from_f32(vec![v.len() as i64], v).map_err(|e| e.0)?
            }
            AttrValue::String(v) if a.name == "value_string" => {
                Tensor::from_strings(vec![], vec![v.clone().into()]).map_err(|e| e.0)?
            }
            AttrValue::Strings(v) if a.name == "value_strings" => Tensor::from_strings(
                vec![v.len() as i64],
                v.iter().map(|s| s.clone().into()).collect(),
            )
            .map_err(|e| e.0)?,
            AttrValue::SparseTensor(_) if a.name == "sparse_value" => return Ok(None),
            _ => {
                return Err(format!(
                    "unexpected attribute '{}' of kind {}",
                    a.name,
                    a.value.kind().name()
                ))
            }
        };
        if found.is_some() {
            return Err("more than one value attribute".into());
        }
        found = Some(t);
    }
    let mut t = found.ok_or("no value attribute")?;
    t.check().map_err(|e| e.0)?;
    // The tensor's own name means nothing once it is an initializer.
    t.name.clear();
    Ok(Some(t))
}

/// What an op sees: its node, decoded inputs, opset and size limit.
pub(crate) struct Cx<'a> {
    pub node: &'a NodeData,
    pub inputs: Vec<Option<Val>>,
    pub raw: &'a [Option<&'a Tensor>],
    pub opset: i64,
    pub limit: u64,
}

impl Cx<'_> {
    pub fn input(&self, i: usize) -> EvalResult<&Val> {
        match self.inputs.get(i) {
            Some(Some(v)) => Ok(v),
            _ => match self.raw.get(i) {
                // Present but of a dtype the evaluator does not handle.
                Some(Some(_)) => Err(EvalError::Skip),
                _ => invalid(format!("missing input {i}")),
            },
        }
    }
    pub fn has(&self, i: usize) -> bool {
        self.raw.get(i).is_some_and(|t| t.is_some())
    }
    /// Input `i` present but not decodable: `Skip`.
    pub fn opt_checked(&self, i: usize) -> EvalResult<Option<&Val>> {
        if self.has(i) {
            self.input(i).map(Some)
        } else {
            Ok(None)
        }
    }
    pub fn ai(&self, name: &str) -> Option<i64> {
        self.node.attr_int(name)
    }
    pub fn ints_attr(&self, name: &str) -> Option<Vec<i64>> {
        self.node.attr_ints(name).map(|v| v.to_vec())
    }
    pub fn check(&self, shape: &[usize], dtype: DType) -> EvalResult<()> {
        check_size(shape, dtype, self.limit)
    }
}

/// Inputs above this many elements are not evaluated at all (16 Mi
/// elements: decoding them would take 128 MiB and more).
const MAX_DECODED_ELEMENTS: u64 = 1 << 24;

/// A lower bound on the bytes of `node`'s result, known before computing
/// it. Selectors, reductions and ops that build a tensor from a shape get
/// 0; layout ops keep (or repeat) their data input's bytes; the other ops
/// (elementwise, with broadcasting) produce at least as many elements as
/// their largest input, each as wide as the result dtype (a Cast from int8
/// to float32 quadruples its input).
fn result_lower_bound(node: &NodeData, inputs: &[Option<&Tensor>]) -> u64 {
    let op = node.op_type.as_str();
    let shrinks = matches!(
        op,
        "Gather"
            | "GatherElements"
            | "Slice"
            | "ReduceSum"
            | "ReduceProd"
            | "ReduceMin"
            | "ReduceMax"
            | "Reshape"
            | "Unsqueeze"
            | "Squeeze"
            | "Expand"
            | "Tile"
            | "ConstantOfShape"
            | "Range"
            | "Flatten"
            | "Transpose"
            | "Concat"
            | "Identity"
    );
    if shrinks {
        // Layout ops keep their data input's elements (or select from it):
        // bound by the data input only where the op keeps every element.
        return match op {
            "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" | "Transpose" | "Identity"
            | "Expand" | "Tile" => inputs
                .first()
                .copied()
                .flatten()
                .map(|t| t.nbytes())
                .unwrap_or(0),
            "Concat" => inputs.iter().flatten().map(|t| t.nbytes()).sum(),
            _ => 0,
        };
    }
    let numel = inputs
        .iter()
        .flatten()
        .map(|t| t.numel().unwrap_or(u64::MAX))
        .max()
        .unwrap_or(0);
    let out = match op {
        "Cast" => node
            .attr_int("to")
            .and_then(|c| i32::try_from(c).ok())
            .map(DType::from_onnx),
        "CastLike" => inputs.get(1).copied().flatten().map(|t| t.dtype),
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor"
        | "Not" => Some(DType::Bool),
        "Where" => inputs.get(1).copied().flatten().map(|t| t.dtype),
        _ => inputs.first().copied().flatten().map(|t| t.dtype),
    };
    let width = out.and_then(elem_bytes).unwrap_or(1) as u64;
    numel.saturating_mul(width)
}

/// Evaluates `node` on constant `inputs` (`None` = absent optional input).
/// Results larger than `limit` bytes are not computed (`Skip`).
pub(crate) fn eval(
    node: &NodeData,
    inputs: &[Option<&Tensor>],
    opset: i64,
    limit: u64,
) -> EvalResult<Vec<Tensor>> {
    if !(node.domain.is_empty() || node.domain == "ai.onnx") || node.has_subgraphs() {
        return Err(EvalError::Skip);
    }
    // Ops that only read dims work on every dtype, strings included.
    match node.op_type.as_str() {
        "Shape" | "Size" => {
            let t = inputs
                .first()
                .copied()
                .flatten()
                .ok_or(EvalError::Invalid("missing input 0".into()))?;
            return layout::shape_or_size(node, &t.dims).map(|v| vec![encode(&v)]);
        }
        _ => {}
    }
    // Refuse before decoding (which widens every element to 64 bits) what
    // would only be refused after computing: ops the evaluator lacks, and
    // results that cannot fit `limit`.
    const LAYOUT: &[&str] = &[
        "Identity", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten", "Concat", "Gather",
        "GatherElements", "Slice", "Expand", "Tile", "ConstantOfShape", "Range", "Where",
    ];
    const ARITH: &[&str] = &[
        "Add", "Sub", "Mul", "Div", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
        "GreaterOrEqual", "And", "Or", "Xor", "Not", "Neg", "Abs", "Floor", "Ceil", "Sqrt",
        "Reciprocal", "Pow", "Min", "Max", "Clip", "Cast", "CastLike", "ReduceSum", "ReduceProd",
        "ReduceMax", "ReduceMin",
    ];
    let op = node.op_type.as_str();
    if !LAYOUT.contains(&op) && !ARITH.contains(&op) {
        return Err(EvalError::Skip);
    }
    if result_lower_bound(node, inputs) > limit {
        return Err(EvalError::Skip);
    }
    let largest = inputs
        .iter()
        .flatten()
        .map(|t| t.numel().unwrap_or(u64::MAX))
        .max()
        .unwrap_or(0);
    if largest > MAX_DECODED_ELEMENTS {
        return Err(EvalError::Skip);
    }
    // Inputs that are present but fail to decode as invalid data are the
    // model's fault; report them.
    let mut decoded = Vec::with_capacity(inputs.len());
    for t in inputs {
        decoded.push(match t.map(decode) {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(EvalError::Invalid(m))) => return invalid(m),
            Some(Err(EvalError::Skip)) => None,
        });
    }
    let cx = Cx {
        node,
        inputs: decoded,
        raw: inputs,
        opset,
        limit,
    };
    let outs = match node.op_type.as_str() {
        "Identity" => vec![cx.input(0)?.clone()],
        "Reshape" | "Transpose" | "Unsqueeze" | "Squeeze" | "Flatten" | "Concat" | "Gather"
        | "GatherElements"
        | "Slice" | "Expand" | "Tile" | "ConstantOfShape" | "Range" | "Where" => {
            vec![layout::eval(&cx)?]
        }
        _ => vec![arith::eval(&cx)?],
    };
    if node.outputs().len() != outs.len() {
        return Err(EvalError::Skip);
    }
    for o in &outs {
        cx.check(o.shape(), o.dtype)?;
    }
    Ok(outs.iter().map(encode).collect())
}

#[cfg(test)]
mod tests;
