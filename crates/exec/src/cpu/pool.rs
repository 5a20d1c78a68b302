//! MaxPool (with its Indices output), AveragePool (1-D and 2-D windows,
//! pads, strides, dilations, count_include_pad; more spatial dims in
//! [`super::window_nd`], which also runs LpPool) and GlobalAveragePool /
//! GlobalMaxPool.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::conv::{phased_plane, row_taps, tap_runs, window, Window};
use crate::cpu::par;
use graphopt_ir::DType;

struct Pool {
    g: Window,
    max: bool,
    include_pad: bool,
    /// MaxPool's Indices output: 0 row-major, 1 column-major (`None`: not
    /// asked for).
    indices: Option<i64>,
    /// The column taps' runs ([`tap_runs`]), fixed by the window.
    runs: Vec<(usize, usize, usize)>,
    /// Tap `t`'s flat offset from its window's origin in the Indices'
    /// storage order ([`max_rows`]).
    offsets: Vec<i64>,
}

impl Kernel for Pool {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let g = &self.g;
        let x = io.input(0)?.f32()?;
        let (y, rest) = io.outputs.split_at_mut(1);
        let y = y[0].f32()?;
        let idx: Option<&mut [i64]> = match (self.indices, rest.first_mut()) {
            (Some(_), Some(o)) => Some(crate::tensor::cast_mut(o.data)),
            _ => None,
        };
        let col_major = self.indices == Some(1);
        let (planes, ohw) = (g.n * g.c, g.oh * g.ow);
        // Planes split across threads; each part owns its planes' outputs
        // (and indices).
        let k = par::parts(
            planes,
            io.threads,
            par::MIN_ELEMS.div_ceil((ohw * g.kh * g.kw).max(1)),
        );
        let mut items = Vec::with_capacity(k);
        let (mut y_rest, mut idx_rest) = (&mut y[..planes * ohw], idx);
        for p in 0..k {
            let r = par::range(planes, k, p);
            let (mine, tail) = y_rest.split_at_mut(r.len() * ohw);
            y_rest = tail;
            let ix = match idx_rest.take() {
                Some(ix) => {
                    let (mine, tail) = ix.split_at_mut(r.len() * ohw);
                    idx_rest = Some(tail);
                    Some(mine)
                }
                None => None,
            };
            items.push((r.start, mine, ix));
        }
        par::for_each_owned(io.threads, items, |(p0, ys, mut ixs)| {
            for (j, out) in ys.chunks_mut(ohw.max(1)).enumerate() {
                let p = p0 + j;
                let plane = &x[p * g.h * g.w..][..g.h * g.w];
                let ix = ixs.as_deref_mut().map(|v| &mut v[j * ohw..][..ohw]);
                self.plane(plane, out, ix, p, col_major);
            }
        });
        Ok(())
    }
}

impl Pool {
    /// Pools one input plane (number `p` of `N·C`) into `out`, with
    /// MaxPool's flat indices into `idx` when asked.
    fn plane(
        &self,
        plane: &[f32],
        out: &mut [f32],
        mut idx: Option<&mut [i64]>,
        p: usize,
        col_major: bool,
    ) {
        let g = &self.g;
        if self.max && self.max_plane(plane, out, idx.as_deref_mut(), p, col_major) {
            return;
        }
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let mut arg = 0usize;
                let (mut acc, mut cnt, mut padded) = (
                    if self.max { f32::NEG_INFINITY } else { 0.0 },
                    0usize,
                    0usize,
                );
                for ki in 0..g.kh {
                    let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
                    for kj in 0..g.kw {
                        let ix = (ox * g.sw + kj * g.dw) as isize - g.pw as isize;
                        if iy < 0 || ix < 0 || iy as usize >= g.h || ix as usize >= g.w {
                            // Pads inside the (begin, end) padding count
                            // for count_include_pad; beyond (ceil_mode)
                            // never.
                            let in_pad = iy < (g.h + g.ph) as isize && ix < (g.w + g.pw) as isize;
                            padded += in_pad as usize;
                            continue;
                        }
                        let v = plane[iy as usize * g.w + ix as usize];
                        if self.max {
                            if v > acc || (v.is_nan() && !acc.is_nan()) || cnt == 0 {
                                acc = v;
                                arg = if col_major {
                                    ix as usize * g.h + iy as usize
                                } else {
                                    iy as usize * g.w + ix as usize
                                };
                            }
                        } else {
                            acc += v;
                        }
                        cnt += 1;
                    }
                }
                if let Some(ix) = idx.as_deref_mut() {
                    ix[oy * g.ow + ox] = (p * g.h * g.w + arg) as i64;
                }
                out[oy * g.ow + ox] = if self.max {
                    acc
                } else {
                    let d = if self.include_pad { cnt + padded } else { cnt };
                    acc / d.max(1) as f32
                };
            }
        }
    }
}

