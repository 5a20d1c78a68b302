//! Coded weights decoded per tile inside the kernels that read them: the
//! fused nodes [`crate::lower::lower_coded`] makes. A coded weight `W`
//! (shape `S`, `numel` elements, float32 once decoded) is stored in one of
//! three ways ([`Code`]), and never exists whole in the arena:
//!
//! - **A palette** (issue 23): a float32 codebook of `ng` groups of `k`
//!   entries and one index per element (uint8, or uint4 packed two per
//!   byte, low nibble first). Groups are `ng` equal runs of `W`'s flat
//!   (row-major) elements, so element `f` is
//!   `codebook[(f / (numel / ng)) * k + index[f]]`; `ng = 1` is one
//!   codebook for the tensor. Nodes `Palette*(…, codebook, indices, …)`.
//! - **Integers with scales** (issue 20, what `--quantize` writes): `W =
//!   DequantizeLinear(q, scale, zero_point?)` with `q` int8, uint8, int4 or
//!   uint4, per-tensor, per-axis or blocked (opset 21's `block_size`)
//!   float32, float16 or bfloat16 scales (a float16 scale is what
//!   `--quantize int4-weights` casts to float32 before its
//!   DequantizeLinear; the cast is exact, so decoding from float16 gives
//!   the same floats). Element `f` is `(q[f] - zp[c]) as f32 · scale[c]`,
//!   `c` its scale's index: DequantizeLinear's kernel's formula, so the
//!   decoded tiles hold the bits it would write. Nodes `Dequant*(…, q,
//!   scale, zero_point?, …)`, with `dequant_axis` and `dequant_block_size`.
//! - **Half precision** (issue 20, what `--precision fp16`, `bf16` and
//!   `fp16-weights` write): `W` itself, a float16 or bfloat16 initializer,
//!   widened exactly. Nodes `HalfMatMul(A, W)` and `HalfGemm(A, W, C?)`;
//!   they reach the kernel through [`crate::cpu::lowp::via_f32`] with `W`
//!   left as it is (a float16/bfloat16 `A` or `C` widened and the output
//!   rounded back; float32 ones, where the model Cast `W` to float32, as
//!   they are), so they decode the tiles the plain node's widened weight
//!   would hold.
//!
//! The kernels, one per reader (the weight's data slots sit where the
//! reader had `W`; what followed it comes after them):
//!
//! - `*MatMul(A, W…)`, `W` `[K, N]`: `A`'s rows (all batch dims flattened,
//!   `W` is shared) times tiles of `W` of [`TILE_K`] rows × [`TILE_N`]
//!   columns, decoded into the workspace, each tile's product accumulated
//!   into the output (`sgemm`'s beta = 1 after the first K tile), on the
//!   kernel the unfused MatMul takes. [`TILE_K`] is that kernel's depth
//!   block (256: graphopt's `KC`, and `matrixmultiply`'s `kc` for f32), so
//!   every output element sums the same partial products in the same order
//!   as the unfused MatMul: results are bitwise equal to the decoded
//!   weights'. One row of `A` (`M = 1`) takes the plain node's
//!   matrix-vector kernel ([`crate::cpu::matmul::product`]), which also
//!   sums in blocks of 256 and so is bitwise equal too.
//! - `*Gemm(A, W…, C?)`: the same tiles, `transB=1` decoding each tile from
//!   rows of `W` `[N, K]` (contiguous runs of K) and handing `sgemm` the
//!   transposed strides; the bias as Gemm writes it (`beta·C`, then every
//!   tile accumulates).
//! - `PaletteConv(X, W…, B?)` (integer Conv weights are not fused, see
//!   [`crate::lower`]), `W` `[M, C/group, (kh,) kw]`: im2col per image and
//!   group as [`crate::cpu::conv`] does, then blocks of [`BLOCK_CHANNELS`]
//!   output channels: each block's weights (contiguous rows of `W`) decoded
//!   into the workspace and multiplied into those channels' rows (splitting
//!   GEMM rows does not change any sum, so this too is bitwise equal). A
//!   block is decoded once per image and group, a small cost next to its
//!   GEMM (`1 / (OH·OW)` of it).
//! - `*Gather(W…, ids)`, axis 0: only the gathered rows are decoded,
//!   straight into the output.
//!
//! Threads: MatMul and Gemm give each thread its own column blocks of `W`
//! (decoded and multiplied there) when `N` spans several blocks, else
//! the product splits by rows or columns as the plain node's does
//! ([`crate::cpu::matmul::product`]); Conv's GEMMs split rows.
//!
//! Workspace: one tile (`TILE_K × TILE_N` floats, 256 KiB) per thread, for
//! up to [`MAX_TILE_THREADS`] threads (the machine's parallelism when the
//! kernel is made), for MatMul and Gemm; the im2col buffer plus one channel
//! block for Conv; none for Gather.
//! Palette indices are checked against `k` once, when the kernel is made
//! (they are constants), so a run never reads past a codebook; integer
//! weights index their scales by position only, checked against the
//! scales' shape when the kernel is made.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::conv::{conv_layout, im2col, Window};
use crate::cpu::lowp::f16_to_f32;
use crate::cpu::matmul::{gemm_bias, gemv, own_kernel, product, sgemm_into_with, sgemm_with};
use crate::cpu::par;
use crate::cpu::quant::scale_axis;
use crate::lower::{
    DEQUANT_AXIS_ATTR, DEQUANT_BLOCK_ATTR, DEQUANT_PREFIX, GROUPS_ATTR, HALF_PREFIX,
    PALETTE_PREFIX, WEIGHT_SHAPE_ATTR,
};
use crate::tensor::{cast, cast_mut, nibble, numel, sign4};
use graphopt_ir::DType;
use half::bf16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Rows of `W` (the reduction dim) per MatMul/Gemm tile: the f32 depth
/// block of graphopt's kernel and of `matrixmultiply`, so that tiles add
/// up in the unfused product's order.
pub const TILE_K: usize = 256;
/// Columns of `W` per MatMul/Gemm tile.
pub const TILE_N: usize = 256;
/// Output channels per Conv block.
pub const BLOCK_CHANNELS: usize = 64;

