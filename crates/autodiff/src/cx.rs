//! The rule context: IR builders that rules use to emit backward nodes.
//!
//! Every helper appends nodes at the end of program order (the backward
//! pass), except [`Cx::shape_of`], which reads a value's shape right after
//! the value is computed so that the value need not stay alive for it.

use crate::{GradError, Result};
use graphopt_ir::{
    AttrValue, Attribute, DType, Dim, Graph, NewNode, NodeId, Shape, Tensor, Type, ValueId,
};
use std::collections::HashMap;

/// What a rule sees.
pub struct Cx<'a> {
    pub g: &'a mut Graph,
    pub opset: i64,
    /// The forward node being differentiated.
    pub node: NodeId,
    /// Which of its inputs need a gradient.
    pub needs: Vec<bool>,
    /// Shapes already read (`Shape` nodes or constants), per value.
    shapes: &'a mut HashMap<ValueId, ValueId>,
    /// Nodes added so far (backward and shape reads).
    pub added: &'a mut Vec<NodeId>,
    /// A rule needs an opset-16 op (ScatterND with reduction).
    pub wants_opset16: &'a mut bool,
    /// Names new values after this instead of the node (the loss).
    pub prefix: Option<String>,
}

pub fn int_attr(name: &str, v: i64) -> Attribute {
    Attribute::new(name, AttrValue::Int(v))
}

pub fn ints_attr(name: &str, v: &[i64]) -> Attribute {
    Attribute::new(name, AttrValue::Ints(v.to_vec()))
}

pub fn float_attr(name: &str, v: f32) -> Attribute {
    Attribute::new(name, AttrValue::Float(v))
}

/// A scalar tensor of float dtype `dt` holding `v`.
pub fn float_scalar(dt: DType, v: f64, dims: Vec<i64>) -> Result<Tensor> {
    let raw: Vec<u8> = match dt {
        DType::F32 => (v as f32).to_le_bytes().to_vec(),
        DType::F64 => v.to_le_bytes().to_vec(),
        other => {
            return Err(GradError::Invalid(format!(
                "gradients of {other} tensors are not supported yet (float and double only)"
            )))
        }
    };
    Ok(Tensor::from_raw(dt, dims, raw.into())?)
}

