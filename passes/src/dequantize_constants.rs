//! Quantized weights back to float, for executors without integer kernels.
//!
//! Why: a QDQ model (what the `quantize` pass writes) stores weights as
//! integers and dequantizes them with `DequantizeLinear`. tract cannot load
//! 4-bit tensors or blocked scales, and wants constant scales; the float
//! model it can run computes the same numbers. The facade runs quantized
//! models this way to measure their error against the float model.
//!
//! Two rewrites, in every graph (subgraphs included):
//! 1. `y = DequantizeLinear(q, s[, z])` with constant inputs ==> `y` a
//!    float initializer (float16 when `s` is float16), computed as
//!    onnxruntime's kernel computes it: `(q - z) * s` in f32, per tensor,
//!    per axis or blocked (opset 21 `block_size`). The integer tensors go
//!    when nothing else reads them.
//! 2. `q, s, z = DynamicQuantizeLinear(x); y = DequantizeLinear(q, s, z)`
//!    ==> the same arithmetic in float ops:
//!    `s = max((max(x, 0) - min(x, 0)) / 255, 2^-126)` (an all-zero `x`
//!    would give 0 / 0; the floor makes it 0, as the kernels do),
//!    `z = clip(round(-min(x, 0) / s), 0, 255)`,
//!    `y = (clip(round(x / s) + z, 0, 255) - z) * s`.
//!
//! A scale that is `Cast(to: float)` of a constant (the quantize pass's
//! int4 form for a float32 weight: float16 scales cast to float32) counts
//! as constant, and the Cast goes with the fold. A folded float16 weight
//! read only by `Cast(to: float)` becomes the float32 weight.
//!
//! A `DequantizeLinear` of a computed value (static activation QDQ) stays.
//! Rewrite 1 gives onnxruntime's bits. Rewrite 2 gave them on the
//! transformers tried (`passes/tests/dequantize_constants_ort.rs`), but a
//! kernel that multiplies by 1 / s instead of dividing may land an element
//! on the next level, so the pass is not [`Pass::exact`].
//!
//! ```text
//! before:                                          after:
//! g (float[1,2] x) => (float[1,2] y)               g (float[1,2] x) => (float[1,2] y)
//!   <int8[2,2] wq = {2, -4, 6, 8},                   <float[2,2] w = {1.0, -1.0, 3.0, 2.0}> {
//!    float[2] ws = {0.5, 0.25}> {                    y = MatMul (x, w)
//!   w = DequantizeLinear <axis: int = 1> (wq, ws)  }
//!   y = MatMul (x, w)
//! }
//! ```

use crate::lower_precision::{f16_bits_to_f32, f32_to_f16_bits};
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{AttrValue, Attribute, DType, Graph, Model, NewNode, Tensor, Type, ValueId};

pub struct DequantizeConstants;

impl Pass for DequantizeConstants {
    fn name(&self) -> &'static str {
        "dequantize_constants"
    }

    fn exact(&self) -> bool {
        false
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        fold_dq(&mut model.graph, &|_| None, &mut stats)?;
        Ok(stats)
    }
}

/// The model with both rewrites applied (a copy; `m` is untouched).
pub fn dequantize_constants(m: &Model) -> Result<Model, PassError> {
    let mut m = m.clone();
    DequantizeConstants.run(&mut m)?;
    Ok(m)
}

/// Constants of the enclosing graphs, by name (`None` in the main graph).
type Outer<'a> = &'a dyn Fn(&str) -> Option<Tensor>;