const ALIGN: usize = 64;

/// A palettized weight's layout.
#[derive(Clone, Debug)]
struct Palette {
    /// Entries per codebook.
    k: usize,
    /// Elements per group (`numel / ng`).
    per: usize,
    /// uint4 indices (else uint8).
    packed: bool,
}

/// An integer weight's layout: `q` as `[outer, len, inner]` around its
/// scale axis (`len = inner = 1` for one scale), one scale per index of
/// the axis, or per `block` of them (blocked).
#[derive(Clone, Debug)]
struct Dequant {
    q: DType,
    scale: DType,
    /// The zero point's type (that of `q`), if there is one.
    zp: Option<DType>,
    len: usize,
    inner: usize,
    /// Elements per scale along the axis (0: not blocked).
    block: usize,
}

/// How a coded weight is stored.
#[derive(Clone, Debug)]
enum Code {
    Palette(Palette),
    Dequant(Dequant),
    /// float16 or bfloat16 elements.
    Half(DType),
}

/// A coded weight: its decoded shape, its storage, and where its data
/// slots start among the node's inputs.
#[derive(Clone, Debug)]
struct Coded {
    /// `S`.
    shape: Vec<usize>,
    code: Code,
    /// The first data slot (the codebook, or `q`).
    first: usize,
}

/// A coded weight's data for one run.
struct Bound<'a> {
    code: &'a Code,
    /// The data slots' bytes: codebook and indices, or `q`, scales and
    /// zero points (empty where absent).
    data: [&'a [u8]; 3],
}

impl Coded {
    /// Reads and checks the layout of the weight whose data starts at
    /// input slot `first` of a `Palette*` or `Dequant*` node.
    fn new(ctx: &NodeCtx, first: usize) -> Result<Coded, String> {
        let shape: Vec<usize> = ctx
            .node
            .attr_ints(WEIGHT_SHAPE_ATTR)
            .ok_or_else(|| format!("no {WEIGHT_SHAPE_ATTR} attribute"))?
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("weight dim {d}")))
            .collect::<Result<_, _>>()?;
        let code = if ctx.node.op_type.starts_with(PALETTE_PREFIX) {
            Code::Palette(Palette::new(ctx, &shape, first)?)
        } else if ctx.node.op_type.starts_with(HALF_PREFIX) {
            let w = ctx.input(first)?;
            if !matches!(w.dtype, DType::F16 | DType::BF16) || w.shape != shape {
                return Err(format!(
                    "a {} weight {:?} for {shape:?} float16/bfloat16",
                    w.dtype.name(),
                    w.shape
                ));
            }
            Code::Half(w.dtype)
        } else {
            Code::Dequant(Dequant::new(ctx, &shape, first)?)
        };
        Ok(Coded { shape, code, first })
    }

    /// Input slots holding the weight's data.
    fn slots(&self) -> usize {
        match self.code {
            Code::Palette(_) => 2,
            Code::Dequant(_) => 3,
            Code::Half(_) => 1,
        }
    }

    /// The slot right after the weight's data (the reader's next input).
    fn next(&self) -> usize {
        self.first + self.slots()
    }

    /// The weight's data in this run.
    fn bind<'a>(&'a self, io: &KernelIo<'a>) -> Result<Bound<'a>, String> {
        let mut data: [&[u8]; 3] = [&[]; 3];
        for (k, d) in data.iter_mut().take(self.slots()).enumerate() {
            if let Some(x) = io.inputs.get(self.first + k).copied().flatten() {
                *d = x.bytes()?;
            }
        }
        Ok(Bound {
            code: &self.code,
            data,
        })
    }
}

