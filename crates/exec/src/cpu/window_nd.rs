//! Windows of three or more spatial dims (video and volumetric models:
//! `Conv3d`, `ConvTranspose3d`, `MaxPool3d`, `AvgPool3d`), and LpPool of
//! any: Conv, ConvTranspose, MaxPool, AveragePool and LpPool over
//! `[N, C, D1, .., Dk]` for any k, with strides, dilations, pads,
//! `auto_pad` and (Conv) groups. The 1-D and 2-D windows keep their own
//! tuned kernels ([`super::conv`], [`super::pool`]); these are the general
//! ones.
//!
//! Conv unfolds one group of one image in tiles of output positions
//! (im2col over every kernel tap, in the 2-D convolution's tile sizes;
//! padding reads as 0) and multiplies each tile into its columns of the
//! output; threads take whole tiles, each in its own workspace slot, as
//! the 2-D convolution's do (a volume that fits one tile is one tile,
//! its rows unfolded and its GEMM's rows split across threads). The
//! workspace is a few tiles whatever the volume or batch. Pooling walks each output position's
//! window directly, planes split across threads.
//!
//! Before (refused: "3-D windows are not implemented"):
//! ```text
//! y = Conv <kernel_shape = [3, 3, 3], pads = [1, 1, 1, 1, 1, 1]> (x, w, b)  # x: [1, 3, 8, 64, 64]
//! ```
//! After: `y` is `[1, M, 8, 64, 64]`, each tile of output positions one
//! `[M, 3·27] x [3·27, cols]` product.
//!
//! Col2Im, im2col's adjoint, walks the same geometry backwards: the image
//! (`image_shape`, any number of dims) is the window's input, the blocks
//! its output positions, and each column value is added into the image
//! position of its tap (padding taps dropped); image planes split across
//! threads. The image's dims come from the output shape (checked against
//! a constant `image_shape`), `block_shape` is read when the kernel runs
//! (checked when the kernel is made if it is a constant).

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::conv;
use crate::cpu::matmul::{own_kernel, sgemm_into_with, sgemm_with, SendPtr};
use crate::cpu::par;
use crate::tensor::cast_mut;
use graphopt_ir::DType;

/// Bytes of one ConvTranspose product tile (`Wᵀ · X` columns).
const TILE_BYTES: usize = 4 << 20;

/// Geometry of a window over `sp` spatial dims.
#[derive(Clone, Debug)]
struct Nd {
    n: usize,
    c: usize,
    input: Vec<usize>,
    out: Vec<usize>,
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    /// Padding at the start and at the end of each spatial dim.
    begin: Vec<usize>,
    end: Vec<usize>,
}

impl Nd {
    /// Reads a Conv's or pooling node's window for input `[N, C, D..]`
    /// and the output shape inference gave.
    fn new(ctx: &NodeCtx, kernel: &[usize]) -> Result<Nd, String> {
        let x = &ctx.input(0)?.shape;
        let y = &ctx.outputs[0].shape;
        let sp = x.len().checked_sub(2).ok_or("input rank below 3")?;
        if kernel.len() != sp || y.len() != x.len() || kernel.contains(&0) {
            return Err(format!(
                "a window of {} dims for an input of shape {x:?}",
                kernel.len()
            ));
        }
        Nd::with(
            ctx.node,
            x[0],
            x[1],
            x[2..].to_vec(),
            y[2..].to_vec(),
            kernel,
        )
    }

