//! Palettized weights decoded per tile inside the kernels that read them
//! (issue 23): the fused nodes [`crate::lower::lower_palette`] makes.
//!
//! A palettized float32 weight `W` (shape `S`, `numel` elements) is a
//! float32 codebook of `ng` groups of `k` entries and one index per element
//! (uint8, or uint4 packed two per byte, low nibble first). Groups are `ng`
//! equal runs of `W`'s flat (row-major) elements, so element `f` is
//! `codebook[(f / (numel / ng)) * k + index[f]]`; `ng = 1` is one codebook
//! for the tensor. The codebook and indices are weights (read in place);
//! `W` and the int32 indices never exist whole:
//!
//! - `PaletteMatMul(A, codebook, indices)`, `W` `[K, N]`: `A`'s rows (all
//!   batch dims flattened, `W` is shared) times tiles of `W` of
//!   [`TILE_K`] rows × [`TILE_N`] columns, decoded into the workspace, each
//!   tile's product accumulated into the output (`sgemm`'s beta = 1 after
//!   the first K tile), on the kernel the unfused MatMul takes. [`TILE_K`]
//!   is that kernel's depth block (256: graphopt's `KC`, and
//!   `matrixmultiply`'s `kc` for f32), so every output element sums the
//!   same partial products in the same order as the unfused MatMul:
//!   results are bitwise equal to the decoded weights'. One row of `A`
//!   (`M = 1`) takes the plain node's matrix-vector kernel ([`crate::cpu::matmul::product`]),
//!   which also sums in blocks of 256 and so is bitwise equal too.
//! - `PaletteGemm(A, codebook, indices, C?)`: the same tiles, `transB=1`
//!   decoding each tile from rows of `W` `[N, K]` (contiguous runs of K) and
//!   handing `sgemm` the transposed strides; the bias as Gemm writes it
//!   (`beta·C`, then every tile accumulates).
//! - `PaletteConv(X, codebook, indices, B?)`, `W` `[M, C/group, (kh,) kw]`:
//!   im2col per image and group as [`crate::cpu::conv`] does, then blocks
//!   of [`BLOCK_CHANNELS`] output channels: each block's weights (contiguous
//!   rows of `W`) decoded into the workspace and multiplied into those
//!   channels' rows (splitting GEMM rows does not change any sum, so this
//!   too is bitwise equal). A block is decoded once per image and group, a
//!   small cost next to its GEMM (`1 / (OH·OW)` of it).
//! - `PaletteGather(codebook, indices, ids)`, axis 0: only the gathered
//!   rows are decoded, straight into the output.
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
//! Indices are checked against `k` once, when the kernel is made (they are
//! constants), so a run never reads past a codebook.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::conv::{conv_layout, im2col, Window};
use crate::cpu::matmul::{gemm_bias, gemv, own_kernel, product, sgemm_into_with, sgemm_with};
use crate::lower::{GROUPS_ATTR, WEIGHT_SHAPE_ATTR};
use crate::tensor::{cast_mut, nibble, numel};
use graphopt_ir::DType;

/// Rows of `W` (the reduction dim) per MatMul/Gemm tile: the f32 depth
/// block of graphopt's kernel and of `matrixmultiply`, so that tiles add
/// up in the unfused product's order.
pub const TILE_K: usize = 256;
/// Columns of `W` per MatMul/Gemm tile.
pub const TILE_N: usize = 256;
/// Output channels per Conv block.
pub const BLOCK_CHANNELS: usize = 64;

const ALIGN: usize = 64;

/// A palettized weight's layout (the data comes with each run).
#[derive(Clone, Debug)]
struct Palette {
    /// `S`.
    shape: Vec<usize>,
    /// Entries per codebook.
    k: usize,
    /// Elements per group (`numel / ng`).
    per: usize,
    /// uint4 indices (else uint8).
    packed: bool,
}

impl Palette {
    /// Reads and checks the layout: codebook in slot `cb`, indices in
    /// slot `idx` (a constant, every index checked below `k`).
    fn new(ctx: &NodeCtx, cb: usize, idx: usize) -> Result<Palette, String> {
        let shape: Vec<usize> = ctx
            .node
            .attr_ints(WEIGHT_SHAPE_ATTR)
            .ok_or_else(|| format!("no {WEIGHT_SHAPE_ATTR} attribute"))?
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("weight dim {d}")))
            .collect::<Result<_, _>>()?;
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
        let n = numel(&shape);
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
            shape,
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

/// The codebook and index bytes of a run.
fn data<'a>(io: &KernelIo<'a>, cb: usize, idx: usize) -> Result<(&'a [f32], &'a [u8]), String> {
    Ok((io.input(cb)?.f32()?, io.input(idx)?.bytes()?))
}

