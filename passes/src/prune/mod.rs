//! `prune`: structured pruning that shrinks tensors for real.
//!
//! The [`groups`] finder collects the axes that share one index space of
//! channels, hidden units or attention heads. For each group this pass
//! ranks the units by importance (the L1 or L2 norm of every weight slice
//! the unit owns, summed over the group's weights, or a seeded random
//! order), removes the least important fraction, and writes a smaller
//! model: every weight of the group is sliced, the shape constants of its
//! Reshapes and the `group` of its depthwise Convs follow, and the
//! activations' declared shapes shrink. Units of a group are removed
//! together or not at all, so the result computes the same function as the
//! original with those channels gone; the output error comes from the
//! removed channels alone, and fine-tuning (`graphopt train`) recovers it.
//!
//! ```text
//! before (ratio 0.5)                        after
//! h = MatMul(x, w1)   w1: [32, 8]           h = MatMul(x, w1)   w1: [32, 4]
//! r = Relu(h)                               r = Relu(h)
//! y = MatMul(r, w2)   w2: [8, 4]            y = MatMul(r, w2)   w2: [4, 4]
//! ```
//!
//! The graph inputs and outputs keep their shapes; a group that reaches one
//! is left alone, as is any group the finder cannot prove safe, and the
//! report says why. `protect` names tensors whose dims stay.

pub mod groups;
pub mod sparsity;

use crate::remat::cost::graph_flops;
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{AttrValue, Attribute, Dim, Graph, Model, NodeId, Tensor, ValueId};
use groups::{Group, Groups, Place};
use std::collections::{BTreeMap, BTreeSet};

/// How much to prune.
#[derive(Clone, Debug, PartialEq)]
pub enum Amount {
    /// The fraction of each group's units removed, in `[0, 1)`.
    Ratio(f64),
    /// Parameters to keep: a fraction of the model's (`<= 1`) or a count.
    TargetParams(f64),
    /// FLOPs to keep (at the pass's dims): a fraction or a count.
    TargetFlops(f64),
    /// Unstructured: this fraction of every weight's elements set to zero
    /// (see [`sparsity`]).
    Sparsity(f64),
}

/// How units are ranked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Criterion {
    L1,
    L2,
    /// A seeded random order (a baseline).
    Random,
    /// First-order Taylor: `|w · dL/dw|` per element, summed over a
    /// unit's weight slices; the per-element scores come from
    /// [`Prune::taylor`] (gradients on calibration data).
    Taylor,
}

impl Criterion {
    pub fn parse(s: &str) -> Result<Criterion, PassError> {
        match s.trim() {
            "l1" => Ok(Criterion::L1),
            "l2" => Ok(Criterion::L2),
            "random" => Ok(Criterion::Random),
            "taylor" => Ok(Criterion::Taylor),
            o => Err(PassError(format!(
                "--criterion {o}: expected l1, l2, taylor or random"
            ))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Criterion::L1 => "l1",
            Criterion::L2 => "l2",
            Criterion::Random => "random",
            Criterion::Taylor => "taylor",
        }
    }
}

/// Which groups are pruned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    Channel,
    Head,
    All,
}

impl Granularity {
    pub fn parse(s: &str) -> Result<Granularity, PassError> {
        match s.trim() {
            "channel" => Ok(Granularity::Channel),
            "head" => Ok(Granularity::Head),
            "all" => Ok(Granularity::All),
            o => Err(PassError(format!(
                "--granularity {o}: expected channel, head or all"
            ))),
        }
    }
    fn takes(self, g: &Group) -> bool {
        match self {
            Granularity::All => true,
            Granularity::Channel => g.block == 1,
            Granularity::Head => g.block > 1,
        }
    }
}

/// The pass and its options (`ratio` R keeps at most `1 - R` of each
/// group's units, as Torch-Pruning does). `Prune` (the constant) is the registry's
/// configuration: half of every group's channels by L1 norm.
#[derive(Clone, Debug)]
pub struct Prune {
    pub amount: Amount,
    pub criterion: Criterion,
    pub granularity: Granularity,
    /// Rank units across groups (importance normalized by each group's
    /// mean) instead of the same ratio in every group; the ratio is then
    /// of all channels (a head counts its channels).
    pub global: bool,
    /// Channel counts stay multiples of this (where the group has that many).
    pub round_to: usize,
    /// Tensors whose dims stay.
    pub protect: Vec<String>,
    /// Symbolic dims for the static shapes the finder and the FLOP count
    /// need (unbound ones are 1).
    pub dims: Vec<(String, i64)>,
    pub seed: u64,
    /// `Criterion::Taylor`'s per-element scores `|w · dL/dw|`, by weight
    /// name (a weight without scores counts 0).
    pub taylor: BTreeMap<String, Vec<f64>>,
}

#[allow(non_upper_case_globals)]
pub const Prune: Prune = Prune {
    amount: Amount::Ratio(0.5),
    criterion: Criterion::L1,
    granularity: Granularity::All,
    global: false,
    round_to: 1,
    protect: Vec::new(),
    dims: Vec::new(),
    seed: 0,
    taylor: BTreeMap::new(),
};

