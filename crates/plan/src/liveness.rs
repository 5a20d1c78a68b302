//! Liveness of a graph's tensors under a schedule, with in-place merging.
//!
//! Time step `i` is the `i`-th node of the schedule. A tensor is live over
//! `[first, last + 1)`:
//! 1. a node output from its node to its last reader (its node if unread);
//! 2. a graph input from step 0; a graph output to the last step;
//! 3. weights (initializers that are not graph inputs) live outside the
//!    arena and are only counted in `weights_bytes`.
//!
//! Storage: every arena tensor gets a storage slot, except that outputs
//! merged by [`crate::inplace_rule`] share their input's slot (whose
//! lifetime grows to cover them).

use crate::check::Alias;
use crate::inplace::{inplace_rule_in, InPlace};
use crate::PlanError;
use graphopt_ir::{Graph, NodeId, ValueId};

/// What a tensor is to the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    Input,
    Output,
    Intermediate,
}

/// One arena tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveTensor {
    pub value: ValueId,
    pub size: u64,
    pub first: usize,
    pub last: usize,
    pub kind: TensorKind,
    /// Index of its storage slot.
    pub storage: usize,
}

/// A storage slot: one or more tensors merged in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Storage {
    pub size: u64,
    pub first: usize,
    pub last: usize,
    /// Holds a graph input or output: never overwritten in place.
    pub pinned: bool,
}

/// Liveness of one schedule.
#[derive(Clone, Debug)]
pub struct Liveness {
    /// Donations honoured (input, output): the output shares the input's
    /// storage (see [`crate::donation`]).
    pub donated: Vec<(ValueId, ValueId)>,
    /// Donations refused, with why.
    pub donations_refused: Vec<String>,
    pub tensors: Vec<LiveTensor>,
    pub storages: Vec<Storage>,
    /// In-place pairs as indices into `tensors`, at their node's step.
    pub aliases: Vec<Alias>,
    pub weights_bytes: u64,
    /// Values left out because their size is unknown (only when asked to
    /// ignore them), sorted.
    pub unknown: Vec<String>,
}

/// The byte size of `v`, if its type is a tensor with known dims.
pub fn value_size(g: &Graph, v: ValueId) -> Option<u64> {
    let t = g.ty(v)?.as_tensor()?;
    let n = t.shape.as_ref()?.numel()?;
    t.elem.storage_bytes(n)
}

/// Computes liveness for `schedule` (which must list every node of `g`
/// once, producers before readers; see [`crate::schedule::check_schedule`]).
/// A value of unknown size is an error naming every such value.
pub fn liveness(g: &Graph, schedule: &[NodeId]) -> Result<Liveness, PlanError> {
    liveness_with(g, schedule, false)
}

/// [`liveness`], optionally leaving values of unknown size out of the
/// arena (listed in [`Liveness::unknown`]) instead of failing.
pub fn liveness_with(
    g: &Graph,
    schedule: &[NodeId],
    ignore_unknown: bool,
) -> Result<Liveness, PlanError> {
    liveness_donating(g, schedule, ignore_unknown, &[])
}