fn fold_dq(g: &mut Graph, outer: Outer, stats: &mut PassStats) -> Result<(), PassError> {
    for n in g.nodes().collect::<Vec<_>>() {
        if g.node(n).has_subgraphs() {
            let captured: Vec<ValueId> = g.node(n).captures().to_vec();
            let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
            let mut r = Ok(());
            {
                let here: &Graph = g;
                let look = |name: &str| match here.value_by_name(name) {
                    Some(v) if here.is_outer(v) => outer(name),
                    Some(v) => here.constant(v).cloned(),
                    None => None,
                };
                for a in &mut attrs {
                    for sub in a.graphs_mut() {
                        if r.is_ok() {
                            r = fold_dq(sub, &look, stats);
                        }
                    }
                }
            }
            g.node_mut(n).attributes = attrs;
            g.refresh_captures(n);
            r?;
            // Integer tensors only a folded body read.
            for v in captured {
                drop_if_unused(g, v);
            }
            continue;
        }
        let d = g.node(n);
        if d.op_type != "DequantizeLinear" || !d.domain.is_empty() {
            continue;
        }
        let ins: Vec<_> = d.inputs().iter().flatten().copied().collect();
        let consts: Vec<Tensor> = ins
            .iter()
            .map_while(|&v| {
                if g.is_outer(v) {
                    outer(g.name(v))
                } else {
                    g.constant(v).cloned().or_else(|| cast_constant(g, v))
                }
            })
            .collect();
        if ins.is_empty() || consts.len() != ins.len() {
            continue;
        }
        let Some(y) = d.output(0) else { continue };
        let axis = d.attr_int("axis").unwrap_or(1);
        let block = d.attr_int("block_size").unwrap_or(0);
        let Some(t) = dequantize(&consts[0], &consts[1], consts.get(2), axis, block) else {
            continue;
        };
        g.remove_node(n);
        g.set_initializer(y, t);
        stats.add("folded", 1);
        // The integer tensors go too (tract loads every initializer, and
        // has no 4-bit types), and Casts of float16 scales no longer read.
        for v in ins {
            if let Some((c, _)) = g.producer(v).filter(|_| g.uses(v).is_empty()) {
                let src = g.node(c).input(0);
                g.remove_node(c);
                g.remove_value(v);
                if let Some(src) = src {
                    drop_if_unused(g, src);
                }
                continue;
            }
            drop_if_unused(g, v);
        }
        fold_cast(g, y, stats);
    }
    emulate_dynamic(g, stats)
}

