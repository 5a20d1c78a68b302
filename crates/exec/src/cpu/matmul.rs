//! MatMul (batched, numpy broadcasting of the batch dims) and Gemm, on
//! graphopt's own kernel ([`own_kernel`], [`super::gemm`]) where the CPU
//! runs it, else on `matrixmultiply::sgemm`; both read their operands at
//! any strides, so transposes cost nothing;
//! a product of one row ([`product`]: a batch-1 classifier, a decoding
//! step) runs on graphopt's matrix-vector kernel. Convolutions multiply on
//! graphopt's kernel too.
//! Work splits across the pool ([`par`]) by batch, or by rows (or column
//! blocks) of one large product. Det (`[..., M, M]`, f32 or f64): an LU
//! factorization with partial pivoting per matrix, in f64.

use crate::backend::{Activation, Data, Kernel, KernelIo, NodeCtx};
use crate::cpu::par;
use crate::tensor::{numel, strides};
use graphopt_ir::DType;

/// `c[m×n] = alpha · a[m×k] · b[k×n] + beta · c` with element strides
/// `(row, col)` per operand, split over row or column blocks on `threads`
/// threads, each block one [`sgemm_into_with`].
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    sa: (usize, usize),
    b: &[f32],
    sb: (usize, usize),
    beta: f32,
    c: &mut [f32],
    rsc: usize,
    threads: usize,
) {
    sgemm_with(false, m, k, n, alpha, a, sa, b, sb, beta, c, rsc, threads)
}

/// A matrix-product node's whole product, with [`sgemm`]'s arguments: one
/// row (`m = 1`) runs as a matrix-vector product ([`gemv`]), which reads
/// `b` once where it lies, where matrixmultiply packs all of `b` for the
/// one row (3-5 against 15-23 GFLOP/s, benches/README.md "GEMM
/// candidates"); anything else, or where [`gemv`] does not apply, runs as
/// [`sgemm_with`] on graphopt's kernel where [`own_kernel`] (BERT-base
/// and GPT-2 at batch 1 went about 5% faster than on matrixmultiply with
/// the weight's rows prefetched: benches/README.md, "Prefetching the
/// weight"). The choice rests on the node's shape and the CPU only, so
/// every split of one node's product sums each element the same way.
#[allow(clippy::too_many_arguments)]
pub(crate) fn product(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    sa: (usize, usize),
    b: &[f32],
    sb: (usize, usize),
    beta: f32,
    c: &mut [f32],
    rsc: usize,
    threads: usize,
) {
    if m == 1 && gemv(k, n, alpha, a, sa.1, b, sb, beta, c, threads) {
        return;
    }
    sgemm_with(
        own_kernel(),
        m,
        k,
        n,
        alpha,
        a,
        sa,
        b,
        sb,
        beta,
        c,
        rsc,
        threads,
    )
}

/// `c[n] = alpha · a[k] · b[k×n] + beta · c` for one row `a` (element
/// stride `csa`) on graphopt's kernel ([`super::gemm::gemv`]), split by
/// blocks of 64 columns on `threads` threads; false, with nothing done,
/// where that kernel does not apply: not x86-64 with AVX2 and FMA, `k = 0`,
/// `a` strided, or `b` with neither a unit row nor a unit column stride.
/// Each element's sum is its own, so any column split gives the same bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv(
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    csa: usize,
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: &mut [f32],
    threads: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if k == 0 || csa != 1 || (rsb != 1 && csb != 1) || !super::gemm::available() {
            return false;
        }
        if n == 0 {
            return true;
        }
        assert!(
            a.len() >= k && b.len() > (k - 1) * rsb + (n - 1) * csb && c.len() >= n,
            "gemv operand too short"
        );
        let blocks = n.div_ceil(64);
        let t = if n * k < 1 << 16 {
            1
        } else {
            par::parts(blocks, threads, 1)
        };
        let c = SendPtr(c.as_mut_ptr());
        par::for_parts(threads, t, |p| {
            let r = par::range(blocks, t, p);
            let (j0, j1) = (r.start * 64, (r.end * 64).min(n));
            if j0 >= j1 {
                return;
            }
            // SAFETY: lengths asserted above; part p writes columns j0..j1
            // of `c` only.
            unsafe {
                super::gemm::gemv(
                    k,
                    j1 - j0,
                    alpha,
                    a.as_ptr(),
                    b.as_ptr().add(j0 * csb),
                    (rsb, csb),
                    beta,
                    c.get().add(j0),
                )
            }
        });
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, n, alpha, a, csa, b, rsb, csb, beta, c, threads);
        false
    }
}

