//! A convolution without an unfolded matrix: the taps read a padded copy
//! of the image in place.
//!
//! Stride 1: copy each channel of the image into rows of `wp = W + gap`
//! floats, zeros around (`gap` = the wider side pad, shared between a
//! row's right pad and the next row's left pad). Output `(oh, ow)` then
//! reads tap `(ci, kh, kw)` at `ci·plane + oh·wp + ow + kh·dh·wp + kw·dw`:
//! over the output grid laid out `OH × wp` (the last `wp - OW` columns of
//! each row computed and dropped), each unfolded row `(ci, kh, kw)` is one
//! contiguous run of the padded copy at a fixed offset. Strides `(sh, sw)`:
//! each channel is copied as `sh · sw` phase planes (phase `(a, b)` holds
//! the padded image's rows `a, a + sh, ..` and columns `b, b + sw, ..`),
//! and tap `(kh, kw)` reads phase `(kh·dh mod sh, kw·dw mod sw)` at row
//! `kh·dh / sh`, column `kw·dw / sw`: again one run per unfolded row.
//!
//! The GEMM reads those runs by their offsets
//! ([`super::gemm::sgemm_rows_bias_act`]: in place for up to 96 output
//! channels, packed panel by panel above), so im2col's matrix (`Cin·k²`
//! rows, every input element copied once per tap) is never written.
//!
//! Each output element is summed from the same products in the same order
//! as over the unfolded matrix (padding reads zeros in both), in the
//! GEMM's depth blocks: the bits of [`super::conv`]'s im2col tiles, for
//! any split of rows and bands across threads.
//!
//! Before (3x3, pad 1, 64 channels, 56 × 56):
//! ```text
//! im2col 576 × 3136 floats (7.2 MB), then W[64 × 576] · col
//! ```
//! After:
//! ```text
//! padded copy 64 × 59 × 57 floats (0.86 MB), then W · rows(col) where
//! row (ci, kh, kw) = padded[ci·3363 + kh·57 + kw ..][..56·57]
//! ```

use crate::backend::Activation;
use crate::cpu::conv::{tiles_in_parts, Unfold, Window};
use crate::cpu::matmul::SendPtr;
use crate::cpu::par;

/// Floats of one part's output block (its rows × its band's grid
/// columns), in L2 while the GEMM writes it and the valid columns are
/// copied out.
const BLOCK_FLOATS: usize = 64 << 10;
/// Widest share of dropped grid columns (`(wp - OW) / wp`) the flat
/// path takes, as a fraction `1 / MAX_WASTE`: a 14-wide output with one
/// pad column computes 15 (7%); a 7-wide one 8 (12.5%: im2col instead).
const MAX_WASTE: usize = 10;
/// Largest padded copy of one image the flat path makes (bytes): the
/// workspace stays bounded whatever the image size, as im2col's tiles
/// keep it (a larger image unfolds in tiles instead).
const MAX_PADDED_BYTES: usize = 8 << 20;
/// Fewest grid columns of a band split across threads (a band narrower
/// than this runs the GEMM's edge slivers more than its full ones).
const MIN_BAND_COLS: usize = 128;

/// The padded layout of a window ([`Flat::new`]).
#[derive(Clone, Debug)]
pub(crate) struct Flat {
    /// Floats per padded row and padded rows per channel (per phase).
    wp: usize,
    hp: usize,
    /// The strides: each channel is copied as `sh · sw` phase planes.
    sh: usize,
    sw: usize,
    /// Offset of unfolded row `(ci, kh, kw)` (in im2col's order) of one
    /// group from the group's first padded channel.
    rows: Vec<usize>,
}