impl Bound<'_> {
    /// Decodes flat elements `start .. start + out.len()` of `W`.
    fn decode(&self, start: usize, out: &mut [f32]) {
        match self.code {
            Code::Palette(p) => p.decode(cast(self.data[0]), self.data[1], start, out),
            Code::Dequant(d) => d.decode(self.data, start, out),
            Code::Half(d) => floats(*d, self.data[0], start, out),
        }
    }
}

impl Palette {
    /// Reads and checks the layout: codebook in slot `cb`, indices in
    /// slot `cb + 1` (a constant, every index checked below `k`).
    fn new(ctx: &NodeCtx, shape: &[usize], cb: usize) -> Result<Palette, String> {
        let idx = cb + 1;
        let c = ctx.input(cb)?;
        let i = ctx.input(idx)?;
        if c.dtype != DType::F32 {
            return Err(format!("codebook of {}, expected float", c.dtype.name()));
        }
        let (ng, k) = match c.shape.as_slice() {
            [k] => (1, *k),
            [ng, k] => (*ng, *k),
            s => return Err(format!("codebook of shape {s:?}")),
        };
        if let Some(a) = ctx.node.attr_ints(GROUPS_ATTR) {
            if a.first().copied() != Some(ng as i64) {
                return Err(format!("{GROUPS_ATTR} {a:?} for {ng} codebook(s)"));
            }
        }
        let n = numel(shape);
        if numel(&i.shape) != n || ng == 0 || !n.is_multiple_of(ng) {
            return Err(format!(
                "{} indices for a weight {shape:?} in {ng} group(s)",
                numel(&i.shape)
            ));
        }
        let packed = match i.dtype {
            DType::U8 => false,
            DType::U4 => true,
            d => return Err(format!("indices of {}, expected uint8 or uint4", d.name())),
        };
        let bytes = ctx
            .constants
            .get(idx)
            .copied()
            .flatten()
            .ok_or("the indices are not a constant")?;
        let p = Palette {
            k,
            per: n / ng,
            packed,
        };
        let need = if packed { n.div_ceil(2) } else { n };
        if bytes.len() < need {
            return Err(format!("{} index bytes, {need} needed", bytes.len()));
        }
        let max = (0..n).map(|f| p.index(bytes, f)).max().unwrap_or(0);
        if n > 0 && max >= k {
            return Err(format!("index {max} out of range for a codebook of {k}"));
        }
        Ok(p)
    }

    #[inline]
    fn index(&self, idx: &[u8], f: usize) -> usize {
        if self.packed {
            nibble(idx, f) as usize
        } else {
            idx[f] as usize
        }
    }

    /// Decodes flat elements `start .. start + out.len()` of `W`.
    fn decode(&self, cb: &[f32], idx: &[u8], start: usize, out: &mut [f32]) {
        let end = start + out.len();
        let mut f = start;
        while f < end {
            let g = f / self.per;
            let stop = ((g + 1) * self.per).min(end);
            let book = &cb[g * self.k..(g + 1) * self.k];
            let dst = &mut out[f - start..stop - start];
            if self.packed {
                // Whole bytes (two elements each) between a leading and a
                // trailing odd element.
                let mut j = 0;
                if f % 2 == 1 && j < dst.len() {
                    dst[0] = book[nibble(idx, f) as usize];
                    j = 1;
                }
                let pairs = (dst.len() - j) / 2;
                let bytes = &idx[(f + j) / 2..][..pairs];
                for (o, &b) in dst[j..j + 2 * pairs].chunks_exact_mut(2).zip(bytes) {
                    o[0] = book[(b & 0xF) as usize];
                    o[1] = book[(b >> 4) as usize];
                }
                j += 2 * pairs;
                if j < dst.len() {
                    dst[j] = book[nibble(idx, f + j) as usize];
                }
            } else {
                for (o, &i) in dst.iter_mut().zip(&idx[f..stop]) {
                    *o = book[i as usize];
                }
            }
            f = stop;
        }
    }
}

