//! The pictures of `graphopt remat --svg`: [`remat_svg`] (a rewrite: live
//! memory per schedule step before and after, with the budget) and
//! [`remat_sweep_svg`] (a sweep: every strategy's frontier of peak memory
//! against extra FLOPs with the chosen point marked, above the timelines of
//! store-all and of that point). Drawn with the chart helper that
//! `plan --svg` uses ([`graphopt_plan::svg::chart`]).

use crate::remat::{ChoiceReason, RematReport, RematSweep};
use graphopt_plan::human_bytes;
use graphopt_plan::svg::chart::{Axis, Plot, Series, Svg, Unit};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const PLOT_W: f64 = WIDTH - LEFT - 20.0;
const BUDGET: &str = "#b8860b";
const STORE_ALL: &str = "#555";
const FLOOR: &str = "#7f7f7f";

/// (step, bytes) points of a per-step timeline.
fn steps(v: &[u64]) -> Vec<(f64, f64)> {
    v.iter()
        .enumerate()
        .map(|(i, &b)| (i as f64, b as f64))
        .collect()
}

/// A plot of timelines (a step line each) with an optional budget line.
fn timelines(
    svg: &mut Svg,
    y: f64,
    h: f64,
    lines: &[(&Series, &[u64])],
    budget: Option<u64>,
) -> Plot {
    let t_max = lines.iter().map(|l| l.1.len()).max().unwrap_or(1).max(1);
    let y_max = lines
        .iter()
        .flat_map(|l| l.1.iter().copied())
        .chain(budget)
        .max()
        .unwrap_or(1)
        .max(1);
    let p = Plot::new(
        LEFT,
        y,
        PLOT_W,
        h,
        &Axis::new("schedule step", Unit::Count, 0.0, t_max as f64),
        &Axis::new("live memory", Unit::Bytes, 0.0, y_max as f64),
    );
    p.axes(svg);
    if let Some(b) = budget {
        p.hline(
            svg,
            b as f64,
            BUDGET,
            &format!("budget {}", human_bytes(b)),
            true,
        );
    }
    for (i, (s, v)) in lines.iter().enumerate() {
        p.steps(svg, &steps(v), s, i, lines.len());
    }
    p
}

/// The picture of a rewrite: live memory per schedule step before and
/// after, the budget dashed, the figures in the caption.
pub fn remat_svg(title: &str, r: &RematReport) -> String {
    let mut svg = Svg::new(WIDTH, 480.0);
    svg.title(
        LEFT,
        24.0,
        &format!("Live memory before and after remat: {title}"),
    );
    let extra =
        100.0 * r.flops_after.saturating_sub(r.flops_before) as f64 / r.flops_before.max(1) as f64;
    svg.caption(
        LEFT,
        44.0,
        &format!(
            "strategy {}{}: lower bound {} -> {} (budget {}), arena {} -> {}, FLOPs +{extra:.2}%, {} nodes recomputed",
            r.strategy,
            if r.proven_optimal { " (proven optimal)" } else { "" },
            human_bytes(r.lower_bound_before_bytes),
            human_bytes(r.lower_bound_after_bytes),
            human_bytes(r.budget_bytes),
            human_bytes(r.arena_before_bytes),
            human_bytes(r.arena_after_bytes),
            r.recomputed_nodes.len()
        ),
    );
    let before = Series::nth("before (store-all)", 0, 2);
    let after = Series::nth("after remat", 1, 2);
    svg.legend(LEFT + 10.0, 68.0, &[&before, &after]);
    timelines(
        &mut svg,
        86.0,
        330.0,
        &[
            (&before, r.timeline_before.as_slice()),
            (&after, r.timeline_after.as_slice()),
        ],
        Some(r.budget_bytes),
    );
    svg.finish()
}

