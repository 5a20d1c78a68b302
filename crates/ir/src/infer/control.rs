//! Control flow (If, Loop, Scan; their bodies are inferred by the driver
//! before these rules run), sequences and optionals.

use super::ctx::{seq_elem, tensor, Cx};
use super::dims::{self, norm_axis};
use crate::{DType, Dim, Graph, Shape, TensorType, Type, TypeKind};

type Out = Option<Vec<Option<Type>>>;

fn graph_attr<'a>(cx: &Cx<'a>, name: &str) -> Option<&'a Graph> {
    match &cx.node.attr(name)?.value {
        crate::AttrValue::Graph(g) => Some(g),
        _ => None,
    }
}

fn out_ty(g: &Graph, i: usize) -> Option<Type> {
    g.ty(*g.outputs.get(i)?).cloned()
}

/// The join of two types a value may have (If branches, loop iterations):
/// what is common to both.
pub(crate) fn join(a: Option<&Type>, b: Option<&Type>) -> Option<Type> {
    let (a, b) = match (a, b) {
        (Some(a), Some(b)) => (a, b),
        (Some(x), None) | (None, Some(x)) => {
            // Only the element type is trustworthy.
            return match &x.kind {
                TypeKind::Tensor(t) => Some(Type::tensor(t.elem, None)),
                _ => None,
            };
        }
        _ => return None,
    };
    match (&a.kind, &b.kind) {
        (TypeKind::Tensor(x), TypeKind::Tensor(y)) if x.elem == y.elem => {
            let shape = match (&x.shape, &y.shape) {
                (Some(s), Some(t)) if s.rank() == t.rank() => Some(Shape::new(
                    s.dims
                        .iter()
                        .zip(&t.dims)
                        .map(|(p, q)| dims::join(p, q))
                        .collect(),
                )),
                _ => None,
            };
            Some(Type::tensor(x.elem, shape))
        }
        (TypeKind::Sequence(Some(x)), TypeKind::Sequence(Some(y))) => Some(Type {
            kind: TypeKind::Sequence(join(Some(x), Some(y)).map(Box::new)),
            denotation: None,
        }),
        (TypeKind::Optional(x), TypeKind::Optional(y)) => join(Some(x), Some(y)).map(|t| Type {
            kind: TypeKind::Optional(Box::new(t)),
            denotation: None,
        }),
        _ if a == b => Some(a.clone()),
        _ => None,
    }
}

fn with_leading(t: Option<Type>, d: Dim, axis: i64) -> Option<Type> {
    let t = t?;
    let tt = t.as_tensor()?;
    let shape = tt.shape.as_ref().and_then(|s| {
        let a = norm_axis(axis, s.rank() + 1)?;
        let mut dims = s.dims.clone();
        dims.insert(a, d);
        Some(Shape::new(dims))
    });
    Some(Type::tensor(tt.elem, shape))
}

fn seq_of(t: Option<Type>) -> Option<Type> {
    Some(Type {
        kind: TypeKind::Sequence(t.map(Box::new)),
        denotation: None,
    })
}

