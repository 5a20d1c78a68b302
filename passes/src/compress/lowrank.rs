//! `lowrank`: truncated SVD of MatMul, Gemm and Conv weights (see the
//! module doc of `compress` for the graph it writes).
//!
//! The weight as the layer applies it is `W [K, N]` (`y = x·W`): a MatMul
//! weight as stored, a Gemm weight transposed when `transB`, a Conv weight
//! `[O, I, k...]` as `[I·k..., O]`. With calibration statistics `S = XᵀX`
//! of the layer's input (MatMul and Gemm), the factors minimize
//! `‖X·(W − A·B)‖`: with `S = L·Lᵀ` (Cholesky, a small ridge), the SVD of
//! `Lᵀ·W` truncated to rank `r` gives `A = L⁻ᵀ·U_r`, `B = U_rᵀ·Lᵀ·W`
//! (SVD-LLM's truncation-aware whitening); when `K > N` the same
//! truncation is `A = W·V_r`, `B = V_rᵀ` with `V_r` the top eigenvectors
//! of `Wᵀ·S·W`. `S` is shrunk toward plain SVD where the calibration
//! rows are few against the features ([`Gram::shrunk`]), and the report
//! warns when they are fewer. Without statistics `S = I`: plain SVD. The
//! singular
//! values come from the eigendecomposition of the smaller Gram matrix.
//!
//! A layer's energy is the sum of the squared singular values; the error
//! reported for it is `sqrt(1 − kept/total)`, the relative L2 error of its
//! output on the calibration inputs (of its weight without them).

use super::linalg::{cholesky, solve_lt, sym_eigen, transpose};
use super::{readers_of, values, CompressReport, Gram, Layer, Rank, Reader, Target};
use crate::PassError;
use graphopt_ir::{AttrValue, Attribute, DType, Graph, NewNode, Tensor, Type};
use ndarray::{Array2, ArrayView2};
use std::collections::BTreeMap;

/// A layer is factored only where `r·(K+N) < MAX_RATIO·K·N`.
pub const MAX_RATIO: f64 = 0.8;

