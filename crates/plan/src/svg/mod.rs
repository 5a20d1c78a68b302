//! SVG drawings of plans: live bytes over time (one step line per order,
//! dashed lines at the arena and the bound) above the arena layout (one
//! rectangle per tensor, time × address; hover for name, size, offset).
//! Both panels are drawn with [`chart`], the helper every graphopt picture
//! shares (`remat --svg` too).

pub mod chart;

use chart::{Axis, Plot, Series, Svg, Unit};

use crate::buffer::Buffer;
use crate::liveness;
use crate::model::human_bytes;
use crate::plan::{Plan, PlanError};
use graphopt_ir::Model;

/// The SVG of an interval plan (`plan --intervals`).
pub fn intervals_svg(
    title: &str,
    bufs: &[Buffer],
    offsets: &[u64],
    arena: u64,
    bound: u64,
) -> String {
    let rects: Vec<Rect> = bufs
        .iter()
        .zip(offsets)
        .filter(|(b, _)| b.is_live())
        .map(|(b, &o)| Rect {
            name: b.id.to_string(),
            t0: b.lower,
            t1: b.upper,
            off: o,
            size: b.size,
        })
        .collect();
    let curve = interval_curve(bufs);
    render_svg(
        title,
        &[("live bytes", &curve, "#1f77b4")],
        &rects,
        arena,
        bound,
    )
}

/// Live bytes of an interval set at every time boundary, as (time, bytes)
/// steps.
pub fn interval_curve(bufs: &[Buffer]) -> Vec<(i64, u64)> {
    let mut ev: Vec<(i64, i128)> = Vec::new();
    for b in bufs.iter().filter(|b| b.is_live()) {
        ev.push((b.lower, b.size as i128));
        ev.push((b.upper, -(b.size as i128)));
    }
    ev.sort_unstable();
    let mut out: Vec<(i64, u64)> = Vec::new();
    let mut cur = 0i128;
    for (t, d) in ev {
        cur += d;
        match out.last_mut() {
            Some(last) if last.0 == t => last.1 = cur.max(0) as u64,
            _ => out.push((t, cur.max(0) as u64)),
        }
    }
    out
}

/// A labelled (time, bytes) step line and its colour.
pub type Curve<'a> = (&'a str, &'a Vec<(i64, u64)>, &'a str);

pub struct Rect {
    pub name: String,
    pub t0: i64,
    pub t1: i64,
    pub off: u64,
    pub size: u64,
}

/// The SVG of a model's plan: memory over time in the original and the
/// chosen order, and the arena layout.
pub fn model_svg(m: &Model, plan: &Plan) -> Result<String, PlanError> {
    let g = &m.graph;
    let original: Vec<_> = g.nodes().collect();
    let curve = |order: &[graphopt_ir::NodeId]| -> Result<Vec<(i64, u64)>, PlanError> {
        let l = liveness::liveness_with(g, order, true)?;
        Ok(liveness::live_bytes(&l.storages, order.len())
            .into_iter()
            .enumerate()
            .map(|(i, b)| (i as i64, b))
            .collect())
    };
    let orig = curve(&original)?;
    let chosen = curve(&plan.schedule)?;
    let rects: Vec<Rect> = plan
        .tensors
        .iter()
        .filter(|t| t.size > 0)
        .map(|t| Rect {
            name: t.name.clone(),
            t0: t.first as i64,
            t1: t.last as i64 + 1,
            off: t.offset,
            size: t.size,
        })
        .collect();
    Ok(render_svg(
        &g.name,
        &[
            ("original order", &orig, "#d62728"),
            ("chosen order", &chosen, "#1f77b4"),
        ],
        &rects,
        plan.arena_bytes,
        plan.lower_bound_bytes,
    ))
}

