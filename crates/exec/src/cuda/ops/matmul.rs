//! MatMul (batched, broadcasting) and Gemm as cuBLAS strided-batched
//! GEMMs, mapped from row-major to cuBLAS's column-major terms.

use super::elementwise::ew_in;
use super::{grid_for, Arg, Gemm, Launch, NodePlan};
use crate::backend::NodeCtx;
use crate::cuda::codegen::{self, BLOCK};
use crate::tensor::numel;
use graphopt_ir::DType;

fn gemm_dtype(d: DType) -> Result<(), String> {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        d => Err(format!(
            "MatMul/Gemm on {} is not supported on CUDA",
            d.name()
        )),
    }
}

/// Row-major `Y[b] (M×N) = A[b] (M×K) · B[b] (K×N)` as a column-major
/// cuBLAS call (`Yᵀ = Bᵀ·Aᵀ`); `stride_*` 0 broadcasts an operand.
#[allow(clippy::too_many_arguments)]
fn row_major_gemm(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    a: Arg,
    ta: bool,
    stride_a: usize,
    b: Arg,
    tb: bool,
    stride_b: usize,
    y: Arg,
    batch: usize,
    alpha: f32,
    beta: f32,
) -> Gemm {
    Gemm {
        dtype,
        trans_a: tb,
        trans_b: ta,
        m: n,
        n: m,
        k,
        a: b,
        lda: if tb { k } else { n },
        stride_a: stride_b,
        b: a,
        ldb: if ta { m } else { k },
        stride_b: stride_a,
        c: y,
        ldc: n,
        stride_c: m * n,
        batch,
        alpha,
        beta,
        offsets: [0; 3],
    }
}

pub(super) fn matmul(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    let y = &ctx.outputs[0];
    gemm_dtype(a.dtype)?;
    if a.dtype != b.dtype || y.dtype != a.dtype {
        return Err("MatMul with mixed dtypes".into());
    }
    let (m, ka) = match a.shape.len() {
        0 => return Err("MatMul on a scalar".into()),
        1 => (1, a.shape[0]),
        r => (a.shape[r - 2], a.shape[r - 1]),
    };
    let (kb, n) = match b.shape.len() {
        0 => return Err("MatMul on a scalar".into()),
        1 => (b.shape[0], 1),
        r => (b.shape[r - 2], b.shape[r - 1]),
    };
    if ka != kb {
        return Err(format!("MatMul inner dims {ka} and {kb} differ"));
    }
    let batch_of = |s: &[usize]| -> usize { s.iter().rev().skip(2).product() };
    let out_batch = numel(&y.shape) / (m * n).max(1);
    let (ba, bb) = (
        if a.shape.len() > 2 {
            batch_of(&a.shape)
        } else {
            1
        },
        if b.shape.len() > 2 {
            batch_of(&b.shape)
        } else {
            1
        },
    );
    if numel(&y.shape) == 0 {
        return Ok(NodePlan::default());
    }
    let full = |bx: usize| bx == out_batch || bx == 1;
    if !full(ba) || !full(bb) {
        // Batch dims broadcast partly ([2,1,..] x [3,..]): one GEMM per
        // output batch element, each operand at its broadcast offset.
        let yb: Vec<usize> = y.shape[..y.shape.len() - 2].to_vec();
        let bst = |s: &[usize], size: usize| -> Result<Vec<i64>, String> {
            let lead = if s.len() > 2 {
                &s[..s.len() - 2]
            } else {
                &[][..]
            };
            let st = codegen::broadcast_strides(lead, &yb)?;
            Ok(st.iter().map(|&x| x * size as i64).collect())
        };
        let (sa, sb) = (bst(&a.shape, m * ka)?, bst(&b.shape, ka * n)?);
        let mut launches = Vec::new();
        for bi in 0..out_batch {
            let (mut r, mut oa, mut ob) = (bi, 0i64, 0i64);
            for d in (0..yb.len()).rev() {
                let c = (r % yb[d]) as i64;
                r /= yb[d];
                oa += c * sa[d];
                ob += c * sb[d];
            }
            let mut g = row_major_gemm(
                a.dtype,
                (m, n, ka),
                Arg::In(0),
                false,
                0,
                Arg::In(1),
                false,
                0,
                Arg::Out(0),
                1,
                1.0,
                0.0,
            );
            // Operands swap in the column-major call: cuBLAS's A is B.
            g.offsets = [ob as usize, oa as usize, bi * m * n];
            launches.push(Launch::Gemm(g));
        }
        return Ok(NodePlan {
            launches,
            ..Default::default()
        });
    }
    let sa = if ba == out_batch { m * ka } else { 0 };
    let sb = if bb == out_batch { ka * n } else { 0 };
    // A broadcast B with a batched A of contiguous rows is one plain GEMM
    // over all rows (M·batch × K) · (K × N): better for cuBLAS than batch 0-stride.
    let g = if sb == 0 && out_batch > 1 && sa == m * ka {
        row_major_gemm(
            a.dtype,
            (m * out_batch, n, ka),
            Arg::In(0),
            false,
            0,
            Arg::In(1),
            false,
            0,
            Arg::Out(0),
            1,
            1.0,
            0.0,
        )
    } else {
        row_major_gemm(
            a.dtype,
            (m, n, ka),
            Arg::In(0),
            false,
            sa,
            Arg::In(1),
            false,
            sb,
            Arg::Out(0),
            out_batch,
            1.0,
            0.0,
        )
    };
    Ok(NodePlan {
        launches: vec![Launch::Gemm(g)],
        ..Default::default()
    })
}

pub(super) fn gemm(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    let y = &ctx.outputs[0];
    gemm_dtype(a.dtype)?;
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Err("Gemm needs 2-D A and B".into());
    }
    let n = ctx.node;
    let ta = n.attr_int("transA").unwrap_or(0) != 0;
    let tb = n.attr_int("transB").unwrap_or(0) != 0;
    let alpha = n.attr_float("alpha").unwrap_or(1.0);
    let beta = n.attr_float("beta").unwrap_or(1.0);
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let nn = if tb { b.shape[0] } else { b.shape[1] };
    let mut p = NodePlan::default();
    let mut beta_eff = 0.0;
    if let Some(Some(c)) = ctx.inputs.get(2) {
        // C of Y's shape may be Y itself (the plan's `Over(2)` pair: an SGD
        // update accumulated onto the weight): the copy below then reads
        // and writes each element at one address, and the GEMM reads Y as
        // C, so nothing need be staged.
        p.in_place = c.shape == y.shape;
        if beta != 0.0 {
            // Y = C broadcast, then the GEMM accumulates onto it.
            let src = codegen::elementwise("expand", &y.shape, y.dtype, &[ew_in(c)], "v0")?;
            p.launches.push(Launch::Kernel {
                func: src.name.clone(),
                grid: grid_for(m * nn, BLOCK as usize),
                block: BLOCK,
                args: vec![Arg::In(2), Arg::Out(0)],
            });
            p.sources.push(src);
            beta_eff = beta;
        }
    }
    p.launches.push(Launch::Gemm(row_major_gemm(
        a.dtype,
        (m, nn, k),
        Arg::In(0),
        ta,
        0,
        Arg::In(1),
        tb,
        0,
        Arg::Out(0),
        1,
        alpha,
        beta_eff,
    )));
    Ok(p)
}