/// Whether a convolution, MatMul or Gemm multiplies on graphopt's kernel
/// ([`super::gemm`]): wherever the CPU runs it. In a convolution it reads
/// the weight (the left operand) in place where matrixmultiply repacks it
/// on every call; on AVX-512 it runs 12x32 tiles (benches/README.md,
/// "AVX-512 tiles": resnet50 and mobilenet_v2 at batch 1 and 8 went 3-9%
/// faster than with matrixmultiply beyond 64 output positions, BERT-base
/// and GPT-2 at batch 1 about 5% with the weight prefetched). The choice
/// depends on the CPU only, so every tiling and thread split of a node's
/// product sums each element the same way.
pub(crate) fn own_kernel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::gemm::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`sgemm`] on graphopt's kernel when `own` (see [`own_kernel`]), else
/// on matrixmultiply.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_with(
    own: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    sa: (usize, usize),
    b: &[f32],
    sb: (usize, usize),
    beta: f32,
    c: &mut [f32],
    rsc: usize,
    threads: usize,
) {
    split_blocks(own, (m, k, n), (a, sa), (b, sb), (c, rsc), threads, |p| {
        // SAFETY: the block's rows and columns of `c` are this part's.
        unsafe {
            sgemm_into_with(
                own, p.rows, k, p.cols, alpha, p.a, sa, p.b, sb, beta, p.c, rsc,
            )
        }
    });
}

/// `c = bias + a · b` then `act`, for a convolution's product (`bias`
/// one value per row of `c`, zeros when absent; `c` is not read), split
/// across threads ([`split_product`]): each part's block gets its bias and
/// activation while it is in cache ([`sgemm_into_bias_act`]: in the
/// tiles of graphopt's kernel, else a bias fill, the product with
/// `beta = 1` and an activation pass), instead of a serial bias pass
/// before the product and an activation pass after it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_bias_act_with(
    own: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    sa: (usize, usize),
    b: &[f32],
    sb: (usize, usize),
    bias: Option<&[f32]>,
    act: Option<Activation>,
    c: &mut [f32],
    rsc: usize,
    threads: usize,
) {
    split_blocks(own, (m, k, n), (a, sa), (b, sb), (c, rsc), threads, |p| {
        let bias = bias.map(|b| &b[p.r0..p.r0 + p.rows]);
        // SAFETY: the block's rows and columns of `c` are this part's.
        unsafe {
            sgemm_into_bias_act(
                own, p.rows, k, p.cols, p.a, sa, p.b, sb, bias, act, p.c, rsc,
            )
        };
    });
}

/// One part's block of a split product: its first row, its rows and
/// columns, the operands from its first row and column, and where its
/// output starts.
struct Block<'a> {
    r0: usize,
    rows: usize,
    cols: usize,
    a: &'a [f32],
    b: &'a [f32],
    c: *mut f32,
}

/// Splits `c[m × n] = a[m × k] · b[k × n]` across threads
/// ([`split_product`]) and runs `f` on each part's [`Block`] (nothing for
/// an empty product).
fn split_blocks(
    own: bool,
    (m, k, n): (usize, usize, usize),
    (a, (rsa, _)): (&[f32], (usize, usize)),
    (b, (_, csb)): (&[f32], (usize, usize)),
    (c, rsc): (&mut [f32], usize),
    threads: usize,
    f: impl Fn(Block) + Sync,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= (m - 1) * rsc + n, "gemm output too short");
    let c_ptr = SendPtr(c.as_mut_ptr());
    split_product(m, k, n, row_unit(own), threads, |r0, rows, c0, cols| {
        let (a, b) = if k == 0 {
            (a, b)
        } else {
            (&a[r0 * rsa..], &b[c0 * csb..])
        };
        // SAFETY: `c` holds the m rows of n (asserted above); the block
        // starts inside it.
        let c = unsafe { c_ptr.get().add(r0 * rsc + c0) };
        f(Block {
            r0,
            rows,
            cols,
            a,
            b,
            c,
        });
    });
}