impl Default for Prune {
    fn default() -> Self {
        Prune
    }
}

/// One group, and what was removed from it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PrunedGroup {
    /// The node whose output channels are the units.
    pub source: String,
    /// `channels` or `heads`.
    pub kind: &'static str,
    pub units: usize,
    /// Channels per unit.
    #[serde(rename = "channels_per_unit")]
    pub block: usize,
    pub removed: usize,
    /// The weights sliced (names).
    pub weights: Vec<String>,
    /// Tensor axes in the group, weights included.
    pub members: usize,
}

/// What one pruning did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PruneReport {
    pub criterion: String,
    /// The per-group ratio used (the one searched for a target).
    pub ratio: f64,
    pub groups: Vec<PrunedGroup>,
    /// Groups left alone: the node they start at, and why.
    pub left_alone: Vec<(String, String)>,
    pub params_before: u64,
    pub params_after: u64,
    /// At the dims (`None`: some op's cost is unknown there).
    pub flops_before: Option<u64>,
    pub flops_after: Option<u64>,
    /// Ratios tried by a target search.
    pub trials: usize,
    /// The symbolic dims shapes and FLOPs were taken at (unbound ones 1).
    pub dims: Vec<(String, i64)>,
    /// What `Amount::Sparsity` did.
    pub sparsity: Option<sparsity::SparsityReport>,
    pub warnings: Vec<String>,
}

impl PruneReport {
    pub fn stats(&self) -> PassStats {
        let mut s = PassStats::default();
        s.add(
            "groups_pruned",
            self.groups.iter().filter(|g| g.removed > 0).count() as u64,
        );
        s.add(
            "units_removed",
            self.groups.iter().map(|g| g.removed as u64).sum(),
        );
        s.add(
            "params_removed",
            self.params_before.saturating_sub(self.params_after),
        );
        s
    }
}

impl Pass for Prune {
    fn name(&self) -> &'static str {
        "prune"
    }
    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }
    fn run_in(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassStats, PassError> {
        // In a pipeline a model without groups is left as it is (with a
        // warning); `graphopt prune` refuses it (Prune::prune's error).
        let r = match self.prune_found(model)? {
            Ok(r) => r,
            Err(no_group) => {
                let mut s = PassStats::default();
                s.warn(no_group);
                return Ok(s);
            }
        };
        let mut s = r.stats();
        s.warnings = r.warnings;
        Ok(s)
    }
    fn exact(&self) -> bool {
        false
    }
}

/// See [`Prune::decide`].
pub struct Decision {
    pub model: Model,
    pub groups: Vec<Group>,
    /// Units removed from each group, ascending.
    pub removed: Vec<Vec<usize>>,
}

/// Everything a ratio needs, computed once.
struct Prepared {
    model: Model,
    /// FLOPs at the dims, from the shapes the finder used.
    flops: Option<u64>,
    groups: Vec<Group>,
    importance: Vec<Vec<f64>>,
    left_alone: Vec<(String, String)>,
}

impl Prune {
    /// Refuses options no pruning can follow, in one line.
    pub fn validate(&self) -> Result<(), PassError> {
        match self.amount {
            Amount::Ratio(r) if !(0.0..1.0).contains(&r) => {
                return Err(PassError(format!(
                    "--ratio {r}: expected a fraction in [0, 1)"
                )))
            }
            Amount::Sparsity(r) if !(0.0..1.0).contains(&r) => {
                return Err(PassError(format!(
                    "--sparsity {r}: expected a fraction in [0, 1)"
                )))
            }
            Amount::TargetParams(t) | Amount::TargetFlops(t) if !(t.is_finite() && t > 0.0) => {
                return Err(PassError(format!(
                    "target {t}: expected a positive fraction (<= 1) or count"
                )))
            }
            _ => {}
        }
        if self.criterion == Criterion::Taylor && self.taylor.is_empty() {
            return Err(PassError(
                "--criterion taylor needs --calibration: its gradients are taken on those inputs"
                    .into(),
            ));
        }
        if self.round_to == 0 {
            return Err(PassError("--round-to 0: expected a positive count".into()));
        }
        Ok(())
    }

    /// Prunes `model` in place. On error the model is unchanged; a model
    /// without a prunable group is an error that gives the first reasons.
    pub fn prune(&self, model: &mut Model) -> Result<PruneReport, PassError> {
        self.prune_found(model)?.map_err(PassError)
    }