/// Elements per chunk of [`Dequant::run`] (its stack buffers).
const CHUNK: usize = 256;

impl Dequant {
    /// Reads and checks the layout: `q`, scale and zero point in slots
    /// `first..first + 3` (the zero point may be absent).
    fn new(ctx: &NodeCtx, shape: &[usize], first: usize) -> Result<Dequant, String> {
        let q = ctx.input(first)?;
        let s = ctx.input(first + 1)?;
        let zp = ctx.inputs.get(first + 2).cloned().flatten();
        if !matches!(q.dtype, DType::I8 | DType::U8 | DType::I4 | DType::U4) {
            return Err(format!(
                "an integer weight of {}, expected int8, uint8, int4 or uint4",
                q.dtype.name()
            ));
        }
        if !matches!(s.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(format!("scales of {}, expected float", s.dtype.name()));
        }
        if q.shape != shape {
            return Err(format!(
                "an integer weight of shape {:?} for {WEIGHT_SHAPE_ATTR} {shape:?}",
                q.shape
            ));
        }
        if let Some(z) = &zp {
            if z.dtype != q.dtype || numel(&z.shape) != numel(&s.shape) {
                return Err(format!(
                    "a zero point of {} {:?} for a weight of {} and scales {:?}",
                    z.dtype.name(),
                    z.shape,
                    q.dtype.name(),
                    s.shape
                ));
            }
        }
        let axis = ctx.node.attr_int(DEQUANT_AXIS_ATTR).unwrap_or(1);
        let block = ctx.node.attr_int(DEQUANT_BLOCK_ATTR).unwrap_or(0);
        let block = usize::try_from(block).map_err(|_| format!("block size {block}"))?;
        let (inner, len) = scale_axis(shape, &s.shape, axis, block, "a coded weight")?;
        Ok(Dequant {
            q: q.dtype,
            scale: s.dtype,
            zp: zp.map(|z| z.dtype),
            len,
            inner,
            block,
        })
    }

    /// Decodes flat elements `start .. start + out.len()` of `W` from
    /// `[q, scales, zero points]`, in runs whose scale index is one for the
    /// whole run or goes up by one per element.
    fn decode(&self, data: [&[u8]; 3], start: usize, out: &mut [f32]) {
        let (len, inner, block) = (self.len, self.inner, self.block);
        let row = len * inner;
        let end = start + out.len();
        let mut f = start;
        while f < end {
            let (o, r) = (f / row, f % row);
            let (a, i) = (r / inner, r % inner);
            // (the run's end, its first scale index, the index's step)
            let (stop, c, step) = match (block, inner) {
                _ if len == 1 && block == 0 => (end, 0, 0),
                (0, 1) => (f + len - a, a, 1),
                (0, _) => (f + inner - i, a, 0),
                (b, 1) => {
                    let run = (b - a % b).min(len - a);
                    (f + run, o * len.div_ceil(b) + a / b, 0)
                }
                (b, _) => (f + inner - i, (o * len.div_ceil(b) + a / b) * inner + i, 1),
            };
            let stop = stop.min(end);
            self.run(data, f, c, step, &mut out[f - start..stop - start]);
            f = stop;
        }
    }

