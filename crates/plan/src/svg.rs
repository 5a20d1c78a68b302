//! SVG drawings of plans: live bytes over time (one step line per order,
//! dashed lines at the arena and the bound) above the arena layout (one
//! rectangle per tensor, time × address; hover for name, size, offset).

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

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Two panels: live bytes over time (one step line per curve, dashed
/// lines at the arena size and the bound), then the arena layout with one
/// rectangle per tensor (time × address; hover for name, size, offset).
pub fn render_svg(title: &str, curves: &[Curve], rects: &[Rect], arena: u64, bound: u64) -> String {
    let (w, ph, pad_l, pad_r, top) = (960.0f64, 260.0f64, 90.0f64, 20.0f64, 40.0f64);
    let lh = 360.0f64;
    let y2 = top + ph + 60.0; // layout panel top
    let height = y2 + lh + 50.0;
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
    let pw = w - pad_l - pad_r;
    let xs = |t: i64| pad_l + (t - t_min) as f64 / (t_max - t_min) as f64 * pw;
    let ys = |b: f64| top + ph - b / y_max * ph;
    let mut s = String::new();
    s += &format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s += &format!(
        "<text x=\"{pad_l}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Memory over time: {}</text>\n",
        esc(title)
    );
    // Axes and grid of panel 1.
    for k in 0..=4 {
        let b = y_max * k as f64 / 4.0;
        let y = ys(b);
        s += &format!(
            "<line x1=\"{pad_l}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n",
            pad_l + pw
        );
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            pad_l - 6.0,
            y + 4.0,
            human_bytes(b as u64)
        );
    }
    // Arena label above its line, bound label below its own.
    for (label, val, color, dy) in [
        ("arena", arena, "#2ca02c", -4.0),
        ("lower bound", bound, "#555", 13.0),
    ] {
        let y = ys(val as f64);
        s += &format!(
            "<line x1=\"{pad_l}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{color}\" stroke-dasharray=\"6 4\"/>\n",
            pad_l + pw
        );
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{color}\">{label} {}</text>\n",
            pad_l + pw,
            y + dy,
            human_bytes(val)
        );
    }
    for (i, (label, pts, color)) in curves.iter().enumerate() {
        let mut d = String::new();
        for (k, &(t, b)) in pts.iter().enumerate() {
            let next = pts.get(k + 1).map(|p| p.0).unwrap_or(t + 1);
            let (x0, x1, y) = (xs(t), xs(next), ys(b as f64));
            if k == 0 {
                d += &format!("M{x0:.1},{:.1} L{x0:.1},{y:.1} ", ys(0.0));
            } else {
                d += &format!("L{x0:.1},{y:.1} ");
            }
            d += &format!("L{x1:.1},{y:.1} ");
        }
        // The first curve (original order) wide and pale underneath, so a
        // chosen order equal to it still shows both.
        let (width, opacity) = if i == 0 && curves.len() > 1 {
            (4.0, 0.45)
        } else {
            (1.4, 1.0)
        };
        s += &format!(
            "<path d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" stroke-opacity=\"{opacity}\"/>\n"
        );
        let ly = top + 14.0 + 16.0 * i as f64;
        s += &format!(
            "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
            pad_l + 10.0,
            pad_l + 30.0,
            pad_l + 36.0,
            ly + 4.0,
            esc(label)
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">schedule step</text>\n",
        pad_l + pw / 2.0,
        top + ph + 30.0
    );
    // Panel 2: the arena layout.
    s += &format!(
        "<text x=\"{pad_l}\" y=\"{}\" font-size=\"15\" font-weight=\"bold\">Arena layout (time × address), {} tensors in {}</text>\n",
        y2 - 12.0,
        rects.len(),
        human_bytes(arena)
    );
    let amax = arena.max(1) as f64;
    let ya = |o: f64| y2 + lh - o / amax * lh;
    s += &format!(
        "<rect x=\"{pad_l}\" y=\"{y2}\" width=\"{pw}\" height=\"{lh}\" fill=\"#f7f7f7\" stroke=\"#999\"/>\n"
    );
    for k in 0..=4 {
        let o = amax * k as f64 / 4.0;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            pad_l - 6.0,
            ya(o) + 4.0,
            human_bytes(o as u64)
        );
    }
    for r in rects {
        let mut h: u32 = 2166136261;
        for c in r.name.bytes() {
            h = (h ^ c as u32).wrapping_mul(16777619);
        }
        let hue = h % 360;
        let (x0, x1) = (xs(r.t0), xs(r.t1));
        let (yt, yb) = (ya((r.off + r.size) as f64), ya(r.off as f64));
        s += &format!(
            "<rect x=\"{x0:.2}\" y=\"{yt:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"hsl({hue},60%,65%)\" stroke=\"#333\" stroke-width=\"0.3\"><title>{} size {} offset {} steps [{}, {})</title></rect>\n",
            (x1 - x0).max(0.5),
            (yb - yt).max(0.5),
            esc(&r.name),
            r.size,
            r.off,
            r.t0,
            r.t1
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">schedule step (chosen order)</text>\n",
        pad_l + pw / 2.0,
        y2 + lh + 30.0
    );
    s += "</svg>\n";
    s
}