/// [`liveness_with`], with each output of `donations` placed in its
/// input's storage where [`crate::donation`]'s rules allow.
pub fn liveness_donating(
    g: &Graph,
    schedule: &[NodeId],
    ignore_unknown: bool,
    donations: &[(ValueId, ValueId)],
) -> Result<Liveness, PlanError> {
    let n = schedule.len();
    let end = n.saturating_sub(1);
    let mut weights_bytes = 0u64;
    for &w in g.initializers() {
        if !g.is_input(w) {
            weights_bytes =
                weights_bytes.saturating_add(g.initializer(w).map(|t| t.nbytes()).unwrap_or(0));
        }
    }
    let nvals = g.values().map(|v| v.index() + 1).max().unwrap_or(0);
    let mut slot: Vec<Option<usize>> = vec![None; nvals];
    let mut tensors: Vec<LiveTensor> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    let mut add = |v: ValueId, first: usize, kind: TensorKind, tensors: &mut Vec<LiveTensor>| {
        if slot[v.index()].is_some() {
            return;
        }
        match value_size(g, v) {
            Some(size) => {
                slot[v.index()] = Some(tensors.len());
                tensors.push(LiveTensor {
                    value: v,
                    size,
                    first,
                    last: first,
                    kind,
                    storage: usize::MAX,
                });
            }
            None => unknown.push(g.name(v).to_string()),
        }
    };
    for &v in &g.inputs {
        add(v, 0, TensorKind::Input, &mut tensors);
    }
    for (pos, &nid) in schedule.iter().enumerate() {
        for &o in g.node(nid).outputs().iter().flatten() {
            let kind = if g.is_output(o) {
                TensorKind::Output
            } else {
                TensorKind::Intermediate
            };
            add(o, pos, kind, &mut tensors);
        }
    }
    unknown.sort();
    unknown.dedup();
    if !unknown.is_empty() && !ignore_unknown {
        return Err(PlanError::UnknownSizes(unknown));
    }
    // Last reads.
    for (pos, &nid) in schedule.iter().enumerate() {
        let d = g.node(nid);
        for &v in d.inputs().iter().flatten().chain(d.captures()) {
            if let Some(t) = slot.get(v.index()).copied().flatten() {
                tensors[t].last = tensors[t].last.max(pos);
            }
        }
    }
    for &v in &g.outputs {
        if let Some(t) = slot.get(v.index()).copied().flatten() {
            tensors[t].last = end.max(tensors[t].first);
        }
    }
    // Storage, merging in place in schedule order.
    let mut storages: Vec<Storage> = Vec::new();
    let mut aliases: Vec<Alias> = Vec::new();
    let new_storage = |t: &mut LiveTensor, storages: &mut Vec<Storage>| {
        t.storage = storages.len();
        storages.push(Storage {
            size: t.size,
            first: t.first,
            last: t.last,
            pinned: t.kind != TensorKind::Intermediate,
        });
    };
    for t in tensors.iter_mut().filter(|t| t.kind == TensorKind::Input) {
        new_storage(t, &mut storages);
    }
    let mut donated = Vec::new();
    let mut donations_refused = Vec::new();
    // Output value index -> the input it is donated to.
    let mut donor: Vec<Option<ValueId>> = vec![None; nvals];
    for &(i, o) in donations {
        if let Some(d) = donor.get_mut(o.index()) {
            *d = Some(i);
        }
    }
    for (pos, &nid) in schedule.iter().enumerate() {
        let d = g.node(nid);
        let rule = inplace_rule_in(&d.domain, &d.op_type);
        for (k, &o) in d.outputs().iter().enumerate() {
            let Some(ot) = o.and_then(|o| slot[o.index()]) else {
                continue;
            };
            if tensors[ot].storage != usize::MAX {
                continue; // also a graph input: already placed
            }
            let mut host: Option<usize> = None;
            // A donated output: into its input's storage once the input is
            // dead, or in place at its last reader when that is this
            // elementwise node.
            let mut in_place_donation = false;
            let donated_to = o.and_then(|o| donor.get(o.index()).copied().flatten());
            if let (Some(iv), Some(ov)) = (donated_to, o) {
                let it = slot.get(iv.index()).copied().flatten();
                let why = match it {
                    None => Some("the input has no arena storage"),
                    Some(it) => {
                        let t = &tensors[it];
                        let s = &storages[t.storage];
                        // A read through a subgraph capture counts: the
                        // node reads it while it writes the output.
                        let reads_here = d
                            .inputs()
                            .iter()
                            .flatten()
                            .chain(d.captures())
                            .any(|&x| x == iv);
                        if t.size != tensors[ot].size {
                            Some("sizes differ")
                        } else if s.last > pos || t.last > pos {
                            Some("the input is read after the output is written")
                        } else if reads_here
                            && !(k == 0
                                && ((rule == InPlace::Elementwise && same_width(g, iv, ov))
                                    || over_host(d) == Some(iv)))
                        {
                            Some("the output's producer reads the input and cannot write in place")
                        } else {
                            in_place_donation = reads_here && t.last == pos;
                            host = Some(it);
                            None
                        }
                    }
                };
                match why {
                    None => donated.push((iv, ov)),
                    Some(w) => {
                        donations_refused.push(format!("{}:{}: {w}", g.name(iv), g.name(ov)))
                    }
                }
            }
            if let Some(it) = host {
                let st = tensors[it].storage;
                tensors[ot].storage = st;
                storages[st].last = storages[st].last.max(tensors[ot].last);
                if in_place_donation {
                    aliases.push(Alias {
                        input: it,
                        output: ot,
                        op_type: d.op_type.clone(),
                        at: pos as i64,
                    });
                }
                continue;
            }
            if k == 0 && rule == InPlace::View {
                host = d
                    .input(0)
                    .and_then(|i| slot[i.index()])
                    .filter(|&it| tensors[it].size >= tensors[ot].size);
            } else if k == 0 && rule == InPlace::Elementwise {
                host = d
                    .inputs()
                    .iter()
                    .flatten()
                    .filter_map(|i| slot[i.index()])
                    .find(|&it| {
                        dies_here(&tensors[it], &storages, tensors[ot].size, pos)
                            && !other_view_read(d, &slot, &tensors, it)
                            && same_width(g, tensors[it].value, tensors[ot].value)
                    });
            } else if k == 0 {
                // The rule's input only, and not when another slot reads it
                // too (the kernel would read values it is overwriting).
                host = over_host(d).and_then(|i| slot[i.index()]).filter(|&it| {
                    dies_here(&tensors[it], &storages, tensors[ot].size, pos)
                        && !other_view_read(d, &slot, &tensors, it)
                });
            }
            match host {
                Some(it) => {
                    let st = tensors[it].storage;
                    tensors[ot].storage = st;
                    storages[st].last = storages[st].last.max(tensors[ot].last);
                    storages[st].pinned |= tensors[ot].kind != TensorKind::Intermediate;
                    aliases.push(Alias {
                        input: it,
                        output: ot,
                        op_type: d.op_type.clone(),
                        at: pos as i64,
                    });
                }
                None => new_storage(&mut tensors[ot], &mut storages),
            }
        }
    }
    Ok(Liveness {
        donated,
        donations_refused,
        tensors,
        storages,
        aliases,
        weights_bytes,
        unknown,
    })
}