    /// The window of `kernel` taps from `[N, C, input..]` to `[N, C,
    /// out..]` with the node's strides, dilations, pads and `auto_pad`.
    fn with(
        node: &graphopt_ir::NodeData,
        n: usize,
        c: usize,
        input: Vec<usize>,
        out: Vec<usize>,
        kernel: &[usize],
    ) -> Result<Nd, String> {
        let sp = input.len();
        let ints = |name: &str, len: usize, d: usize| -> Result<Vec<usize>, String> {
            match node.attr_ints(name) {
                None => Ok(vec![d; len]),
                Some(v) if v.len() == len && v.iter().all(|&x| x >= 0) => {
                    Ok(v.iter().map(|&x| x as usize).collect())
                }
                Some(v) => Err(format!("{name} {v:?} for {sp} spatial dims")),
            }
        };
        let strides = ints("strides", sp, 1)?;
        let dilations = ints("dilations", sp, 1)?;
        if strides.contains(&0) || dilations.contains(&0) {
            return Err("strides and dilations must be positive".into());
        }
        let pads = ints("pads", 2 * sp, 0)?;
        let (mut begin, mut end) = (pads[..sp].to_vec(), pads[sp..].to_vec());
        match node.attr_str("auto_pad").unwrap_or("NOTSET") {
            a @ ("SAME_UPPER" | "SAME_LOWER") => {
                for i in 0..sp {
                    let need = (out[i].saturating_sub(1) * strides[i]
                        + (kernel[i] - 1) * dilations[i]
                        + 1)
                    .saturating_sub(input[i]);
                    begin[i] = if a == "SAME_LOWER" {
                        need.div_ceil(2)
                    } else {
                        need / 2
                    };
                    end[i] = need - begin[i];
                }
            }
            "VALID" => {
                begin = vec![0; sp];
                end = vec![0; sp];
            }
            _ => {}
        }
        Ok(Nd {
            n,
            c,
            input,
            out,
            kernel: kernel.to_vec(),
            strides,
            dilations,
            begin,
            end,
        })
    }

    fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    fn in_plane(&self) -> usize {
        self.input.iter().product()
    }

    fn out_plane(&self) -> usize {
        self.out.iter().product()
    }

    /// Each tap's offset from its window's origin, per dim
    /// (`k·dilation - begin pad`), `taps × dims` row-major: the table
    /// [`Nd::window`] walks.
    fn tap_table(&self) -> Vec<isize> {
        let sp = self.out.len();
        let mut table = vec![0isize; self.taps() * sp];
        for (t, offs) in table.chunks_mut(sp.max(1)).enumerate() {
            let mut rest = t;
            for d in (0..sp).rev() {
                let kc = rest % self.kernel[d];
                rest /= self.kernel[d];
                offs[d] = (kc * self.dilations[d]) as isize - self.begin[d] as isize;
            }
        }
        table
    }

    /// Calls `f(tap, position)` for every tap of the window of output
    /// position `o` (flat): `position` is the flat input index, or `None`
    /// for a tap in the begin or end padding; a tap past the end padding
    /// (a `ceil_mode` window) is skipped. `table` is [`Nd::tap_table`];
    /// `oc` is scratch of one element per spatial dim.
    fn window(
        &self,
        o: usize,
        table: &[isize],
        oc: &mut [usize],
        mut f: impl FnMut(usize, Option<usize>),
    ) {
        let sp = self.out.len();
        // The window's origin per dim.
        let mut rest = o;
        for d in (0..sp).rev() {
            oc[d] = (rest % self.out[d]) * self.strides[d];
            rest /= self.out[d];
        }
        for (t, offs) in table.chunks(sp.max(1)).enumerate() {
            let (mut pos, mut inside, mut padded) = (0usize, true, true);
            for d in 0..sp {
                let i = oc[d] as isize + offs[d];
                if i < 0 || i as usize >= self.input[d] {
                    inside = false;
                    padded &= i < (self.input[d] + self.end[d]) as isize;
                } else {
                    pos = pos * self.input[d] + i as usize;
                }
            }
            if inside {
                f(t, Some(pos));
            } else if padded {
                f(t, None);
            }
        }
    }

