//! The training losses of the ONNX spec: NegativeLogLikelihoodLoss and
//! SoftmaxCrossEntropyLoss (log-softmax over axis 1, then the same NLL;
//! optional `log_prob` output), on f32 with int64/int32 labels: class
//! weights, `ignore_index`, reductions none / sum / mean (the weighted
//! mean: divided by the summed weights of the counted labels).

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::tensor::cast_mut;
use graphopt_ir::DType;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

struct Nll {
    softmax: bool,
    n: usize,
    c: usize,
    /// Elements per (image, class): the product of the dims after C.
    d: usize,
    reduction: Reduction,
    ignore: Option<i64>,
}

impl Kernel for Nll {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let t = io.input(1)?.ints()?;
        let w = match io.inputs.get(2).copied().flatten() {
            Some(w) => Some(w.f32()?),
            None => None,
        };
        let (n, c, d) = (self.n, self.c, self.d);
        // log-probabilities: the input (NLL) or its log-softmax over C.
        let lp_own: Vec<f32>;
        let lp: &[f32] = if self.softmax {
            let mut v = x.to_vec();
            for i in 0..n {
                for k in 0..d {
                    let at = |j: usize| (i * c + j) * d + k;
                    let m = (0..c).map(|j| x[at(j)]).fold(f32::NEG_INFINITY, f32::max);
                    let s: f32 = (0..c).map(|j| (x[at(j)] - m).exp()).sum();
                    for j in 0..c {
                        v[at(j)] = x[at(j)] - m - s.ln();
                    }
                }
            }
            lp_own = v;
            &lp_own
        } else {
            x
        };
        let mut losses = vec![0f32; n * d];
        let mut wsum = 0f32;
        for i in 0..n {
            for k in 0..d {
                let label = t[i * d + k];
                if Some(label) == self.ignore {
                    continue;
                }
                if label < 0 || label >= c as i64 {
                    return Err(format!("label {label} out of range for {c} classes"));
                }
                let wi = w.map_or(1.0, |w| w[label as usize]);
                losses[i * d + k] = -lp[(i * c + label as usize) * d + k] * wi;
                wsum += wi;
            }
        }
        let y = io.outputs[0].f32()?;
        match self.reduction {
            Reduction::None => y.copy_from_slice(&losses),
            Reduction::Sum => y[0] = losses.iter().sum(),
            Reduction::Mean => y[0] = losses.iter().sum::<f32>() / wsum,
        }
        if self.softmax {
            if let Some(o) = io.outputs.get_mut(1) {
                cast_mut::<f32>(o.data).copy_from_slice(lp);
            }
        }
        Ok(())
    }
}

pub fn nll(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let t = ctx.input(1)?;
    if x.dtype != DType::F32 || !matches!(t.dtype, DType::I64 | DType::I32) {
        return Err(format!(
            "{} on {} with {} labels is not implemented",
            ctx.node.op_type,
            x.dtype.name(),
            t.dtype.name()
        ));
    }
    if x.shape.len() < 2 {
        return Err("input of rank below 2".into());
    }
    let reduction = match ctx.node.attr_str("reduction").unwrap_or("mean") {
        "none" => Reduction::None,
        "sum" => Reduction::Sum,
        "mean" => Reduction::Mean,
        r => return Err(format!("reduction '{r}' is not implemented")),
    };
    Ok(Box::new(Nll {
        softmax: ctx.node.op_type == "SoftmaxCrossEntropyLoss",
        n: x.shape[0],
        c: x.shape[1],
        d: x.shape[2..].iter().product(),
        reduction,
        ignore: ctx.node.attr_int("ignore_index"),
    }))
}
