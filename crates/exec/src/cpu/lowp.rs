//! fp16 and bf16 by widening: a node whose float tensors are float16 or
//! bfloat16 runs the fp32 kernel on f32 copies of its inputs (in the
//! workspace) and rounds the f32 outputs back once, as onnxruntime's CPU
//! provider does for most ops (compute in f32, round at the output).
//! The conversions split across threads and use F16C where the CPU has it;
//! they widen whole tensors, except the float16/bfloat16 weights of MatMul
//! and Gemm, which [`crate::lower`] hands to kernels that widen them tile
//! by tile (`HalfMatMul`, `HalfGemm`: the slot [`via_f32`] leaves as it
//! is).
//! Byte-generic data movement (Reshape, Transpose, Concat, ...) needs no
//! widening and never comes here.

use crate::backend::{Data, In, Kernel, KernelIo, NodeCtx, Out, TensorInfo};
use crate::cpu::par;
use crate::tensor::{cast, cast_mut, numel};
use graphopt_ir::DType;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
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

/// Elements per part of a conversion split across threads.
const CONVERT_MIN: usize = 1 << 16;

/// `dst = f32(src)`, split across threads; fp16 by `half`'s slice
/// conversion (F16C instructions where the CPU has them).
pub(crate) fn widen(threads: usize, d: DType, src: &[u8], dst: &mut [f32]) {
    let s: &[u16] = cast(src);
    par::for_chunks_mut(threads, dst, 1, CONVERT_MIN, |first, part| {
        let bits = &s[first..first + part.len()];
        if d == DType::F16 {
            bits.reinterpret_cast::<f16>().convert_to_f32_slice(part);
        } else {
            bits.reinterpret_cast::<bf16>().convert_to_f32_slice(part);
        }
    });
}

/// `dst = round(src)` to fp16 or bf16, split across threads.
pub(crate) fn narrow(threads: usize, d: DType, src: &[f32], dst: &mut [u8]) {
    let o: &mut [u16] = cast_mut(dst);
    par::for_chunks_mut(threads, o, 1, CONVERT_MIN, |first, part| {
        let src = &src[first..first + part.len()];
        if d == DType::F16 {
            part.reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(src);
        } else {
            part.reinterpret_cast_mut::<bf16>()
                .convert_from_f32_slice(src);
        }
    });
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
                    widen(io.threads, d, src, cast_mut(&mut buf[..n * 4]));
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
        // The f32 buffers of the narrowed outputs, by output slot.
        let mut bufs: Vec<Option<&mut [u8]>> = Vec::with_capacity(io.outputs.len());
        for k in 0..io.outputs.len() {
            match self.outs.get(k).copied().flatten() {
                Some(_) => {
                    let n = self.out_n[k];
                    let (buf, r) =
                        std::mem::take(&mut rest).split_at_mut((n * 4).next_multiple_of(A));
                    rest = r;
                    bufs.push(Some(&mut buf[..n * 4]));
                }
                None => bufs.push(None),
            }
        }
        let threads = io.threads;
        let outs = io
            .outputs
            .iter_mut()
            .zip(bufs.iter_mut())
            .map(|(o, b)| match b {
                Some(b) => Out {
                    dtype: DType::F32,
                    shape: o.shape,
                    data: b,
                },
                None => Out {
                    dtype: o.dtype,
                    shape: o.shape,
                    data: &mut *o.data,
                },
            })
            .collect();
        let mut inner = KernelIo {
            inputs: ins,
            outputs: outs,
            workspace: inner_ws,
            threads,
        };
        self.inner.run(&mut inner)?;
        drop(inner);
        for (k, b) in bufs.iter().enumerate() {
            if let (Some(b), Some(d)) = (b, self.outs.get(k).copied().flatten()) {
                narrow(threads, d, cast::<f32>(b), io.outputs[k].data);
            }
        }
        Ok(())
    }
}

/// Wraps the fp32 kernel `make` gives for the widened node; input slot
/// `raw`, if given, is handed over as it is (not widened).
pub fn via_f32(
    ctx: &NodeCtx,
    raw: Option<usize>,
    make: impl Fn(&NodeCtx) -> Result<Box<dyn Kernel>, String>,
) -> Result<Box<dyn Kernel>, String> {
    let widened = |k: usize, t: &Option<TensorInfo>| match t {
        Some(t) if low(t.dtype) && raw != Some(k) => Some(t.dtype),
        _ => None,
    };
    let wide = NodeCtx {
        node: ctx.node,
        opset: ctx.opset,
        inputs: ctx
            .inputs
            .iter()
            .enumerate()
            .map(|(k, t)| match widened(k, t) {
                Some(_) => t.as_ref().map(widen_info),
                None => t.clone(),
            })
            .collect(),
        outputs: ctx.outputs.iter().map(widen_info).collect(),
        // Constant low-precision inputs would be misread as f32.
        constants: ctx
            .constants
            .iter()
            .zip(ctx.inputs.iter().enumerate())
            .map(|(c, (k, t))| if widened(k, t).is_some() { None } else { *c })
            .collect(),
    };
    let inner = make(&wide)?;
    Ok(Box::new(ViaF32 {
        inner,
        ins: ctx
            .inputs
            .iter()
            .enumerate()
            .map(|(k, t)| widened(k, t))
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
