//! fp16 and bf16 by widening: a node whose float tensors are float16 or
//! bfloat16 runs the fp32 kernel on f32 copies of its inputs (in the
//! workspace) and rounds the f32 outputs back once, as onnxruntime's CPU
//! provider does for most ops (compute in f32, round at the output).
//! The conversions split across threads and use AVX-512F (float16) or
//! `half`'s conversions (F16C where the CPU has it). They widen whole
//! tensors except in three cases: the float16/bfloat16 weights of MatMul
//! and Gemm, which [`crate::lower`] hands to kernels that widen them tile
//! by tile (`HalfMatMul`, `HalfGemm`: the slot [`via_f32`] leaves as it
//! is), and the two below.
//! Byte-generic data movement (Reshape, Transpose, Concat, ...) needs no
//! widening and never comes here.
//!
//! Elementwise nodes (the planner's elementwise in-place table,
//! [`graphopt_plan::inplace_rule`]) whose inputs each have the output's
//! shape or hold one element are widened, computed and rounded back
//! [`CHUNK`] elements at a time instead ([`Chunked`]), each thread its own
//! run of chunks: the workspace then holds a few chunks per thread, not
//! whole f32 copies (a residual Add of ResNet-50 at batch 8 widened 77 MB).
//! A one-image, one-group Conv whose weight would widen to more than
//! [`CONV_BLOCK_BYTES`] runs block of output channels by block of output
//! channels ([`ConvBlocks`]), each block's weights widened in turn.

use crate::backend::{Data, In, Kernel, KernelIo, NodeCtx, Out, TensorInfo};
use crate::cpu::par;
use crate::tensor::{cast, cast_mut, elem_size, numel};
use graphopt_ir::DType;
use graphopt_plan::{inplace_rule, InPlace};
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

