//! The rematerialization problem of one training graph, and a fast
//! simulator of the peak memory of any drop set.
//!
//! [`Problem::new`] reads a graph whose value types are concrete (bind
//! dims and infer first) and whose program order is topological, and
//! splits its nodes into:
//! - **forward**: the nodes the first graph output (the loss) depends on,
//!   and every node placed before the last of them (the `Shape` nodes
//!   `graphopt grad` puts right after the value they read);
//! - **backward**: the rest.
//!
//! A **candidate** is a forward node that may be recomputed: default
//! domain, deterministic (no `Random*`, `Multinomial`, `Bernoulli`,
//! `Dropout`), no subgraphs, no graph output among its outputs, and at
//! least one output read by a backward node (a value the backward pass
//! saves). Recomputable forward nodes that the backward pass does not read
//! are *followers*: dropped in every drop set (see
//! [`Problem::followers`]).
//!
//! A **drop set** marks candidates. Each dropped node runs once more, as a
//! clone placed right before the first backward node that reads one of its
//! outputs (or before the first clone that does, for chains of dropped
//! nodes); backward readers read the clone, and the forward outputs die
//! after their last forward reader. [`Problem::simulate`] builds that
//! order and returns its peak of live bytes, counted as the planner's
//! liveness counts it (graph inputs from step 0, graph outputs to the end,
//! weights outside the arena, views sharing their input's storage,
//! elementwise outputs taking over a same-sized input that dies there,
//! Scatter outputs taking over their `data` input and Gemm outputs their
//! `C` likewise), as the
//! planner counts the same order.
//!
//! [`Problem::lower_bound`] bounds the simulated peak of every completion
//! of a partial drop set from below (what the exact solver prunes with).

use crate::remat::cost::node_flops;
use graphopt_ir::{Graph, NodeId, ValueId};
use graphopt_plan::inplace::{inplace_rule, InPlace};
use graphopt_plan::liveness::{over_host, value_size};

const INF: usize = usize::MAX;

const RANDOM: &[&str] = &[
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
];

#[derive(Clone, Debug)]
pub(crate) struct SNode {
    pub ins: Vec<usize>,
    pub outs: Vec<usize>,
    /// Output 0 is a view of input 0 (shares its storage).
    pub view: bool,
    /// Output 0 may take over a same-sized input's storage that dies here.
    pub elementwise: bool,
    /// Output 0 may take over one input's storage (kept first in `ins`) if
    /// same-sized and dying here: a Scatter's `data` or a Gemm's `C` that
    /// no other input slot reads (the planner's `Over` rule).
    pub update: bool,
    pub forward: bool,
    pub flops: u64,
    /// A hash of the op type (block detection).
    pub op: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct SVal {
    /// Arena bytes (0 for weights and values of unknown size).
    pub size: u64,
    pub producer: Option<usize>,
    pub output: bool,
    /// Reader positions (each reader once), ascending.
    pub readers: Vec<usize>,
}

/// A training graph seen by the solvers: nodes by position in the
/// original order, values densely numbered.
#[derive(Clone, Debug)]
pub struct Problem {
    pub order: Vec<NodeId>,
    pub(crate) nodes: Vec<SNode>,
    pub(crate) vals: Vec<SVal>,
    /// Candidate positions (the solvers' choices), in forward order.
    pub candidates: Vec<usize>,
    /// Recomputable forward nodes no backward node reads: always in the
    /// drop set ([`Problem::base_drop`]), so that a copy needing their
    /// outputs recomputes them instead of holding them from the forward
    /// pass (dropping them changes nothing when no copy needs them).
    pub followers: Vec<usize>,
    /// FLOPs of one execution of every node (the graph's cost).
    pub total_flops: u64,
}

/// What one simulated drop set costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Simulated {
    pub peak: u64,
    /// Live bytes summed over steps (memory × time): the tie-breaker of
    /// the greedy solver.
    pub area: u128,
    pub extra_flops: u64,
    pub clones: usize,
}