impl Flat {
    /// The layout for window `g` with `cg` channels per group, or None
    /// where the flat path does not apply: a single tap, a grid that would
    /// drop more than `1 / MAX_WASTE` of its columns, a padded image over
    /// [`MAX_PADDED_BYTES`], or (stride 1) pads too wide for one shared
    /// gap.
    pub(crate) fn new(g: &Window, cg: usize) -> Option<Flat> {
        // (No channels: nothing to multiply; the im2col path fills the bias.)
        if g.kh * g.kw < 2 || g.oh == 0 || g.ow == 0 || cg == 0 {
            return None;
        }
        let (span_h, span_w) = (g.dh * (g.kh - 1), g.dw * (g.kw - 1));
        let (wp, hp) = if g.sh == 1 && g.sw == 1 {
            // The end pad the output reaches past the image.
            let pr = (g.ow + span_w).saturating_sub(g.w + g.pw);
            let wp = g.w + g.pw.max(pr);
            // Valid columns fit a padded row; a tap past a row's end lands
            // in the next row's left pad (zeros): OW + span_w <= wp + pw;
            // the widest tap offset stays inside the plane's extra row.
            if g.ow > wp || g.ow + span_w > wp + g.pw || span_w > wp {
                return None;
            }
            (wp, g.oh + span_h + 1)
        } else {
            // Phase rows wide enough that no valid tap wraps.
            (g.ow + span_w / g.sw, g.oh + span_h / g.sh + 1)
        };
        if (wp - g.ow) * MAX_WASTE > wp {
            return None;
        }
        let flat = Flat {
            wp,
            hp,
            sh: g.sh,
            sw: g.sw,
            rows: Vec::new(),
        };
        if flat.padded_floats(g.c) * 4 > MAX_PADDED_BYTES {
            return None;
        }
        let (plane, phase) = (flat.padded_floats(1), hp * wp);
        let rows = (0..cg)
            .flat_map(|c| (0..g.kh).flat_map(move |i| (0..g.kw).map(move |j| (c, i, j))))
            .map(|(c, i, j)| {
                let (y, x) = (i * g.dh, j * g.dw);
                let phase_at = (y % g.sh * g.sw + x % g.sw) * phase;
                c * plane + phase_at + y / g.sh * wp + x / g.sw
            })
            .collect();
        Some(Flat { rows, ..flat })
    }

    /// Floats of one image's padded copy (`channels` of them).
    pub(crate) fn padded_floats(&self, channels: usize) -> usize {
        channels * self.sh * self.sw * self.hp * self.wp
    }

    /// Floats of one part's output block.
    pub(crate) fn block_floats(&self) -> usize {
        BLOCK_FLOATS.max(self.wp)
    }

    /// Copies image `x` (`channels` planes of `H × W`) into `out` with its
    /// padding as zeros, as phase planes: phase `(a, b)` holds the padded
    /// image's rows `a, a + sh, ..` and columns `b, b + sw, ..` (at stride
    /// 1, the one phase is the padded image); channels split across
    /// threads.
    pub(crate) fn pad(&self, g: &Window, x: &[f32], out: &mut [f32], threads: usize) {
        let (wp, plane, hw) = (self.wp, self.padded_floats(1), g.h * g.w);
        let min = par::MIN_ELEMS.div_ceil(plane.max(1));
        par::for_chunks_mut(threads, out, plane, min, |c0, planes| {
            for (j, dst) in planes.chunks_exact_mut(plane).enumerate() {
                let src = &x[(c0 + j) * hw..][..hw];
                // (Stride 1: one phase, the image at columns pw..pw + W of
                // each row, copied as block moves.)
                let phases = dst.chunks_exact_mut(self.hp * wp);
                for (ph, phase) in phases.enumerate() {
                    let (a, b) = (ph / self.sw, ph % self.sw);
                    // Columns j whose padded column j·sw + b lies in the
                    // image: j0..j1, from image column j0·sw + b - pw.
                    let j0 = g.pw.saturating_sub(b).div_ceil(self.sw);
                    let j1 = (g.w + g.pw)
                        .saturating_sub(b)
                        .div_ceil(self.sw)
                        .clamp(j0, wp);
                    for (i, row) in phase.chunks_exact_mut(wp).enumerate() {
                        let y = (i * self.sh + a).checked_sub(g.ph).filter(|&y| y < g.h);
                        match y {
                            Some(y) if j0 < j1 => {
                                row[..j0].fill(0.0);
                                let from = &src[y * g.w + j0 * self.sw + b - g.pw..];
                                let n = j1 - j0;
                                <f32 as Unfold>::strided(
                                    &from[..(n - 1) * self.sw + 1],
                                    self.sw,
                                    &mut row[j0..j1],
                                );
                                row[j1..].fill(0.0);
                            }
                            _ => row.fill(0.0),
                        }
                    }
                }
            }
        });
    }

