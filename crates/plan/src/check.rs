//! The plan checker, written apart from the planner so that a planner bug
//! cannot hide itself: it recomputes everything from the buffers and the
//! offsets alone.
//!
//! A plan is valid when
//! 1. every live buffer lies inside the arena;
//! 2. every offset is a multiple of the alignment;
//! 3. no two buffers alive at the same time share a byte, except a pair the
//!    planner declared as sharing storage ([`Alias`]) and which the in-place
//!    table ([`crate::inplace_rule`]) allows: such a pair must sit at the
//!    same offset.

use crate::buffer::Buffer;
use std::fmt;

/// Two buffers declared to share storage: node `op_type` at time step `at`
/// reads `input` and writes `output` into the same bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alias {
    /// Index of the input buffer in the checked list.
    pub input: usize,
    /// Index of the output buffer in the checked list.
    pub output: usize,
    pub op_type: String,
    /// The time step of the node.
    pub at: i64,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckError(pub String);

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CheckError {}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// Checks a placement of `bufs` at `offsets` in an arena of `arena` bytes.
///
/// Declared aliases join buffers into groups; two buffers may share bytes
/// while both are live only inside one group, at one offset. An alias is
/// legal when the op's in-place rule allows it: a view's output is no
/// larger than its input; an elementwise or update (Scatter) output has the
/// input's size, the input dies at the node, and nothing else in those
/// bytes outlives it. (Which input slot an update overwrites, input 0, is
/// not the checker's to see: it checks buffers, not nodes; the executor
/// refuses a pair on another slot.)
/// Returns every broken rule (at most 20 overlaps are named).
pub fn check_plan(
    bufs: &[Buffer],
    offsets: &[u64],
    arena: u64,
    alignment: u64,
    aliases: &[Alias],
) -> Result<(), Vec<CheckError>> {
    let mut errs = Vec::new();
    if offsets.len() != bufs.len() {
        errs.push(CheckError(format!(
            "{} offsets for {} buffers",
            offsets.len(),
            bufs.len()
        )));
        return Err(errs);
    }
    let align = alignment.max(1);
    for (b, &o) in bufs.iter().zip(offsets) {
        if !b.is_live() {
            continue;
        }
        match o.checked_add(b.size) {
            Some(end) if end <= arena => {}
            _ => errs.push(CheckError(format!(
                "buffer {} at [{o}, {o}+{}) exceeds the arena of {arena} bytes",
                b.id, b.size
            ))),
        }
        if o % align != 0 {
            errs.push(CheckError(format!(
                "buffer {} offset {o} is not a multiple of {align}",
                b.id
            )));
        }
    }
    let shares = |i: usize, j: usize| {
        let (oi, oj) = (offsets[i] as u128, offsets[j] as u128);
        oi < oj + bufs[j].size as u128 && oj < oi + bufs[i].size as u128
    };
    let mut parent: Vec<usize> = (0..bufs.len()).collect();
    for a in aliases {
        let (Some(i), Some(o)) = (bufs.get(a.input), bufs.get(a.output)) else {
            errs.push(CheckError(format!(
                "alias names buffer {} or {} that does not exist",
                a.input, a.output
            )));
            continue;
        };
        let rule = crate::inplace::inplace_rule(&a.op_type);
        let legal = match rule {
            crate::InPlace::View => o.size <= i.size,
            crate::InPlace::Elementwise | crate::InPlace::Over(_) => {
                o.size == i.size && i.upper == a.at + 1 && o.lower == a.at
            }
            crate::InPlace::None => false,
        };
        if !legal {
            errs.push(CheckError(format!(
                "{} at step {} may not put buffer {} ({} bytes, [{}, {})) in buffer {} ({} bytes, [{}, {}))",
                a.op_type, a.at, o.id, o.size, o.lower, o.upper, i.id, i.size, i.lower, i.upper
            )));
            continue;
        }
        if offsets[a.input] != offsets[a.output] {
            errs.push(CheckError(format!(
                "aliased buffers {} and {} are at different offsets",
                i.id, o.id
            )));
            continue;
        }
        if matches!(rule, crate::InPlace::Elementwise | crate::InPlace::Over(_)) {
            // Overwriting: nothing else in these bytes may be read later.
            for (k, t) in bufs.iter().enumerate() {
                if k != a.input
                    && k != a.output
                    && t.is_live()
                    && t.lower <= a.at
                    && t.upper > a.at + 1
                    && shares(k, a.input)
                {
                    errs.push(CheckError(format!(
                        "{} at step {} overwrites buffer {}, which buffer {} still needs",
                        a.op_type, a.at, i.id, t.id
                    )));
                }
            }
        }
        let (ri, ro) = (find(&mut parent, a.input), find(&mut parent, a.output));
        parent[ri.max(ro)] = ri.min(ro);
    }
    // Sweep over time: a buffer is compared with the buffers live when it starts.
    let mut idx: Vec<usize> = (0..bufs.len()).filter(|&i| bufs[i].is_live()).collect();
    idx.sort_by_key(|&i| (bufs[i].lower, i));
    let mut live: Vec<usize> = Vec::new();
    let mut reported = 0;
    for &i in &idx {
        let b = &bufs[i];
        live.retain(|&j| bufs[j].upper > b.lower);
        for &j in &live {
            if !shares(i, j) {
                continue;
            }
            let same_group =
                find(&mut parent, i) == find(&mut parent, j) && offsets[i] == offsets[j];
            if !same_group {
                if reported < 20 {
                    errs.push(CheckError(format!(
                        "buffers {} [{}, {}) and {} [{}, {}) are live together and overlap in memory",
                        bufs[j].id, bufs[j].lower, bufs[j].upper, b.id, b.lower, b.upper
                    )));
                }
                reported += 1;
            }
        }
        live.push(i);
    }
    if reported > 20 {
        errs.push(CheckError(format!(
            "... and {} more overlaps",
            reported - 20
        )));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_overlaps_bounds_and_alignment() {
        let bufs = [
            Buffer::new(0, 0, 2, 4),
            Buffer::new(1, 1, 3, 4),
            Buffer::new(2, 2, 4, 4),
        ];
        assert!(check_plan(&bufs, &[0, 4, 0], 8, 4, &[]).is_ok());
        let e = check_plan(&bufs, &[0, 2, 0], 8, 1, &[]).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(check_plan(&bufs, &[0, 4, 0], 7, 1, &[]).is_err());
        assert!(check_plan(&bufs, &[0, 6, 0], 10, 4, &[]).is_err());
        assert!(check_plan(&bufs, &[0, 4], 8, 1, &[]).is_err());
    }

    #[test]
    fn aliases_follow_the_table() {
        let mut bufs = [Buffer::new(0, 0, 2, 4), Buffer::new(1, 1, 3, 4)];
        let alias = |op: &str| Alias {
            input: 0,
            output: 1,
            op_type: op.into(),
            at: 1,
        };
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[alias("Relu")]).is_ok());
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[alias("Reshape")]).is_ok());
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[alias("ScatterND")]).is_ok());
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[alias("MatMul")]).is_err());
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[]).is_err());
        // An input that lives past the node cannot be overwritten.
        bufs[0].upper = 3;
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[alias("Relu")]).is_err());
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[alias("ScatterElements")]).is_err());
        assert!(check_plan(&bufs, &[0, 0], 4, 1, &[alias("Reshape")]).is_ok());
        // Nor can a view of it that lives on.
        let bufs = [
            Buffer::new(0, 0, 2, 4),
            Buffer::new(1, 1, 4, 4),
            Buffer::new(2, 1, 3, 4),
        ];
        let v = Alias {
            input: 0,
            output: 1,
            op_type: "Reshape".into(),
            at: 1,
        };
        let e = Alias {
            input: 0,
            output: 2,
            op_type: "Relu".into(),
            at: 1,
        };
        assert!(check_plan(&bufs, &[0, 0, 0], 4, 1, std::slice::from_ref(&v)).is_err());
        assert!(check_plan(&bufs, &[0, 0, 0], 4, 1, &[v, e]).is_err());
    }
}