    /// Writes tap `t` of one input channel `x` for the output positions
    /// `p0..p0 + row.len()` into `row` (0 in the padding): one im2col row,
    /// walked as runs along the last dim.
    fn unfold_row(&self, x: &[f32], t: usize, p0: usize, row: &mut [f32]) {
        let sp = self.out.len();
        let last = sp - 1;
        // The tap's offset per dim, and the first position's coordinates.
        let mut off = vec![0isize; sp];
        let mut rest = t;
        for d in (0..sp).rev() {
            let kc = rest % self.kernel[d];
            rest /= self.kernel[d];
            off[d] = (kc * self.dilations[d]) as isize - self.begin[d] as isize;
        }
        let mut oc = vec![0usize; sp];
        let mut rest = p0;
        for d in (0..sp).rev() {
            oc[d] = rest % self.out[d];
            rest /= self.out[d];
        }
        let (s_last, in_last) = (self.strides[last] as isize, self.input[last] as isize);
        let mut j = 0;
        while j < row.len() {
            let run = (self.out[last] - oc[last]).min(row.len() - j);
            let dst = &mut row[j..j + run];
            // The run's row of the input, if inside in every outer dim.
            let mut base = Some(0usize);
            for d in 0..last {
                let i = (oc[d] * self.strides[d]) as isize + off[d];
                base = match base {
                    Some(b) if i >= 0 && (i as usize) < self.input[d] => {
                        Some(b * self.input[d] + i as usize)
                    }
                    _ => None,
                };
            }
            match base {
                None => dst.fill(0.0),
                Some(b) => {
                    let src = &x[b * self.input[last]..][..self.input[last]];
                    let i0 = oc[last] as isize * s_last + off[last];
                    // The run's taps inside the row: q in lo..hi, where
                    // 0 <= i0 + q·s < in_last.
                    let lo = if i0 >= 0 {
                        0
                    } else {
                        ((-i0 + s_last - 1) / s_last) as usize
                    };
                    let hi = if i0 >= in_last {
                        0
                    } else {
                        (((in_last - 1 - i0) / s_last) as usize + 1).min(run)
                    };
                    let lo = lo.min(hi);
                    dst[..lo].fill(0.0);
                    dst[hi..].fill(0.0);
                    // (lo == hi: no tap of the run falls inside the row,
                    // and `first` would lie outside it.)
                    if lo < hi {
                        let first = (i0 + lo as isize * s_last) as usize;
                        // The 2-D unfolding's strided copy (block copies,
                        // stride 2 in AVX2 shuffles).
                        <f32 as conv::Unfold>::strided(
                            &src[first..],
                            s_last as usize,
                            &mut dst[lo..hi],
                        );
                    }
                }
            }
            j += run;
            // Advance the coordinates by the run (odometer).
            oc[last] += run;
            let mut d = last;
            while oc[d] == self.out[d] && d > 0 {
                oc[d] = 0;
                d -= 1;
                oc[d] += 1;
            }
        }
    }
}

/// Conv over three or more spatial dims.
struct ConvNd {
    g: Nd,
    m: usize,
    group: usize,
    bias: bool,
    /// Output positions per im2col tile ([`conv::tile_cols`]).
    tile: usize,
    /// Tile buffers in the workspace ([`conv::tile_slots`]).
    slots: usize,
    own: bool,
}

impl ConvNd {
    fn k(&self) -> usize {
        self.g.c / self.group * self.g.taps()
    }

    /// Unfolds channels `xg` (`[cg, D..]`) for output positions
    /// `p0..p0 + pt` into `col` (`[k, pt]`), rows split across `threads`.
    fn unfold(&self, xg: &[f32], p0: usize, pt: usize, col: &mut [f32], threads: usize) {
        let (taps, ip) = (self.g.taps(), self.g.in_plane());
        par::for_chunks_mut(threads, &mut col[..self.k() * pt], pt, 8, |r0, rows| {
            for (j, row) in rows.chunks_mut(pt).enumerate() {
                let r = r0 + j;
                self.g
                    .unfold_row(&xg[r / taps * ip..][..ip], r % taps, p0, row);
            }
        });
    }
}