    /// `out[j] = (q[f + j] - zp[c + step·j]) · scale[c + step·j]`, in
    /// chunks through stack buffers (so each loop is one that vectorizes).
    fn run(&self, [q, s, z]: [&[u8]; 3], f: usize, c: usize, step: usize, out: &mut [f32]) {
        let mut qi = [0i32; CHUNK];
        let mut zi = [0i32; CHUNK];
        let mut sf = [0f32; CHUNK];
        for c0 in (0..out.len()).step_by(CHUNK) {
            let m = CHUNK.min(out.len() - c0);
            ints(self.q, q, f + c0, &mut qi[..m]);
            let o = &mut out[c0..c0 + m];
            if step == 0 {
                let mut one = [0i32; 1];
                if let Some(d) = self.zp {
                    ints(d, z, c, &mut one);
                }
                let mut sc = [0f32; 1];
                floats(self.scale, s, c, &mut sc);
                let (zv, sv) = (one[0], sc[0]);
                for (o, &v) in o.iter_mut().zip(&qi[..m]) {
                    *o = (v - zv) as f32 * sv;
                }
            } else {
                let at = c + c0;
                match self.zp {
                    Some(d) => ints(d, z, at, &mut zi[..m]),
                    None => zi[..m].fill(0),
                }
                floats(self.scale, s, at, &mut sf[..m]);
                for (((o, &v), &zv), &sv) in o.iter_mut().zip(&qi[..m]).zip(&zi[..m]).zip(&sf[..m])
                {
                    *o = (v - zv) as f32 * sv;
                }
            }
        }
    }
}

/// Elements `at .. at + out.len()` of an int8/uint8/int4/uint4 tensor.
fn ints(d: DType, b: &[u8], at: usize, out: &mut [i32]) {
    match d {
        DType::I8 => {
            for (o, &v) in out.iter_mut().zip(&b[at..]) {
                *o = v as i8 as i32;
            }
        }
        DType::U8 => {
            for (o, &v) in out.iter_mut().zip(&b[at..]) {
                *o = v as i32;
            }
        }
        DType::I4 => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = sign4(nibble(b, at + j)) as i32;
            }
        }
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = nibble(b, at + j) as i32;
            }
        }
    }
}

/// Elements `at .. at + out.len()` of a float32/float16/bfloat16 tensor,
/// as float32 (exactly).
fn floats(d: DType, b: &[u8], at: usize, out: &mut [f32]) {
    let n = out.len();
    match d {
        DType::F32 => out.copy_from_slice(&cast::<f32>(b)[at..at + n]),
        DType::F16 => f16_to_f32(&cast::<u16>(b)[at..at + n], out),
        _ => cast::<u16>(b)[at..at + n]
            .reinterpret_cast::<bf16>()
            .convert_to_f32_slice(out),
    }
}

/// The kernel of a fused node (domain [`crate::lower::CODED_DOMAIN`]).
pub fn kernel(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let op = ctx.node.op_type.as_str();
    match op
        .trim_start_matches(PALETTE_PREFIX)
        .trim_start_matches(DEQUANT_PREFIX)
        .trim_start_matches(HALF_PREFIX)
    {
        "MatMul" => matmul(ctx),
        "Gemm" => gemm(ctx),
        "Conv" => conv(ctx),
        "Gather" => gather(ctx),
        _ => Err(format!("no coded-weight kernel for {op}")),
    }
}

/// Tile buffers in the MatMul/Gemm workspace: one per thread that decodes
/// and multiplies a column block, up to this many.
pub const MAX_TILE_THREADS: usize = 8;

/// How many tile buffers a MatMul/Gemm kernel's workspace holds: the
/// machine's parallelism, at most [`MAX_TILE_THREADS`].
fn tile_slots() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_TILE_THREADS)
}

fn tile_floats(kk: usize, n: usize) -> usize {
    TILE_K.min(kk) * TILE_N.min(n)
}

/// A pointer handed to the column-block threads of [`tiled_gemm`].
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: each thread writes a disjoint set of columns through it (see
// `tiled_gemm`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer `k` floats on (a method, so that closures capture the
    /// whole `SendPtr`, not its raw field).
    fn add(self, k: usize) -> *mut f32 {
        self.0.wrapping_add(k)
    }
}