impl Problem {
    /// Reads `g` (concrete types, topological program order).
    pub fn new(g: &Graph) -> Problem {
        let order: Vec<NodeId> = g.order().to_vec();
        let cap = order.iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut pos_of = vec![INF; cap];
        for (i, n) in order.iter().enumerate() {
            pos_of[n.index()] = i;
        }
        // Forward: the cone of the loss, then everything placed before its
        // last node.
        let cone = super::loss_cone(g);
        let last_fwd = order
            .iter()
            .enumerate()
            .filter(|(_, n)| cone.contains(n))
            .map(|(i, _)| i)
            .max();
        let nv = g.values().map(|v| v.index() + 1).max().unwrap_or(0);
        let mut dense = vec![INF; nv];
        let mut vals: Vec<SVal> = Vec::new();
        let mut id = |v: ValueId, vals: &mut Vec<SVal>| -> usize {
            if dense[v.index()] == INF {
                dense[v.index()] = vals.len();
                let weight = g.initializer(v).is_some() && !g.is_input(v);
                vals.push(SVal {
                    size: if weight {
                        0
                    } else {
                        value_size(g, v).unwrap_or(0)
                    },
                    producer: None,
                    output: g.is_output(v),
                    readers: Vec::new(),
                });
            }
            dense[v.index()]
        };
        let mut nodes = Vec::with_capacity(order.len());
        let mut total_flops = 0u64;
        for (i, &n) in order.iter().enumerate() {
            let d = g.node(n);
            let mut ins: Vec<usize> = Vec::new();
            for &v in d.inputs().iter().flatten().chain(d.captures()) {
                let k = id(v, &mut vals);
                if !ins.contains(&k) {
                    ins.push(k);
                }
            }
            let outs: Vec<usize> = d
                .outputs()
                .iter()
                .flatten()
                .map(|&v| id(v, &mut vals))
                .collect();
            for &o in &outs {
                vals[o].producer = Some(i);
            }
            for &k in &ins {
                vals[k].readers.push(i);
            }
            let default = d.domain.is_empty() || d.domain == "ai.onnx";
            let flops = node_flops(g, n);
            total_flops = total_flops.saturating_add(flops);
            nodes.push(SNode {
                view: default && inplace_rule(&d.op_type) == InPlace::View && d.input(0).is_some(),
                elementwise: default && inplace_rule(&d.op_type) == InPlace::Elementwise,
                update: over_host(d).is_some(),
                forward: cone.contains(&n) || last_fwd.is_some_and(|l| i < l),
                ins,
                outs,
                flops,
                op: d.op_type.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                    (h ^ b as u64).wrapping_mul(0x100000001b3)
                }),
            });
        }
        // The view's and the update's host must be first.
        for (i, &n) in order.iter().enumerate() {
            let d = g.node(n);
            let host = if nodes[i].update {
                over_host(d)
            } else if nodes[i].view {
                d.input(0)
            } else {
                None
            };
            if let Some(h) = host {
                let v0 = dense[h.index()];
                let ins = &mut nodes[i].ins;
                if let Some(k) = ins.iter().position(|&x| x == v0) {
                    ins.swap(0, k);
                }
            }
        }
        let eligible = |i: usize| {
            let nd = &nodes[i];
            let d = g.node(order[i]);
            nd.forward
                && (d.domain.is_empty() || d.domain == "ai.onnx")
                && !RANDOM.contains(&d.op_type.as_str())
                && !d.has_subgraphs()
                && !nd.outs.is_empty()
                && nd.outs.iter().all(|&o| !vals[o].output)
        };
        let saved = |i: usize| {
            nodes[i]
                .outs
                .iter()
                .any(|&o| vals[o].readers.iter().any(|&r| !nodes[r].forward))
        };
        let candidates = (0..order.len())
            .filter(|&i| eligible(i) && saved(i))
            .collect();
        let followers = (0..order.len())
            .filter(|&i| eligible(i) && !saved(i))
            .collect();
        Problem {
            order,
            nodes,
            vals,
            candidates,
            followers,
            total_flops,
        }
    }

    /// Whether the graph has a backward part at all: a node outside the
    /// loss's cone that is placed after it. A one-output inference model
    /// has none (everything it computes is the "loss"'s cone), and then
    /// there is nothing to recompute for.
    pub fn has_backward(&self) -> bool {
        self.nodes.iter().any(|n| !n.forward)
    }

    /// The drop set every solver starts from: the followers.
    pub fn base_drop(&self) -> Vec<bool> {
        let mut d = vec![false; self.nodes.len()];
        for &f in &self.followers {
            d[f] = true;
        }
        d
    }

    /// Node count of the original order.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// FLOPs of node at position `i`.
    pub fn flops(&self, i: usize) -> u64 {
        self.nodes[i].flops
    }

    /// Bytes of node `i`'s outputs that the backward pass reads; for a
    /// view, the bytes of the storage it views (which it keeps alive).
    pub fn saved_bytes(&self, i: usize) -> u64 {
        let nd = &self.nodes[i];
        let read_back = nd
            .outs
            .iter()
            .any(|&o| self.vals[o].readers.iter().any(|&r| !self.nodes[r].forward));
        if nd.view {
            let mut k = nd.ins[0];
            while let Some(q) = self.vals[k].producer {
                if !self.nodes[q].view {
                    break;
                }
                k = self.nodes[q].ins[0];
            }
            return if read_back { self.vals[k].size } else { 0 };
        }
        nd.outs
            .iter()
            .filter(|&&o| self.vals[o].readers.iter().any(|&r| !self.nodes[r].forward))
            .map(|&o| self.vals[o].size)
            .sum()
    }

    /// Candidate `i` and the view candidates reading its outputs
    /// (transitively): what dropping `i` drops, so that no kept view holds
    /// a dropped node's storage.
    pub(crate) fn with_views(&self, i: usize, is_cand: &[bool]) -> Vec<usize> {
        let mut out = vec![i];
        let mut k = 0;
        while k < out.len() {
            let q = out[k];
            k += 1;
            for &o in &self.nodes[q].outs {
                for &r in &self.vals[o].readers {
                    if self.nodes[r].view
                        && is_cand[r]
                        && self.nodes[r].ins[0] == o
                        && !out.contains(&r)
                    {
                        out.push(r);
                    }
                }
            }
        }
        out
    }

    /// Where each dropped node's clone goes: the position of the backward
    /// node it is placed before (`INF`: no clone, nothing reads it later).
    pub(crate) fn anchors(&self, drop: &[bool]) -> Vec<usize> {
        let mut anchor = vec![INF; self.nodes.len()];
        for i in (0..self.nodes.len()).rev() {
            if !drop[i] {
                continue;
            }
            let mut a = INF;
            for &o in &self.nodes[i].outs {
                for &r in &self.vals[o].readers {
                    if !self.nodes[r].forward {
                        a = a.min(r);
                    } else if drop[r] {
                        a = a.min(anchor[r]);
                    }
                }
            }
            anchor[i] = a;
        }
        anchor
    }

    /// The order with clones: `(position, is_clone)` pairs.
    pub(crate) fn emit_order(&self, drop: &[bool], anchor: &[usize]) -> Vec<(usize, bool)> {
        let n = self.nodes.len();
        let mut before: Vec<Vec<usize>> = vec![Vec::new(); n];
        for i in 0..n {
            if drop[i] && anchor[i] != INF {
                before[anchor[i]].push(i);
            }
        }
        let mut out = Vec::with_capacity(n);
        for (q, copies) in before.iter().enumerate() {
            out.extend(copies.iter().map(|&c| (c, true)));
            out.push((q, false));
        }
        out
    }

    /// The simulated peak and extra FLOPs of drop set `drop` (indexed by
    /// position; only candidates may be set).
    pub fn simulate(&self, drop: &[bool]) -> Simulated {
        let anchor = self.anchors(drop);
        let seq = self.emit_order(drop, &anchor);
        let nv = self.vals.len();
        // Instances: value k (original) and nv + k (its clone).
        let mut first = vec![INF; 2 * nv];
        let mut last = vec![0usize; 2 * nv];
        let mut extra = 0u64;
        let mut clones = 0usize;
        for (k, v) in self.vals.iter().enumerate() {
            if v.producer.is_none() {
                first[k] = 0;
            }
        }
        let cloned = |k: usize| -> bool {
            self.vals[k]
                .producer
                .is_some_and(|p| drop[p] && anchor[p] != INF)
        };
        for (t, &(i, is_clone)) in seq.iter().enumerate() {
            let nd = &self.nodes[i];
            if is_clone {
                extra = extra.saturating_add(nd.flops);
                clones += 1;
            }
            let reads_clone = is_clone || !nd.forward;
            for &k in &nd.ins {
                let inst = if reads_clone && cloned(k) { nv + k } else { k };
                last[inst] = last[inst].max(t);
            }
            for &k in &nd.outs {
                let inst = if is_clone { nv + k } else { k };
                first[inst] = t;
                last[inst] = last[inst].max(t);
            }
        }
        let end = seq.len().saturating_sub(1);
        for (k, v) in self.vals.iter().enumerate() {
            if v.output && first[k] != INF {
                last[k] = end;
            }
        }
        // Storages, in emission order, as the planner's liveness merges
        // them: a view shares its input's storage; an elementwise output
        // takes over a same-sized input storage that dies at this step
        // (neither a graph input nor output).
        let mut root: Vec<usize> = (0..2 * nv).collect();
        let mut slast = last.clone();
        let pinned = |inst: usize| {
            let v = &self.vals[inst % nv];
            v.producer.is_none() || v.output
        };
        let mut spinned: Vec<bool> = (0..2 * nv).map(pinned).collect();
        for (t, &(i, is_clone)) in seq.iter().enumerate() {
            let nd = &self.nodes[i];
            let Some(&k0) = nd.outs.first() else {
                continue;
            };
            let size = self.vals[k0].size;
            if size == 0 || !(nd.view || nd.elementwise || nd.update) {
                continue;
            }
            let out = if is_clone { nv + k0 } else { k0 };
            let reads_clone = is_clone || !nd.forward;
            let inst_of = |k: usize| if reads_clone && cloned(k) { nv + k } else { k };
            let dies = |h: usize| {
                let r = root[h];
                self.vals[h % nv].size == size && !spinned[r] && slast[r] == t && last[h] == t
            };
            let host = if nd.view {
                let h = inst_of(nd.ins[0]);
                (self.vals[h % nv].size >= size).then_some(h)
            } else if nd.update {
                let h = inst_of(nd.ins[0]);
                dies(h).then_some(h)
            } else {
                nd.ins.iter().map(|&k| inst_of(k)).find(|&h| dies(h))
            };
            if let Some(h) = host {
                let r = root[h];
                root[out] = r;
                slast[r] = slast[r].max(last[out]);
                spinned[r] |= pinned(out);
            }
        }
        let mut delta = vec![0i128; seq.len() + 2];
        for inst in 0..2 * nv {
            if first[inst] == INF || root[inst] != inst {
                continue;
            }
            let size = self.vals[inst % nv].size as i128;
            if size == 0 {
                continue;
            }
            delta[first[inst]] += size;
            delta[slast[inst] + 1] -= size;
        }
        let (mut cur, mut peak, mut area) = (0i128, 0i128, 0u128);
        for d in delta {
            cur += d;
            peak = peak.max(cur);
            area += cur.max(0) as u128;
        }
        Simulated {
            peak: peak as u64,
            area,
            extra_flops: extra,
            clones,
        }
    }

    /// The exact solver's bound: see [`LowerBound`].
    pub(crate) fn lower_bound(&self) -> LowerBound {
        LowerBound::new(self)
    }
}

