//! The kernel of a `ConvAdd` node ([`crate::fuse_residual`]): a Conv
//! whose output is added to a residual `R` of its shape, `Y = Conv(X, W,
//! B) + R`, then the activation fused after it (a ResNet block's last
//! convolution, its shortcut and the Relu).
//!
//! Image by image: the convolution of one image goes to a buffer of one
//! image's output in the workspace (the Conv kernel itself, made for one
//! image), and `Y[n] = act(buffer + R[n])` is written over `R[n]` where
//! the plan runs the node in place (its rule: output over `R`). The
//! batch's convolution output is never whole: at batch 8 on ResNet-50's
//! first block, 25.7 MB of arena become 3.2 MB of workspace. Small
//! outputs (at most [`FOLD_MAX_COLS`] positions) at batch above one run
//! the whole batch at once instead, as the Conv kernel folds their images
//! into one product: the buffer then holds the batch's (small) output.
//!
//! The sums are the plain nodes': the Conv's (per image, as the Conv runs
//! its images), then `conv + r` (Add's, commutative in IEEE arithmetic),
//! then the activation.

use super::conv::FOLD_MAX_COLS;
use super::par;
use crate::activation::Activation;
use crate::backend::{Data, In, Kernel, KernelIo, NodeCtx, Out};
use crate::tensor::cast;
use graphopt_ir::DType;

/// Bytes the per-image buffer starts at in the workspace (the inner
/// kernel's own workspace comes first), a multiple of 64.
fn align64(b: usize) -> usize {
    b.div_ceil(64) * 64
}

struct ConvAdd {
    /// The Conv kernel for one image.
    inner: Box<dyn Kernel>,
    /// Runs of images (each `imgs` images), and one run's input and
    /// output shapes.
    runs: usize,
    x1: Vec<usize>,
    y1: Vec<usize>,
    /// Whether `B` is given (input 3).
    bias: bool,
    act: Option<Activation>,
}

/// Makes the kernel of a `ConvAdd(X, W, R, B?)` node.
pub fn kernel(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let r = ctx.input(2)?;
    let y = ctx.outputs.first().ok_or("ConvAdd has one output")?;
    if x.shape.len() != 4 {
        return Err(format!(
            "ConvAdd takes a 2-D convolution (input of rank 4), not rank {}",
            x.shape.len()
        ));
    }
    if y.shape.len() != 4 || y.shape[0] != x.shape[0] {
        return Err(format!(
            "ConvAdd's output {:?} is not a 2-D convolution's of input {:?}",
            y.shape, x.shape
        ));
    }
    if r.dtype != DType::F32 || r.shape != y.shape {
        return Err(format!(
            "ConvAdd's residual ({} {:?}) must be float of the output's shape {:?}",
            r.dtype.name(),
            r.shape,
            y.shape
        ));
    }
    let n = x.shape[0];
    let whole = n > 1 && y.shape[2] * y.shape[3] <= FOLD_MAX_COLS;
    let imgs = if whole { n } else { 1 };
    let x1: Vec<usize> = std::iter::once(imgs)
        .chain(x.shape[1..].iter().copied())
        .collect();
    let y1: Vec<usize> = std::iter::once(imgs)
        .chain(y.shape[1..].iter().copied())
        .collect();
    let bias = ctx.inputs.get(3).is_some_and(|b| b.is_some());
    let mut inputs = vec![
        Some(crate::backend::TensorInfo {
            dtype: x.dtype,
            shape: x1.clone(),
        }),
        ctx.inputs.get(1).cloned().flatten(),
    ];
    let mut constants = vec![None, ctx.constants.get(1).copied().flatten()];
    if bias {
        inputs.push(ctx.inputs[3].clone());
        constants.push(ctx.constants.get(3).copied().flatten());
    }
    let one = NodeCtx {
        node: ctx.node,
        opset: ctx.opset,
        inputs,
        outputs: vec![crate::backend::TensorInfo {
            dtype: y.dtype,
            shape: y1.clone(),
        }],
        constants,
    };
    let inner = super::conv::conv(&one)?;
    Ok(Box::new(ConvAdd {
        inner,
        runs: n / imgs,
        x1,
        y1,
        bias,
        act: None,
    }))
}

impl Kernel for ConvAdd {
    fn in_place(&self) -> bool {
        true
    }

    fn fuse_activation(&mut self, act: Activation) -> bool {
        if self.act.is_some() {
            return false;
        }
        self.act = Some(act);
        true
    }

    fn workspace_bytes(&self) -> usize {
        align64(self.inner.workspace_bytes()) + self.y1.iter().product::<usize>() * 4
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?;
        x.expect(DType::F32)?;
        let x = x.bytes()?;
        let w = io.input(1)?;
        let r = io.input(2)?;
        let b = if self.bias { Some(io.input(3)?) } else { None };
        let r: Option<&[f32]> = match r.data {
            Data::Bytes(bytes) => Some(cast(bytes)),
            Data::Output0 => None,
        };
        let threads = io.threads;
        let (xs, ys): (usize, usize) = (self.x1.iter().product(), self.y1.iter().product());
        let split = align64(self.inner.workspace_bytes());
        if io.workspace.len() < split + ys * 4 {
            return Err("ConvAdd: workspace too small".into());
        }
        let (inner_ws, rest) = io.workspace.split_at_mut(split);
        let buf = &mut rest[..ys * 4];
        let y: &mut [f32] = io.outputs[0].f32()?;
        let n = self.runs;
        if x.len() < n * xs * 4 || y.len() < n * ys || r.is_some_and(|r| r.len() < n * ys) {
            return Err("ConvAdd: an input or the output is shorter than its shape".into());
        }
        for i in 0..n {
            let xi = &x[i * xs * 4..(i + 1) * xs * 4];
            let mut inputs = vec![
                Some(In {
                    dtype: DType::F32,
                    shape: &self.x1,
                    data: Data::Bytes(xi),
                }),
                Some(w),
            ];
            if let Some(b) = b {
                inputs.push(Some(b));
            }
            let mut one = KernelIo {
                inputs,
                outputs: vec![Out {
                    dtype: DType::F32,
                    shape: &self.y1,
                    data: &mut *buf,
                }],
                workspace: &mut *inner_ws,
                threads,
            };
            self.inner.run(&mut one)?;
            let conv: &[f32] = cast(&*buf);
            let yi = &mut y[i * ys..(i + 1) * ys];
            let ri = r.map(|r| &r[i * ys..(i + 1) * ys]);
            let act = self.act;
            par::for_chunks_mut(threads, yi, 1, par::MIN_ELEMS, |first, part| {
                let c = &conv[first..first + part.len()];
                match ri {
                    Some(r) => {
                        let r = &r[first..first + part.len()];
                        for j in 0..part.len() {
                            part[j] = c[j] + r[j];
                        }
                    }
                    None => {
                        for j in 0..part.len() {
                            part[j] += c[j];
                        }
                    }
                }
                if let Some(a) = act {
                    a.apply_all(part);
                }
            });
        }
        Ok(())
    }
}