/// Conv of a `[N, C, D1, .., Dk]` input, k >= 3.
pub fn conv(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let w = ctx.input(1)?;
    if x.dtype != DType::F32 || w.dtype != DType::F32 {
        return Err(format!("Conv on {} is not implemented", x.dtype.name()));
    }
    if w.shape.len() != x.shape.len() {
        return Err(format!(
            "a weight of shape {:?} for an input of shape {:?}",
            w.shape, x.shape
        ));
    }
    let g = Nd::new(ctx, &w.shape[2..])?;
    let group = ctx.node.attr_int("group").unwrap_or(1);
    let m = w.shape[0];
    if group <= 0 || !g.c.is_multiple_of(group as usize) || !m.is_multiple_of(group as usize) {
        return Err(format!("bad group {group} for {} channels", g.c));
    }
    let group = group as usize;
    if w.shape[1] * group != g.c {
        return Err(format!(
            "a weight of shape {:?} for {} input channels in {group} groups",
            w.shape, g.c
        ));
    }
    let bias = match ctx.inputs.get(2).and_then(|b| b.as_ref()) {
        Some(b) if b.shape != [m] => {
            return Err(format!("a bias of shape {:?} for {m} outputs", b.shape))
        }
        Some(_) => true,
        None => false,
    };
    let k = g.c / group * g.taps();
    let op = g.out_plane();
    let tile = conv::tile_cols(k, op);
    Ok(Box::new(ConvNd {
        slots: conv::tile_slots(op.div_ceil(tile)),
        g,
        m,
        group,
        bias,
        tile,
        own: own_kernel(),
    }))
}