/// `c[m × n] (row stride n) = alpha · a · W + beta0 · c` with `W` `[kk × n]`
/// decoded tile by tile: `tile(k0, kt, n0, nt, buf)` fills `buf` with rows
/// `k0..k0+kt`, columns `n0..n0+nt` of `W` and returns the tile's strides.
/// `a` has strides `sa` (column `k0` starts at `k0 · sa.1`). `ws` holds
/// one or more tile buffers: with several threads and several column
/// blocks (of at most [`TILE_N`]), each thread decodes and multiplies its own column
/// blocks; otherwise the blocks go one after another and each block's
/// product splits across threads as [`product`] splits it. Either way
/// each output element adds its K tiles in order.
#[allow(clippy::too_many_arguments)]
fn tiled_gemm(
    m: usize,
    kk: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    sa: (usize, usize),
    beta0: f32,
    c: &mut [f32],
    ws: &mut [f32],
    threads: usize,
    tile: impl Fn(usize, usize, usize, usize, &mut [f32]) -> (usize, usize) + Sync,
) {
    if m == 0 || n == 0 {
        return;
    }
    if kk == 0 {
        if beta0 == 0.0 {
            c[..m * n].fill(0.0);
        }
        return;
    }
    assert!(
        a.len() > (m - 1) * sa.0 + (kk - 1) * sa.1 && c.len() >= m * n,
        "palette gemm operand too short"
    );
    let len = tile_floats(kk, n);
    let slots = (ws.len() / len).max(1);
    // Blocks of at most TILE_N columns, as many as a multiple of the
    // threads where there are several (768 columns on 2 threads: 4 of
    // 192, not 3 of 256 of which one thread would take two).
    let mut blocks = n.div_ceil(TILE_N);
    let t = threads.min(blocks).min(slots).max(1);
    if t > 1 {
        blocks = blocks.next_multiple_of(t);
    }
    let width = n.div_ceil(blocks).next_multiple_of(16).min(TILE_N);
    let blocks = n.div_ceil(width);
    // Column block `b` of `W` into the tile `w`, times `a`, into columns
    // `b·width..` of `c` (through `c0`, with `gemm_threads`).
    let block = |b: usize, w: &mut [f32], c0: SendPtr, gemm_threads: usize| {
        let n0 = b * width;
        let nt = width.min(n - n0);
        for k0 in (0..kk).step_by(TILE_K) {
            let kt = TILE_K.min(kk - k0);
            let w = &mut w[..kt * nt];
            let sb = tile(k0, kt, n0, nt, w);
            let beta = if k0 == 0 { beta0 } else { 1.0 };
            if gemm_threads > 1 {
                // SAFETY: one thread owns all of `c` here.
                let c = unsafe { std::slice::from_raw_parts_mut(c0.0, m * n) };
                product(
                    m,
                    kt,
                    nt,
                    alpha,
                    &a[k0 * sa.1..],
                    sa,
                    w,
                    sb,
                    beta,
                    &mut c[n0..],
                    n,
                    gemm_threads,
                );
                continue;
            }
            if m == 1 {
                // SAFETY: columns n0..n0+nt of the one row of `c` are this
                // thread's alone.
                let c = unsafe { std::slice::from_raw_parts_mut(c0.0.add(n0), nt) };
                // The kernel the plain node's `product` takes for one row.
                if gemv(kt, nt, alpha, &a[k0 * sa.1..], sa.1, w, sb, beta, c, 1) {
                    continue;
                }
            }
            // SAFETY: `c` holds m rows of n; this call writes columns
            // n0..n0+nt of each row only, and no other thread writes those
            // columns. The kernel the plain node's `product` takes.
            unsafe {
                sgemm_into_with(
                    own_kernel(),
                    m,
                    kt,
                    nt,
                    alpha,
                    &a[k0 * sa.1..],
                    sa,
                    w,
                    sb,
                    beta,
                    c0.0.add(n0),
                    n,
                );
            }
        }
    };
    let c0 = SendPtr(c.as_mut_ptr());
    if t == 1 {
        for b in 0..blocks {
            block(b, &mut ws[..len], c0, threads);
        }
        return;
    }
    // On the one pool (threads spawned here would compete with its
    // spinning workers): part `i` takes tile buffer `i` and blocks i, i+t, ...
    let ws0 = SendPtr(ws.as_mut_ptr());
    par::for_parts(threads, t, |i| {
        // SAFETY: `t <= ws.len() / len`, and buffer `i` is part i's alone.
        let w = unsafe { std::slice::from_raw_parts_mut(ws0.add(i * len), len) };
        for b in (i..blocks).step_by(t) {
            block(b, w, c0, 1);
        }
    });
}

struct MatMul {
    w: Coded,
    rows: usize,
    k: usize,
    n: usize,
    slots: usize,
}