/// `out = f32(bits)` for float16 bits: sixteen at a time with AVX-512F's
/// conversion where the CPU has it, the rest (and everything on other
/// CPUs) by `half`'s slice conversion (F16C, eight at a time, where the
/// CPU has it). Both are the hardware's IEEE conversion, so the bits are
/// `half`'s either way; `half` calls a function per block of eight, which
/// cost a quarter of ResNet-50's fp16 run.
pub(crate) fn f16_to_f32(bits: &[u16], out: &mut [f32]) {
    debug_assert_eq!(bits.len(), out.len());
    let n = bits.len().min(out.len());
    let (bits, out) = (&bits[..n], &mut out[..n]);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F where the call is made.
    let done = if super::gemm::wide() {
        unsafe { f16_to_f32_avx512(bits, out) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    bits[done..]
        .reinterpret_cast::<f16>()
        .convert_to_f32_slice(&mut out[done..]);
}

/// `out = round(src)` to float16 bits, round to nearest even: as
/// [`f16_to_f32`], sixteen at a time on AVX-512F, then `half`.
pub(crate) fn f32_to_f16(src: &[f32], out: &mut [u16]) {
    debug_assert_eq!(src.len(), out.len());
    let n = src.len().min(out.len());
    let (src, out) = (&src[..n], &mut out[..n]);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F where the call is made.
    let done = if super::gemm::wide() {
        unsafe { f32_to_f16_avx512(src, out) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    out[done..]
        .reinterpret_cast_mut::<f16>()
        .convert_from_f32_slice(&src[done..]);
}

/// The whole blocks of sixteen of [`f16_to_f32`]; returns how many
/// elements it converted.
///
/// # Safety
/// The CPU has AVX-512F; `out` is at least as long as `bits`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn f16_to_f32_avx512(bits: &[u16], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let n = bits.len() / 16 * 16;
    // SAFETY: i + 16 <= n <= both lengths.
    unsafe {
        for i in (0..n).step_by(16) {
            let h = _mm256_loadu_si256(bits.as_ptr().add(i).cast());
            _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
    }
    n
}

/// The whole blocks of sixteen of [`f32_to_f16`] (round to nearest even,
/// as `half`'s F16C path rounds); returns how many it converted.
///
/// # Safety
/// The CPU has AVX-512F; `out` is at least as long as `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn f32_to_f16_avx512(src: &[f32], out: &mut [u16]) -> usize {
    use std::arch::x86_64::*;
    let n = src.len() / 16 * 16;
    // SAFETY: i + 16 <= n <= both lengths.
    unsafe {
        for i in (0..n).step_by(16) {
            let h =
                _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), h);
        }
    }
    n
}

/// `dst = f32(src)`, split across threads; fp16 by [`f16_to_f32`], bf16
/// by `half`'s slice conversion.
pub(crate) fn widen(threads: usize, d: DType, src: &[u8], dst: &mut [f32]) {
    let s: &[u16] = cast(src);
    par::for_chunks_mut(threads, dst, 1, CONVERT_MIN, |first, part| {
        let bits = &s[first..first + part.len()];
        if d == DType::F16 {
            f16_to_f32(bits, part);
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
            f32_to_f16(src, part);
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
    if raw.is_none() {
        if let Some(k) = chunked(ctx, &make).or_else(|| conv_blocks(ctx, &make)) {
            return Ok(k);
        }
    }
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

/// The [`Chunked`] kernel of an elementwise node with an fp16/bf16 output
/// of more than one [`CHUNK`], whose inputs each have the output's shape
/// or one element; `None` where that does not hold (or the run's kernel
/// cannot be made), and the node is widened whole.
fn chunked(
    ctx: &NodeCtx,
    make: &impl Fn(&NodeCtx) -> Result<Box<dyn Kernel>, String>,
) -> Option<Box<dyn Kernel>> {
    let node = ctx.node;
    let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
    // The planner's elementwise table: output element `i` from element `i`
    // of each input (the shape checks below keep broadcast inputs out).
    if !default_domain || inplace_rule(&node.op_type) != InPlace::Elementwise {
        return None;
    }
    let [o] = &ctx.outputs[..] else {
        return None;
    };
    let n = numel(&o.shape);
    if !low(o.dtype) || n <= CHUNK {
        return None;
    }
    let mut ins = Vec::with_capacity(ctx.inputs.len());
    for t in &ctx.inputs {
        let Some(t) = t else {
            ins.push(None);
            continue;
        };
        let whole = numel(&t.shape) == 1;
        let bits = t.dtype.bits()? as usize;
        if (!whole && t.shape != o.shape) || !bits.is_multiple_of(8) {
            return None;
        }
        ins.push(Some(Cut {
            low: low(t.dtype).then_some(t.dtype),
            whole,
            size: bits / 8,
            dtype: t.dtype,
        }));
    }
    // The node as the kernel of one run of `len` elements sees it.
    let run_ctx = |len: usize| NodeCtx {
        node,
        opset: ctx.opset,
        inputs: ins
            .iter()
            .map(|c| {
                c.map(|c| TensorInfo {
                    dtype: if c.low.is_some() { DType::F32 } else { c.dtype },
                    shape: if c.whole { vec![] } else { vec![len] },
                })
            })
            .collect(),
        outputs: vec![TensorInfo {
            dtype: DType::F32,
            shape: vec![len],
        }],
        // Only a single element keeps its contents (widened ones excepted).
        constants: ctx
            .constants
            .iter()
            .zip(&ins)
            .map(|(k, c)| match c {
                Some(c) if c.whole && c.low.is_none() => *k,
                _ => None,
            })
            .collect(),
    };
    let full = make(&run_ctx(CHUNK)).ok()?;
    let tail = match n % CHUNK {
        0 => None,
        r => Some(make(&run_ctx(r)).ok()?),
    };
    Some(Box::new(Chunked {
        full,
        tail,
        n,
        ins,
        out: o.dtype,
        slots: par::max_threads().clamp(1, 8),
    }))
}

/// Elements per run of a [`Chunked`] node (128 KiB of f32 per buffer).
pub const CHUNK: usize = 1 << 15;

/// How a [`Chunked`] node cuts one input.
#[derive(Clone, Copy, Debug)]
struct Cut {
    /// The low dtype to widen (`None`: handed over as it is).
    low: Option<DType>,
    /// One element, handed whole to every run (else cut like the output).
    whole: bool,
    /// Bytes per element.
    size: usize,
    dtype: DType,
}

/// An elementwise fp16/bf16 node run [`CHUNK`] elements at a time: each
/// run's inputs widened into the workspace, the f32 kernel made for a run
/// (`full`, or `tail` for the last, shorter one) on one thread, its output
/// rounded back. Threads take contiguous runs of chunks, each with its own
/// buffers. Every element sees the arithmetic of the whole-tensor path, so
/// the bits are the same. An input in place over the output is read before
/// its run is written.
struct Chunked {
    full: Box<dyn Kernel>,
    tail: Option<Box<dyn Kernel>>,
    n: usize,
    ins: Vec<Option<Cut>>,
    out: DType,
    /// Buffer sets in the workspace (the threads that may share the work).
    slots: usize,
}

impl Chunked {
    /// One thread's buffers: the widened inputs, the f32 output, then the
    /// inner kernel's workspace.
    fn slot_bytes(&self) -> usize {
        let ins: usize = self
            .ins
            .iter()
            .flatten()
            .filter(|c| c.low.is_some())
            .map(|c| (if c.whole { 4 } else { CHUNK * 4 }).next_multiple_of(A))
            .sum();
        let inner = self
            .full
            .workspace_bytes()
            .max(self.tail.as_ref().map_or(0, |t| t.workspace_bytes()));
        ins + (CHUNK * 4).next_multiple_of(A) + inner.next_multiple_of(A)
    }
}

/// A pointer shared by the threads of one [`Chunked`] run.
#[derive(Clone, Copy)]
struct Shared(*mut u8);
// SAFETY: the threads touch disjoint ranges through it (see `Chunked::run`).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// The pointer `k` bytes on (a method, so that closures capture the
    /// whole `Shared`).
    fn at(self, k: usize) -> *mut u8 {
        self.0.wrapping_add(k)
    }
}

impl Kernel for Chunked {
    fn workspace_bytes(&self) -> usize {
        self.slots * self.slot_bytes()
    }

    fn in_place(&self) -> bool {
        true
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let chunks = self.n.div_ceil(CHUNK);
        let parts = io.threads.min(self.slots).min(chunks).max(1);
        let slot = self.slot_bytes();
        if io.workspace.len() < parts * slot {
            return Err("workspace too small".into());
        }
        let out_size = elem_size(self.out).unwrap_or(2);
        if io.outputs[0].data.len() < self.n * out_size {
            return Err("output shorter than its shape".into());
        }
        let ws = Shared(io.workspace.as_mut_ptr());
        let out = Shared(io.outputs[0].data.as_mut_ptr());
        // Each input's bytes (an in-place input: the output's).
        let mut srcs: Vec<Option<(Shared, usize)>> = Vec::with_capacity(io.inputs.len());
        for i in &io.inputs {
            srcs.push(match i.map(|x| x.data) {
                None => None,
                Some(Data::Bytes(b)) => Some((Shared(b.as_ptr().cast_mut()), b.len())),
                Some(Data::Output0) => Some((out, io.outputs[0].data.len())),
            });
        }
        let failed = std::sync::Mutex::new(None);
        par::for_parts(io.threads, parts, |p| {
            // SAFETY: slot p of the workspace is this part's alone.
            let w = unsafe { std::slice::from_raw_parts_mut(ws.at(p * slot), slot) };
            for c in par::range(chunks, parts, p) {
                let (s, e) = (c * CHUNK, (self.n).min((c + 1) * CHUNK));
                if let Err(why) = self.run_chunk(s, e, w, &srcs, out, out_size) {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                    return;
                }
            }
        });
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

impl Chunked {
    /// Elements `s..e` of the output, with buffers `w`.
    #[allow(clippy::too_many_arguments)]
    fn run_chunk(
        &self,
        s: usize,
        e: usize,
        w: &mut [u8],
        srcs: &[Option<(Shared, usize)>],
        out: Shared,
        out_size: usize,
    ) -> Result<(), String> {
        let len = e - s;
        let run_shape = [len];
        let mut rest: &mut [u8] = w;
        let mut ins: Vec<Option<In>> = Vec::with_capacity(self.ins.len());
        for (k, cut) in self.ins.iter().enumerate() {
            let (Some(cut), Some((src, src_len))) = (cut, srcs[k]) else {
                ins.push(None);
                continue;
            };
            let (first, count) = if cut.whole { (0, 1) } else { (s, len) };
            if first * cut.size + count * cut.size > src_len {
                return Err(format!("input {k} is shorter than its shape"));
            }
            // SAFETY: within the input (checked above); an in-place input's
            // run is read here, before this run of the output is written.
            let bytes =
                unsafe { std::slice::from_raw_parts(src.at(first * cut.size), count * cut.size) };
            // A single element is a scalar to the run's kernel.
            let shape: &[usize] = if cut.whole { &[] } else { &run_shape };
            match cut.low {
                Some(d) => {
                    let (buf, r) = std::mem::take(&mut rest)
                        .split_at_mut((if cut.whole { 4 } else { CHUNK * 4 }).next_multiple_of(A));
                    rest = r;
                    widen(1, d, bytes, cast_mut(&mut buf[..count * 4]));
                    let buf: &[u8] = buf;
                    ins.push(Some(In {
                        dtype: DType::F32,
                        shape,
                        data: Data::Bytes(&buf[..count * 4]),
                    }));
                }
                None => ins.push(Some(In {
                    dtype: cut.dtype,
                    shape,
                    data: Data::Bytes(bytes),
                })),
            }
        }
        let (obuf, inner_ws) = rest.split_at_mut((CHUNK * 4).next_multiple_of(A));
        let inner = match &self.tail {
            Some(t) if len < CHUNK => t,
            _ => &self.full,
        };
        let mut kio = KernelIo {
            inputs: ins,
            outputs: vec![Out {
                dtype: DType::F32,
                shape: &run_shape,
                data: &mut obuf[..len * 4],
            }],
            workspace: &mut inner_ws[..inner.workspace_bytes()],
            threads: 1,
        };
        inner.run(&mut kio)?;
        drop(kio);
        // SAFETY: elements s..e of the output are this run's alone.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.at(s * out_size), len * out_size) };
        narrow(1, self.out, cast::<f32>(&obuf[..len * 4]), dst);
        Ok(())
    }
}

/// Widened weight bytes above which a one-image Conv runs in blocks of
/// output channels ([`ConvBlocks`]).
pub const CONV_BLOCK_BYTES: usize = 2 << 20;

/// A one-image, one-group fp16/bf16 Conv whose widened weight would
/// exceed [`CONV_BLOCK_BYTES`]: the input is widened once, then each block
/// of `block` output channels has its weights (contiguous rows of `W`) and
/// bias widened, runs the f32 Conv made for that many channels, and is
/// rounded back into its channels of the output (contiguous, one image).
/// An output channel's sum does not depend on which others run beside it,
/// so the bits are the whole-weight path's; the workspace holds one block
/// of weights instead of all of them (ResNet-50's layer4 3x3: 9.4 MB).
struct ConvBlocks {
    full: Box<dyn Kernel>,
    tail: Option<Box<dyn Kernel>>,
    /// Output channels, per block, and elements per channel of `W` and
    /// of the output.
    m: usize,
    block: usize,
    per_w: usize,
    per_y: usize,
    x_n: usize,
    /// `W`'s and the output's shapes (their channel dims are a block's in
    /// each run).
    w_shape: Vec<usize>,
    y_shape: Vec<usize>,
    x: Option<DType>,
    w: DType,
    b: Option<DType>,
    y: DType,
}

impl ConvBlocks {
    /// Workspace layout: widened input, a block's weights, its bias, its
    /// f32 output, then the inner kernel's workspace.
    fn parts(&self) -> [usize; 5] {
        let inner = self
            .full
            .workspace_bytes()
            .max(self.tail.as_ref().map_or(0, |t| t.workspace_bytes()));
        [
            if self.x.is_some() { self.x_n * 4 } else { 0 },
            self.block * self.per_w * 4,
            self.block * 4,
            self.block * self.per_y * 4,
            inner,
        ]
        .map(|b| b.next_multiple_of(A))
    }
}

impl Kernel for ConvBlocks {
    fn workspace_bytes(&self) -> usize {
        self.parts().iter().sum()
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let [xb, wb, bb, yb, _] = self.parts();
        if io.workspace.len() < self.workspace_bytes() {
            return Err("workspace too small".into());
        }
        let ws = std::mem::take(&mut io.workspace);
        let (xbuf, rest) = ws.split_at_mut(xb);
        let (wbuf, rest) = rest.split_at_mut(wb);
        let (bbuf, rest) = rest.split_at_mut(bb);
        let (ybuf, inner_ws) = rest.split_at_mut(yb);
        let threads = io.threads;
        let x_in = io.input(0)?;
        let x_bytes = x_in.bytes()?;
        let w_bytes = io.input(1)?.bytes()?;
        let b_bytes = match io.inputs.get(2).copied().flatten() {
            Some(b) => Some(b.bytes()?),
            None => None,
        };
        let size = |d: DType| elem_size(d).unwrap_or(2);
        let (ws_, ys_) = (size(self.w), size(self.y));
        let x_size = self.x.map_or(4, size);
        let short = x_bytes.len() < self.x_n * x_size
            || w_bytes.len() < self.m * self.per_w * ws_
            || io.outputs[0].data.len() < self.m * self.per_y * ys_
            || b_bytes
                .zip(self.b)
                .is_some_and(|(b, d)| b.len() < self.m * size(d));
        if short {
            return Err("an input or the output is shorter than its shape".into());
        }
        if let Some(d) = self.x {
            widen(threads, d, x_bytes, cast_mut(&mut xbuf[..self.x_n * 4]));
        }
        for m0 in (0..self.m).step_by(self.block) {
            let mb = self.block.min(self.m - m0);
            let (mut w_shape, mut y_shape) = (self.w_shape.clone(), self.y_shape.clone());
            (w_shape[0], y_shape[1]) = (mb, mb);
            let b_shape = [mb];
            let wf: &mut [f32] = cast_mut(&mut wbuf[..mb * self.per_w * 4]);
            widen(
                threads,
                self.w,
                &w_bytes[m0 * self.per_w * ws_..(m0 + mb) * self.per_w * ws_],
                wf,
            );
            let bias = match (b_bytes, self.b) {
                (Some(b), Some(d)) => {
                    let bs = size(d);
                    widen(
                        1,
                        d,
                        &b[m0 * bs..(m0 + mb) * bs],
                        cast_mut(&mut bbuf[..mb * 4]),
                    );
                    Some(&bbuf[..mb * 4])
                }
                _ => None,
            };
            let inner = match &self.tail {
                Some(t) if mb < self.block => t,
                _ => &self.full,
            };
            let x_data: &[u8] = match self.x {
                Some(_) => &xbuf[..self.x_n * 4],
                None => x_bytes,
            };
            let w_data: &[u8] = &wbuf[..mb * self.per_w * 4];
            let mut inputs = vec![
                Some(In {
                    dtype: DType::F32,
                    shape: x_in.shape,
                    data: Data::Bytes(x_data),
                }),
                Some(In {
                    dtype: DType::F32,
                    shape: &w_shape,
                    data: Data::Bytes(w_data),
                }),
            ];
            if let Some(b) = bias {
                inputs.push(Some(In {
                    dtype: DType::F32,
                    shape: &b_shape,
                    data: Data::Bytes(b),
                }));
            }
            let mut kio = KernelIo {
                inputs,
                outputs: vec![Out {
                    dtype: DType::F32,
                    shape: &y_shape,
                    data: &mut ybuf[..mb * self.per_y * 4],
                }],
                workspace: &mut inner_ws[..inner.workspace_bytes()],
                threads,
            };
            inner.run(&mut kio)?;
            drop(kio);
            narrow(
                threads,
                self.y,
                cast::<f32>(&ybuf[..mb * self.per_y * 4]),
                &mut io.outputs[0].data[m0 * self.per_y * ys_..(m0 + mb) * self.per_y * ys_],
            );
        }
        Ok(())
    }
}

/// The [`ConvBlocks`] kernel of a Conv with one image, one group, an
/// fp16/bf16 weight over [`CONV_BLOCK_BYTES`] once widened and an fp16/bf16
/// output; `None` otherwise (or where the block's kernel cannot be made).
fn conv_blocks(
    ctx: &NodeCtx,
    make: &impl Fn(&NodeCtx) -> Result<Box<dyn Kernel>, String>,
) -> Option<Box<dyn Kernel>> {
    let node = ctx.node;
    let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
    if !default_domain || node.op_type != "Conv" || node.attr_int("group").unwrap_or(1) != 1 {
        return None;
    }
    let (x, w) = (ctx.input(0).ok()?, ctx.input(1).ok()?);
    let b = ctx.inputs.get(2).cloned().flatten();
    let [y] = &ctx.outputs[..] else {
        return None;
    };
    let m = *w.shape.first()?;
    // One input channel: a one-channel block would take the depthwise
    // kernel, which sums in another order than the GEMM paths.
    if x.shape.first() != Some(&1)
        || y.shape.first() != Some(&1)
        || w.shape.get(1).is_none_or(|&c| c < 2)
        || !low(w.dtype)
        || !low(y.dtype)
        || y.shape.get(1) != Some(&m)
        || m == 0
        || numel(&w.shape) * 4 <= CONV_BLOCK_BYTES
        || b.as_ref().is_some_and(|b| b.shape != [m] || !low(b.dtype))
    {
        return None;
    }
    let per_w = numel(&w.shape) / m;
    let per_y = numel(&y.shape) / m;
    // Whole runs of 16 channels, as many as fit the block's bytes.
    let block = (CONV_BLOCK_BYTES / (per_w * 4)).max(16) / 16 * 16;
    if block >= m {
        return None;
    }
    let block_ctx = |mb: usize| {
        let mut w_shape = w.shape.clone();
        w_shape[0] = mb;
        let mut y_shape = y.shape.clone();
        y_shape[1] = mb;
        let f32_of = |shape: Vec<usize>| {
            Some(TensorInfo {
                dtype: DType::F32,
                shape,
            })
        };
        let mut inputs = vec![Some(widen_info(x)), f32_of(w_shape)];
        if b.is_some() {
            inputs.push(f32_of(vec![mb]));
        }
        NodeCtx {
            node,
            opset: ctx.opset,
            constants: vec![None; inputs.len()],
            inputs,
            outputs: vec![TensorInfo {
                dtype: DType::F32,
                shape: y_shape,
            }],
        }
    };
    let full = make(&block_ctx(block)).ok()?;
    let tail = match m % block {
        0 => None,
        r => Some(make(&block_ctx(r)).ok()?),
    };
    Some(Box::new(ConvBlocks {
        full,
        tail,
        m,
        block,
        per_w,
        per_y,
        x_n: numel(&x.shape),
        w_shape: w.shape.clone(),
        y_shape: y.shape.clone(),
        x: low(x.dtype).then_some(x.dtype),
        w: w.dtype,
        b: b.map(|b| b.dtype),
        y: y.dtype,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every float16 bit pattern, NaNs included, widens to `half`'s bits
    /// for the same slice; and every such float, with exact ties,
    /// subnormals, overflow and random f32 bits, rounds back to `half`'s
    /// bits. Odd lengths and offsets put elements both in the sixteen-wide
    /// blocks and in what is left to `half`. (Without AVX-512F both sides
    /// are `half`'s.)
    #[test]
    fn conversions_give_halfs_bits() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let mut floats: Vec<f32> = Vec::new();
        for (start, len) in [(0, all.len()), (3, 1000), (17, 23), (5, 7)] {
            let bits = &all[start..start + len];
            let mut got = vec![0f32; len];
            let mut want = vec![0f32; len];
            f16_to_f32(bits, &mut got);
            bits.reinterpret_cast::<f16>()
                .convert_to_f32_slice(&mut want);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "widening {start}+{len}");
            floats.extend_from_slice(&got);
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            floats.push(f32::from_bits(x));
        }
        // Exact ties between neighbouring float16 values (normal and
        // subnormal, both signs), and values past the largest.
        for k in (0..0x7bffu16).step_by(7) {
            for sign in [0, 0x8000] {
                let (a, b) = (f16::from_bits(k | sign), f16::from_bits((k + 1) | sign));
                floats.push((a.to_f32() + b.to_f32()) / 2.0);
            }
        }
        for k in 0..2048u32 {
            floats.push(65504.0 + k as f32 * 16.0);
        }
        for (start, len) in [(0, floats.len()), (9, 4097), (1, 15)] {
            let src = &floats[start..start + len];
            let mut got = vec![0u16; len];
            let mut want = vec![f16::ZERO; len];
            f32_to_f16(src, &mut got);
            want.convert_from_f32_slice(src);
            let same = got.iter().zip(&want).all(|(a, b)| *a == b.to_bits());
            assert!(same, "narrowing {start}+{len}");
        }
    }
}