pub(super) fn apply(
    g: &mut Graph,
    targets: &[Target],
    rank: Rank,
    grams: &BTreeMap<String, Gram>,
    report: &mut CompressReport,
) -> Result<(), PassError> {
    for t in targets {
        let kind = t.readers[0].2;
        if t.readers.iter().any(|r| r.2 != kind) {
            report.kept.push((
                t.name.clone(),
                "read by different ops or layouts: kept".into(),
            ));
            continue;
        }
        if matches!(kind, Reader::ConvTranspose | Reader::Gather) {
            report.kept.push((
                t.name.clone(),
                "lowrank factors MatMul, Gemm and Conv weights only".into(),
            ));
            continue;
        }
        let w = t.v;
        let dims = g.initializer(w).expect("an initializer").dims.clone();
        if kind == Reader::Conv
            && t
                .readers
                .iter()
                .any(|r| g.node(r.0).attr_int("group").unwrap_or(1) != 1)
        {
            report
                .kept
                .push((t.name.clone(), "a grouped convolution: kept".into()));
            continue;
        }
        let stored: Vec<f64> = values(g, w).iter().map(|&x| x as f64).collect();
        if stored.iter().any(|x| !x.is_finite()) {
            report
                .kept
                .push((t.name.clone(), "holds NaN or Inf: kept".into()));
            continue;
        }
        // W [K, N] as the layer applies it.
        let (k, n, wm) = match kind {
            Reader::MatMul | Reader::Gemm(false) => {
                (dims[0] as usize, dims[1] as usize, stored.clone())
            }
            Reader::Gemm(true) => (
                dims[1] as usize,
                dims[0] as usize,
                transpose(&stored, dims[0] as usize, dims[1] as usize),
            ),
            _ => {
                let o = dims[0] as usize;
                let rest = stored.len() / o.max(1);
                (rest, o, transpose(&stored, o, rest))
            }
        };
        // Statistics of the inputs of every reader, where collected.
        let mut gram: Option<Gram> = None;
        if matches!(kind, Reader::MatMul | Reader::Gemm(_)) {
            for &(r, _, _) in &t.readers {
                let d = g.node(r);
                if d.attr_int("transA").unwrap_or(0) != 0 {
                    continue;
                }
                let Some(x) = d.input(0) else { continue };
                if let Some(s) = grams.get(g.name(x)).filter(|s| s.dim == k && s.rows > 0) {
                    match &mut gram {
                        Some(acc) => acc.merge(s),
                        None => gram = Some(s.clone()),
                    }
                }
            }
        }
        if let Some(s) = gram.as_ref().filter(|s| s.rows < k as u64) {
            report.warnings.push(format!(
                "{}: the calibration inputs give {} rows for {k} input features; its whitening is shrunk toward plain SVD (more calibration data makes it count)",
                t.name, s.rows
            ));
        }
        let f = factor(&wm, k, n, gram.as_ref(), rank);
        let full = k.min(n);
        let r = f.rank;
        let (nodes, op) = readers_of(g, t);
        if r == 0 || (r * (k + n)) as f64 >= MAX_RATIO * (k * n) as f64 {
            report.kept.push((
                t.name.clone(),
                format!(
                    "rank {r} of {full} saves too little (r·(K+N) = {} >= {MAX_RATIO}·K·N = {})",
                    r * (k + n),
                    (MAX_RATIO * (k * n) as f64) as u64
                ),
            ));
            continue;
        }
        let bytes_before = 4 * (k * n) as u64;
        report.layers.push(Layer {
            weight: t.name.clone(),
            nodes,
            op,
            detail: format!(
                "rank {r} of {full}, {:.4} of the energy{}",
                f.kept_energy,
                if gram.is_some() {
                    " (whitened by calibration)"
                } else {
                    ""
                }
            ),
            bytes_before,
            bytes_after: 4 * (r * (k + n)) as u64,
            weight_error: (1.0 - f.kept_energy).max(0.0).sqrt(),
        });
        let base = t.name.clone();
        let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
        let add = |g: &mut Graph, hint: &str, t: Tensor| -> Result<_, PassError> {
            let v = g.add_value(g.fresh_name(hint), Some(Type::known(t.dtype, &t.dims)))?;
            g.set_initializer(v, t);
            Ok(v)
        };
        let (a_t, b_t) = match kind {
            Reader::MatMul | Reader::Gemm(false) => (
                Tensor::from_f32(vec![k as i64, r as i64], &f32s(&f.a))?,
                Tensor::from_f32(vec![r as i64, n as i64], &f32s(&f.b))?,
            ),
            Reader::Gemm(true) => (
                Tensor::from_f32(vec![k as i64, r as i64], &f32s(&f.a))?,
                Tensor::from_f32(vec![n as i64, r as i64], &f32s(&transpose(&f.b, r, n)))?,
            ),
            _ => {
                // First Conv: Aᵀ as [r, I, k...]; second: Bᵀ as [O, r, 1...].
                let mut vd = dims.clone();
                vd[0] = r as i64;
                let mut ud = vec![n as i64, r as i64];
                ud.extend(std::iter::repeat_n(1, dims.len() - 2));
                (
                    Tensor::from_f32(vd, &f32s(&transpose(&f.a, k, r)))?,
                    Tensor::from_f32(ud, &f32s(&transpose(&f.b, r, n)))?,
                )
            }
        };
        let av = add(g, &format!("{base}_lowrank_a"), a_t)?;
        let bv = add(g, &format!("{base}_lowrank_b"), b_t)?;
        for &(node, _, _) in &t.readers {
            let d = g.node(node).clone();
            let x = d.input(0).ok_or_else(|| {
                PassError(format!("compress: {} has no input 0", d.op_type))
            })?;
            let tv = g.add_value(
                g.fresh_name(&format!("{base}_lowrank_t")),
                Some(Type::tensor(DType::F32, None)),
            )?;
            let mut first = NewNode::new(d.op_type.clone())
                .name(g.fresh_name(&format!("{base}_lowrank")))
                .inputs(&[x, av])
                .outputs(&[tv]);
            match kind {
                Reader::Gemm(_) => {
                    if let Some(ta) = d.attr_int("transA").filter(|&v| v != 0) {
                        first = first.attr(Attribute::new("transA", AttrValue::Int(ta)));
                    }
                }
                Reader::Conv => {
                    for a in &d.attributes {
                        first = first.attr(a.clone());
                    }
                }
                _ => {}
            }
            g.insert_node_before(node, first)?;
            g.set_input(node, 0, Some(tv));
            g.set_input(node, 1, Some(bv));
            let nd = g.node_mut(node);
            match kind {
                Reader::Gemm(_) => nd.attributes.retain(|a| a.name != "transA"),
                Reader::Conv => {
                    nd.attributes.retain(|a| {
                        !matches!(a.name.as_str(), "auto_pad" | "pads" | "strides" | "dilations")
                    });
                    for a in &mut nd.attributes {
                        if a.name == "kernel_shape" {
                            a.value = AttrValue::Ints(vec![1; dims.len() - 2]);
                        }
                    }
                }
                _ => {}
            }
        }
        if g.uses(w).is_empty() {
            g.take_initializer(w);
            g.remove_value(w);
        }
    }
    Ok(())
}