/// One-thread [`sgemm_bias_act_with`] into a raw output: on graphopt's
/// kernel with the bias and activation in its epilogue
/// ([`super::gemm::sgemm_bias_act`]), else a bias fill, the product with
/// `beta = 1` and an activation pass (the same bits).
///
/// # Safety
/// As [`sgemm_into_with`]'s; `bias` (when given) holds `m` floats.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_into_bias_act(
    own: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    bias: Option<&[f32]>,
    act: Option<Activation>,
    c: *mut f32,
    rsc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if own && k > 0 && super::gemm::available() {
        check_operands((m, k, n), (a, (rsa, csa)), (b, (rsb, csb)));
        // SAFETY: operands checked above; `c` is the caller's promise.
        unsafe {
            super::gemm::sgemm_bias_act(
                m,
                k,
                n,
                a.as_ptr(),
                (rsa, csa),
                b.as_ptr(),
                (rsb, csb),
                bias,
                act,
                c,
                rsc,
            )
        };
        return;
    }
    // SAFETY: the caller's promise (rows of n at stride rsc).
    let row = |r: usize| unsafe { std::slice::from_raw_parts_mut(c.add(r * rsc), n) };
    for r in 0..m {
        row(r).fill(bias.map_or(0.0, |b| b[r]));
    }
    // SAFETY: the caller's promise, passed on.
    unsafe { sgemm_into_with(own, m, k, n, 1.0, a, (rsa, csa), b, (rsb, csb), 1.0, c, rsc) };
    if let Some(act) = act {
        for r in 0..m {
            act.apply_all(row(r));
        }
    }
}

/// Panics unless `a` holds `m × k` elements at its strides and `b`
/// `k × n` at its (`m`, `k`, `n` at least 1): what the unsafe kernels
/// then read.
fn check_operands(
    (m, k, n): (usize, usize, usize),
    (a, (rsa, csa)): (&[f32], (usize, usize)),
    (b, (rsb, csb)): (&[f32], (usize, usize)),
) {
    assert!(
        a.len() > (m - 1) * rsa + (k - 1) * csa && b.len() > (k - 1) * rsb + (n - 1) * csb,
        "gemm operand too short"
    );
}

/// Rows per block of a product split by rows: 64 on matrixmultiply
/// (whole tiles of its micro-kernel, so which rows fall in edge tiles,
/// rounded differently when alpha is not 1, does not depend on the thread
/// count); 16 on graphopt's kernel, whose sums do not depend on the tile
/// an element falls in, so that a 160-row product splits 80/80 rather
/// than 128/32.
fn row_unit(own: bool) -> usize {
    if own && own_kernel() {
        16
    } else {
        64
    }
}

/// Splits an `m × k × n` product across `threads` and runs
/// `run(first_row, rows, first_col, cols)` on each part's block of the
/// output (one call on the calling thread when it is small).
///
/// Each part packs all of the operand it does not split: split the rows
/// when `a` has more rows than `b` has columns (each part then repacks
/// the smaller `b`), else the columns (in blocks of 64). Either way every
/// element's sum is the one a single call makes. Row parts start at
/// multiples of `row_unit` ([`row_unit`]).
fn split_product<F>(m: usize, k: usize, n: usize, row_unit: usize, threads: usize, run: F)
where
    F: Fn(usize, usize, usize, usize) + Sync,
{
    let by_rows = par::parts(m.div_ceil(row_unit), threads, 1);
    let by_cols = par::parts(n.div_ceil(64), threads, 1);
    let rows = if m >= n {
        by_rows > 1 || by_cols == 1
    } else {
        by_cols == 1
    };
    let (t, blocks) = match (k == 0 || m * n * k < 1 << 16, rows) {
        (true, _) => (1, 1),
        (false, true) => (by_rows, m.div_ceil(row_unit)),
        (false, false) => (by_cols, n.div_ceil(64)),
    };
    if t == 1 {
        run(0, m, 0, n);
        return;
    }
    let unit = if rows { row_unit } else { 64 };
    par::for_parts(threads, t, |p| {
        let r = par::range(blocks, t, p);
        let (first, end) = (r.start * unit, r.end * unit);
        if rows {
            run(first, end.min(m) - first, 0, n);
        } else {
            run(0, m, first, end.min(n) - first);
        }
    });
}