impl Pool {
    /// MaxPool of one plane (number `p` of `N·C`): per output row, one
    /// pass per window tap over the outputs whose tap falls inside the
    /// image (no bounds test per element, no branch per element), each
    /// tap a contiguous run of a row ([`phased_plane`] for strides), with
    /// the winning tap of each output when `idx` asks. Taps go in the
    /// order of [`Self::plane`] and only a strictly greater value wins, so
    /// the first maximum's index is kept, as there. A window with no
    /// element inside the image gives -inf (index `p·H·W`), as there.
    /// False when the plane holds a NaN, or with indices a -inf (which
    /// must win an all -inf window's first tap): [`Self::plane`] then
    /// redoes it (a NaN in a window wins there).
    fn max_plane(
        &self,
        plane: &[f32],
        out: &mut [f32],
        idx: Option<&mut [i64]>,
        p: usize,
        col_major: bool,
    ) -> bool {
        let g = &self.g;
        let taps = (&self.runs[..], &self.offsets[..]);
        phased_plane(g, plane, |src| {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { max_rows_avx2(g, src, taps, out, idx, p, col_major) };
            }
            max_rows(g, src, taps, out, idx, p, col_major)
        })
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_rows_avx2(
    g: &Window,
    src: &[f32],
    taps: Taps,
    out: &mut [f32],
    idx: Option<&mut [i64]>,
    p: usize,
    col_major: bool,
) -> bool {
    max_rows(g, src, taps, out, idx, p, col_major)
}

/// A window's column-tap runs and its taps' index offsets
/// ([`Pool::runs`], [`Pool::offsets`]).
type Taps<'a> = (&'a [(usize, usize, usize)], &'a [i64]);

/// [`Pool::max_plane`]'s loops over the (phased) plane `src`, indexed so
/// that they compile inside the caller's target features.
#[inline(always)]
fn max_rows(
    g: &Window,
    src: &[f32],
    (runs, off): Taps,
    out: &mut [f32],
    mut idx: Option<&mut [i64]>,
    p: usize,
    col_major: bool,
) -> bool {
    let base = (p * g.h * g.w) as i64;
    let mut odd = false;
    // With indices: the winning tap (ki·kw + kj + 1; 0 for none) of each
    // output of the row, turned into flat indices once the row is done
    // (a narrow select per tap instead of an index computed and stored
    // per tap). Tap t's element of output (oy, ox) lies at `origin(oy,
    // ox) + off[t]` (row- or column-major), so no division turns it back.
    let mut won: Vec<u32> = vec![0; if idx.is_some() { g.ow } else { 0 }];
    let (rs, cs) = storage_strides(g, col_major);
    for (oy, row) in out.chunks_mut(g.ow.max(1)).enumerate().take(g.oh) {
        row.fill(f32::NEG_INFINITY);
        won.fill(0);
        let with_idx = idx.is_some();
        row_taps(g, src, runs, oy, |ki, kj, lo, taps| {
            let n = taps.len();
            let dst = &mut row[lo..lo + n];
            if !with_idx {
                for i in 0..n {
                    let v = taps[i];
                    odd |= v.is_nan();
                    dst[i] = if v > dst[i] { v } else { dst[i] };
                }
                return;
            }
            let tap = (ki * g.kw + kj + 1) as u32;
            let won = &mut won[lo..lo + n];
            for i in 0..n {
                let v = taps[i];
                odd |= v.is_nan() || v == f32::NEG_INFINITY;
                let better = v > dst[i];
                dst[i] = if better { v } else { dst[i] };
                won[i] = if better { tap } else { won[i] };
            }
        });
        if let Some(ix) = idx.as_deref_mut() {
            let y0 = (oy * g.sh) as i64 - g.ph as i64;
            for (ox, (i, &t)) in ix[oy * g.ow..][..g.ow].iter_mut().zip(&won).enumerate() {
                let x0 = (ox * g.sw) as i64 - g.pw as i64;
                let origin = y0 * rs as i64 + x0 * cs as i64;
                *i = match t {
                    0 => base,
                    t => base + origin + off[t as usize - 1],
                };
            }
        }
    }
    !odd
}

pub fn pool(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 {
        return Err(format!("pooling on {} is not implemented", x.dtype.name()));
    }
    if x.shape.len() > 4 {
        return super::window_nd::pool(ctx);
    }
    let max = ctx.node.op_type == "MaxPool";
    let indices = (ctx.outputs.len() > 1 && ctx.outputs[1].shape != [0])
        .then(|| ctx.node.attr_int("storage_order").unwrap_or(0));
    if indices.is_some() && (!max || ctx.outputs[1].dtype != DType::I64) {
        return Err("a second output of pooling is MaxPool's int64 Indices only".into());
    }
    let ks: Vec<usize> = ctx
        .node
        .attr_ints("kernel_shape")
        .ok_or("no kernel_shape")?
        .iter()
        .map(|&k| k as usize)
        .collect();
    let g = window(ctx, &ks)?;
    let mut runs = vec![(0, 0, 0); g.kw];
    tap_runs(&g, &mut runs);
    let (rs, cs) = storage_strides(&g, indices == Some(1));
    let offsets = (0..g.kh * g.kw)
        .map(|t| ((t / g.kw * g.dh) * rs + (t % g.kw * g.dw) * cs) as i64)
        .collect();
    Ok(Box::new(Pool {
        g,
        max,
        include_pad: ctx.node.attr_int("count_include_pad") == Some(1),
        indices,
        runs,
        offsets,
    }))
}

/// An input plane's (row, column) strides in MaxPool's Indices: row-major,
/// or column-major (`storage_order = 1`).
fn storage_strides(g: &Window, col_major: bool) -> (usize, usize) {
    if col_major {
        (1, g.h)
    } else {
        (g.w, 1)
    }
}

struct Global {
    max: bool,
    plane: usize,
}

impl Kernel for Global {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let y = io.outputs[0].f32()?;
        for (o, p) in y.iter_mut().zip(x.chunks(self.plane.max(1))) {
            *o = if self.max {
                p.iter().copied().fold(f32::NEG_INFINITY, f32::max)
            } else {
                p.iter().sum::<f32>() / self.plane as f32
            };
        }
        Ok(())
    }
}

pub fn global(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 || x.shape.len() < 2 {
        return Err("global pooling is implemented for f32 [N, C, ...] only".into());
    }
    Ok(Box::new(Global {
        max: ctx.node.op_type == "GlobalMaxPool",
        plane: x.shape[2..].iter().product(),
    }))
}