/// A lower bound on the simulated peak of every drop set that keeps the
/// candidates marked kept (the others free), on the original time axis:
/// 1. a value no candidate produces is live at least over its original
///    interval (recomputation only extends lifetimes);
/// 2. a candidate's output is live over its forward interval (producer to
///    last forward reader) whether dropped or not, and over its backward
///    interval (first to last backward reader) too: its clone runs before
///    the first backward reader;
/// 3. a kept candidate's output also covers the gap between the two.
///
/// Views count nothing of their own (their host only lives longer).
pub(crate) struct LowerBound {
    /// Live bytes per original step with every candidate dropped.
    pub base: Vec<i128>,
    /// Per candidate index: (gap start, gap end exclusive, bytes).
    pub gaps: Vec<Vec<(usize, usize, i128)>>,
}

impl LowerBound {
    fn new(p: &Problem) -> LowerBound {
        let n = p.nodes.len();
        let end = n.saturating_sub(1);
        let mut delta = vec![0i128; n + 2];
        let mut cand_of = vec![INF; n];
        for (c, &i) in p.candidates.iter().enumerate() {
            cand_of[i] = c;
        }
        let mut gaps = vec![Vec::new(); p.candidates.len()];
        for v in &p.vals {
            if v.size == 0 {
                continue;
            }
            if let Some(pr) = v.producer {
                if p.nodes[pr].view {
                    continue;
                }
            }
            let size = v.size as i128;
            // An elementwise or update output may share the storage of an
            // input that dies at its step: counted from the step after, so
            // that the bound never exceeds the simulator.
            let merges = |pr: usize| p.nodes[pr].elementwise || p.nodes[pr].update;
            if v.producer.is_some_and(merges) && v.readers.is_empty() && !v.output {
                continue; // live at its own step only
            }
            let f = match v.producer {
                Some(pr) if merges(pr) => (pr + 1).min(end),
                Some(pr) => pr,
                None => 0,
            };
            let l_all = if v.output {
                end
            } else {
                v.readers.iter().copied().max().unwrap_or(f).max(f)
            };
            let cand = v.producer.map(|pr| cand_of[pr]).unwrap_or(INF);
            if cand == INF {
                delta[f] += size;
                delta[l_all + 1] -= size;
                continue;
            }
            let fwd_last = v
                .readers
                .iter()
                .copied()
                .filter(|&r| p.nodes[r].forward)
                .max()
                .unwrap_or(f)
                .max(f);
            let bw: Vec<usize> = v
                .readers
                .iter()
                .copied()
                .filter(|&r| !p.nodes[r].forward)
                .collect();
            delta[f] += size;
            delta[fwd_last + 1] -= size;
            if let (Some(&b0), Some(&b1)) = (bw.iter().min(), bw.iter().max()) {
                delta[b0] += size;
                delta[b1 + 1] -= size;
                if b0 > fwd_last + 1 {
                    gaps[cand].push((fwd_last + 1, b0, size));
                }
            }
        }
        let mut base = Vec::with_capacity(n);
        let mut cur = 0i128;
        for d in delta.iter().take(n) {
            cur += d;
            base.push(cur);
        }
        LowerBound { base, gaps }
    }
}