impl Kernel for ConvNd {
    fn workspace_bytes(&self) -> usize {
        self.k() * self.tile * self.slots * 4
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let w = io.input(1)?.f32()?;
        let b = if self.bias {
            Some(io.input(2)?.f32()?)
        } else {
            None
        };
        let threads = io.threads;
        let ws: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let y = io.outputs[0].f32()?;
        let g = &self.g;
        let (cg, mg, k) = (g.c / self.group, self.m / self.group, self.k());
        let (ip, op, tile) = (g.in_plane(), g.out_plane(), self.tile);
        let tiles = op.div_ceil(tile);
        for n in 0..g.n {
            let yn = &mut y[n * self.m * op..][..self.m * op];
            for (ch, plane) in yn.chunks_mut(op.max(1)).enumerate() {
                plane.fill(b.map_or(0.0, |b| b[ch]));
            }
            if mg == 0 {
                // No output channels: nothing to multiply into.
                continue;
            }
            for gi in 0..self.group {
                let xg = &x[(n * g.c + gi * cg) * ip..][..cg * ip];
                let wg = &w[gi * mg * k..][..mg * k];
                let yg = &mut yn[gi * mg * op..][..mg * op];
                let t = threads.min(self.slots).min(tiles);
                if t > 1 {
                    // Each part unfolds and multiplies its own tiles into
                    // its own columns of the output.
                    let yp = SendPtr(yg.as_mut_ptr());
                    conv::tiles_in_parts(threads, t, (tile, op), ws, k * tile, |col, p0, pt| {
                        self.unfold(xg, p0, pt, col, 1);
                        // SAFETY: columns p0..p0+pt of the mg rows of `yg`
                        // (row stride op) are this part's alone.
                        unsafe {
                            sgemm_into_with(
                                self.own,
                                mg,
                                k,
                                pt,
                                1.0,
                                wg,
                                (k, 1),
                                &col[..k * pt],
                                (pt, 1),
                                1.0,
                                yp.get().add(p0),
                                op,
                            )
                        };
                    });
                } else {
                    let col = &mut ws[..k * tile];
                    for j in 0..tiles {
                        let (p0, pt) = (j * tile, tile.min(op - j * tile));
                        self.unfold(xg, p0, pt, col, threads);
                        sgemm_with(
                            self.own,
                            mg,
                            k,
                            pt,
                            1.0,
                            wg,
                            (k, 1),
                            &col[..k * pt],
                            (pt, 1),
                            1.0,
                            &mut yg[p0..],
                            op,
                            threads,
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// ConvTranspose over three or more spatial dims: per image and group,
/// `Wᵀ · X` for a tile of input positions (`[M/g · taps, cols]`), each of
/// its elements then added at its output position (col2im), output
/// channels split across threads.
struct TransposeNd {
    /// Input `[N, C, ..]` over output `[N, M, ..]`; `begin` pads the
    /// output's start.
    g: Nd,
    m: usize,
    group: usize,
    bias: bool,
    cols: usize,
}

/// ConvTranspose of a `[N, C, D1, .., Dk]` input, k >= 3, with the
/// strides, dilations and begin pads of [`super::conv::transpose_window`].
pub fn conv_transpose(
    ctx: &NodeCtx,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    begin: Vec<usize>,
) -> Result<Box<dyn Kernel>, String> {
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    let y = &ctx.outputs[0];
    if w.dtype != DType::F32 {
        return Err(format!(
            "ConvTranspose on {} is not implemented",
            w.dtype.name()
        ));
    }
    let group = ctx.node.attr_int("group").unwrap_or(1);
    let c = x.shape[1];
    if group <= 0 || w.shape[0] != c || !c.is_multiple_of(group as usize) {
        return Err(format!("bad group {group} for {c} channels"));
    }
    let group = group as usize;
    let m = w.shape[1] * group;
    if y.shape[1] != m || y.shape[0] != x.shape[0] {
        return Err(format!(
            "an output of shape {:?} for input {:?} and weight {:?}",
            y.shape, x.shape, w.shape
        ));
    }
    let bias = match ctx.inputs.get(2).and_then(|b| b.as_ref()) {
        Some(b) if b.shape != [m] => {
            return Err(format!("a bias of shape {:?} for {m} outputs", b.shape))
        }
        Some(_) => true,
        None => false,
    };
    let sp = x.shape.len() - 2;
    let g = Nd {
        n: x.shape[0],
        c,
        input: x.shape[2..].to_vec(),
        out: y.shape[2..].to_vec(),
        kernel: w.shape[2..].to_vec(),
        strides,
        dilations,
        begin,
        end: vec![0; sp],
    };
    let rows = m / group * g.taps();
    let cols = (TILE_BYTES / 4 / rows.max(1)).clamp(1, g.in_plane().max(1));
    Ok(Box::new(TransposeNd {
        g,
        m,
        group,
        bias,
        cols,
    }))
}

impl Kernel for TransposeNd {
    fn workspace_bytes(&self) -> usize {
        self.m / self.group * self.g.taps() * self.cols * 4
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let w = io.input(1)?.f32()?;
        let b = if self.bias {
            Some(io.input(2)?.f32()?)
        } else {
            None
        };
        let threads = io.threads;
        let col: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let y = io.outputs[0].f32()?;
        let g = &self.g;
        let (cg, mg, taps) = (g.c / self.group, self.m / self.group, g.taps());
        let (ip, op) = (g.in_plane(), g.out_plane());
        let rows = mg * taps;
        let sp = g.out.len();
        y.fill(0.0);
        for n in 0..g.n {
            for gi in 0..self.group {
                let xg = &x[(n * g.c + gi * cg) * ip..][..cg * ip];
                // Rows c of the group's weight: [cg, mg · taps].
                let wg = &w[gi * cg * rows..][..cg * rows];
                let yg = &mut y[(n * self.m + gi * mg) * op..][..mg * op];
                let mut p0 = 0;
                while p0 < ip {
                    let cols = self.cols.min(ip - p0);
                    let tile = &mut col[..rows * cols];
                    // tile = wgᵀ · xg[:, p0..p0 + cols]
                    sgemm_with(
                        own_kernel(),
                        rows,
                        cg,
                        cols,
                        1.0,
                        wg,
                        (1, rows),
                        &xg[p0..],
                        (ip, 1),
                        0.0,
                        tile,
                        cols,
                        threads,
                    );
                    let tile = &*tile;
                    par::for_chunks_mut(threads, yg, op.max(1), 1, |m0, planes| {
                        let mut ic = vec![0usize; sp];
                        let mut kc = vec![0usize; sp];
                        for (j, plane) in planes.chunks_mut(op.max(1)).enumerate() {
                            let mi = m0 + j;
                            for t in 0..taps {
                                let mut rest = t;
                                for d in (0..sp).rev() {
                                    kc[d] = rest % g.kernel[d];
                                    rest /= g.kernel[d];
                                }
                                let src = &tile[(mi * taps + t) * cols..][..cols];
                                for (q, &v) in src.iter().enumerate() {
                                    let mut rest = p0 + q;
                                    for d in (0..sp).rev() {
                                        ic[d] = rest % g.input[d];
                                        rest /= g.input[d];
                                    }
                                    let mut at = Some(0usize);
                                    for d in 0..sp {
                                        let o = (ic[d] * g.strides[d] + kc[d] * g.dilations[d])
                                            as isize
                                            - g.begin[d] as isize;
                                        at = match at {
                                            Some(a) if o >= 0 && (o as usize) < g.out[d] => {
                                                Some(a * g.out[d] + o as usize)
                                            }
                                            _ => None,
                                        };
                                    }
                                    if let Some(a) = at {
                                        plane[a] += v;
                                    }
                                }
                            }
                        }
                    });
                    p0 += cols;
                }
            }
            if let Some(b) = b {
                let yn = &mut y[n * self.m * op..][..self.m * op];
                for (ch, plane) in yn.chunks_mut(op.max(1)).enumerate() {
                    plane.iter_mut().for_each(|v| *v += b[ch]);
                }
            }
        }
        Ok(())
    }
}

/// What a [`PoolNd`] computes over each window.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Max,
    /// Counting the padding's taps (`count_include_pad`) or not.
    Average {
        include_pad: bool,
    },
    /// `(Σ |x|^p)^(1/p)`; the padding adds nothing.
    Lp(i32),
}

/// MaxPool or AveragePool over three or more spatial dims, and LpPool over
/// any number.
struct PoolNd {
    g: Nd,
    mode: Mode,
    /// MaxPool's Indices output (row-major only).
    indices: bool,
}

/// MaxPool / AveragePool of a `[N, C, D1, .., Dk]` input, k >= 3, or
/// LpPool, k >= 1.
pub fn pool(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 {
        return Err(format!("pooling on {} is not implemented", x.dtype.name()));
    }
    let op = ctx.node.op_type.as_str();
    let mode = match op {
        "MaxPool" => Mode::Max,
        "LpPool" => {
            let p = ctx.node.attr_int("p").unwrap_or(2);
            if !(1..=1 << 16).contains(&p) {
                return Err(format!("LpPool p {p} is not a positive integer"));
            }
            Mode::Lp(p as i32)
        }
        _ => Mode::Average {
            include_pad: ctx.node.attr_int("count_include_pad") == Some(1),
        },
    };
    let indices = ctx.outputs.len() > 1 && ctx.outputs[1].shape != [0];
    if indices && (mode != Mode::Max || ctx.outputs[1].dtype != DType::I64) {
        return Err("a second output of pooling is MaxPool's int64 Indices only".into());
    }
    if indices && ctx.node.attr_int("storage_order").unwrap_or(0) != 0 {
        return Err("MaxPool's column-major Indices (storage_order = 1) are implemented for 1-D and 2-D windows only".into());
    }
    let ks: Vec<usize> = ctx
        .node
        .attr_ints("kernel_shape")
        .ok_or_else(|| format!("{op} needs kernel_shape"))?
        .iter()
        .map(|&k| k.max(0) as usize)
        .collect();
    Ok(Box::new(PoolNd {
        g: Nd::new(ctx, &ks)?,
        mode,
        indices,
    }))
}

impl Kernel for PoolNd {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let g = &self.g;
        let (ip, op) = (g.in_plane(), g.out_plane());
        let planes = g.n * g.c;
        let (y, rest) = io.outputs.split_at_mut(1);
        let y = y[0].f32()?;
        let idx: Option<&mut [i64]> = match (self.indices, rest.first_mut()) {
            (true, Some(o)) => Some(cast_mut(o.data)),
            _ => None,
        };
        // Planes split across threads; each part owns its planes' outputs
        // (and indices).
        let k = par::parts(
            planes,
            io.threads,
            par::MIN_ELEMS.div_ceil((op * g.taps()).max(1)),
        );
        let mut items = Vec::with_capacity(k);
        let (mut y_rest, mut idx_rest) = (&mut y[..planes * op], idx);
        for p in 0..k {
            let r = par::range(planes, k, p);
            let (mine, tail) = y_rest.split_at_mut(r.len() * op);
            y_rest = tail;
            let ix = match idx_rest.take() {
                Some(ix) => {
                    let (mine, tail) = ix.split_at_mut(r.len() * op);
                    idx_rest = Some(tail);
                    Some(mine)
                }
                None => None,
            };
            items.push((r.start, mine, ix));
        }
        let table = g.tap_table();
        par::for_each_owned(io.threads, items, |(p0, ys, mut ixs)| {
            let mut oc = vec![0usize; g.out.len()];
            for (j, out) in ys.chunks_mut(op.max(1)).enumerate() {
                let p = p0 + j;
                let plane = &x[p * ip..][..ip];
                for (o, v) in out.iter_mut().enumerate() {
                    let (mut acc, mut arg, mut cnt, mut padded) = (0f32, 0usize, 0usize, 0usize);
                    let mode = self.mode;
                    g.window(o, &table, &mut oc, |_, pos| match pos {
                        Some(pos) => {
                            let v = plane[pos];
                            match mode {
                                Mode::Max => {
                                    if cnt == 0 || v > acc || (v.is_nan() && !acc.is_nan()) {
                                        acc = v;
                                        arg = pos;
                                    }
                                }
                                Mode::Average { .. } => acc += v,
                                Mode::Lp(p) => {
                                    let a = v.abs();
                                    acc += match p {
                                        1 => a,
                                        2 => a * a,
                                        _ => a.powi(p),
                                    };
                                }
                            }
                            cnt += 1;
                        }
                        None => padded += 1,
                    });
                    *v = match mode {
                        Mode::Max if cnt == 0 => f32::NEG_INFINITY,
                        Mode::Max => acc,
                        Mode::Average { include_pad } => {
                            let d = if include_pad { cnt + padded } else { cnt };
                            acc / d.max(1) as f32
                        }
                        Mode::Lp(1) => acc,
                        Mode::Lp(2) => acc.sqrt(),
                        Mode::Lp(p) => acc.powf(1.0 / p as f32),
                    };
                    if let Some(ix) = ixs.as_deref_mut() {
                        ix[j * op + o] = (p * ip + arg) as i64;
                    }
                }
            }
        });
        Ok(())
    }
}

/// Col2Im: `[N, C·∏block, L]` columns summed into `[N, C, image..]`.
struct Col2Im {
    /// The window's strides, dilations and pads over the image; its
    /// kernel and blocks come from `block_shape` ([`Col2Im::geometry`]).
    template: Nd,
    /// Input dims 1 and 2.
    rows: usize,
    cols: usize,
}

impl Col2Im {
    /// The window of `block` over the image: its blocks (the positions a
    /// window of `block` takes over the padded image) must number the
    /// input's columns, and the kernel's taps times the channels its rows.
    fn geometry(&self, block: &[i64]) -> Result<Nd, String> {
        let mut g = self.template.clone();
        let sp = g.input.len();
        if block.len() != sp || block.iter().any(|&k| k <= 0) {
            return Err(format!(
                "Col2Im block_shape {block:?} for an image of {sp} dims"
            ));
        }
        g.kernel = block.iter().map(|&k| k as usize).collect();
        let taps = g.kernel.iter().try_fold(1usize, |a, &k| a.checked_mul(k));
        if taps.and_then(|t| t.checked_mul(g.c)) != Some(self.rows) {
            return Err(format!(
                "Col2Im input of {} rows for {} channels and block_shape {block:?}",
                self.rows, g.c
            ));
        }
        for d in 0..sp {
            let span = (g.kernel[d] - 1)
                .checked_mul(g.dilations[d])
                .and_then(|v| v.checked_add(1));
            let padded = g.input[d]
                .checked_add(g.begin[d])
                .and_then(|v| v.checked_add(g.end[d]));
            g.out[d] = match (padded, span) {
                (Some(p), Some(s)) if p >= s => (p - s) / g.strides[d] + 1,
                _ => 0,
            };
        }
        let blocks = g.out.iter().try_fold(1usize, |a, &k| a.checked_mul(k));
        if blocks != Some(self.cols) || self.cols == 0 {
            return Err(format!(
                "Col2Im: {:?} blocks of {block:?} fit the image {:?}, but the input has {} columns",
                g.out, g.input, self.cols
            ));
        }
        Ok(g)
    }
}

/// Col2Im of `[N, C·∏block_shape, L]` into `[N, C, image_shape..]`.
pub fn col2im(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let y = &ctx.outputs[0];
    if x.dtype != DType::F32 {
        return Err(format!("Col2Im on {} is not implemented", x.dtype.name()));
    }
    if ctx.node.attr_str("auto_pad").is_some() {
        return Err("Col2Im has no auto_pad".into());
    }
    let consts = |i: usize| -> Result<Option<Vec<i64>>, String> {
        let t = ctx.input(i)?;
        if t.dtype != DType::I64 || t.shape.len() != 1 {
            return Err(format!(
                "Col2Im input {i} of {} {:?}, not a 1-D int64",
                t.dtype.name(),
                t.shape
            ));
        }
        Ok(ctx
            .constants
            .get(i)
            .copied()
            .flatten()
            .map(|b| crate::tensor::cast::<i64>(b).to_vec()))
    };
    let (image_c, block_c) = (consts(1)?, consts(2)?);
    let sp = y.shape.len().saturating_sub(2);
    let (rows, cols) = match x.shape[..] {
        [n, rows, cols] if sp > 0 && n == y.shape[0] => (rows, cols),
        _ => {
            return Err(format!(
                "Col2Im input of shape {:?} for an output of shape {:?}",
                x.shape, y.shape
            ))
        }
    };
    let image = y.shape[2..].to_vec();
    if let Some(i) = image_c {
        if i.len() != sp || i.iter().zip(&image).any(|(&a, &b)| a != b as i64) {
            return Err(format!(
                "Col2Im image_shape {i:?} but an output of shape {:?}",
                y.shape
            ));
        }
    }
    let k = Col2Im {
        template: Nd::with(
            ctx.node,
            y.shape[0],
            y.shape[1],
            image,
            vec![0; sp],
            &vec![1; sp],
        )?,
        rows,
        cols,
    };
    if let Some(b) = block_c {
        k.geometry(&b)?;
    }
    Ok(Box::new(k))
}

impl Kernel for Col2Im {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let g = self.geometry(&io.input(2)?.ints()?)?;
        let y = io.outputs[0].f32()?;
        let (ip, l, taps) = (g.in_plane(), g.out_plane(), g.taps());
        let planes = g.n * g.c;
        let min = par::MIN_ELEMS.div_ceil((l * taps).max(1));
        let table = g.tap_table();
        let g = &g;
        par::for_chunks_mut(
            io.threads,
            &mut y[..planes * ip],
            ip.max(1),
            min,
            |p0, part| {
                let mut oc = vec![0usize; g.out.len()];
                for (j, plane) in part.chunks_mut(ip.max(1)).enumerate() {
                    plane.fill(0.0);
                    // Plane `p` is channel `p % C` of image `p / C`: its
                    // columns are rows `(p % C)·taps..` of image `p / C`.
                    let cols = &x[(p0 + j) * taps * l..][..taps * l];
                    for o in 0..l {
                        g.window(o, &table, &mut oc, |t, pos| {
                            if let Some(pos) = pos {
                                plane[pos] += cols[t * l + o];
                            }
                        });
                    }
                }
            },
        );
        Ok(())
    }
}