    /// [`Prune::prune`], with a model without a prunable group apart (the
    /// inner error, its message), which a pipeline leaves as it is.
    fn prune_found(&self, model: &mut Model) -> Result<Result<PruneReport, String>, PassError> {
        self.validate()?;
        for p in &self.protect {
            if model.graph.value_by_name(p).is_none() {
                return Err(PassError(format!(
                    "--protect {p}: the model has no tensor named '{p}'"
                )));
            }
        }
        if let Amount::Sparsity(sp) = self.amount {
            return self.unstructured(model, sp).map(Ok);
        }
        let prep = match self.prepare(model)? {
            Ok(p) => p,
            Err(no_group) => return Ok(Err(no_group)),
        };
        // Counted on the prepared model: weights in Constant nodes are
        // initializers there, as they are in the output.
        let params_before = params(&prep.model.graph);
        let flops_before = prep.flops;
        let (ratio, trials) = self.ratio(&prep, params_before, flops_before)?;
        let (m, groups) = self.at_ratio(&prep, ratio)?;
        graphopt_ir::verify::verify_model(&m)
            .map_err(|e| PassError(format!("prune: the output is invalid IR: {e}")))?;
        let report = PruneReport {
            criterion: self.criterion.name().into(),
            ratio,
            groups,
            left_alone: prep.left_alone.clone(),
            params_before,
            params_after: params(&m.graph),
            flops_before,
            flops_after: self.flops(&m),
            trials,
            dims: self.bound_dims(&prep.model),
            sparsity: None,
            warnings: Vec::new(),
        };
        if report.groups.iter().any(|g| g.removed > 0) {
            *model = m;
        }
        Ok(Ok(report))
    }

    /// `Amount::Sparsity`: see [`sparsity`].
    fn unstructured(&self, model: &mut Model, sp: f64) -> Result<PruneReport, PassError> {
        let mut m = model.clone();
        constants_to_initializers(&mut m.graph);
        let params_before = params(&m.graph);
        let flops = self.flops(&m);
        let r = sparsity::sparsify(&mut m.graph, sp, &self.protect)?;
        graphopt_ir::verify::verify_model(&m)
            .map_err(|e| PassError(format!("prune: the output is invalid IR: {e}")))?;
        let report = PruneReport {
            criterion: "magnitude".into(),
            ratio: sp,
            params_before,
            params_after: params(&m.graph),
            flops_before: flops,
            flops_after: flops,
            dims: self.bound_dims(&m),
            sparsity: Some(r),
            warnings: vec![
                "unstructured sparsity saves file bytes only: runtimes load sparse initializers dense, and the FLOPs stay".into(),
            ],
            ..PruneReport::default()
        };
        *model = m;
        Ok(report)
    }

    /// What [`Prune::prune`] decides for `model`, without writing it: the
    /// model the groups index (Constant nodes made initializers, small
    /// shared constants copied per reader, shape chains owned per
    /// Reshape), the groups, and the units removed from each.
    pub fn decide(&self, model: &Model) -> Result<Decision, PassError> {
        self.validate()?;
        if matches!(self.amount, Amount::Sparsity(_)) {
            return Err(PassError(
                "decide: unstructured sparsity removes no unit".into(),
            ));
        }
        let prep = self.prepare(model)?.map_err(PassError)?;
        let (ratio, _) = self.ratio(&prep, params(&prep.model.graph), prep.flops)?;
        let removed = self.choose(&prep, ratio);
        Ok(Decision {
            model: prep.model,
            groups: prep.groups,
            removed,
        })
    }

    /// The ratio the amount asks for (searched for a target), and the
    /// trials it took.
    fn ratio(
        &self,
        prep: &Prepared,
        params_before: u64,
        flops_before: Option<u64>,
    ) -> Result<(f64, usize), PassError> {
        match self.amount {
            Amount::Ratio(r) | Amount::Sparsity(r) => Ok((r, 0)),
            Amount::TargetParams(t) => {
                let target = if t <= 1.0 {
                    t * params_before as f64
                } else {
                    t
                };
                self.search(prep, target, "parameters", |m| Some(params(&m.graph)))
            }
            Amount::TargetFlops(t) => {
                let Some(fb) = flops_before else {
                    return Err(PassError(
                        "--target-flops: the model's FLOPs are not known at these dims (bind its dims with --dim)".into(),
                    ));
                };
                let target = if t <= 1.0 { t * fb as f64 } else { t };
                self.search(prep, target, "FLOPs", |m| self.flops(m))
            }
        }
    }