/// One-thread `c = alpha · a · b + beta · c` into a raw output, on
/// graphopt's kernel when `own` ([`own_kernel`]), else matrixmultiply, for the
/// parts of a split product that each own a block of a shared output
/// (`k = 0`: `c = beta · c`, the operands unread).
///
/// # Safety
/// `c` must hold the `m` rows of `n` elements at row stride `rsc`, which
/// no other thread reads or writes during the call (the operands' lengths
/// are checked).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_into_with(
    own: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: *mut f32,
    rsc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for r in 0..m {
            for j in 0..n {
                // SAFETY: `c` holds m rows of n at stride rsc (the caller's
                // promise).
                let v = unsafe { &mut *c.add(r * rsc + j) };
                *v = if beta == 0.0 { 0.0 } else { beta * *v };
            }
        }
        return;
    }
    check_operands((m, k, n), (a, (rsa, csa)), (b, (rsb, csb)));
    #[cfg(target_arch = "x86_64")]
    if own && super::gemm::available() {
        // SAFETY: operands checked above; `c` is the caller's promise.
        unsafe {
            super::gemm::sgemm(
                m,
                k,
                n,
                alpha,
                a.as_ptr(),
                (rsa, csa),
                b.as_ptr(),
                (rsb, csb),
                beta,
                c,
                rsc,
            )
        };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = own;
    // SAFETY: operands checked above; `c` is the caller's promise.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c,
            rsc as isize,
            1,
        )
    }
}

/// A raw output pointer handed to the parts of a split product, each of
/// which writes a disjoint block.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);
// SAFETY: parts write disjoint elements (see the callers).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not
    /// the raw field).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// The matrix sizes of a (batched, broadcasting) matrix product and the
/// element offset of each batch's operands.
pub struct Batches {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub oa: Vec<usize>,
    pub ob: Vec<usize>,
}