/// The kernel of a fused node (domain [`crate::lower::PALETTE_DOMAIN`]).
pub fn kernel(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    match ctx.node.op_type.as_str() {
        "PaletteMatMul" => matmul(ctx),
        "PaletteGemm" => gemm(ctx),
        "PaletteConv" => conv(ctx),
        "PaletteGather" => gather(ctx),
        op => Err(format!("no palette kernel for {op}")),
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

/// `c[m × n] (row stride n) = alpha · a · W + beta0 · c` with `W` `[kk × n]`
/// decoded tile by tile: `tile(k0, kt, n0, nt, buf)` fills `buf` with rows
/// `k0..k0+kt`, columns `n0..n0+nt` of `W` and returns the tile's strides.
/// `a` has strides `sa` (column `k0` starts at `k0 · sa.1`). `ws` holds
/// one or more tile buffers: with several threads and several column
/// blocks of [`TILE_N`], each thread decodes and multiplies its own column
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
    let blocks = n.div_ceil(TILE_N);
    let t = threads.min(blocks).min(ws.len() / len).max(1);
    // Column block `b` of `W` into the tile `w`, times `a`, into columns
    // `b·TILE_N..` of `c` (through `c0`, with `gemm_threads`).
    let block = |b: usize, w: &mut [f32], c0: SendPtr, gemm_threads: usize| {
        let n0 = b * TILE_N;
        let nt = TILE_N.min(n - n0);
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
    std::thread::scope(|s| {
        for (i, w) in ws.chunks_mut(len).take(t).enumerate() {
            let block = &block;
            s.spawn(move || {
                for b in (i..blocks).step_by(t) {
                    block(b, w, c0, 1);
                }
            });
        }
    });
}

struct MatMul {
    p: Palette,
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
        let (cb, idx) = data(io, 1, 2)?;
        let threads = io.threads;
        let ws: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let o = io.outputs[0].f32()?;
        let (k, n, p) = (self.k, self.n, &self.p);
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
            |k0, kt, n0, nt, w| {
                for r in 0..kt {
                    p.decode(cb, idx, (k0 + r) * n + n0, &mut w[r * nt..(r + 1) * nt]);
                }
                (nt, 1)
            },
        );
        Ok(())
    }
}

fn matmul(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let p = Palette::new(ctx, 1, 2)?;
    let a = ctx.input(0)?;
    if a.dtype != DType::F32 || a.shape.is_empty() {
        return Err(format!("PaletteMatMul on {} {:?}", a.dtype.name(), a.shape));
    }
    let [k, n] = p.shape[..] else {
        return Err(format!("a weight of shape {:?} (2-D expected)", p.shape));
    };
    if a.shape[a.shape.len() - 1] != k {
        return Err(format!("inner dims differ: {:?} x {:?}", a.shape, p.shape));
    }
    let rows = numel(&a.shape) / k.max(1);
    if numel(&ctx.outputs[0].shape) != rows * n {
        return Err(format!(
            "output {:?} for {rows} x {n}",
            ctx.outputs[0].shape
        ));
    }
    Ok(Box::new(MatMul {
        p,
        rows,
        k,
        n,
        slots: tile_slots(),
    }))
}

struct Gemm {
    p: Palette,
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
        let (cb, idx) = data(io, 1, 2)?;
        let c = match &self.c {
            Some(_) => Some(io.input(3)?.f32()?),
            None => None,
        };
        let threads = io.threads;
        let ws: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let o = io.outputs[0].f32()?;
        let (m, k, n, p) = (self.m, self.k, self.n, &self.p);
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
            |k0, kt, n0, nt, w| {
                if trans_b {
                    // W is [N, K]: column j of the tile is a run of row n0+j.
                    for j in 0..nt {
                        p.decode(cb, idx, (n0 + j) * k + k0, &mut w[j * kt..(j + 1) * kt]);
                    }
                    (1, kt)
                } else {
                    for r in 0..kt {
                        p.decode(cb, idx, (k0 + r) * n + n0, &mut w[r * nt..(r + 1) * nt]);
                    }
                    (nt, 1)
                }
            },
        );
        Ok(())
    }
}

fn gemm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let p = Palette::new(ctx, 1, 2)?;
    let a = ctx.input(0)?;
    if a.dtype != DType::F32 || a.shape.len() != 2 || p.shape.len() != 2 {
        return Err("PaletteGemm is implemented for 2-D f32 only".into());
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
        (p.shape[1], p.shape[0])
    } else {
        (p.shape[0], p.shape[1])
    };
    if kb != k || ctx.outputs[0].shape != [m, n] {
        return Err(format!(
            "Gemm of {:?} and a weight {:?} into {:?}",
            a.shape, p.shape, ctx.outputs[0].shape
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
        c: ctx.inputs.get(3).cloned().flatten().map(|t| t.shape),
        p,
        slots: tile_slots(),
    }))
}

struct Conv {
    p: Palette,
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
        let (cb, idx) = data(io, 1, 2)?;
        let b = if self.bias {
            Some(io.input(3)?.f32()?)
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
                    self.p.decode(cb, idx, (gi * mg + o0) * k, w);
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
    let p = Palette::new(ctx, 1, 2)?;
    let (g, m, group, direct) = conv_layout(ctx, &p.shape)?;
    Ok(Box::new(Conv {
        p,
        g,
        m,
        group,
        bias: ctx.inputs.get(3).is_some_and(|b| b.is_some()),
        direct,
    }))
}

struct Gather {
    p: Palette,
}

impl Kernel for Gather {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let (cb, idx) = data(io, 0, 1)?;
        let ids = io.input(2)?.ints()?;
        let o = io.outputs[0].f32()?;
        let dim = self.p.shape[0];
        let row = numel(&self.p.shape[1..]);
        for (j, &i) in ids.iter().enumerate() {
            let r = if i < 0 { i + dim as i64 } else { i };
            if r < 0 || r as usize >= dim {
                return Err(format!("index {i} out of range for a dim of {dim}"));
            }
            self.p
                .decode(cb, idx, r as usize * row, &mut o[j * row..(j + 1) * row]);
        }
        Ok(())
    }
}

fn gather(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let p = Palette::new(ctx, 0, 1)?;
    let a = ctx.node.attr_int("axis").unwrap_or(0);
    if p.shape.is_empty() || (a != 0 && a != -(p.shape.len() as i64)) {
        return Err(format!("PaletteGather along axis {a}"));
    }
    let ids = ctx.input(2)?;
    let want = numel(&ids.shape) * numel(&p.shape[1..]);
    if numel(&ctx.outputs[0].shape) != want {
        return Err(format!("output {:?}", ctx.outputs[0].shape));
    }
    Ok(Box::new(Gather { p }))
}