impl Kernel for MatMul {
    fn workspace_bytes(&self) -> usize {
        self.slots * tile_floats(self.k, self.n) * 4
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let a = io.input(0)?.f32()?;
        let w = self.w.bind(io)?;
        let threads = io.threads;
        let ws: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let o = io.outputs[0].f32()?;
        let (k, n) = (self.k, self.n);
        tiled_gemm(
            self.rows,
            k,
            n,
            1.0,
            a,
            (k, 1),
            0.0,
            o,
            ws,
            threads,
            |k0, kt, n0, nt, t| {
                for r in 0..kt {
                    w.decode((k0 + r) * n + n0, &mut t[r * nt..(r + 1) * nt]);
                }
                (nt, 1)
            },
        );
        Ok(())
    }
}

fn matmul(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let w = Coded::new(ctx, 1)?;
    let a = ctx.input(0)?;
    if a.dtype != DType::F32 || a.shape.is_empty() {
        return Err(format!(
            "{} on {} {:?}",
            ctx.node.op_type,
            a.dtype.name(),
            a.shape
        ));
    }
    let [k, n] = w.shape[..] else {
        return Err(format!("a weight of shape {:?} (2-D expected)", w.shape));
    };
    if a.shape[a.shape.len() - 1] != k {
        return Err(format!("inner dims differ: {:?} x {:?}", a.shape, w.shape));
    }
    let rows = numel(&a.shape) / k.max(1);
    if numel(&ctx.outputs[0].shape) != rows * n {
        return Err(format!(
            "output {:?} for {rows} x {n}",
            ctx.outputs[0].shape
        ));
    }
    Ok(Box::new(MatMul {
        w,
        rows,
        k,
        n,
        slots: tile_slots(),
    }))
}

struct Gemm {
    w: Coded,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    k: usize,
    n: usize,
    c: Option<Vec<usize>>,
    slots: usize,
}

impl Kernel for Gemm {
    fn workspace_bytes(&self) -> usize {
        self.slots * tile_floats(self.k, self.n) * 4
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let a = io.input(0)?.f32()?;
        let w = self.w.bind(io)?;
        let c = match &self.c {
            Some(_) => Some(io.input(self.w.next())?.f32()?),
            None => None,
        };
        let threads = io.threads;
        let ws: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let o = io.outputs[0].f32()?;
        let (m, k, n) = (self.m, self.k, self.n);
        // The bias as Gemm writes it: beta·C broadcast, then accumulate.
        let beta0 = gemm_bias(o, c, self.c.as_deref(), self.beta, m, n);
        let sa = if self.trans_a { (1, m) } else { (k, 1) };
        let trans_b = self.trans_b;
        tiled_gemm(
            m,
            k,
            n,
            self.alpha,
            a,
            sa,
            beta0,
            o,
            ws,
            threads,
            |k0, kt, n0, nt, t| {
                if trans_b {
                    // W is [N, K]: column j of the tile is a run of row n0+j.
                    for j in 0..nt {
                        w.decode((n0 + j) * k + k0, &mut t[j * kt..(j + 1) * kt]);
                    }
                    (1, kt)
                } else {
                    for r in 0..kt {
                        w.decode((k0 + r) * n + n0, &mut t[r * nt..(r + 1) * nt]);
                    }
                    (nt, 1)
                }
            },
        );
        Ok(())
    }
}

fn gemm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let w = Coded::new(ctx, 1)?;
    let a = ctx.input(0)?;
    if a.dtype != DType::F32 || a.shape.len() != 2 || w.shape.len() != 2 {
        return Err(format!(
            "{} is implemented for 2-D f32 only",
            ctx.node.op_type
        ));
    }
    let node = ctx.node;
    let trans_a = node.attr_int("transA").unwrap_or(0) != 0;
    let trans_b = node.attr_int("transB").unwrap_or(0) != 0;
    let (m, k) = if trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (kb, n) = if trans_b {
        (w.shape[1], w.shape[0])
    } else {
        (w.shape[0], w.shape[1])
    };
    if kb != k || ctx.outputs[0].shape != [m, n] {
        return Err(format!(
            "Gemm of {:?} and a weight {:?} into {:?}",
            a.shape, w.shape, ctx.outputs[0].shape
        ));
    }
    Ok(Box::new(Gemm {
        alpha: node.attr_float("alpha").unwrap_or(1.0),
        beta: node.attr_float("beta").unwrap_or(1.0),
        trans_a,
        trans_b,
        m,
        k,
        n,
        c: ctx.inputs.get(w.next()).cloned().flatten().map(|t| t.shape),
        w,
        slots: tile_slots(),
    }))
}

