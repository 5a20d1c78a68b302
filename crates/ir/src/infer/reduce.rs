//! Reductions: `Reduce*` with the axes attribute (older opsets) or input
//! (ReduceSum from 13, the others from 18), `keepdims` and
//! `noop_with_empty_axes`.

use super::ctx::{tensor, Cx};
use super::dims::norm_axes;
use crate::{Dim, Type};

type Out = Option<Vec<Option<Type>>>;

const REDUCE: &[&str] = &[
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
];

pub(crate) fn infer(cx: &Cx) -> Out {
    if !REDUCE.contains(&cx.op()) {
        return None;
    }
    let keep = cx.ai_or("keepdims", 1) != 0;
    let noop = cx.ai_or("noop_with_empty_axes", 0) != 0;
    let e0 = cx.elem(0);
    let Some(d) = cx.dims(0) else {
        return Some(vec![tensor(e0, None)]);
    };
    let r = d.len();
    let axes: Option<Vec<i64>> = if cx.has(1) {
        cx.ints(1)
    } else {
        Some(cx.aints("axes").map(|a| a.to_vec()).unwrap_or_default())
    };
    let dims = match axes {
        None => keep.then(|| vec![Dim::Unknown; r]),
        Some(a) if a.is_empty() => {
            if noop {
                Some(d.to_vec())
            } else if keep {
                Some(vec![Dim::Known(1); r])
            } else {
                Some(vec![])
            }
        }
        Some(a) => norm_axes(&a, r).map(|a| {
            let mut o = Vec::with_capacity(r);
            for (i, x) in d.iter().enumerate() {
                if a.contains(&i) {
                    if keep {
                        o.push(Dim::Known(1));
                    }
                } else {
                    o.push(x.clone());
                }
            }
            o
        }),
    };
    Some(vec![tensor(e0, dims)])
}