/// Two factors of `W [k, n]`: `a [k, r]`, `b [r, n]`, row-major.
struct Factors {
    a: Vec<f64>,
    b: Vec<f64>,
    rank: usize,
    kept_energy: f64,
}

fn factor(w: &[f64], k: usize, n: usize, gram: Option<&Gram>, rank: Rank) -> Factors {
    // Products by matrixmultiply's packed GEMM (through ndarray); the
    // eigendecomposition and the triangular solve in `linalg`.
    let wm = ArrayView2::from_shape((k, n), w).expect("k x n");
    let s = gram.map(|s| s.shrunk());
    let flat = |a: Array2<f64>| -> Vec<f64> { a.as_standard_layout().iter().copied().collect() };
    if k <= n {
        // M = Lᵀ·W, eigenvectors of M·Mᵀ [k, k].
        let l = s.as_ref().map(|s| cholesky(s, k));
        let m: Array2<f64> = match &l {
            Some(l) => {
                let lv = ArrayView2::from_shape((k, k), l).expect("k x k");
                lv.t().dot(&wm)
            }
            None => wm.to_owned(),
        };
        let gm = m.dot(&m.t());
        let (vals, vecs) = sym_eigen(&flat(gm), k);
        let (r, kept) = choose(&vals, k, n, rank);
        // U_r [k, r] (its rows are vecs' first r rows, transposed), and
        // B = U_rᵀ·M [r, n].
        let urt = ArrayView2::from_shape((r, k), &vecs[..r * k]).expect("r x k");
        let b = flat(urt.dot(&m));
        let ur = flat(urt.t().to_owned());
        let a = match &l {
            Some(l) => solve_lt(l, &ur, k, r),
            None => ur,
        };
        Factors {
            a,
            b,
            rank: r,
            kept_energy: kept,
        }
    } else {
        // Eigenvectors of Wᵀ·S·W [n, n]: A = W·V_r, B = V_rᵀ.
        let sw: Array2<f64> = match &s {
            Some(s) => ArrayView2::from_shape((k, k), s).expect("k x k").dot(&wm),
            None => wm.to_owned(),
        };
        let mut gm = wm.t().dot(&sw);
        // Symmetrize (rounding).
        for i in 0..n {
            for j in 0..i {
                let m = (gm[[i, j]] + gm[[j, i]]) / 2.0;
                gm[[i, j]] = m;
                gm[[j, i]] = m;
            }
        }
        let (vals, vecs) = sym_eigen(&flat(gm), n);
        let (r, kept) = choose(&vals, k, n, rank);
        let vrt = ArrayView2::from_shape((r, n), &vecs[..r * n]).expect("r x n");
        let a = flat(wm.dot(&vrt.t()));
        let b = vecs[..r * n].to_vec();
        Factors {
            a,
            b,
            rank: r,
            kept_energy: kept,
        }
    }
}

/// The rank and the fraction of the energy it keeps.
fn choose(vals: &[f64], k: usize, n: usize, rank: Rank) -> (usize, f64) {
    let full = k.min(n);
    let lam: Vec<f64> = vals.iter().take(full).map(|&v| v.max(0.0)).collect();
    let total: f64 = lam.iter().sum();
    let kept = |r: usize| {
        if total <= 0.0 {
            1.0
        } else {
            lam[..r].iter().sum::<f64>() / total
        }
    };
    let r = match rank {
        Rank::Fixed(r) => (r as usize).min(full),
        Rank::Params(f) => ((f * (k * n) as f64 / (k + n) as f64).floor() as usize).clamp(1, full),
        Rank::Energy(e) => {
            let mut acc = 0.0;
            let mut r = full;
            for (i, &l) in lam.iter().enumerate() {
                acc += l;
                if acc >= e * total * (1.0 - 1e-12) {
                    r = i + 1;
                    break;
                }
            }
            r.max(1)
        }
    };
    (r, kept(r))
}