    /// The groups of `model` (after Constant nodes become initializers and
    /// small constants read by several nodes are copied per reader) and
    /// their units' importance.
    /// `Ok(Err(reasons))` when no group can be pruned.
    fn prepare(&self, model: &Model) -> Result<Result<Prepared, String>, PassError> {
        let mut m = model.clone();
        constants_to_initializers(&mut m.graph);
        fold_shape_constants(&mut m);
        unshare_small(&mut m.graph);
        own_shape_chains(&mut m.graph)?;
        let shapes = self.shapes(&m);
        let flops = flops_of(&shapes);
        let Groups { groups, left_alone } = groups::find(&m, &shapes.graph);
        let label = |n: NodeId| node_label(&m.graph, n);
        let mut left: Vec<(String, String)> = left_alone
            .iter()
            .map(|l| (label(l.source), l.reason.clone()))
            .collect();
        let mut kept = Vec::new();
        for grp in groups {
            let protected = grp.members.keys().find(|p| {
                self.protect
                    .iter()
                    .any(|name| m.graph.name(p.value) == name.as_str())
            });
            if let Some(p) = protected {
                left.push((
                    label(grp.source),
                    format!("protected: '{}'", m.graph.name(p.value)),
                ));
            } else if !self.granularity.takes(&grp) {
                left.push((
                    label(grp.source),
                    format!("{} group, not in --granularity", grp.kind()),
                ));
            } else {
                kept.push(grp);
            }
        }
        if kept.is_empty() {
            let why: Vec<String> = left
                .iter()
                .take(3)
                .map(|(s, r)| format!("{s}: {r}"))
                .collect();
            return Ok(Err(format!(
                "no prunable group in the model{}",
                if why.is_empty() {
                    " (no Conv, Gemm or MatMul with a constant weight)".to_string()
                } else {
                    format!(
                        " ({}{})",
                        why.join("; "),
                        if left.len() > 3 { "; ..." } else { "" }
                    )
                }
            )));
        }
        let importance = kept
            .iter()
            .enumerate()
            .map(|(i, grp)| self.importance(&m.graph, grp, i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Ok(Prepared {
            model: m,
            flops,
            groups: kept,
            importance,
            left_alone: left,
        }))
    }

    /// The dims shapes are taken at: the given ones, every other symbolic
    /// input dim 1.
    pub fn bound_dims(&self, m: &Model) -> Vec<(String, i64)> {
        let mut dims = self.dims.clone();
        for name in graphopt_plan::input_dim_names(m) {
            if !dims.iter().any(|d| d.0 == name) {
                dims.push((name, 1));
            }
        }
        dims
    }

    /// The model with its symbolic dims bound and shapes inferred.
    fn shapes(&self, m: &Model) -> Model {
        let mut s = m.clone();
        let dims = self.bound_dims(m);
        infer_model(
            &mut s,
            &InferOptions {
                dims,
                input_defaults: false,
            },
        );
        s
    }

    fn flops(&self, m: &Model) -> Option<u64> {
        flops_of(&self.shapes(m))
    }

    /// The importance of each unit of `grp`.
    fn importance(&self, g: &Graph, grp: &Group, index: usize) -> Result<Vec<f64>, PassError> {
        let mut imp = vec![0.0f64; grp.units];
        if self.criterion == Criterion::Random {
            let mut x = self.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for v in imp.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = (x >> 11) as f64;
            }
            return Ok(imp);
        }
        for p in &grp.weights {
            // BatchNorm's running statistics are not parameters.
            let stats = g.uses(p.value).iter().all(|u| {
                matches!(*u, graphopt_ir::Use::Input { node, slot: 3 | 4 }
                    if g.node(node).op_type == "BatchNormalization")
            });
            if stats {
                continue;
            }
            let t = g.initializer(p.value).expect("a weight member");
            if !t.dtype.is_float() {
                continue;
            }
            let vals = if self.criterion == Criterion::Taylor {
                match self.taylor.get(g.name(p.value)) {
                    Some(v) if v.len() as u64 == t.numel().unwrap_or(0) => v.clone(),
                    _ => continue,
                }
            } else {
                let Some(v) = t.to_f64_vec() else { continue };
                v
            };
            let d: Vec<usize> = t.dims.iter().map(|&x| x as usize).collect();
            let len = d[p.axis];
            let inner: usize = d[p.axis + 1..].iter().product();
            let outer: usize = d[..p.axis].iter().product();
            let span = grp.members[p];
            let mut per_pos = vec![0.0f64; len];
            for o in 0..outer {
                for (pos, acc) in per_pos.iter_mut().enumerate() {
                    let base = (o * len + pos) * inner;
                    for &x in &vals[base..base + inner] {
                        *acc += match self.criterion {
                            Criterion::L2 => x * x,
                            _ => x.abs(),
                        };
                    }
                }
            }
            for (u, v) in imp.iter_mut().enumerate() {
                *v += span.positions(u).map(|q| per_pos[q]).sum::<f64>();
            }
        }
        Ok(imp)
    }