/// Whether another input slot of `d` reads tensor `it`'s storage through
/// another tensor (a view of it): the kernel would read what it writes.
fn other_view_read(
    d: &graphopt_ir::NodeData,
    slot: &[Option<usize>],
    tensors: &[LiveTensor],
    it: usize,
) -> bool {
    d.inputs()
        .iter()
        .flatten()
        .filter_map(|i| slot[i.index()])
        .any(|o| o != it && tensors[o].storage == tensors[it].storage)
}

/// The input a node's [`InPlace::Over`] rule lets its
/// output 0 overwrite: input `j` of `Over(j)`, when no other input slot
/// (nor a subgraph capture) reads the same value. The planner, the
/// executors' binding and `remat`'s simulator all ask this.
pub fn over_host(d: &graphopt_ir::NodeData) -> Option<ValueId> {
    let InPlace::Over(j) = inplace_rule_in(&d.domain, &d.op_type) else {
        return None;
    };
    let v = d.input(j)?;
    let shared = d
        .inputs()
        .iter()
        .enumerate()
        .any(|(i, x)| i != j && *x == Some(v))
        || d.captures().contains(&v);
    (!shared).then_some(v)
}

/// Whether `a` and `b` have elements of one width: then the same bytes
/// are the same elements, and an elementwise output over its input reads
/// each element where it writes it. (An int64 input broadcast to a float32
/// output of twice its elements has the output's bytes, not its elements.)
fn same_width(g: &Graph, a: ValueId, b: ValueId) -> bool {
    let bits = |v: ValueId| g.ty(v).and_then(|t| t.elem()).and_then(|d| d.bits());
    bits(a).is_some() && bits(a) == bits(b)
}

/// Whether tensor `t` may give its storage to a `size`-byte output of the
/// node at step `pos`: an intermediate storage (neither graph input nor
/// output) of that size whose tensor and storage both end there.
fn dies_here(t: &LiveTensor, storages: &[Storage], size: u64, pos: usize) -> bool {
    let s = &storages[t.storage];
    !s.pinned && t.size == size && s.last == pos && t.last == pos
}

/// The peak of live storage bytes at one step, and that step.
pub fn peak(storages: &[Storage], steps: usize) -> (u64, usize) {
    let mut delta = vec![0i128; steps + 2];
    for s in storages {
        delta[s.first] += s.size as i128;
        delta[s.last + 1] -= s.size as i128;
    }
    let (mut cur, mut best, mut at) = (0i128, 0i128, 0usize);
    for (i, d) in delta.iter().enumerate() {
        cur += d;
        if cur > best {
            best = cur;
            at = i;
        }
    }
    (best as u64, at)
}

/// Live storage bytes at every step `0..steps` (for plots).
pub fn live_bytes(storages: &[Storage], steps: usize) -> Vec<u64> {
    let mut delta = vec![0i128; steps + 2];
    for s in storages {
        delta[s.first.min(steps)] += s.size as i128;
        delta[(s.last + 1).min(steps + 1)] -= s.size as i128;
    }
    let mut cur = 0i128;
    delta[..steps]
        .iter()
        .map(|d| {
            cur += d;
            cur.max(0) as u64
        })
        .collect()
}