pub(crate) fn infer(cx: &Cx) -> Out {
    Some(match cx.op() {
        "If" => {
            let (t, e) = (graph_attr(cx, "then_branch"), graph_attr(cx, "else_branch"));
            (0..cx.nout())
                .map(|i| {
                    let a = t.and_then(|g| out_ty(g, i));
                    let b = e.and_then(|g| out_ty(g, i));
                    if t.is_some() && e.is_some() {
                        join(a.as_ref(), b.as_ref())
                    } else {
                        None
                    }
                })
                .collect()
        }
        "Loop" => {
            let body = graph_attr(cx, "body");
            let n_carried = cx.nin().saturating_sub(2);
            let trip = cx
                .ints(0)
                .filter(|v| v.len() == 1 && v[0] >= 0)
                .filter(|_| !cx.has(1))
                .map_or(Dim::Unknown, |v| Dim::Known(v[0]));
            (0..cx.nout())
                .map(|i| {
                    let b = body?;
                    if i < n_carried {
                        let bt = out_ty(b, 1 + i);
                        join(bt.as_ref(), cx.ty(2 + i))
                    } else {
                        with_leading(out_ty(b, 1 + i), trip.clone(), 0)
                    }
                })
                .collect()
        }
        "Scan" => {
            let body = graph_attr(cx, "body");
            let n_scan_in = cx.ai_or("num_scan_inputs", 0).max(0) as usize;
            let n_state = cx.nin().saturating_sub(n_scan_in);
            let in_axes = cx.aints("scan_input_axes").unwrap_or(&[]);
            let out_axes = cx.aints("scan_output_axes").unwrap_or(&[]);
            let len = (n_state < cx.nin())
                .then(|| {
                    let d = cx.dims(n_state)?;
                    let a = norm_axis(in_axes.first().copied().unwrap_or(0), d.len())?;
                    Some(d[a].clone())
                })
                .flatten()
                .unwrap_or(Dim::Unknown);
            (0..cx.nout())
                .map(|i| {
                    let b = body?;
                    if i < n_state {
                        let bt = out_ty(b, i);
                        join(bt.as_ref(), cx.ty(i))
                    } else {
                        let ax = out_axes.get(i - n_state).copied().unwrap_or(0);
                        with_leading(out_ty(b, i), len.clone(), ax)
                    }
                })
                .collect()
        }
        "SequenceConstruct" => {
            let mut acc: Option<Type> = cx.ty(0).cloned();
            for i in 1..cx.nin() {
                acc = join(acc.as_ref(), cx.ty(i));
            }
            vec![seq_of(acc)]
        }
        "SequenceEmpty" => {
            let e = cx.adtype("dtype").unwrap_or(DType::F32);
            vec![seq_of(Some(Type::tensor(e, None)))]
        }
        "SequenceInsert" => {
            let s = cx.ty(0).and_then(seq_elem);
            vec![seq_of(join(s, cx.ty(1)))]
        }
        "SequenceErase" => vec![cx.ty(0).cloned()],
        "SequenceAt" => vec![cx.ty(0).and_then(seq_elem).cloned()],
        "SequenceLength" => vec![Some(Type::known(DType::I64, &[]))],
        "SplitToSequence" => {
            let e = cx.elem(0);
            let shape = cx.dims(0).and_then(|d| {
                let a = norm_axis(cx.ai_or("axis", 0), d.len())?;
                let mut o = d.to_vec();
                if cx.has(1) {
                    o[a] = Dim::Unknown;
                } else if cx.ai_or("keepdims", 1) == 0 {
                    o.remove(a);
                } else {
                    o[a] = Dim::Known(1);
                }
                Some(o)
            });
            vec![seq_of(tensor(e, shape).filter(|_| e.is_some()))]
        }
        "ConcatFromSequence" => {
            let el = cx
                .ty(0)
                .and_then(seq_elem)
                .and_then(|t| t.as_tensor())
                .cloned();
            let new_axis = cx.ai_or("new_axis", 0) != 0;
            let out = el.map(|TensorType { elem, shape }| {
                let r = shape.map(|s| s.rank() + usize::from(new_axis));
                Type::tensor(elem, r.map(|r| Shape::new(vec![Dim::Unknown; r])))
            });
            vec![out]
        }
        "Optional" => {
            let inner = if cx.has(0) {
                cx.ty(0).cloned()
            } else {
                match &cx.node.attr("type").map(|a| &a.value) {
                    Some(crate::AttrValue::Type(t)) => Some(t.clone()),
                    _ => None,
                }
            };
            vec![inner.map(|t| Type {
                kind: TypeKind::Optional(Box::new(t)),
                denotation: None,
            })]
        }
        "OptionalGetElement" => vec![cx.ty(0).map(|t| match &t.kind {
            TypeKind::Optional(e) => (**e).clone(),
            _ => t.clone(),
        })],
        "OptionalHasElement" => vec![Some(Type::known(DType::Bool, &[]))],
        _ => return None,
    })
}