    /// Units removed from each group at `ratio`.
    fn choose(&self, prep: &Prepared, ratio: f64) -> Vec<Vec<usize>> {
        let keep_count = |grp: &Group, removed: usize| -> usize {
            let mut k = (grp.units - removed.min(grp.units - 1)).max(1);
            while k < grp.units && !(k * grp.block).is_multiple_of(self.round_to) {
                k += 1;
            }
            k
        };
        let lowest = |imp: &[f64], n: usize| -> Vec<usize> {
            let mut idx: Vec<usize> = (0..imp.len()).collect();
            idx.sort_by(|&a, &b| imp[a].total_cmp(&imp[b]).then(a.cmp(&b)));
            let mut r: Vec<usize> = idx.into_iter().take(n).collect();
            r.sort_unstable();
            r
        };
        if !self.global {
            return prep
                .groups
                .iter()
                .zip(&prep.importance)
                .map(|(grp, imp)| {
                    let n = removed_at_ratio(grp.units, ratio);
                    lowest(imp, grp.units - keep_count(grp, n))
                })
                .collect();
        }
        // Global: every unit ranked by its importance over its group's mean.
        let mut all: Vec<(f64, usize, usize)> = Vec::new();
        for (gi, imp) in prep.importance.iter().enumerate() {
            let mean = imp.iter().sum::<f64>() / imp.len().max(1) as f64;
            for (u, &v) in imp.iter().enumerate() {
                all.push((if mean > 0.0 { v / mean } else { 1.0 }, gi, u));
            }
        }
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        // The ratio is of channels: a head of 64 weighs 64.
        let g = &prep.model.graph;
        let width: Vec<usize> = prep
            .groups
            .iter()
            .map(|grp| {
                let out = g.node(grp.source).output(0);
                grp.members
                    .iter()
                    .find(|(p, _)| Some(p.value) == out)
                    .map(|(_, s)| s.block * s.repeat)
                    .unwrap_or(grp.block)
            })
            .collect();
        let total: usize = prep
            .groups
            .iter()
            .zip(&width)
            .map(|(grp, w)| grp.units * w)
            .sum();
        let budget = removed_at_ratio(total, ratio);
        let mut count = vec![0usize; prep.groups.len()];
        let mut taken = 0;
        for &(_, gi, _) in &all {
            if taken + width[gi] > budget {
                continue;
            }
            taken += width[gi];
            count[gi] += 1;
        }
        prep.groups
            .iter()
            .zip(&prep.importance)
            .zip(count)
            .map(|((grp, imp), c)| lowest(imp, grp.units - keep_count(grp, c)))
            .collect()
    }