/// Two panels: live bytes over time (one step line per curve, dashed
/// lines at the arena size and the bound), then the arena layout with one
/// rectangle per tensor (time × address; hover for name, size, offset).
pub fn render_svg(title: &str, curves: &[Curve], rects: &[Rect], arena: u64, bound: u64) -> String {
    let (w, left, right) = (960.0f64, 90.0f64, 20.0f64);
    let pw = w - left - right;
    let (top, ph) = (70.0f64, 250.0f64);
    let y2 = top + ph + 100.0; // layout panel top
    let lh = 330.0f64;
    let height = y2 + lh + 55.0;
    let t_max = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.0 + 1))
        .chain(rects.iter().map(|r| r.t1))
        .max()
        .unwrap_or(1)
        .max(1);
    let t_min = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.0))
        .chain(rects.iter().map(|r| r.t0))
        .min()
        .unwrap_or(0)
        .min(t_max - 1);
    let y_max = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.1))
        .chain([arena, bound])
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let steps = Axis::new("schedule step", Unit::Count, t_min as f64, t_max as f64);
    let mut svg = Svg::new(w, height);
    svg.title(left, 22.0, &format!("Memory over time: {title}"));
    let series: Vec<Series> = curves
        .iter()
        .enumerate()
        .map(|(i, (label, _, color))| Series::with_color(label, color, i, curves.len()))
        .collect();
    svg.legend(left + 10.0, 46.0, &series.iter().collect::<Vec<_>>());
    let p = Plot::new(
        left,
        top,
        pw,
        ph,
        &steps,
        &Axis::new("live memory", Unit::Bytes, 0.0, y_max),
    );
    p.axes(&mut svg);
    // Arena label above its line, bound label below its own.
    p.hline(
        &mut svg,
        arena as f64,
        "#2ca02c",
        &format!("arena {}", human_bytes(arena)),
        true,
    );
    p.hline(
        &mut svg,
        bound as f64,
        "#555",
        &format!("lower bound {}", human_bytes(bound)),
        false,
    );
    for (i, ((_, pts, _), s)) in curves.iter().zip(&series).enumerate() {
        let pts: Vec<(f64, f64)> = pts.iter().map(|&(t, b)| (t as f64, b as f64)).collect();
        p.steps(&mut svg, &pts, s, i, curves.len());
    }
    // Panel 2: the arena layout.
    svg.title(
        left,
        y2 - 14.0,
        &format!(
            "Arena layout (time × address), {} tensors in {}",
            rects.len(),
            human_bytes(arena)
        ),
    );
    let layout = Plot::new(
        left,
        y2,
        pw,
        lh,
        &Axis::new(
            "schedule step (chosen order)",
            Unit::Count,
            t_min as f64,
            t_max as f64,
        ),
        &Axis::new("arena offset", Unit::Bytes, 0.0, arena.max(1) as f64),
    );
    layout.axes(&mut svg);
    for r in rects {
        let mut h: u32 = 2166136261;
        for c in r.name.bytes() {
            h = (h ^ c as u32).wrapping_mul(16777619);
        }
        let hue = h % 360;
        let (x0, x1) = (layout.px(r.t0 as f64), layout.px(r.t1 as f64));
        let (yt, yb) = (layout.py((r.off + r.size) as f64), layout.py(r.off as f64));
        svg.raw(&format!(
            "<rect x=\"{x0:.2}\" y=\"{yt:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"hsl({hue},60%,65%)\" stroke=\"#333\" stroke-width=\"0.3\"><title>{} size {} offset {} steps [{}, {})</title></rect>\n",
            (x1 - x0).max(0.5),
            (yb - yt).max(0.5),
            chart::esc(&r.name),
            r.size,
            r.off,
            r.t0,
            r.t1
        ));
    }
    layout.hline(
        &mut svg,
        arena as f64,
        "#2ca02c",
        &format!("arena {}", human_bytes(arena)),
        true,
    );
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two orders over four steps and three tensors: the whole picture as
    /// text, so that any change to it shows in review.
    #[test]
    fn small_plan_picture() {
        let orig = vec![(0, 3000), (1, 5000), (2, 4000), (3, 1000)];
        let chosen = vec![(0, 3000), (1, 3000), (2, 4000), (3, 1000)];
        let rects = [
            Rect {
                name: "a<b".into(),
                t0: 0,
                t1: 2,
                off: 0,
                size: 3000,
            },
            Rect {
                name: "c".into(),
                t0: 2,
                t1: 3,
                off: 0,
                size: 4000,
            },
            Rect {
                name: "d".into(),
                t0: 3,
                t1: 4,
                off: 0,
                size: 1000,
            },
        ];
        let svg = render_svg(
            "tiny & small",
            &[
                ("original order", &orig, "#d62728"),
                ("chosen order", &chosen, "#1f77b4"),
            ],
            &rects,
            4096,
            4000,
        );
        insta::assert_snapshot!(svg);
    }
}
