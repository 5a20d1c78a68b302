//! `cluster`: k-means palettization of each weight (see the module doc of
//! `compress` for the graph it writes).
//!
//! Per tensor, one codebook of at most 2^bits centroids; with
//! `per-channel-groups=G`, one per `G` consecutive slices of the first
//! axis (a first axis `G` does not divide falls back to one codebook, with
//! a warning). Indices are uint4 (packed, low nibble first) up to 4 bits
//! where the opset allows, else uint8. Centroids are float32.

use super::kmeans::{assign, palette};
use super::{readers_of, rel_l2, values, CompressReport, Layer, Target};
use crate::quantize::pack4;
use crate::PassError;
use bytes::Bytes;
use graphopt_ir::{AttrValue, Attribute, DType, Graph, NewNode, Tensor, Type};

/// The k-means seed (fixed: the same weights give the same file).
const SEED: u64 = 0x5EED_C0DE;

pub(super) fn apply(
    g: &mut Graph,
    targets: &[Target],
    bits: u32,
    group: Option<u64>,
    uint4: bool,
    report: &mut CompressReport,
) -> Result<(), PassError> {
    let k = 1usize << bits;
    let packed = uint4 && bits <= 4;
    for t in targets {
        let w = t.v;
        let tensor = g.initializer(w).expect("a target is an initializer").clone();
        let dims = tensor.dims.clone();
        let vals = values(g, w);
        if vals.iter().any(|x| !x.is_finite()) {
            report
                .kept
                .push((t.name.clone(), "holds NaN or Inf: kept".into()));
            continue;
        }
        let numel = vals.len();
        let first = dims.first().copied().unwrap_or(1).max(1) as u64;
        let ng = match group {
            Some(gs) if first.is_multiple_of(gs) => (first / gs) as usize,
            Some(gs) => {
                report.warnings.push(format!(
                    "{}: its first axis ({first}) is not a multiple of per-channel-groups={gs}: one codebook for the tensor",
                    t.name
                ));
                1
            }
            None => 1,
        };
        let per = numel / ng;
        // One palette per group, padded to the same length (the codebook
        // is rectangular).
        let mut books: Vec<Vec<f32>> = Vec::with_capacity(ng);
        let mut idx: Vec<u8> = Vec::with_capacity(numel);
        let mut decoded: Vec<f32> = Vec::with_capacity(numel);
        for c in vals.chunks_exact(per) {
            let p = palette(c, k, SEED);
            let i = assign(c, &p.centroids);
            decoded.extend(i.iter().map(|&j| p.centroids[j as usize]));
            idx.extend(i);
            books.push(p.centroids);
        }
        let kk = books.iter().map(Vec::len).max().unwrap_or(1).max(1);
        for b in &mut books {
            let last = *b.last().unwrap_or(&0.0);
            b.resize(kk, last);
        }
        let codebook: Vec<f32> = books.concat();
        let idx_bytes = if packed {
            numel.div_ceil(2) as u64
        } else {
            numel as u64
        };
        let shape_bytes = if ng > 1 { 8 * dims.len() as u64 } else { 0 };
        let bytes_before = tensor.nbytes();
        let bytes_after = idx_bytes + 4 * codebook.len() as u64 + shape_bytes;
        if bytes_after >= bytes_before {
            report.kept.push((
                t.name.clone(),
                format!("{bytes_after} bytes compressed against {bytes_before}: kept"),
            ));
            continue;
        }
        let (nodes, op) = readers_of(g, t);
        let err = rel_l2(&vals, &decoded);
        report.layers.push(Layer {
            weight: t.name.clone(),
            nodes,
            op,
            detail: format!(
                "cluster {bits}-bit, {kk} centroids, {}, {}",
                if ng > 1 {
                    format!("{ng} groups of {}", first as usize / ng)
                } else {
                    "per tensor".to_string()
                },
                if packed { "uint4" } else { "uint8" }
            ),
            bytes_before,
            bytes_after,
            weight_error: err,
        });
        let (idx_dtype, raw) = if packed {
            let v: Vec<i8> = idx.iter().map(|&i| i as i8).collect();
            (DType::U4, pack4(&v))
        } else {
            (DType::U8, idx)
        };
        let idx_dims = if ng > 1 {
            vec![ng as i64, per as i64]
        } else {
            dims.clone()
        };
        let base = t.name.clone();
        let add = |g: &mut Graph, hint: &str, t: Tensor| -> Result<_, PassError> {
            let v = g.add_value(g.fresh_name(hint), Some(Type::known(t.dtype, &t.dims)))?;
            g.set_initializer(v, t);
            Ok(v)
        };
        let iv = add(
            g,
            &format!("{base}_palette_indices"),
            Tensor::from_raw(idx_dtype, idx_dims.clone(), Bytes::from(raw))?,
        )?;
        let cb_dims = if ng > 1 {
            vec![ng as i64, kk as i64]
        } else {
            vec![kk as i64]
        };
        let cv = add(
            g,
            &format!("{base}_palette_codebook"),
            Tensor::from_f32(cb_dims, &codebook)?,
        )?;
        let i32v = g.add_value(
            g.fresh_name(&format!("{base}_palette_indices_i32")),
            Some(Type::known(DType::I32, &idx_dims)),
        )?;
        let mut new = vec![NewNode::new("Cast")
            .name(g.fresh_name(&format!("{base}_palette_cast")))
            .inputs(&[iv])
            .outputs(&[i32v])
            .attr(Attribute::new(
                "to",
                AttrValue::Int(DType::I32.to_onnx() as i64),
            ))];
        g.take_initializer(w);
        if ng > 1 {
            let flat = g.add_value(
                g.fresh_name(&format!("{base}_palette_flat")),
                Some(Type::known(DType::F32, &idx_dims)),
            )?;
            let sv = add(
                g,
                &format!("{base}_palette_shape"),
                Tensor::from_i64(vec![dims.len() as i64], &dims)?,
            )?;
            new.push(
                NewNode::new("GatherElements")
                    .name(g.fresh_name(&format!("{base}_palette_gather")))
                    .inputs(&[cv, i32v])
                    .outputs(&[flat])
                    .attr(Attribute::new("axis", AttrValue::Int(1))),
            );
            new.push(
                NewNode::new("Reshape")
                    .name(g.fresh_name(&format!("{base}_palette_reshape")))
                    .inputs(&[flat, sv])
                    .outputs(&[w]),
            );
        } else {
            new.push(
                NewNode::new("Gather")
                    .name(g.fresh_name(&format!("{base}_palette_gather")))
                    .inputs(&[cv, i32v])
                    .outputs(&[w])
                    .attr(Attribute::new("axis", AttrValue::Int(0))),
            );
        }
        // Just before the first reader: the decoded weight is an
        // activation to a planner, alive no longer than it must be.
        let first = g
            .first_in_order(t.readers.iter().map(|r| r.0))
            .expect("a target has readers");
        for n in new {
            g.insert_node_before(first, n)?;
        }
    }
    Ok(())
}
