//! `prune --sparsity S --unstructured`: the smallest weights set to zero,
//! one by one, and stored as ONNX `sparse_initializer`s where that makes
//! the file smaller.
//!
//! ```text
//! before (S = 0.75)                     after
//! w = {0.1, -2.0, 0.05, 0.3}            sparse w: values {-2.0}, indices {1}, dims [2, 2]
//! y = MatMul(x, w)                      y = MatMul(x, w)
//! ```
//!
//! Each weight read as a MatMul/Gemm `B` or a Conv/ConvTranspose weight
//! loses the `S` fraction of its elements with the least magnitude (ties
//! by position). ONNX's COO form holds an int64 index per stored value, so
//! a tensor of 4-byte floats is smaller sparse only past 2/3 zeros; below
//! that it stays dense (with its zeros). Nothing is saved at run time:
//! onnxruntime, tract and graphopt's runtime make sparse initializers
//! dense when they load them. The full onnx checker's type inference does
//! not accept a sparse initializer read by a dense op (a limit of the
//! checker: the plain checker and onnxruntime do).

use crate::PassError;
use graphopt_ir::{Graph, SparseTensor, Tensor, Use, ValueId};

/// What unstructured sparsity did. Run-time bytes do not change: runtimes
/// load the weights dense.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SparsityReport {
    pub sparsity: f64,
    /// Weights that lost elements.
    pub weights: usize,
    /// Of those, the ones stored as sparse initializers (the others stay
    /// dense: COO's int64 indices make them smaller only past 2/3 zeros).
    pub stored_sparse: usize,
    /// Elements set to zero, of all elements of those weights.
    pub zeroed: u64,
    pub elements: u64,
    /// Bytes of those weights in the file, before and after.
    pub file_bytes_before: u64,
    pub file_bytes_after: u64,
}

/// Whether every read of `v` is a weight slot of a MatMul, Gemm, Conv or
/// ConvTranspose.
fn is_weight(g: &Graph, v: ValueId) -> bool {
    let uses = g.uses(v);
    !uses.is_empty()
        && !g.is_output(v)
        && !g.is_input(v)
        && uses.iter().all(|u| match *u {
            Use::Input { node, slot: 1 } => {
                let d = g.node(node);
                (d.domain.is_empty() || d.domain == "ai.onnx")
                    && matches!(
                        d.op_type.as_str(),
                        "MatMul" | "Gemm" | "Conv" | "ConvTranspose"
                    )
            }
            _ => false,
        })
}

/// Zeroes the `sparsity` fraction (in `[0, 1)`, as [`super::Prune::validate`]
/// checks) of every weight's elements (see the module doc); `keep` names
/// weights left as they are.
pub(super) fn sparsify(
    g: &mut Graph,
    sparsity: f64,
    keep: &[String],
) -> Result<SparsityReport, PassError> {
    let mut r = SparsityReport {
        sparsity,
        ..SparsityReport::default()
    };
    let targets: Vec<ValueId> = g
        .initializers()
        .iter()
        .copied()
        .filter(|&v| is_weight(g, v) && !keep.iter().any(|k| k == g.name(v)))
        .collect();
    for v in targets {
        let t = g.initializer(v).expect("an initializer");
        if !t.dtype.is_float() {
            continue;
        }
        let (Some(vals), Some(raw), Some(bits)) = (t.to_f64_vec(), t.raw(), t.dtype.bits()) else {
            continue;
        };
        if bits % 8 != 0 || vals.is_empty() {
            continue;
        }
        let es = (bits / 8) as usize;
        let k = (vals.len() as f64 * sparsity + 1e-9).floor() as usize;
        if k == 0 {
            continue;
        }
        let mut order: Vec<usize> = (0..vals.len()).collect();
        order.sort_by(|&a, &b| vals[a].abs().total_cmp(&vals[b].abs()).then(a.cmp(&b)));
        let mut bytes = raw.to_vec();
        for &i in &order[..k] {
            bytes[i * es..(i + 1) * es].fill(0);
        }
        let dense = Tensor {
            data: graphopt_ir::TensorData::Raw(bytes.into()),
            ..t.clone()
        };
        let nnz = vals.len() - k;
        let dense_bytes = (vals.len() * es) as u64;
        let sparse_bytes = (nnz * (es + 8)) as u64;
        r.weights += 1;
        r.zeroed += k as u64;
        r.elements += vals.len() as u64;
        r.file_bytes_before += dense_bytes;
        if sparse_bytes < dense_bytes {
            let raw = dense.raw().expect("raw");
            let mut values = Vec::with_capacity(nnz * es);
            let mut indices = Vec::with_capacity(nnz);
            for i in 0..vals.len() {
                let e = &raw[i * es..(i + 1) * es];
                if e.iter().any(|&b| b != 0) {
                    values.extend_from_slice(e);
                    indices.push(i as i64);
                }
            }
            let n = indices.len() as i64;
            let mut values = Tensor::from_raw(dense.dtype, vec![n], values.into())?;
            values.name = g.name(v).to_string();
            let sp = SparseTensor {
                values,
                indices: Tensor::from_i64(vec![n], &indices)?,
                dims: dense.dims.clone(),
            };
            r.file_bytes_after += (indices.len() * (es + 8)) as u64;
            g.take_initializer(v);
            g.set_sparse_initializer(v, sp);
            r.stored_sparse += 1;
        } else {
            r.file_bytes_after += dense_bytes;
            g.set_initializer(v, dense);
        }
    }
    if r.weights == 0 {
        return Err(PassError(
            "--unstructured: the model has no float MatMul, Gemm or Conv weight to sparsify".into(),
        ));
    }
    Ok(r)
}