/// The picture of a sweep: each strategy's frontier (peak memory against
/// extra FLOPs, one marker per point) with store-all, the outputs' floor
/// and the budget dashed and [`RematSweep::chosen`] ringed; below, live
/// memory per schedule step of store-all and of the chosen point.
pub fn remat_sweep_svg(title: &str, s: &RematSweep) -> String {
    let mut svg = Svg::new(WIDTH, 890.0);
    svg.title(
        LEFT,
        24.0,
        &format!("Peak memory against recomputation: {title}"),
    );
    svg.caption(
        LEFT,
        44.0,
        &format!(
            "store-all peak {}; graph outputs {} (no recomputation goes below); {:.3} GFLOP per step; {} nodes, {} recomputable",
            human_bytes(s.lower_bound_store_all_bytes),
            human_bytes(s.outputs_bytes),
            s.flops as f64 / 1e9,
            s.nodes,
            s.candidates
        ),
    );
    let first = s
        .frontiers
        .first()
        .map(|f| f.strategy.as_str())
        .unwrap_or("");
    let (marked, mark_label) = match (&s.chosen, s.budget_bytes) {
        (Some(ch), _) => {
            let at = format!(
                "{}, +{:.2}% FLOPs",
                human_bytes(ch.peak_bytes),
                ch.extra_flops_pct
            );
            match ch.reason {
                ChoiceReason::Budget => (
                    format!(
                        "Marked: the point the budget {} picks on {}'s frontier (fewest extra FLOPs within it): {at}",
                        human_bytes(s.budget_bytes.unwrap_or(0)),
                        ch.strategy
                    ),
                    format!("budget pick: {at}"),
                ),
                ChoiceReason::Knee => (
                    format!(
                        "Marked: the knee of {}'s frontier (most memory saved per extra FLOP; no budget given): {at}",
                        ch.strategy
                    ),
                    format!("knee: {at}"),
                ),
                ChoiceReason::LeastPeak => (
                    format!(
                        "Marked: the least peak of {}'s frontier (no budget given, no knee): {at}",
                        ch.strategy
                    ),
                    format!("least peak: {at}"),
                ),
            }
        }
        (None, Some(b)) => (
            format!(
                "No point of {first}'s frontier fits the budget {}: nothing marked",
                human_bytes(b)
            ),
            String::new(),
        ),
        (None, None) => ("No frontier: nothing marked".to_string(), String::new()),
    };
    svg.caption(LEFT, 62.0, &marked);
    let n = s.frontiers.len();
    let series: Vec<Series> = s
        .frontiers
        .iter()
        .enumerate()
        .map(|(i, f)| Series::nth(&f.strategy, i, n))
        .collect();
    svg.legend(LEFT + 10.0, 86.0, &series.iter().collect::<Vec<_>>());
    let x_max = s
        .frontiers
        .iter()
        .flat_map(|f| f.points.iter().map(|q| q.extra_flops_pct))
        .fold(0.0f64, f64::max);
    let y_max = s
        .frontiers
        .iter()
        .flat_map(|f| f.points.iter().map(|q| q.peak_bytes))
        .chain([s.lower_bound_store_all_bytes, s.outputs_bytes])
        .chain(s.budget_bytes)
        .max()
        .unwrap_or(1)
        .max(1);
    let p = Plot::new(
        LEFT,
        104.0,
        PLOT_W,
        300.0,
        &Axis::new(
            "extra FLOPs, of the training step",
            Unit::Percent,
            0.0,
            if x_max > 0.0 { x_max } else { 1.0 },
        ),
        &Axis::new("peak live memory", Unit::Bytes, 0.0, y_max as f64),
    );
    p.axes(&mut svg);
    p.hline(
        &mut svg,
        s.lower_bound_store_all_bytes as f64,
        STORE_ALL,
        &format!("store-all {}", human_bytes(s.lower_bound_store_all_bytes)),
        true,
    );
    p.hline(
        &mut svg,
        s.outputs_bytes as f64,
        FLOOR,
        &format!("outputs {}", human_bytes(s.outputs_bytes)),
        true,
    );
    if let Some(b) = s.budget_bytes {
        p.hline(
            &mut svg,
            b as f64,
            BUDGET,
            &format!("budget {}", human_bytes(b)),
            false,
        );
    }
    for (f, ser) in s.frontiers.iter().zip(&series) {
        let mut pts: Vec<(f64, f64)> = f
            .points
            .iter()
            .map(|q| (q.extra_flops_pct, q.peak_bytes as f64))
            .collect();
        pts.reverse(); // by rising extra FLOPs
        p.line(&mut svg, &pts, ser);
    }
    if let Some(ch) = &s.chosen {
        p.mark(
            &mut svg,
            ch.extra_flops_pct,
            ch.peak_bytes as f64,
            &mark_label,
        );
    }
    // Panel 2: the timelines.
    svg.title(
        LEFT,
        490.0,
        "Live memory per schedule step: store-all and the marked point",
    );
    let before = Series::nth("store-all (no recomputation)", 0, 2);
    let after = s.chosen.as_ref().map(|ch| {
        Series::nth(
            &format!(
                "marked point ({}, +{:.2}% FLOPs)",
                ch.strategy, ch.extra_flops_pct
            ),
            1,
            2,
        )
    });
    let mut lines: Vec<(&Series, &[u64])> = vec![(&before, s.timeline_before.as_slice())];
    if let (Some(a), Some(ch)) = (&after, &s.chosen) {
        lines.push((a, ch.timeline_after.as_slice()));
    }
    svg.legend(
        LEFT + 10.0,
        512.0,
        &lines.iter().map(|l| l.0).collect::<Vec<_>>(),
    );
    timelines(&mut svg, 530.0, 300.0, &lines, s.budget_bytes);
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remat::{FrontierPoint, StrategyFrontier, SweepChoice};

    fn point(peak: u64, pct: f64) -> FrontierPoint {
        FrontierPoint {
            peak_bytes: peak,
            peak_fraction: peak as f64 / 10_000.0,
            extra_flops: (pct * 100.0) as u64,
            extra_flops_pct: pct,
            recomputed_nodes: 1,
            proven_optimal: false,
        }
    }

    /// A hand-made sweep of two strategies with a budget pick: the whole
    /// picture as text, so that any change to it shows in review.
    #[test]
    fn small_sweep_picture() {
        let sweep = RematSweep {
            lower_bound_store_all_bytes: 10_000,
            outputs_bytes: 2_000,
            flops: 1_000_000,
            nodes: 12,
            candidates: 5,
            frontiers: vec![
                StrategyFrontier {
                    strategy: "auto".into(),
                    points: vec![point(4_000, 30.0), point(6_000, 10.0), point(10_000, 0.0)],
                    seconds: 0.1,
                    max_solve_seconds: 0.05,
                },
                StrategyFrontier {
                    strategy: "sqrt".into(),
                    points: vec![point(7_000, 20.0)],
                    seconds: 0.1,
                    max_solve_seconds: 0.05,
                },
            ],
            budget_bytes: Some(6_500),
            chosen: Some(SweepChoice {
                strategy: "auto".into(),
                index: 1,
                reason: ChoiceReason::Budget,
                peak_bytes: 6_000,
                extra_flops_pct: 10.0,
                recomputed_nodes: 1,
                timeline_after: vec![1_000, 6_000, 3_000, 5_000, 2_000],
            }),
            timeline_before: vec![1_000, 10_000, 5_000, 2_000],
        };
        insta::assert_snapshot!(remat_sweep_svg("tiny <sweep>", &sweep));
    }
}
