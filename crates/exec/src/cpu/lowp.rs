//! fp16 and bf16 by widening: a node whose float tensors are float16 or
//! bfloat16 runs the fp32 kernel on f32 copies of its inputs (in the
//! workspace) and rounds the f32 outputs back once, as onnxruntime's CPU
//! provider does for most ops (compute in f32, round at the output).
//! Byte-generic data movement (Reshape, Transpose, Concat, ...) needs no
//! widening and never comes here.

use crate::backend::{Data, In, Kernel, KernelIo, NodeCtx, Out, TensorInfo};
use crate::tensor::{cast, cast_mut, numel};
use graphopt_ir::DType;
use half::{bf16, f16};

fn low(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Whether the node touches fp16/bf16 tensors.
pub fn is_low(ctx: &NodeCtx) -> bool {
    ctx.inputs.iter().flatten().any(|t| low(t.dtype)) || ctx.outputs.iter().any(|t| low(t.dtype))
}

fn widen_info(t: &TensorInfo) -> TensorInfo {
    TensorInfo {
        dtype: if low(t.dtype) { DType::F32 } else { t.dtype },
        shape: t.shape.clone(),
    }
}

const A: usize = 64;

struct ViaF32 {
    inner: Box<dyn Kernel>,
    /// The low dtype of each input (`None`: passed through).
    ins: Vec<Option<DType>>,
    outs: Vec<Option<DType>>,
    in_n: Vec<usize>,
    out_n: Vec<usize>,
}

fn widen(d: DType, src: &[u8], dst: &mut [f32]) {
    if d == DType::F16 {
        let s: &[u16] = cast(src);
        dst.iter_mut()
            .zip(s)
            .for_each(|(o, &b)| *o = f16::from_bits(b).to_f32());
    } else {
        let s: &[u16] = cast(src);
        dst.iter_mut()
            .zip(s)
            .for_each(|(o, &b)| *o = bf16::from_bits(b).to_f32());
    }
}

fn narrow(d: DType, src: &[f32], dst: &mut [u8]) {
    let o: &mut [u16] = cast_mut(dst);
    if d == DType::F16 {
        o.iter_mut()
            .zip(src)
            .for_each(|(o, &v)| *o = f16::from_f32(v).to_bits());
    } else {
        o.iter_mut()
            .zip(src)
            .for_each(|(o, &v)| *o = bf16::from_f32(v).to_bits());
    }
}

impl Kernel for ViaF32 {
    fn workspace_bytes(&self) -> usize {
        let conv: usize = self
            .ins
            .iter()
            .zip(&self.in_n)
            .chain(self.outs.iter().zip(&self.out_n))
            .filter(|(d, _)| d.is_some())
            .map(|(_, n)| (n * 4).next_multiple_of(A))
            .sum();
        self.inner.workspace_bytes().next_multiple_of(A) + conv
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let ws = std::mem::take(&mut io.workspace);
        let (inner_ws, mut rest) =
            ws.split_at_mut(self.inner.workspace_bytes().next_multiple_of(A));
        let mut ins: Vec<Option<In>> = Vec::with_capacity(io.inputs.len());
        for (k, i) in io.inputs.iter().enumerate() {
            match (i, self.ins.get(k).copied().flatten()) {
                (Some(x), Some(d)) => {
                    let n = self.in_n[k];
                    let (buf, r) =
                        std::mem::take(&mut rest).split_at_mut((n * 4).next_multiple_of(A));
                    rest = r;
                    let src = match x.data {
                        Data::Bytes(b) => b,
                        Data::Output0 => return Err("in place on a widened input".into()),
                    };
                    widen(d, src, cast_mut(&mut buf[..n * 4]));
                    let buf: &[u8] = buf;
                    ins.push(Some(In {
                        dtype: DType::F32,
                        shape: x.shape,
                        data: Data::Bytes(&buf[..n * 4]),
                    }));
                }
                (i, _) => ins.push(*i),
            }
        }
        let mut outs = Vec::with_capacity(io.outputs.len());
        let mut narrowed = Vec::new();
        for (k, o) in io.outputs.iter_mut().enumerate() {
            match self.outs.get(k).copied().flatten() {
                Some(_) => {
                    let n = self.out_n[k];
                    let (buf, r) =
                        std::mem::take(&mut rest).split_at_mut((n * 4).next_multiple_of(A));
                    rest = r;
                    narrowed.push(k);
                    outs.push(Out {
                        dtype: DType::F32,
                        shape: o.shape,
                        data: &mut buf[..n * 4],
                    });
                }
                None => outs.push(Out {
                    dtype: o.dtype,
                    shape: o.shape,
                    data: &mut *o.data,
                }),
            }
        }
        let mut inner = KernelIo {
            inputs: ins,
            outputs: outs,
            workspace: inner_ws,
            threads: io.threads,
        };
        self.inner.run(&mut inner)?;
        let wide: Vec<Vec<f32>> = narrowed
            .iter()
            .map(|&k| cast::<f32>(inner.outputs[k].data).to_vec())
            .collect();
        drop(inner);
        for (&k, w) in narrowed.iter().zip(&wide) {
            let d = self.outs[k].expect("narrowed output");
            narrow(d, w, io.outputs[k].data);
        }
        Ok(())
    }
}

/// Wraps the fp32 kernel `make` gives for the widened node.
pub fn via_f32(
    ctx: &NodeCtx,
    make: impl Fn(&NodeCtx) -> Result<Box<dyn Kernel>, String>,
) -> Result<Box<dyn Kernel>, String> {
    let wide = NodeCtx {
        node: ctx.node,
        opset: ctx.opset,
        inputs: ctx
            .inputs
            .iter()
            .map(|t| t.as_ref().map(widen_info))
            .collect(),
        outputs: ctx.outputs.iter().map(widen_info).collect(),
        // Constant low-precision inputs would be misread as f32.
        constants: ctx
            .constants
            .iter()
            .zip(&ctx.inputs)
            .map(|(c, t)| {
                if t.as_ref().is_some_and(|t| low(t.dtype)) {
                    None
                } else {
                    *c
                }
            })
            .collect(),
    };
    let inner = make(&wide)?;
    Ok(Box::new(ViaF32 {
        inner,
        ins: ctx
            .inputs
            .iter()
            .map(|t| t.as_ref().filter(|t| low(t.dtype)).map(|t| t.dtype))
            .collect(),
        outs: ctx
            .outputs
            .iter()
            .map(|t| Some(t.dtype).filter(|&d| low(d)))
            .collect(),
        in_n: ctx
            .inputs
            .iter()
            .map(|t| t.as_ref().map_or(0, |t| numel(&t.shape)))
            .collect(),
        out_n: ctx.outputs.iter().map(|t| numel(&t.shape)).collect(),
    }))
}