    /// `(output channels per chunk, output rows per band)` for `mg`
    /// output channels on `threads`: as many channels as fit, and bands of
    /// rows whose block fits [`BLOCK_FLOATS`], bands cut finer so that each
    /// thread gets as many, or the channels split where a band would fall
    /// under [`MIN_BAND_COLS`] columns.
    fn split(&self, g: &Window, mg: usize, threads: usize) -> (usize, usize) {
        let slot = self.block_floats();
        let band_for = |chunk: usize| (slot / (chunk * self.wp)).clamp(1, g.oh);
        // Channels whose one grid row fits the block (whole tiles of 16
        // where it cuts them).
        let fit = slot / self.wp;
        let mut chunk = if mg <= fit {
            mg
        } else if fit >= 16 {
            fit / 16 * 16
        } else {
            fit
        };
        // Bands of equal height: 56 rows in bands of at most 17 are 4 of 14,
        // not 17, 17, 17 and 5.
        let even = |band: usize| g.oh.div_ceil(g.oh.div_ceil(band));
        let mut band = even(band_for(chunk));
        let bands = g.oh.div_ceil(band);
        if threads > 1 && bands % threads != 0 {
            let finer = g.oh.div_ceil(bands.next_multiple_of(threads));
            if finer * self.wp >= MIN_BAND_COLS {
                band = finer;
            } else if mg >= 32 * threads {
                // Never more channels than fit the block.
                chunk = chunk.min(mg.div_ceil(threads).next_multiple_of(16));
                band = band.min(band_for(chunk));
            }
        }
        assert!(chunk * band * self.wp <= slot, "flat block over its slot");
        (chunk, band)
    }

    /// One image's group: `y[mg × OH·OW] = act(bias + wg · taps)` for the
    /// group's padded channels `padded` (from [`Flat::pad`]), in blocks of
    /// (output channels, output rows) split across threads, each block
    /// multiplied into part `p`'s slot of `ws` ([`Flat::block_floats`]
    /// floats each) and its valid columns copied into `y`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        g: &Window,
        (mg, k): (usize, usize),
        wg: &[f32],
        padded: &[f32],
        bias: Option<&[f32]>,
        act: Option<Activation>,
        y: &mut [f32],
        ws: &mut [f32],
        threads: usize,
    ) {
        let (wp, ohw) = (self.wp, g.oh * g.ow);
        let slot = self.block_floats();
        let slots = ws.len() / slot;
        let (chunk, band) = self.split(g, mg, threads);
        let (chunks, bands) = (mg.div_ceil(chunk), g.oh.div_ceil(band));
        let items = chunks * bands;
        let t = par::parts(items, threads.min(slots), 1);
        let rows = &self.rows[..k];
        // The grid's last element the taps read lies inside `padded`.
        let last = rows.iter().max().map_or(0, |&r| r + g.oh * wp);
        assert!(last <= padded.len() && wg.len() >= mg * k && y.len() >= mg * ohw);
        let yp = SendPtr(y.as_mut_ptr());
        // Items are (chunk, band) pairs, each part with its own slot.
        tiles_in_parts(threads, t, (1, items), ws, slot, |block, item, _| {
            let (m0, oh0) = (item / bands * chunk, item % bands * band);
            let (ms, rs) = (chunk.min(mg - m0), band.min(g.oh - oh0));
            let cols = rs * wp;
            assert!(ms * cols <= block.len());
            // SAFETY: the rows' offsets plus the band's grid columns stay
            // inside `padded` (asserted: the last band ends at OH·wp);
            // `block` holds ms × cols (asserted); bias rows m0.. exist where
            // given. (Flat::new makes a layout only where graphopt's kernel
            // runs.)
            #[cfg(target_arch = "x86_64")]
            unsafe {
                super::gemm::sgemm_rows_bias_act(
                    ms,
                    k,
                    cols,
                    wg[m0 * k..].as_ptr(),
                    (k, 1),
                    (padded[oh0 * wp..].as_ptr(), rows),
                    bias.map(|b| &b[m0..m0 + ms]),
                    act,
                    block.as_mut_ptr(),
                    cols,
                )
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("the flat path runs on graphopt's kernel only");
            for m in 0..ms {
                for r in 0..rs {
                    let src = &block[m * cols + r * wp..][..g.ow];
                    // SAFETY: output channel m0 + m, row oh0 + r: this
                    // item's alone, inside `y` (asserted).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            yp.get().add((m0 + m) * ohw + (oh0 + r) * g.ow),
                            g.ow,
                        )
                    };
                    dst.copy_from_slice(src);
                }
            }
        });
    }
}
