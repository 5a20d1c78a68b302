//! The cost model of rematerialization: what one execution of a node
//! costs, in floating-point operations (FLOPs).
//!
//! One table, read top to bottom:
//!
//! | ops | FLOPs |
//! |---|---|
//! | `MatMul`, `MatMulInteger` | `2 · numel(Y) · K`, `K` = the last dim of `A` (batched and broadcast products count every output) |
//! | `Gemm` | `2 · M · N · K` (+ `M · N` when `C` is given) |
//! | `Conv`, `ConvInteger` | `2 · numel(Y) · (C_in / group) · prod(kernel)` (+ `numel(Y)` with a bias) |
//! | `ConvTranspose` | `2 · numel(X) · (C_out / group) · prod(kernel)` |
//! | `Einsum` | `2 · prod(size of every distinct index letter)` (one multiply-add per point of the full index space) |
//! | reductions (`Reduce*`, `ArgMax`, `ArgMin`, `GlobalAveragePool`, `GlobalMaxPool`) | `numel(input 0)` |
//! | pooling (`AveragePool`, `MaxPool`, `LpPool`) | `numel(Y) · prod(kernel)` |
//! | `Softmax`, `LogSoftmax`, normalisations (`LayerNormalization`, `BatchNormalization`, `InstanceNormalization`, `GroupNormalization`) | `numel(input 0)` per pass over it: 3 for softmax (max, exp-sum, divide), 2 for normalisations (statistics, scale) |
//! | views (`Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`, `Identity`) and metadata (`Shape`, `Size`, `Constant`, `ConstantOfShape`'s fill counts) | `0` (views), element count of the output otherwise |
//! | everything else (elementwise, `Transpose`, `Concat`, `Gather`, `Slice`, `Where`, `Cast`, ...) | `numel(Y)` summed over outputs |
//!
//! Shapes are read from the graph's value types, so they must be concrete
//! (bind dims and infer first). A node whose shapes are unknown costs
//! `numel` of what is known, or 1: recomputing it is never free.
//!
//! Elementwise ops count one FLOP per element although `Erf` or `Pow`
//! take more cycles than `Add`: the model ranks what to recompute, and at
//! the sizes of training graphs the products (`MatMul`, `Conv`) dominate
//! by two to three orders of magnitude.

use graphopt_ir::{Graph, NodeId, ValueId};

fn dims(g: &Graph, v: Option<ValueId>) -> Option<Vec<u64>> {
    let s = g.ty(v?)?.shape()?.as_known()?;
    s.iter()
        .map(|&d| u64::try_from(d).ok())
        .collect::<Option<Vec<u64>>>()
}

fn numel(g: &Graph, v: Option<ValueId>) -> Option<u64> {
    dims(g, v).map(|d| d.iter().product())
}

fn outputs_numel(g: &Graph, n: NodeId) -> u64 {
    g.node(n)
        .outputs()
        .iter()
        .filter_map(|&o| numel(g, o))
        .fold(0u64, u64::saturating_add)
}

/// FLOPs of one execution of node `n` (see the module table).
pub fn node_flops(g: &Graph, n: NodeId) -> u64 {
    let d = g.node(n);
    let out0 = || numel(g, d.output(0));
    let in0 = || numel(g, d.input(0));
    let kernel = || -> Option<u64> {
        if let Some(k) = d.attr_ints("kernel_shape") {
            return Some(k.iter().map(|&x| x.max(0) as u64).product());
        }
        // From the weight's shape: [C_out, C_in/group, k...].
        let w = dims(g, d.input(1))?;
        Some(w.iter().skip(2).product())
    };
    let custom = !(d.domain.is_empty() || d.domain == "ai.onnx");
    let f: Option<u64> = if custom {
        None
    } else {
        match d.op_type.as_str() {
            "MatMul" | "MatMulInteger" => {
                let a = dims(g, d.input(0));
                let k = a.as_ref().and_then(|a| a.last().copied());
                match (out0(), k) {
                    (Some(y), Some(k)) => Some(2u64.saturating_mul(y).saturating_mul(k)),
                    _ => None,
                }
            }
            "Gemm" => {
                let a = dims(g, d.input(0));
                let trans_a = d.attr_int("transA").unwrap_or(0) != 0;
                let k = a.and_then(|a| {
                    if a.len() == 2 {
                        Some(if trans_a { a[0] } else { a[1] })
                    } else {
                        None
                    }
                });
                match (out0(), k) {
                    (Some(y), Some(k)) => {
                        let bias = if d.input(2).is_some() { y } else { 0 };
                        Some(
                            2u64.saturating_mul(y)
                                .saturating_mul(k)
                                .saturating_add(bias),
                        )
                    }
                    _ => None,
                }
            }
            "Conv" | "ConvInteger" => {
                let w = dims(g, d.input(1));
                let cin_per_group = w.as_ref().and_then(|w| w.get(1).copied());
                match (out0(), cin_per_group, kernel()) {
                    (Some(y), Some(c), Some(k)) => {
                        let bias = if d.input(2).is_some() { y } else { 0 };
                        Some(
                            2u64.saturating_mul(y)
                                .saturating_mul(c)
                                .saturating_mul(k)
                                .saturating_add(bias),
                        )
                    }
                    _ => None,
                }
            }
            "ConvTranspose" => {
                // W: [C_in, C_out/group, k...]: every input element meets
                // C_out/group · prod(kernel) weights.
                let w = dims(g, d.input(1));
                let cout_per_group = w.as_ref().and_then(|w| w.get(1).copied());
                match (in0(), cout_per_group, kernel()) {
                    (Some(x), Some(c), Some(k)) => {
                        Some(2u64.saturating_mul(x).saturating_mul(c).saturating_mul(k))
                    }
                    _ => None,
                }
            }
            "Einsum" => einsum_flops(g, n),
            "AveragePool" | "MaxPool" | "LpPool" => match (out0(), kernel()) {
                (Some(y), Some(k)) => Some(y.saturating_mul(k)),
                _ => None,
            },
            "Softmax" | "LogSoftmax" => in0().map(|x| x.saturating_mul(3)),
            "LayerNormalization"
            | "BatchNormalization"
            | "InstanceNormalization"
            | "GroupNormalization" => in0().map(|x| x.saturating_mul(2)),
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" | "Shape" | "Size" => {
                Some(0)
            }
            op if op.starts_with("Reduce")
                || matches!(
                    op,
                    "ArgMax" | "ArgMin" | "GlobalAveragePool" | "GlobalMaxPool"
                ) =>
            {
                in0()
            }
            _ => Some(outputs_numel(g, n)),
        }
    };
    f.unwrap_or_else(|| outputs_numel(g, n).max(1))
}