impl<'a> Cx<'a> {
    pub(crate) fn new(
        g: &'a mut Graph,
        opset: i64,
        node: NodeId,
        shapes: &'a mut HashMap<ValueId, ValueId>,
        added: &'a mut Vec<NodeId>,
        wants_opset16: &'a mut bool,
    ) -> Cx<'a> {
        Cx {
            g,
            opset,
            node,
            needs: Vec::new(),
            shapes,
            added,
            wants_opset16,
            prefix: None,
        }
    }

    pub fn op_type(&self) -> String {
        self.g.node(self.node).op_type.clone()
    }

    pub fn node_name(&self) -> String {
        let n = self.g.node(self.node);
        if n.name.is_empty() {
            n.output(0)
                .map(|v| self.g.name(v).to_string())
                .unwrap_or_default()
        } else {
            n.name.clone()
        }
    }

    /// An error about the current node.
    pub fn unsupported(&self, msg: impl Into<String>) -> GradError {
        GradError::Unsupported {
            op: self.op_type(),
            node: self.node_name(),
            msg: msg.into(),
        }
    }

    pub fn input(&self, i: usize) -> Option<ValueId> {
        self.g.node(self.node).input(i)
    }

    pub fn x(&self, i: usize) -> Result<ValueId> {
        self.input(i)
            .ok_or_else(|| self.unsupported(format!("input {i} is missing")))
    }

    pub fn y(&self, i: usize) -> Result<ValueId> {
        self.g
            .node(self.node)
            .output(i)
            .ok_or_else(|| self.unsupported(format!("output {i} is missing")))
    }

    pub fn need(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    pub fn attr_int(&self, name: &str, default: i64) -> i64 {
        self.g.node(self.node).attr_int(name).unwrap_or(default)
    }

    pub fn attr_float(&self, name: &str, default: f32) -> f32 {
        self.g.node(self.node).attr_float(name).unwrap_or(default)
    }

    pub fn attr_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.g.node(self.node).attr_ints(name).map(|v| v.to_vec())
    }

    /// The element type of `v` (float types only carry gradients).
    pub fn dtype(&self, v: ValueId) -> Result<DType> {
        self.g
            .ty(v)
            .and_then(|t| t.elem())
            .ok_or_else(|| self.unsupported(format!("the type of '{}' is unknown", self.g.name(v))))
    }

    /// `v`'s dims, if its rank is known.
    pub fn dims(&self, v: ValueId) -> Option<Vec<Dim>> {
        self.g.ty(v).and_then(|t| t.shape()).map(|s| s.dims.clone())
    }

    pub fn rank(&self, v: ValueId) -> Result<usize> {
        self.dims(v)
            .map(|d| d.len())
            .ok_or_else(|| self.unsupported(format!("the rank of '{}' is unknown", self.g.name(v))))
    }

    /// A constant `v`'s integer values.
    pub fn const_ints(&self, v: ValueId) -> Option<Vec<i64>> {
        self.g.constant(v).and_then(|t| t.to_i64_vec()).or_else(|| {
            let n = self.g.producer_node(v)?;
            if n.op_type == "Constant" {
                n.attr_tensor("value").and_then(|t| t.to_i64_vec())
            } else {
                None
            }
        })
    }

    /// A constant `v`'s float values.
    pub fn const_floats(&self, v: ValueId) -> Option<Vec<f64>> {
        self.g.constant(v).and_then(|t| t.to_f64_vec()).or_else(|| {
            let n = self.g.producer_node(v)?;
            if n.op_type == "Constant" {
                n.attr_tensor("value")
                    .and_then(|t| t.to_f64_vec())
                    .or_else(|| n.attr_float("value_float").map(|f| vec![f as f64]))
            } else {
                None
            }
        })
    }

    fn hint(&self, op: &str) -> String {
        let base = match &self.prefix {
            Some(p) => p.clone(),
            None => self.node_name().replace(['/', ':', '.'], "_"),
        };
        format!("{}_{}", base.trim_start_matches('_'), op.to_lowercase())
    }

    /// Appends `op(inputs)` with one output and returns it.
    pub fn op(&mut self, op: &str, inputs: &[ValueId], attrs: Vec<Attribute>) -> Result<ValueId> {
        let hint = self.hint(op);
        let out = self.g.fresh_value(&format!("{hint}_grad"), None);
        let mut n = NewNode::new(op).inputs(inputs).outputs(&[out]);
        n.name = format!("grad/{}", self.g.name(out));
        n.attributes = attrs;
        let id = self.g.add_node(n)?;
        self.added.push(id);
        Ok(out)
    }

    /// A new initializer (a constant).
    pub fn constant(&mut self, hint: &str, t: Tensor) -> ValueId {
        let hint = format!("{}_{hint}", self.hint("const"));
        self.g.add_initializer(&hint, t)
    }

    pub fn const_i64(&mut self, vals: &[i64]) -> Result<ValueId> {
        let t = Tensor::from_i64(vec![vals.len() as i64], vals)?;
        Ok(self.constant("ints", t))
    }

    /// A float scalar of dtype `dt`.
    pub fn scalar(&mut self, dt: DType, v: f64) -> Result<ValueId> {
        let t = float_scalar(dt, v, vec![])?;
        Ok(self.constant("scalar", t))
    }

    /// `x * s` for a float constant `s`.
    pub fn scale(&mut self, x: ValueId, dt: DType, s: f64) -> Result<ValueId> {
        if s == 1.0 {
            return Ok(x);
        }
        let c = self.scalar(dt, s)?;
        self.op("Mul", &[x, c], vec![])
    }

    /// `v`'s shape as an int64 vector: a constant when static, else a
    /// `Shape` node placed right after `v` is computed (memoized).
    pub fn shape_of(&mut self, v: ValueId) -> Result<ValueId> {
        if let Some(&s) = self.shapes.get(&v) {
            return Ok(s);
        }
        let known: Option<Vec<i64>> = self
            .dims(v)
            .and_then(|d| d.iter().map(|d| d.known()).collect());
        let s = if let Some(k) = known {
            let t = Tensor::from_i64(vec![k.len() as i64], &k)?;
            let hint = format!("{}_shape", self.g.name(v).replace(['/', ':', '.'], "_"));
            self.g.add_initializer(hint.trim_start_matches('_'), t)
        } else {
            let pos = match self.g.producer(v) {
                Some((n, _)) => self
                    .g
                    .order()
                    .iter()
                    .position(|&m| m == n)
                    .map_or(0, |p| p + 1),
                None => 0,
            };
            let hint = format!("{}_shape", self.g.name(v).replace(['/', ':', '.'], "_"));
            let out = self.g.fresh_value(hint.trim_start_matches('_'), None);
            let mut n = NewNode::new("Shape").inputs(&[v]).outputs(&[out]);
            n.name = format!("grad/{}", self.g.name(out));
            let id = self.g.insert_node(pos, n)?;
            self.added.push(id);
            out
        };
        self.shapes.insert(v, s);
        Ok(s)
    }

    /// `op(x, axes)` for a reduction whose axes are an attribute before
    /// opset `input_from` and an input from it on.
    fn reduce(
        &mut self,
        op: &str,
        input_from: i64,
        x: ValueId,
        axes: &[i64],
        keepdims: bool,
    ) -> Result<ValueId> {
        let kd = int_attr("keepdims", keepdims as i64);
        if self.opset >= input_from {
            let a = self.const_i64(axes)?;
            self.op(op, &[x, a], vec![kd])
        } else {
            self.op(op, &[x], vec![ints_attr("axes", axes), kd])
        }
    }

    /// `ReduceSum(x, axes)` (axes an input from opset 13 on).
    pub fn reduce_sum(&mut self, x: ValueId, axes: &[i64], keepdims: bool) -> Result<ValueId> {
        self.reduce("ReduceSum", 13, x, axes, keepdims)
    }

    /// `ReduceMean(x, axes)` (axes an input from opset 18 on).
    pub fn reduce_mean(&mut self, x: ValueId, axes: &[i64], keepdims: bool) -> Result<ValueId> {
        self.reduce("ReduceMean", 18, x, axes, keepdims)
    }

    /// `ReduceMax(x, axes)` (axes an input from opset 18 on).
    pub fn reduce_max(&mut self, x: ValueId, axes: &[i64], keepdims: bool) -> Result<ValueId> {
        self.reduce("ReduceMax", 18, x, axes, keepdims)
    }

    pub fn unsqueeze(&mut self, x: ValueId, axes: &[i64]) -> Result<ValueId> {
        if self.opset >= 13 {
            let a = self.const_i64(axes)?;
            self.op("Unsqueeze", &[x, a], vec![])
        } else {
            self.op("Unsqueeze", &[x], vec![ints_attr("axes", axes)])
        }
    }

    pub fn reshape(&mut self, x: ValueId, shape: ValueId) -> Result<ValueId> {
        self.op("Reshape", &[x, shape], vec![])
    }

    pub fn transpose(&mut self, x: ValueId, perm: &[i64]) -> Result<ValueId> {
        self.op("Transpose", &[x], vec![ints_attr("perm", perm)])
    }

    /// Zeros shaped like `v` (dtype `dt`).
    pub fn zeros_like(&mut self, v: ValueId, dt: DType) -> Result<ValueId> {
        let s = self.shape_of(v)?;
        let t = float_scalar(dt, 0.0, vec![1])?;
        self.op(
            "ConstantOfShape",
            &[s],
            vec![Attribute::new("value", AttrValue::Tensor(t))],
        )
    }

    /// Reduces `grad` (dims `gdims`, the broadcast result) back to the
    /// shape of `operand`: `ReduceSum` over the axes that broadcasting
    /// added or stretched, then `Reshape` to `Shape(operand)`.
    ///
    /// The axes are found statically when every dim of the operand is
    /// known to be 1 or to equal the result's dim. Otherwise they are found
    /// at run time: the axes where `Shape(grad)` differs from the operand's
    /// shape padded with leading ones (`NonZero(Not(Equal(..)))`), summed
    /// with `noop_with_empty_axes=1`.
    pub fn unbroadcast(
        &mut self,
        grad: ValueId,
        gdims: &[Dim],
        operand: ValueId,
    ) -> Result<ValueId> {
        let odims = self.dims(operand).ok_or_else(|| {
            self.unsupported(format!(
                "the rank of '{}' is unknown, so its broadcast cannot be undone",
                self.g.name(operand)
            ))
        })?;
        if odims.len() > gdims.len() {
            return Err(self.unsupported("an operand has a higher rank than the result"));
        }
        let lead = gdims.len() - odims.len();
        let mut axes: Vec<i64> = (0..lead as i64).collect();
        let mut dynamic = false;
        for (i, od) in odims.iter().enumerate() {
            let gd = &gdims[lead + i];
            if od == gd && *od != Dim::Unknown {
                continue;
            }
            if od.known() == Some(1) {
                if gd.known() != Some(1) {
                    axes.push((lead + i) as i64);
                }
                continue;
            }
            dynamic = true;
        }
        if dynamic {
            return self.unbroadcast_dynamic(grad, lead, operand);
        }
        if axes.is_empty() {
            return Ok(grad);
        }
        let r = self.reduce_sum(grad, &axes, false)?;
        if axes.iter().all(|&a| (a as usize) < lead) {
            // Only leading axes were summed: the result already has the
            // operand's shape.
            return Ok(r);
        }
        let s = self.shape_of(operand)?;
        self.reshape(r, s)
    }

    fn unbroadcast_dynamic(
        &mut self,
        grad: ValueId,
        lead: usize,
        operand: ValueId,
    ) -> Result<ValueId> {
        let gs = self.op("Shape", &[grad], vec![])?;
        let os = self.shape_of(operand)?;
        let padded = if lead > 0 {
            let ones = self.const_i64(&vec![1; lead])?;
            self.op("Concat", &[ones, os], vec![int_attr("axis", 0)])?
        } else {
            os
        };
        let eq = self.op("Equal", &[gs, padded], vec![])?;
        let ne = self.op("Not", &[eq], vec![])?;
        let nz = self.op("NonZero", &[ne], vec![])?;
        let flat = self.const_i64(&[-1])?;
        let axes = self.reshape(nz, flat)?;
        let r = self.op(
            "ReduceSum",
            &[grad, axes],
            vec![int_attr("keepdims", 1), int_attr("noop_with_empty_axes", 1)],
        )?;
        self.reshape(r, os)
    }

    /// The number of elements of `v` as a float scalar of dtype `dt`:
    /// a constant when static, else `Cast(ReduceProd(Shape(v)))`.
    pub fn numel_f(&mut self, v: ValueId, dt: DType) -> Result<ValueId> {
        let known: Option<i64> = self
            .dims(v)
            .and_then(|d| d.iter().map(|d| d.known()).product::<Option<i64>>());
        if let Some(n) = known {
            return self.scalar(dt, n as f64);
        }
        let s = self.shape_of(v)?;
        let p = self.op("ReduceProd", &[s], vec![int_attr("keepdims", 0)])?;
        self.op("Cast", &[p], vec![int_attr("to", dt.to_onnx() as i64)])
    }

    /// Sets the type of `v` (used for graph outputs).
    pub fn set_type(&mut self, v: ValueId, ty: Option<Type>) {
        self.g.value_mut(v).ty = ty;
    }

    /// `op(inputs)` whose result is a scalar (rank 0) of type `dt`: typed
    /// at once, so that [`Cx::uniform`] recognizes an `Expand` of it.
    pub fn scalar_op(&mut self, op: &str, inputs: &[ValueId], dt: DType) -> Result<ValueId> {
        let v = self.op(op, inputs, vec![])?;
        self.set_type(v, Some(Type::tensor(dt, Some(Shape::known(&[])))));
        Ok(v)
    }

    /// A uniform gradient: the scalar `s` (rank 0) broadcast to `like`'s
    /// shape, `Expand(s, Shape(like))`. Rules that can use the scalar
    /// instead read it back with [`Cx::uniform`]; the others read the
    /// `Expand`, which then is materialized where it is read (and the
    /// builder lets broadcasting readers take `s` itself when their other
    /// operand already has the whole shape).
    pub fn expand_like(&mut self, s: ValueId, like: ValueId) -> Result<ValueId> {
        let shape = self.shape_of(like)?;
        self.op("Expand", &[s, shape], vec![])
    }

    /// `s` when the gradient `d` is `Expand(s, shape)` of a scalar `s`
    /// (rank 0, so the result's shape is `shape`): a gradient equal to `s`
    /// everywhere, as the sum and mean losses seed.
    pub fn uniform(&self, d: ValueId) -> Option<ValueId> {
        let n = self.g.producer_node(d)?;
        if n.op_type != "Expand" || !(n.domain.is_empty() || n.domain == "ai.onnx") {
            return None;
        }
        let s = n.input(0)?;
        self.dims(s).is_some_and(|d| d.is_empty()).then_some(s)
    }

    /// The gradient of `operand` when the op broadcast it to its result
    /// `y` (Add, Sub, Expand) and `y`'s gradient is the scalar `s`
    /// everywhere: each element of `operand` was copied
    /// `numel(y) / numel(operand)` times, so its gradient is `s` times that,
    /// again uniform, `Expand(s·k, Shape(operand))` (`k` a constant when
    /// the sizes are static, `s` itself when the shapes are the same).
    pub fn uniform_unbroadcast(
        &mut self,
        s: ValueId,
        y: ValueId,
        operand: ValueId,
    ) -> Result<ValueId> {
        let dt = self.dtype(operand)?;
        let (yd, od) = (self.dims(y), self.dims(operand));
        let same = matches!((&yd, &od), (Some(a), Some(b)) if a == b && !a.contains(&Dim::Unknown));
        let numel = |d: &Option<Vec<Dim>>| -> Option<i64> {
            d.as_ref()?
                .iter()
                .map(|d| d.known())
                .product::<Option<i64>>()
        };
        let s = if same {
            s
        } else if let (Some(ny), Some(no)) = (numel(&yd), numel(&od)) {
            if no == 0 || ny % no != 0 {
                return Err(self.unsupported(format!(
                    "'{}' ({no} elements) does not broadcast to {ny} elements",
                    self.g.name(operand)
                )));
            }
            if ny == no {
                s
            } else {
                let k = self.scalar(dt, (ny / no) as f64)?;
                self.scalar_op("Mul", &[s, k], dt)?
            }
        } else {
            // The ratio in int64 (exact), then in `dt`.
            let mut numel = |v: ValueId| -> Result<ValueId> {
                let sh = self.shape_of(v)?;
                self.op("ReduceProd", &[sh], vec![int_attr("keepdims", 0)])
            };
            let (ny, no) = (numel(y)?, numel(operand)?);
            let q = self.op("Div", &[ny, no], vec![])?;
            let k = self.op("Cast", &[q], vec![int_attr("to", dt.to_onnx() as i64)])?;
            self.scalar_op("Mul", &[s, k], dt)?
        };
        self.expand_like(s, operand)
    }
}