    /// The smallest ratio whose model meets `target` of `what`.
    fn search(
        &self,
        prep: &Prepared,
        target: f64,
        what: &str,
        measure: impl Fn(&Model) -> Option<u64>,
    ) -> Result<(f64, usize), PassError> {
        let at = |r: f64| -> Result<f64, PassError> {
            let (m, _) = self.at_ratio(prep, r)?;
            measure(&m)
                .map(|x| x as f64)
                .ok_or_else(|| PassError(format!("the model's {what} are not known")))
        };
        let mut trials = 1;
        let top = 0.99;
        let least = at(top)?;
        if least > target {
            return Err(PassError(format!(
                "no ratio meets the target of {target:.0} {what}: at ratio {top} the model keeps {least:.0} (what no group can prune stays)"
            )));
        }
        let (mut lo, mut hi) = (0.0f64, top);
        if at(0.0)? <= target {
            return Ok((0.0, trials + 1));
        }
        trials += 1;
        for _ in 0..14 {
            let mid = 0.5 * (lo + hi);
            trials += 1;
            if at(mid)? <= target {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Ok((hi, trials))
    }

    /// The pruned model at `ratio`.
    fn at_ratio(
        &self,
        prep: &Prepared,
        ratio: f64,
    ) -> Result<(Model, Vec<PrunedGroup>), PassError> {
        let removed = self.choose(prep, ratio);
        let mut m = prep.model.clone();
        apply(&mut m.graph, &prep.groups, &removed)?;
        let g = &prep.model.graph;
        let report = prep
            .groups
            .iter()
            .zip(&removed)
            .map(|(grp, r)| PrunedGroup {
                source: node_label(g, grp.source),
                kind: grp.kind(),
                units: grp.units,
                block: grp.block,
                removed: r.len(),
                weights: grp
                    .weights
                    .iter()
                    .map(|p| g.name(p.value).to_string())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                members: grp.members.len(),
            })
            .collect();
        Ok((m, report))
    }
}

/// Units removed from `units` at `ratio`: at most `1 - ratio` of them
/// stay (Torch-Pruning's convention, so that the two tools agree at the
/// same ratio: 64 channels at 0.3 keep 44, 12 heads keep 8).
fn removed_at_ratio(units: usize, ratio: f64) -> usize {
    units - ((units as f64 * (1.0 - ratio) + 1e-9).floor() as usize).min(units)
}

/// FLOPs of a model whose shapes are inferred (`None` when a compute op's
/// output shape is not known).
fn flops_of(s: &Model) -> Option<u64> {
    let g = &s.graph;
    // Unknown when a compute op's output shape is.
    let known = g.nodes().all(|n| {
        let d = g.node(n);
        !matches!(
            d.op_type.as_str(),
            "Conv" | "MatMul" | "Gemm" | "ConvTranspose"
        ) || d
            .output(0)
            .and_then(|o| g.ty(o))
            .and_then(|t| t.shape())
            .is_some_and(|s| s.as_known().is_some())
    });
    known.then(|| graph_flops(g))
}

fn node_label(g: &Graph, n: NodeId) -> String {
    let d = g.node(n);
    if d.name.is_empty() {
        format!("{} {}", d.op_type, n)
    } else {
        format!("{} '{}'", d.op_type, d.name)
    }
}

/// Elements of every float initializer, sparse ones counted dense (their
/// zeros are parameters still).
pub fn params(g: &Graph) -> u64 {
    let dense: u64 = g
        .initializers()
        .iter()
        .filter_map(|&v| g.initializer(v))
        .filter(|t| t.dtype.is_float())
        .map(|t| t.numel().unwrap_or(0))
        .sum();
    let sparse: u64 = g
        .sparse_initializers()
        .iter()
        .filter_map(|&v| g.sparse_initializer(v))
        .filter(|s| s.values.dtype.is_float())
        .map(|s| graphopt_ir::numel(&s.dims).unwrap_or(0))
        .sum();
    dense + sparse
}

/// Constant nodes become initializers, so that weights and shape
/// constants are one kind of thing.
fn constants_to_initializers(g: &mut Graph) {
    let found: Vec<(NodeId, Tensor)> = g
        .nodes()
        .filter_map(|n| {
            let d = g.node(n);
            if d.op_type != "Constant" || !(d.domain.is_empty() || d.domain == "ai.onnx") {
                return None;
            }
            let v = d.output(0)?;
            if g.is_output(v) {
                return None;
            }
            let t = crate::fold_constants::consteval::constant_value(d)
                .ok()
                .flatten()?;
            Some((n, t))
        })
        .collect();
    for (n, t) in found {
        crate::fold_constants::replace_by_constants(g, n, vec![t]);
    }
    // An Identity of a weight: exporters write one where two parameters
    // are equal. A vector (a bias, a norm's scale: equal when freshly
    // initialized) becomes its own copy, so that each layer prunes its
    // own; a matrix stays one weight read twice (a tie: both reads must
    // then fall in one group).
    let ids: Vec<(NodeId, ValueId, ValueId, Tensor)> = g
        .nodes()
        .filter_map(|n| {
            let d = g.node(n);
            if d.op_type != "Identity" || g.is_output(d.output(0)?) {
                return None;
            }
            let x = d.input(0)?;
            Some((n, x, d.output(0)?, g.constant(x)?.clone()))
        })
        .collect();
    for (n, x, y, t) in ids {
        if t.dims.len() <= 1 {
            crate::fold_constants::replace_by_constants(g, n, vec![t]);
        } else if g.replace_all_uses(y, x).is_ok() {
            g.remove_node(n);
            if g.uses(y).is_empty() {
                g.remove_value(y);
            }
        }
    }
}

/// Shapes built from constants only (the TorchScript exporter's
/// `Where(Equal(shape, -1), 1, shape)` for an Expand) become constants the
/// walk can read and rewrite. Only integer and boolean arithmetic is
/// folded, small: a float weight stays what it is (a Transpose of a tied
/// embedding is not copied).
fn fold_shape_constants(m: &mut Model) {
    let Some(opset) = m.onnx_opset() else {
        return;
    };
    let g = &mut m.graph;
    let order: Vec<NodeId> = g.nodes().collect();
    for n in order {
        if !g.is_live_node(n) {
            continue;
        }
        let d = g.node(n);
        if d.op_type == "Constant" || d.outputs().iter().flatten().any(|&o| g.is_output(o)) {
            continue;
        }
        let ins: Vec<Option<&Tensor>> = d
            .inputs()
            .iter()
            .map(|v| v.and_then(|v| g.constant(v)))
            .collect();
        let all_const = d
            .inputs()
            .iter()
            .zip(&ins)
            .all(|(v, t)| v.is_none() || t.is_some());
        if !all_const || ins.iter().flatten().any(|t| t.dtype.is_float()) || d.inputs().is_empty() {
            continue;
        }
        if let Ok(outs) = crate::fold_constants::consteval::eval(d, &ins, opset, 1024) {
            if outs.iter().all(|t| !t.dtype.is_float()) {
                crate::fold_constants::replace_by_constants(g, n, outs);
            }
        }
    }
}

/// A constant of rank 0 or 1 read by several nodes (a BatchNorm's zeros,
/// shared by deduplication) gets a copy per reader, so that groups slice
/// their own.
fn unshare_small(g: &mut Graph) {
    let shared: Vec<ValueId> = g
        .initializers()
        .iter()
        .copied()
        .filter(|&v| {
            !g.is_input(v)
                && g.initializer(v)
                    .is_some_and(|t| t.dims.len() <= 1 && t.dtype.is_float())
                && g.uses(v)
                    .iter()
                    .map(|u| u.node())
                    .collect::<BTreeSet<_>>()
                    .len()
                    > 1
        })
        .collect();
    for v in shared {
        let t = g.initializer(v).expect("an initializer").clone();
        let uses: Vec<_> = g.uses(v).to_vec();
        let first = uses[0].node();
        for u in uses {
            if let graphopt_ir::Use::Input { node, slot } = u {
                if node != first {
                    let name = g.name(v).to_string();
                    let c = g.add_initializer(&name, t.clone());
                    g.set_input(node, slot as usize, Some(c));
                }
            }
        }
    }
}

/// Every Reshape gets its own copy of the Concat/Unsqueeze chain that
/// builds its shape at run time (exporters share one between the query,
/// key and value of a layer, and across layers), so that a group rewrites
/// its own sizes only.
fn own_shape_chains(g: &mut Graph) -> Result<(), PassError> {
    let reshapes: Vec<NodeId> = g
        .nodes()
        .filter(|&n| g.node(n).op_type == "Reshape" && g.node(n).inputs().len() > 1)
        .collect();
    for n in reshapes {
        own_input(g, n, 1, 0)?;
    }
    Ok(())
}

fn own_input(g: &mut Graph, reader: NodeId, slot: usize, depth: usize) -> Result<(), PassError> {
    let Some(v) = g.node(reader).input(slot) else {
        return Ok(());
    };
    if depth > 4 || g.initializer(v).is_some() {
        return Ok(());
    }
    let Some((p, _)) = g.producer(v) else {
        return Ok(());
    };
    let d = g.node(p).clone();
    if !matches!(
        d.op_type.as_str(),
        "Concat" | "Unsqueeze" | "Cast" | "Identity"
    ) || d.outputs().len() != 1
    {
        return Ok(());
    }
    let mut p = p;
    if g.uses(v).len() > 1 {
        let ty = g.ty(v).cloned();
        let name = g.name(v).to_string();
        let out = g.fresh_value(&name, ty);
        let ins: Vec<ValueId> = d.inputs().iter().flatten().copied().collect();
        if ins.len() != d.inputs().len() {
            return Ok(());
        }
        let mut new = graphopt_ir::NewNode::new(d.op_type.clone())
            .domain(d.domain.clone())
            .inputs(&ins)
            .outputs(&[out]);
        new.attributes = d.attributes.clone();
        p = g.insert_node_before(reader, new)?;
        g.set_input(reader, slot, Some(out));
    }
    for k in 0..g.node(p).inputs().len() {
        own_input(g, p, k, depth + 1)?;
    }
    Ok(())
}

/// Removes `removed[i]` units of `groups[i]` from `g`.
fn apply(g: &mut Graph, groups: &[Group], removed: &[Vec<usize>]) -> Result<(), PassError> {
    let mut cut: BTreeMap<Place, BTreeSet<usize>> = BTreeMap::new();
    for (grp, rm) in groups.iter().zip(removed) {
        if rm.is_empty() {
            continue;
        }
        for (p, span) in &grp.members {
            let e = cut.entry(*p).or_default();
            for &u in rm {
                e.extend(span.positions(u));
            }
        }
    }
    for (p, pos) in &cut {
        if let Some(t) = g.initializer(p.value) {
            let t = slice(t, p.axis, pos)
                .map_err(|e| PassError(format!("prune: weight '{}': {e}", g.name(p.value))))?;
            g.set_initializer(p.value, t);
        }
        let d = g.value_mut(p.value);
        if let Some(s) =
            d.ty.as_mut()
                .and_then(|t| t.as_tensor_mut())
                .and_then(|t| t.shape.as_mut())
        {
            if let Some(Dim::Known(k)) = s.dims.get_mut(p.axis) {
                *k -= pos.len() as i64;
            }
        }
    }
    let removed_at = |v: ValueId, axis: usize| -> i64 {
        cut.get(&Place { value: v, axis })
            .map(|s| s.len() as i64)
            .unwrap_or(0)
    };
    let mut literals: Vec<groups::Literal> = Vec::new();
    let mut depthwise: BTreeSet<NodeId> = BTreeSet::new();
    for (grp, rm) in groups.iter().zip(removed) {
        if !rm.is_empty() {
            literals.extend(grp.literals.iter().copied());
            depthwise.extend(grp.depthwise.iter().copied());
        }
    }
    // One rewrite per Reshape axis; a constant several readers share and
    // change alike stays one constant.
    literals.sort_by_key(|l| (l.reshape, l.axis));
    literals.dedup_by_key(|l| (l.reshape, l.axis));
    let mut rewritten: BTreeMap<(ValueId, Vec<i64>), ValueId> = BTreeMap::new();
    for l in literals {
        let out = g.node(l.reshape).output(0).expect("a Reshape output");
        let r = removed_at(out, l.axis);
        if r == 0 {
            continue;
        }
        let cur = g
            .node(l.reader)
            .input(l.slot)
            .expect("the literal's reader");
        let t = g.initializer(cur).ok_or_else(|| {
            PassError(format!(
                "prune: {}: its shape is no longer a constant",
                node_label(g, l.reshape)
            ))
        })?;
        let mut vals = t.to_i64_vec().unwrap_or_default();
        let dims = t.dims.clone();
        let dtype = t.dtype;
        let Some(x) = vals.get_mut(l.index) else {
            continue;
        };
        *x -= r;
        let c = match rewritten.get(&(cur, vals.clone())) {
            Some(&c) => c,
            None => {
                let mut t = Tensor::from_i64(dims, &vals)?;
                if dtype == graphopt_ir::DType::I32 {
                    let raw: Vec<u8> = vals
                        .iter()
                        .flat_map(|&v| (v as i32).to_le_bytes())
                        .collect();
                    t = Tensor::from_raw(dtype, t.dims.clone(), raw.into())?;
                }
                let hint = g.name(cur).to_string();
                let c = g.add_initializer(&hint, t);
                rewritten.insert((cur, vals), c);
                c
            }
        };
        g.set_input(l.reader, l.slot, Some(c));
        if g.uses(cur).is_empty() && !g.is_output(cur) {
            g.remove_value(cur);
        }
    }
    // Split sizes along a pruned axis.
    let mut splits: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (grp, rm) in groups.iter().zip(removed) {
        if !rm.is_empty() {
            splits.extend(grp.splits.iter().map(|(&n, &a)| (n, a)));
        }
    }
    for (n, axis) in splits {
        let d = g.node(n).clone();
        let new_sizes = |old: &[i64]| -> Vec<i64> {
            old.iter()
                .zip(d.outputs())
                .map(|(&l, o)| l - o.map(|o| removed_at(o, axis)).unwrap_or(0))
                .collect()
        };
        if let Some(sv) = d.input(1) {
            let old = g
                .initializer(sv)
                .and_then(|t| t.to_i64_vec())
                .ok_or_else(|| {
                    PassError(format!(
                        "prune: {}: its sizes are not a constant",
                        node_label(g, n)
                    ))
                })?;
            let new = new_sizes(&old);
            if new != old {
                let t = Tensor::from_i64(vec![new.len() as i64], &new)?;
                let hint = g.name(sv).to_string();
                let c = g.add_initializer(&hint, t);
                g.set_input(n, 1, Some(c));
                if g.uses(sv).is_empty() && !g.is_output(sv) {
                    g.remove_value(sv);
                }
            }
        } else if let Some(old) = d.attr_ints("split").map(|a| a.to_vec()) {
            let new = new_sizes(&old);
            let attrs = &mut g.node_mut(n).attributes;
            attrs.retain(|a| a.name != "split");
            attrs.push(Attribute::new("split", AttrValue::Ints(new)));
        }
    }
    // Identity Gathers: indices 0..n-1 again, over the channels left.
    let mut gathers: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (grp, rm) in groups.iter().zip(removed) {
        if !rm.is_empty() {
            gathers.extend(grp.gathers.iter().map(|(&n, &a)| (n, a)));
        }
    }
    for (n, axis) in gathers {
        let d = g.node(n).clone();
        let (Some(out), Some(iv)) = (d.output(0), d.input(1)) else {
            continue;
        };
        let r = removed_at(out, axis);
        let Some(t) = g.initializer(iv).cloned() else {
            continue;
        };
        let Some(k) = t.dims.iter().position(|&x| x > 1) else {
            continue;
        };
        let len = t.dims[k] - r;
        let mut dims = t.dims.clone();
        dims[k] = len;
        let vals: Vec<i64> = (0..len).collect();
        let mut nt = Tensor::from_i64(dims, &vals)?;
        if t.dtype == graphopt_ir::DType::I32 {
            let raw: Vec<u8> = vals
                .iter()
                .flat_map(|&v| (v as i32).to_le_bytes())
                .collect();
            nt = Tensor::from_raw(t.dtype, nt.dims.clone(), raw.into())?;
        }
        let hint = g.name(iv).to_string();
        let c = g.add_initializer(&hint, nt);
        g.set_input(n, 1, Some(c));
        if g.uses(iv).is_empty() && !g.is_output(iv) {
            g.remove_value(iv);
        }
    }
    for n in depthwise {
        let x = g.node(n).input(0).expect("depthwise input");
        let r = removed_at(x, 1);
        let old = g.node(n).attr_int("group").unwrap_or(1);
        let attrs = &mut g.node_mut(n).attributes;
        attrs.retain(|a| a.name != "group");
        attrs.push(Attribute::new("group", AttrValue::Int(old - r)));
    }
    Ok(())
}

/// `t` without positions `pos` on `axis`.
fn slice(t: &Tensor, axis: usize, pos: &BTreeSet<usize>) -> Result<Tensor, String> {
    let bits = t
        .dtype
        .bits()
        .filter(|b| b % 8 == 0)
        .ok_or_else(|| format!("{} elements are packed below a byte", t.dtype.name()))?;
    let es = (bits / 8) as usize;
    let raw = t.raw().ok_or("not a numeric tensor")?;
    let d: Vec<usize> = t.dims.iter().map(|&x| x as usize).collect();
    let len = d[axis];
    let inner: usize = d[axis + 1..].iter().product::<usize>() * es;
    let outer: usize = d[..axis].iter().product();
    let keep: Vec<usize> = (0..len).filter(|p| !pos.contains(p)).collect();
    let mut out = Vec::with_capacity(outer * keep.len() * inner);
    for o in 0..outer {
        for &p in &keep {
            let b = (o * len + p) * inner;
            out.extend_from_slice(&raw[b..b + inner]);
        }
    }
    let mut dims = t.dims.clone();
    dims[axis] = keep.len() as i64;
    let mut n = Tensor::from_raw(t.dtype, dims, out.into()).map_err(|e| e.0)?;
    n.name = t.name.clone();
    n.doc_string = t.doc_string.clone();
    n.metadata_props = t.metadata_props.clone();
    Ok(n)
}

#[cfg(test)]
mod tests;