/// Batches of `a @ b` with numpy semantics (1-D operands promoted).
pub fn batches(a: &[usize], b: &[usize]) -> Result<Batches, String> {
    // 1-D operands: [k] as [1, k] and [k] as [k, 1].
    let sa: Vec<usize> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let sb: Vec<usize> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let n = sb[sb.len() - 1];
    if sb[sb.len() - 2] != k {
        return Err(format!("inner dims differ: {a:?} x {b:?}"));
    }
    let ba = &sa[..sa.len() - 2];
    let bb = &sb[..sb.len() - 2];
    let rank = ba.len().max(bb.len());
    let mut batch = vec![1usize; rank];
    for d in 0..rank {
        let x = if d + ba.len() >= rank {
            ba[d + ba.len() - rank]
        } else {
            1
        };
        let y = if d + bb.len() >= rank {
            bb[d + bb.len() - rank]
        } else {
            1
        };
        batch[d] = x.max(y);
    }
    let nb = numel(&batch);
    // Batch offsets of each operand.
    let offs = |bs: &[usize], mat: usize| -> Vec<usize> {
        let own = strides(bs);
        let mut v = Vec::with_capacity(nb);
        let mut idx = vec![0usize; rank];
        for _ in 0..nb {
            let mut off = 0;
            for (d, &i) in idx.iter().enumerate() {
                let od = d as isize - (rank - bs.len()) as isize;
                if od >= 0 && bs[od as usize] != 1 {
                    off += i * own[od as usize];
                }
            }
            v.push(off * mat);
            for d in (0..rank).rev() {
                idx[d] += 1;
                if idx[d] < batch[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        v
    };
    let (oa, ob) = (offs(ba, m * k), offs(bb, k * n));
    Ok(Batches { m, k, n, oa, ob })
}

struct MatMul {
    a: Vec<usize>,
    b: Vec<usize>,
    out: Vec<usize>,
}

impl Kernel for MatMul {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let (a, b) = (io.input(0)?.f32()?, io.input(1)?.f32()?);
        let threads = io.threads;
        let o = io.outputs[0].f32()?;
        let Batches { m, k, n, oa, ob } = batches(&self.a, &self.b)?;
        let nb = oa.len();
        if o.len() != nb * m * n {
            return Err(format!(
                "output {:?} does not fit {:?} x {:?}",
                self.out, self.a, self.b
            ));
        }
        if o.is_empty() {
            return Ok(());
        }
        // Batch `i` into `c` on `t` threads.
        let one = |i: usize, c: &mut [f32], t: usize| {
            product(
                m,
                k,
                n,
                1.0,
                &a[oa[i]..],
                (k, 1),
                &b[ob[i]..],
                (n, 1),
                0.0,
                c,
                n,
                t,
            )
        };
        if nb > 1
            && ob.iter().all(|&o| o == 0)
            && oa.iter().enumerate().all(|(i, &o)| o == i * m * k)
        {
            // One weight for every batch, `a`'s batches one after another:
            // one product of all the rows (as the palette kernels make it),
            // the weight packed once per part instead of once per batch.
            product(nb * m, k, n, 1.0, a, (k, 1), b, (n, 1), 0.0, o, n, threads);
        } else if nb >= threads && threads > 1 && nb > 1 {
            par::for_chunks_mut(threads, o, m * n, 1, |first, chunk| {
                for (j, c) in chunk.chunks_mut(m * n).enumerate() {
                    one(first + j, c, 1);
                }
            });
        } else {
            for (i, c) in o.chunks_mut(m * n).enumerate() {
                one(i, c, threads);
            }
        }
        Ok(())
    }
}

pub fn matmul(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    if a.dtype != DType::F32 || b.dtype != DType::F32 {
        return Err(format!("MatMul on {} is not implemented", a.dtype.name()));
    }
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err("MatMul of a scalar".into());
    }
    Ok(Box::new(MatMul {
        a: a.shape.clone(),
        b: b.shape.clone(),
        out: ctx.outputs[0].shape.clone(),
    }))
}

struct Gemm {
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
    a: Vec<usize>,
    b: Vec<usize>,
    c: Option<Vec<usize>>,
}

impl Kernel for Gemm {
    /// `C` may be in the output's storage (the plan's `Over(2)` pair): the
    /// product then accumulates onto it, `Y = alpha·A·B + beta·Y`.
    fn in_place(&self) -> bool {
        true
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let (a, b) = (io.input(0)?.f32()?, io.input(1)?.f32()?);
        let in_place = self.c.is_some() && matches!(io.input(2)?.data, Data::Output0);
        let c = match &self.c {
            Some(_) if !in_place => Some(io.input(2)?.f32()?),
            _ => None,
        };
        let threads = io.threads;
        let o = io.outputs[0].f32()?;
        let (m, k) = if self.trans_a {
            (self.a[1], self.a[0])
        } else {
            (self.a[0], self.a[1])
        };
        let n = if self.trans_b { self.b[0] } else { self.b[1] };
        let sa = if self.trans_a { (1, m) } else { (k, 1) };
        let sb = if self.trans_b { (1, k) } else { (n, 1) };
        let beta = gemm_bias(o, c, self.c.as_deref(), self.beta, m, n);
        product(m, k, n, self.alpha, a, sa, b, sb, beta, o, n, threads);
        Ok(())
    }
}

/// Gemm's bias: `o = beta·C` broadcast to `[m, n]` (C of shape `cs`), and
/// the beta the product then accumulates with (1, or 0 without a bias).
/// `c` None with a shape `cs` is C already in `o` (the plan's in-place
/// pair, C of `o`'s shape): scaled there, the same bits.
pub(crate) fn gemm_bias(
    o: &mut [f32],
    c: Option<&[f32]>,
    cs: Option<&[usize]>,
    beta: f32,
    m: usize,
    n: usize,
) -> f32 {
    match (c, cs) {
        (_, Some(_)) if beta == 0.0 => 0.0,
        (Some(c), Some(cs)) => {
            crate::cpu::elementwise::for_each_bcast(&[m, n], [cs], |i, [ic]| {
                o[i] = beta * c[ic];
            });
            1.0
        }
        (None, Some(_)) => {
            if beta != 1.0 {
                o.iter_mut().for_each(|x| *x *= beta);
            }
            1.0
        }
        _ => 0.0,
    }
}

pub fn gemm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    if a.dtype != DType::F32 || a.shape.len() != 2 || b.shape.len() != 2 {
        return Err("Gemm is implemented for 2-D f32 only".into());
    }
    let c = ctx.inputs.get(2).cloned().flatten().map(|t| t.shape);
    let n = &ctx.node;
    Ok(Box::new(Gemm {
        alpha: n.attr_float("alpha").unwrap_or(1.0),
        beta: n.attr_float("beta").unwrap_or(1.0),
        trans_a: n.attr_int("transA").unwrap_or(0) != 0,
        trans_b: n.attr_int("transB").unwrap_or(0) != 0,
        a: a.shape.clone(),
        b: b.shape.clone(),
        c,
    }))
}