/// `v = Cast(c, to: float)` of a float16 or float32 constant `c` (the
/// quantize pass's float16 int4 scales for a float32 weight): `c` in
/// float32.
fn cast_constant(g: &Graph, v: ValueId) -> Option<Tensor> {
    let (c, _) = g.producer(v)?;
    let d = g.node(c);
    if d.op_type != "Cast"
        || !d.domain.is_empty()
        || d.attr_int("to") != Some(DType::F32.to_onnx() as i64)
    {
        return None;
    }
    let t = g.constant(d.input(0)?)?;
    let raw = t.raw()?;
    let vals: Vec<f32> = match t.dtype {
        DType::F16 => raw
            .chunks_exact(2)
            .map(|b| f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        DType::F32 => return Some(t.clone()),
        _ => return None,
    };
    Tensor::from_f32(t.dims.clone(), &vals).ok()
}

/// `y` a folded float16 weight read only by `Cast(to: float)` (the int4
/// form with float16 scales of a float32 model) ==> the Cast's output a
/// float32 initializer (exact: every float16 is a float32).
fn fold_cast(g: &mut Graph, y: ValueId, stats: &mut PassStats) {
    let [graphopt_ir::Use::Input { node: c, slot: 0 }] = *g.uses(y) else {
        return;
    };
    let d = g.node(c);
    let to_f32 = d.attr_int("to") == Some(DType::F32.to_onnx() as i64);
    let (Some(out), Some(t)) = (d.output(0), g.initializer(y)) else {
        return;
    };
    if d.op_type != "Cast" || !d.domain.is_empty() || !to_f32 || g.is_output(y) {
        return;
    }
    if t.dtype != DType::F16 {
        return;
    }
    let Some(raw) = t.raw() else { return };
    let vals: Vec<f32> = raw
        .chunks_exact(2)
        .map(|b| f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    let Ok(t32) = Tensor::from_f32(t.dims.clone(), &vals) else {
        return;
    };
    g.remove_node(c);
    g.set_initializer(out, t32);
    drop_if_unused(g, y);
    stats.add("casts_folded", 1);
}

/// Removes `v` when nothing reads it any more and it is a plain
/// initializer of this graph, or a capture (the enclosing graph drops the
/// tensor once no body captures it).
fn drop_if_unused(g: &mut Graph, v: ValueId) {
    if !g.is_live_value(v) || !g.uses(v).is_empty() || g.is_input(v) || g.is_output(v) {
        return;
    }
    if g.is_outer(v) {
        g.remove_value(v);
    } else if g.initializer(v).is_some() {
        g.take_initializer(v);
        g.remove_value(v);
    }
}

fn emulate_dynamic(g: &mut Graph, stats: &mut PassStats) -> Result<(), PassError> {
    for n in g.nodes().collect::<Vec<_>>() {
        let d = g.node(n);
        if d.op_type != "DequantizeLinear" || !d.domain.is_empty() || d.inputs().len() != 3 {
            continue;
        }
        let (Some(q), Some(y)) = (d.input(0), d.output(0)) else {
            continue;
        };
        let Some((p, 0)) = g.producer(q) else {
            continue;
        };
        let pd = g.node(p);
        if pd.op_type != "DynamicQuantizeLinear"
            || !pd.domain.is_empty()
            || pd.outputs().iter().flatten().copied().collect::<Vec<_>>()
                != d.inputs().iter().flatten().copied().collect::<Vec<_>>()
        {
            continue;
        }
        let Some(x) = pd.input(0) else { continue };
        let f = |g: &mut Graph, h: &str| g.fresh_value(h, Some(Type::tensor(DType::F32, None)));
        let c = |g: &mut Graph, h: &str, v: f32| g.add_initializer(h, Tensor::scalar_f32(v));
        let zero = c(g, "dql_zero", 0.0);
        let q255 = c(g, "dql_255", 255.0);
        let mut nodes: Vec<NewNode> = Vec::new();
        let mut op = |g: &mut Graph, o: &str, ins: &[ValueId], out: Option<ValueId>| {
            let out = out.unwrap_or_else(|| f(g, "dql"));
            let mut nn = NewNode::new(o).inputs(ins).outputs(&[out]);
            if o.starts_with("Reduce") {
                nn = nn.attr(Attribute::new("keepdims", AttrValue::Int(0)));
            }
            nodes.push(nn);
            out
        };
        let mx = op(g, "ReduceMax", &[x], None);
        let mn = op(g, "ReduceMin", &[x], None);
        let mx = op(g, "Max", &[mx, zero], None);
        let mn = op(g, "Min", &[mn, zero], None);
        let rg = op(g, "Sub", &[mx, mn], None);
        let tiny = c(g, "dql_tiny", f32::MIN_POSITIVE);
        let sc = op(g, "Div", &[rg, q255], None);
        let sc = op(g, "Max", &[sc, tiny], None);
        let nm = op(g, "Neg", &[mn], None);
        let zf = op(g, "Div", &[nm, sc], None);
        let zr = op(g, "Round", &[zf], None);
        let zp = op(g, "Clip", &[zr, zero, q255], None);
        let xs = op(g, "Div", &[x, sc], None);
        let xr = op(g, "Round", &[xs], None);
        let xz = op(g, "Add", &[xr, zp], None);
        let qc = op(g, "Clip", &[xz, zero, q255], None);
        let qz = op(g, "Sub", &[qc, zp], None);
        g.remove_node(n);
        op(g, "Mul", &[qz, sc], Some(y));
        for nn in nodes {
            g.insert_node_before(p, nn)?;
        }
        stats.add("emulated", 1);
        let outs: Vec<_> = g.node(p).outputs().iter().flatten().copied().collect();
        if outs
            .iter()
            .all(|&v| g.uses(v).is_empty() && !g.is_output(v))
        {
            g.remove_node(p);
            for v in outs {
                g.remove_value(v);
            }
        }
    }
    Ok(())
}

/// Integer elements as i32 (int8, uint8, int4, uint4, int32).
fn ints(t: &Tensor) -> Option<Vec<i32>> {
    let raw = t.raw()?;
    Some(match t.dtype {
        DType::I8 => raw.iter().map(|&b| b as i8 as i32).collect(),
        DType::U8 => raw.iter().map(|&b| b as i32).collect(),
        DType::U4 | DType::I4 => {
            let n = t.numel().ok()? as usize;
            (0..n)
                .map(|i| {
                    let nib = (raw[i / 2] >> (4 * (i % 2))) & 0xF;
                    if t.dtype == DType::I4 {
                        ((nib << 4) as i8 >> 4) as i32
                    } else {
                        nib as i32
                    }
                })
                .collect()
        }
        DType::I32 => raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => return None,
    })
}

/// `(q - z) * s` with `s` per tensor, per `axis`, or per `block` elements
/// along `axis`; `None` for element types or layouts it does not know
/// (the node then stays).
fn dequantize(q: &Tensor, s: &Tensor, z: Option<&Tensor>, axis: i64, block: i64) -> Option<Tensor> {
    let sv: Vec<f32> = match s.dtype {
        DType::F32 => s
            .raw()?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => s
            .raw()?
            .chunks_exact(2)
            .map(|c| f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => return None,
    };
    let qv = ints(q)?;
    let zv = match z {
        Some(z) => ints(z)?,
        None => vec![0; sv.len()],
    };
    if zv.len() != sv.len() {
        return None;
    }
    let r = q.dims.len() as i64;
    let dims = &q.dims;
    let a = if axis < 0 { axis + r } else { axis };
    let n = qv.len();
    let mut out = vec![0f32; n];
    if sv.len() == 1 {
        for i in 0..n {
            out[i] = (qv[i] - zv[0]) as f32 * sv[0];
        }
    } else if block > 0 {
        if !(0..r).contains(&a) {
            return None;
        }
        let a = a as usize;
        let mut sdims = dims.clone();
        sdims[a] = (dims[a] + block - 1) / block;
        if sdims.iter().product::<i64>() as usize != sv.len() {
            return None;
        }
        for (i, o) in out.iter_mut().enumerate() {
            // Unravel i in dims, map axis a to its block, ravel in sdims.
            let mut rem = i;
            let mut si = 0usize;
            let mut mul = 1usize;
            for k in (0..dims.len()).rev() {
                let d = dims[k] as usize;
                let mut c = rem % d;
                rem /= d;
                if k == a {
                    c /= block as usize;
                }
                si += c * mul;
                mul *= sdims[k] as usize;
            }
            *o = (qv[i] - zv[si]) as f32 * sv[si];
        }
    } else {
        if !(0..r).contains(&a) {
            return None;
        }
        let a = a as usize;
        let nc = dims[a] as usize;
        if nc != sv.len() {
            return None;
        }
        let stride: usize = dims[a + 1..].iter().product::<i64>() as usize;
        for i in 0..n {
            let c = (i / stride) % nc;
            out[i] = (qv[i] - zv[c]) as f32 * sv[c];
        }
    }
    if s.dtype == DType::F16 {
        let raw: Vec<u8> = out
            .iter()
            .flat_map(|x| f32_to_f16_bits(*x).to_le_bytes())
            .collect();
        return Tensor::from_raw(DType::F16, dims.clone(), raw.into()).ok();
    }
    Tensor::from_f32(dims.clone(), &out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn per_axis_int8_folds_to_float() {
        assert_pass(
            &DequantizeConstants,
            r#"<ir_version: 8, opset_import: ["" : 13]>
            g (float[1,2] x) => (float[1,2] y) <int8[2,2] wq = {2, -4, 6, 8}, float[2] ws = {0.5, 0.25}> {
              w = DequantizeLinear <axis: int = 1> (wq, ws)
              y = MatMul (x, w)
            }"#,
            r#"<ir_version: 8, opset_import: ["" : 13]>
            g (float[1,2] x) => (float[1,2] y) <float[2,2] w = {1.0, -1.0, 3.0, 2.0}> {
              y = MatMul (x, w)
            }"#,
        );
    }

    #[test]
    fn computed_dequantize_stays() {
        assert_unchanged(
            &DequantizeConstants,
            r#"<ir_version: 8, opset_import: ["" : 13]>
            g (uint8[4] q) => (float[4] y) <float s = {0.5}, uint8 z = {128}> {
              y = DequantizeLinear (q, s, z)
            }"#,
        );
    }

    #[test]
    fn mismatched_scale_count_is_left_alone() {
        // Three scales for two channels: not something to guess at.
        assert_unchanged(
            &DequantizeConstants,
            r#"<ir_version: 8, opset_import: ["" : 13]>
            g () => (float[2,2] w) <int8[2,2] wq = {2, -4, 6, 8}, float[3] ws = {0.5, 0.25, 1.0}> {
              w = DequantizeLinear <axis: int = 1> (wq, ws)
            }"#,
        );
    }
}