struct Conv {
    w: Coded,
    g: Window,
    m: usize,
    group: usize,
    bias: bool,
    /// 1×1, stride 1, no padding: the input is the GEMM operand.
    direct: bool,
}

impl Conv {
    fn col_bytes(&self) -> usize {
        if self.direct {
            0
        } else {
            let cg = self.g.c / self.group;
            (cg * self.g.kh * self.g.kw * self.g.oh * self.g.ow * 4).next_multiple_of(ALIGN)
        }
    }
    fn k(&self) -> usize {
        self.g.c / self.group * self.g.kh * self.g.kw
    }
    fn block(&self) -> usize {
        BLOCK_CHANNELS.min(self.m / self.group)
    }
}

impl Kernel for Conv {
    fn workspace_bytes(&self) -> usize {
        self.col_bytes() + self.block() * self.k() * 4
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let g = &self.g;
        let x = io.input(0)?.f32()?;
        let wd = self.w.bind(io)?;
        let b = if self.bias {
            Some(io.input(self.w.next())?.f32()?)
        } else {
            None
        };
        let threads = io.threads;
        let (colb, wb) = io.workspace[..self.workspace_bytes()].split_at_mut(self.col_bytes());
        let col: &mut [f32] = cast_mut(colb);
        let wblk: &mut [f32] = cast_mut(wb);
        let y = io.outputs[0].f32()?;
        let (cg, mg) = (g.c / self.group, self.m / self.group);
        let k = self.k();
        let ohw = g.oh * g.ow;
        let block = self.block();
        for n in 0..g.n {
            let xi = &x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
            let yi = &mut y[n * self.m * ohw..][..self.m * ohw];
            match b {
                Some(b) => {
                    for (m, plane) in yi.chunks_mut(ohw.max(1)).enumerate() {
                        plane.fill(b[m]);
                    }
                }
                None => yi.fill(0.0),
            }
            for gi in 0..self.group {
                let src: &[f32] = if self.direct {
                    &xi[gi * cg * ohw..][..cg * ohw]
                } else {
                    im2col(g, xi, gi * cg, cg, col);
                    &*col
                };
                let yg = &mut yi[gi * mg * ohw..][..mg * ohw];
                for o0 in (0..mg).step_by(block.max(1)) {
                    let ob = block.min(mg - o0);
                    let w = &mut wblk[..ob * k];
                    wd.decode((gi * mg + o0) * k, w);
                    // The kernel the plain Conv picks on its unfolded
                    // paths (bitwise equal to it there).
                    sgemm_with(
                        own_kernel(),
                        ob,
                        k,
                        ohw,
                        1.0,
                        w,
                        (k, 1),
                        src,
                        (ohw, 1),
                        1.0,
                        &mut yg[o0 * ohw..][..ob * ohw],
                        ohw,
                        threads,
                    );
                }
            }
        }
        Ok(())
    }
}

fn conv(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let w = Coded::new(ctx, 1)?;
    let (g, m, group, direct) = conv_layout(ctx, &w.shape)?;
    Ok(Box::new(Conv {
        g,
        m,
        group,
        bias: ctx.inputs.get(w.next()).is_some_and(|b| b.is_some()),
        w,
        direct,
    }))
}

struct Gather {
    w: Coded,
}

impl Kernel for Gather {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let w = self.w.bind(io)?;
        let ids = io.input(self.w.next())?.ints_ref()?;
        let o = io.outputs[0].f32()?;
        let dim = self.w.shape[0];
        let row = numel(&self.w.shape[1..]);
        for (j, &i) in ids.iter().enumerate() {
            let r = if i < 0 { i + dim as i64 } else { i };
            if r < 0 || r as usize >= dim {
                return Err(format!("index {i} out of range for a dim of {dim}"));
            }
            w.decode(r as usize * row, &mut o[j * row..(j + 1) * row]);
        }
        Ok(())
    }
}

fn gather(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let w = Coded::new(ctx, 0)?;
    let a = ctx.node.attr_int("axis").unwrap_or(0);
    if w.shape.is_empty() || (a != 0 && a != -(w.shape.len() as i64)) {
        return Err(format!("{} along axis {a}", ctx.node.op_type));
    }
    let ids = ctx.input(w.next())?;
    let want = numel(&ids.shape) * numel(&w.shape[1..]);
    if numel(&ctx.outputs[0].shape) != want {
        return Err(format!("output {:?}", ctx.outputs[0].shape));
    }
    Ok(Box::new(Gather { w }))
}