/// Det of each `[M, M]` matrix of `[..., M, M]`: Gaussian elimination with
/// partial pivoting in f64 (the sign flipped per row swap), rounded once
/// to the output type.
struct Det {
    f64_io: bool,
    batch: usize,
    m: usize,
}

impl Kernel for Det {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x: Vec<f64> = io.input(0)?.floats()?;
        let m = self.m;
        let dets: Vec<f64> = (0..self.batch)
            .map(|b| det(&mut x[b * m * m..][..m * m].to_vec(), m))
            .collect();
        let o = &mut io.outputs[0];
        if self.f64_io {
            crate::tensor::cast_mut::<f64>(o.data).copy_from_slice(&dets);
        } else {
            for (d, v) in o.f32()?.iter_mut().zip(&dets) {
                *d = *v as f32;
            }
        }
        Ok(())
    }
}

/// The determinant of the row-major `m × m` matrix `a` (overwritten).
fn det(a: &mut [f64], m: usize) -> f64 {
    let mut d = 1.0;
    for c in 0..m {
        // The largest magnitude in column c at or below the diagonal; a
        // NaN there is the pivot, so it spreads to the result as numpy's.
        let mut p = c;
        for r in c + 1..m {
            let (v, best) = (a[r * m + c], a[p * m + c]);
            if !best.is_nan() && (v.is_nan() || v.abs() > best.abs()) {
                p = r;
            }
        }
        let piv = a[p * m + c];
        if piv == 0.0 {
            return 0.0;
        }
        if p != c {
            for k in 0..m {
                a.swap(p * m + k, c * m + k);
            }
            d = -d;
        }
        d *= piv;
        for r in c + 1..m {
            let f = a[r * m + c] / piv;
            if f != 0.0 {
                for k in c + 1..m {
                    a[r * m + k] -= f * a[c * m + k];
                }
            }
        }
    }
    d
}

pub fn det_kernel(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if !matches!(x.dtype, DType::F32 | DType::F64) {
        return Err(format!("Det on {} is not implemented", x.dtype.name()));
    }
    let r = x.shape.len();
    if r < 2 || x.shape[r - 1] != x.shape[r - 2] {
        return Err(format!(
            "Det takes square matrices [..., M, M], got {:?}",
            x.shape
        ));
    }
    if ctx.outputs[0].shape != x.shape[..r - 2] || ctx.outputs[0].dtype != x.dtype {
        return Err("Det's output is not the input's batch shape and type".into());
    }
    Ok(Box::new(Det {
        f64_io: x.dtype == DType::F64,
        batch: x.shape[..r - 2].iter().product(),
        m: x.shape[r - 1],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphopt_testutil::uniform as fill;

    /// One row takes the matrix-vector kernel, in both layouts of `b` and
    /// at any thread count: the bits of a direct one-thread call.
    #[test]
    fn one_row_runs_on_the_matrix_vector_kernel() {
        #[cfg(target_arch = "x86_64")]
        if super::super::gemm::available() {
            let (k, n) = (700, 300);
            let (a, b) = (fill(k, 1), fill(k * n, 2));
            for sb in [(n, 1), (1, k)] {
                let mut direct = vec![0f32; n];
                // SAFETY: a holds k, b k × n at sb, direct n.
                unsafe {
                    super::super::gemm::gemv(
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        b.as_ptr(),
                        sb,
                        0.0,
                        direct.as_mut_ptr(),
                    )
                };
                let mut mm = vec![0f32; n];
                sgemm(1, k, n, 1.0, &a, (k, 1), &b, sb, 0.0, &mut mm, n, 1);
                if sb.0 == 1 {
                    // Dot products sum in lanes, matrixmultiply in order:
                    // the bits tell which ran. (With a row-major `b` the
                    // two sum alike, in blocks of 256.)
                    assert_ne!(mm, direct, "the check cannot tell the kernels apart");
                }
                for threads in [1, 2, 3] {
                    let mut c = vec![0f32; n];
                    product(1, k, n, 1.0, &a, (k, 1), &b, sb, 0.0, &mut c, n, threads);
                    assert_eq!(c, direct, "{sb:?}, {threads} threads");
                }
            }
        }
    }
}