/// `2 · prod(dim of each distinct letter)`, the letters' sizes read from
/// the operands' shapes.
fn einsum_flops(g: &Graph, n: NodeId) -> Option<u64> {
    let d = g.node(n);
    let eq = d.attr_str("equation")?.replace(' ', "");
    let lhs = eq.split("->").next()?;
    let mut size: std::collections::BTreeMap<char, u64> = Default::default();
    for (term, &v) in lhs.split(',').zip(d.inputs()) {
        let sh = dims(g, v)?;
        if term.contains("...") {
            // Ellipsis dims: count them as one letter of their product.
            let named = term.replace("...", "");
            let extra = sh.len().checked_sub(named.len())?;
            let ell: u64 = sh[..extra].iter().product();
            let e = size.entry('…').or_insert(1);
            *e = (*e).max(ell);
            for (c, &s) in named.chars().zip(&sh[extra..]) {
                size.insert(c, s);
            }
        } else {
            for (c, &s) in term.chars().zip(&sh) {
                size.insert(c, s);
            }
        }
    }
    Some(
        size.values()
            .fold(2u64, |acc, &s| acc.saturating_mul(s.max(1))),
    )
}

/// FLOPs of one execution of the whole graph.
pub fn graph_flops(g: &Graph) -> u64 {
    g.nodes()
        .map(|n| node_flops(g, n))
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphopt_ir::{DType, NewNode, Type};

    fn graph(op: &str, ins: &[&[i64]], out: &[i64]) -> (Graph, NodeId) {
        let mut g = Graph::new("t");
        let vs: Vec<ValueId> = ins
            .iter()
            .enumerate()
            .map(|(i, s)| {
                g.add_value(format!("x{i}"), Some(Type::known(DType::F32, s)))
                    .unwrap()
            })
            .collect();
        let y = g
            .add_value("y", Some(Type::known(DType::F32, out)))
            .unwrap();
        let n = g
            .add_node(NewNode::new(op).inputs(&vs).outputs(&[y]))
            .unwrap();
        (g, n)
    }

    #[test]
    fn products_are_exact() {
        let (g, n) = graph("MatMul", &[&[8, 16, 32], &[32, 64]], &[8, 16, 64]);
        assert_eq!(node_flops(&g, n), 2 * 8 * 16 * 64 * 32);
        let (g, n) = graph("Gemm", &[&[4, 5], &[5, 6]], &[4, 6]);
        assert_eq!(node_flops(&g, n), 2 * 4 * 6 * 5);
        let (g, n) = graph("Conv", &[&[1, 3, 8, 8], &[16, 3, 3, 3]], &[1, 16, 6, 6]);
        assert_eq!(node_flops(&g, n), 2 * 16 * 36 * 3 * 9);
        let (g, n) = graph("Relu", &[&[2, 3]], &[2, 3]);
        assert_eq!(node_flops(&g, n), 6);
        let (g, n) = graph("ReduceSum", &[&[2, 3]], &[2]);
        assert_eq!(node_flops(&g, n), 6);
        let (g, n) = graph("Reshape", &[&[2, 3]], &[6]);
        assert_eq!(node_flops(&g, n), 0);
    }

    #[test]
    fn einsum_counts_the_index_space() {
        let (mut g, n) = graph("Einsum", &[&[2, 3, 4], &[2, 4, 5]], &[2, 3, 5]);
        g.node_mut(n).attributes.push(graphopt_ir::Attribute::new(
            "equation",
            graphopt_ir::AttrValue::String(b"bij,bjk->bik".to_vec()),
        ));
        assert_eq!(node_flops(&g, n), 2 * 2 * 3 * 4 * 5);
    }
}
