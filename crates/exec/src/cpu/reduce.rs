//! Reductions: ReduceMean / ReduceSum / ReduceMax / ReduceMin (axes as an
//! attribute or, from opsets 13/18, an input) and Softmax /
//! LogSoftmax (per-axis since opset 13, over the flattened tail before).

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::elementwise::for_each_bcast;
use graphopt_ir::DType;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Red {
    Mean,
    Sum,
    Max,
    Min,
}

struct Reduce {
    op: Red,
    attr_axes: Option<Vec<i64>>,
    noop_empty: bool,
    shape: Vec<usize>,
}

impl Kernel for Reduce {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let rank = self.shape.len() as i64;
        let axes: Vec<i64> = match (&self.attr_axes, io.inputs.get(1).copied().flatten()) {
            (Some(a), _) => a.clone(),
            (None, Some(t)) => t.ints()?,
            (None, None) => Vec::new(),
        };
        let o = io.outputs[0].f32()?;
        if axes.is_empty() && self.noop_empty {
            o.copy_from_slice(x);
            return Ok(());
        }
        let mut kd = self.shape.clone();
        let mut count = 1usize;
        for (d, k) in kd.iter_mut().enumerate() {
            let reduced = axes.is_empty()
                || axes
                    .iter()
                    .any(|&a| (if a < 0 { a + rank } else { a }) == d as i64);
            if reduced {
                count *= *k;
                *k = 1;
            }
        }
        let init = match self.op {
            Red::Max => f32::NEG_INFINITY,
            Red::Min => f32::INFINITY,
            _ => 0.0,
        };
        o.fill(init);
        let op = self.op;
        for_each_bcast(&self.shape, [kd.as_slice()], |i, [j]| {
            let v = x[i];
            o[j] = match op {
                Red::Max => {
                    if v > o[j] || v.is_nan() {
                        v
                    } else {
                        o[j]
                    }
                }
                Red::Min => {
                    if v < o[j] || v.is_nan() {
                        v
                    } else {
                        o[j]
                    }
                }
                _ => o[j] + v,
            };
        });
        if op == Red::Mean {
            let c = count.max(1) as f32;
            o.iter_mut().for_each(|v| *v /= c);
        }
        Ok(())
    }
}

pub fn reduce(ctx: &NodeCtx) -> Option<Result<Box<dyn Kernel>, String>> {
    let op = match ctx.node.op_type.as_str() {
        "ReduceMean" => Red::Mean,
        "ReduceSum" => Red::Sum,
        "ReduceMax" => Red::Max,
        "ReduceMin" => Red::Min,
        _ => return None,
    };
    Some((|| {
        let x = ctx.input(0)?;
        if x.dtype != DType::F32 {
            return Err(format!(
                "{} on {} is not implemented",
                ctx.node.op_type,
                x.dtype.name()
            ));
        }
        Ok(Box::new(Reduce {
            op,
            attr_axes: ctx.node.attr_ints("axes").map(|a| a.to_vec()),
            noop_empty: ctx.node.attr_int("noop_with_empty_axes") == Some(1),
            shape: x.shape.clone(),
        }) as Box<dyn Kernel>)
    })())
}

struct Softmax {
    outer: usize,
    len: usize,
    inner: usize,
    log: bool,
}

impl Kernel for Softmax {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let y = io.outputs[0].f32()?;
        let (len, inner) = (self.len, self.inner);
        for o in 0..self.outer {
            for i in 0..inner {
                let at = |k: usize| o * len * inner + k * inner + i;
                let mut m = f32::NEG_INFINITY;
                for k in 0..len {
                    m = m.max(x[at(k)]);
                }
                let mut s = 0.0f32;
                for k in 0..len {
                    let e = (x[at(k)] - m).exp();
                    y[at(k)] = e;
                    s += e;
                }
                for k in 0..len {
                    y[at(k)] = if self.log {
                        x[at(k)] - m - s.ln()
                    } else {
                        y[at(k)] / s
                    };
                }
            }
        }
        Ok(())
    }
}

pub fn softmax(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 {
        return Err(format!("Softmax on {} is not implemented", x.dtype.name()));
    }
    let r = x.shape.len() as i64;
    let new = ctx.opset >= 13;
    let mut axis = ctx
        .node
        .attr_int("axis")
        .unwrap_or(if new { -1 } else { 1 });
    if axis < 0 {
        axis += r;
    }
    let axis = axis.clamp(0, r.max(1) - 1) as usize;
    let s = &x.shape;
    let outer: usize = s[..axis].iter().product();
    let (len, inner) = if new {
        (
            s.get(axis).copied().unwrap_or(1),
            s[axis + 1..].iter().product(),
        )
    } else {
        (s[axis..].iter().product(), 1)
    };
    Ok(Box::new(Softmax {
        outer,
        len,
        inner,
        log: ctx.node.op_type == "LogSoftmax",
    }))
}
