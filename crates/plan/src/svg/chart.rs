//! The one chart helper every graphopt picture is drawn with (`plan --svg`,
//! `plan --intervals --svg`, `remat --svg`, `remat --sweep --svg`).
//!
//! A [`Plot`] is a rectangle of the page with two [`Axis`]es: tick values
//! at round steps (1, 2, 2.5 or 5 times a power of ten) and the unit in
//! the axis title (`live memory (MB)`, `extra FLOPs (%)`). Sizes use the
//! decimal units of [`crate::human_bytes`] (B, KB, MB, GB, TB), so an axis
//! and a label printed next to it agree. Series stay apart where they
//! overlap: each has its own colour, marker and dash pattern
//! ([`Series::nth`]), and the first of several is drawn wide and pale
//! underneath with larger markers, so a line equal to it still shows both.
//! A legend row shows each series' line sample and marker.
//!
//! Output is deterministic: coordinates are printed with one decimal, tick
//! values with the decimals their step needs, and nothing depends on hash
//! order or the clock.

/// Escapes text for SVG content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A coordinate with one decimal (never `-0.0`).
pub fn c(v: f64) -> String {
    let v = if v.abs() < 0.05 || !v.is_finite() {
        0.0
    } else {
        v
    };
    format!("{v:.1}")
}

/// The decimal size units of [`crate::human_bytes`].
const BYTE_UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];

/// The round step (1, 2, 2.5 or 5 × 10^k) that cuts `span` into at most
/// `max_ticks` intervals.
pub fn nice_step(span: f64, max_ticks: usize) -> f64 {
    let span = if span > 0.0 && span.is_finite() {
        span
    } else {
        1.0
    };
    let raw = span / max_ticks.max(1) as f64;
    let mag = 10f64.powi(raw.log10().floor() as i32);
    for m in [1.0, 2.0, 2.5, 5.0] {
        if m * mag >= raw * (1.0 - 1e-9) {
            return m * mag;
        }
    }
    10.0 * mag
}

/// Decimals that print every multiple of `step` exactly.
fn decimals_for(step: f64) -> usize {
    (0..6)
        .find(|&d| {
            let s = step * 10f64.powi(d as i32);
            (s - s.round()).abs() < 1e-6 * s.abs().max(1.0)
        })
        .unwrap_or(6)
}

/// What an axis counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, ticked in the decimal unit of the axis's top value.
    Bytes,
    /// A percentage: plain tick numbers, `(%)` in the title.
    Percent,
    /// Whole counts (schedule steps): integer ticks.
    Count,
    /// Plain numbers (a loss): decimal ticks, the title as given.
    Number,
}

/// One axis: its title, unit and the data range it must show.
#[derive(Clone, Debug)]
pub struct Axis {
    pub title: String,
    pub unit: Unit,
    pub min: f64,
    pub max: f64,
}

impl Axis {
    pub fn new(title: &str, unit: Unit, min: f64, max: f64) -> Axis {
        Axis {
            title: title.to_string(),
            unit,
            min,
            max,
        }
    }
}

/// An axis laid out: the range widened to whole steps, in display units.
#[derive(Clone, Debug)]
struct Scale {
    title: String,
    /// Data units per display unit (1000^k for bytes).
    div: f64,
    lo: f64,
    hi: f64,
    step: f64,
    decimals: usize,
}

impl Scale {
    fn new(a: &Axis, max_ticks: usize) -> Scale {
        let top = a.max.abs().max(a.min.abs());
        let (div, title) = match a.unit {
            Unit::Bytes => {
                let (mut div, mut k) = (1.0f64, 0);
                while top / div >= 1000.0 && k + 1 < BYTE_UNITS.len() {
                    div *= 1000.0;
                    k += 1;
                }
                (div, format!("{} ({})", a.title, BYTE_UNITS[k]))
            }
            Unit::Percent => (1.0, format!("{} (%)", a.title)),
            Unit::Count | Unit::Number => (1.0, a.title.clone()),
        };
        let lo = if a.min.is_finite() { a.min / div } else { 0.0 };
        let mut hi = if a.max.is_finite() { a.max / div } else { 1.0 };
        if hi <= lo {
            hi = lo + 1.0;
        }
        let mut step = nice_step(hi - lo, max_ticks);
        if a.unit == Unit::Count {
            step = step.max(1.0);
        }
        let lo_n = (lo / step + 1e-9).floor() * step;
        let hi_n = (hi / step - 1e-9).ceil() * step;
        Scale {
            title,
            div,
            lo: lo_n,
            hi: hi_n.max(lo_n + step),
            step,
            decimals: decimals_for(step),
        }
    }

    fn ticks(&self) -> Vec<(f64, String)> {
        let n = ((self.hi - self.lo) / self.step).round() as i64;
        (0..=n)
            .map(|i| {
                let v = self.lo + i as f64 * self.step;
                let v = if v.abs() < self.step * 1e-9 { 0.0 } else { v };
                (v * self.div, format!("{v:.*}", self.decimals))
            })
            .collect()
    }

    /// Position of data value `v` in [0, 1].
    fn frac(&self, v: f64) -> f64 {
        (v / self.div - self.lo) / (self.hi - self.lo)
    }
}

/// The shape drawn at a series' points and in its legend entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const DASHES: [&str; 6] = ["", "8 4", "2 3", "10 3 2 3", "5 5", "1 2"];
const MARKERS: [Marker; 5] = [
    Marker::Circle,
    Marker::Square,
    Marker::Triangle,
    Marker::Diamond,
    Marker::Cross,
];

/// How one line is drawn and named in the legend.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub color: String,
    /// `stroke-dasharray`, empty for solid.
    pub dash: String,
    pub marker: Marker,
    pub width: f64,
    pub opacity: f64,
    /// Marker radius in pixels.
    pub marker_size: f64,
}

impl Series {
    /// The `i`-th of `n` series: its own colour, marker and dash; the first
    /// of several wide and pale underneath, with larger markers.
    pub fn nth(label: &str, i: usize, n: usize) -> Series {
        Series::with_color(label, COLORS[i % COLORS.len()], i, n)
    }

    /// [`Series::nth`] with a given colour.
    pub fn with_color(label: &str, color: &str, i: usize, n: usize) -> Series {
        let under = i == 0 && n > 1;
        Series {
            label: label.to_string(),
            color: color.to_string(),
            dash: DASHES[i % DASHES.len()].to_string(),
            marker: MARKERS[i % MARKERS.len()],
            width: if under { 5.0 } else { 1.6 },
            opacity: if under { 0.4 } else { 1.0 },
            marker_size: if under { 7.5 } else { 4.5 },
        }
    }

    fn stroke_attrs(&self, width: f64, opacity: f64) -> String {
        let mut s = format!(
            "stroke=\"{}\" stroke-width=\"{}\"",
            esc(&self.color),
            c(width)
        );
        if !self.dash.is_empty() {
            s += &format!(" stroke-dasharray=\"{}\"", esc(&self.dash));
        }
        if opacity < 1.0 {
            s += &format!(" stroke-opacity=\"{}\"", c(opacity));
        }
        s
    }
}

/// An SVG document being written.
pub struct Svg {
    out: String,
}

impl Svg {
    /// A white page of `w` × `h` pixels.
    pub fn new(w: f64, h: f64) -> Svg {
        Svg {
            out: format!(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                c(w),
                c(h)
            ),
        }
    }

    /// Appends raw SVG (already escaped).
    pub fn raw(&mut self, s: &str) {
        self.out.push_str(s);
    }

    /// Text at (x, y); `anchor` is `start`, `middle` or `end`.
    pub fn text(&mut self, x: f64, y: f64, anchor: &str, extra: &str, text: &str) {
        let anchor = if anchor == "start" {
            String::new()
        } else {
            format!(" text-anchor=\"{anchor}\"")
        };
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!(" {extra}")
        };
        self.out += &format!(
            "<text x=\"{}\" y=\"{}\"{anchor}{extra}>{}</text>\n",
            c(x),
            c(y),
            esc(text)
        );
    }

    /// A bold title line.
    pub fn title(&mut self, x: f64, y: f64, text: &str) {
        self.text(x, y, "start", "font-size=\"15\" font-weight=\"bold\"", text);
    }

    /// A grey caption line.
    pub fn caption(&mut self, x: f64, y: f64, text: &str) {
        self.text(x, y, "start", "fill=\"#444\"", text);
    }

    /// One legend row starting at (x, y): per series a line sample in its
    /// dash with its marker in the middle, then the label.
    pub fn legend(&mut self, x: f64, y: f64, series: &[&Series]) {
        let mut cx = x;
        for s in series {
            self.out += "<g class=\"legend-entry\">";
            self.out += &format!(
                "<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" {}/>",
                c(cx),
                c(cx + 30.0),
                c(y),
                c(y),
                s.stroke_attrs(s.width.min(4.0), s.opacity.max(0.6))
            );
            self.marker(s, cx + 15.0, y, s.marker_size.min(5.0));
            self.out += &format!(
                "<text x=\"{}\" y=\"{}\">{}</text></g>\n",
                c(cx + 36.0),
                c(y + 4.0),
                esc(&s.label)
            );
            cx += 36.0 + text_width(&s.label) + 22.0;
        }
    }

    fn marker(&mut self, s: &Series, x: f64, y: f64, r: f64) {
        let col = esc(&s.color);
        let fill = format!("fill=\"{col}\" stroke=\"white\" stroke-width=\"0.8\"");
        self.out += &match s.marker {
            Marker::Circle => format!(
                "<circle class=\"marker\" cx=\"{}\" cy=\"{}\" r=\"{}\" {fill}/>",
                c(x),
                c(y),
                c(r)
            ),
            Marker::Square => {
                let a = r * 0.9;
                format!(
                    "<rect class=\"marker\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" {fill}/>",
                    c(x - a),
                    c(y - a),
                    c(2.0 * a),
                    c(2.0 * a)
                )
            }
            Marker::Triangle => format!(
                "<path class=\"marker\" d=\"M{},{} L{},{} L{},{} Z\" {fill}/>",
                c(x),
                c(y - 1.2 * r),
                c(x + 1.1 * r),
                c(y + 0.8 * r),
                c(x - 1.1 * r),
                c(y + 0.8 * r)
            ),
            Marker::Diamond => format!(
                "<path class=\"marker\" d=\"M{},{} L{},{} L{},{} L{},{} Z\" {fill}/>",
                c(x),
                c(y - 1.2 * r),
                c(x + r),
                c(y),
                c(x),
                c(y + 1.2 * r),
                c(x - r),
                c(y)
            ),
            Marker::Cross => format!(
                "<path class=\"marker\" d=\"M{},{} L{},{} M{},{} L{},{}\" fill=\"none\" stroke=\"{col}\" stroke-width=\"2\"/>",
                c(x - r),
                c(y - r),
                c(x + r),
                c(y + r),
                c(x - r),
                c(y + r),
                c(x + r),
                c(y - r)
            ),
        };
    }

    /// The finished document.
    pub fn finish(mut self) -> String {
        self.out += "</svg>\n";
        self.out
    }
}

/// Rough width of `s` at 12 px sans-serif, for laying out legend rows.
pub fn text_width(s: &str) -> f64 {
    s.chars().count() as f64 * 6.6
}

/// A plot area: a rectangle of the page and the axes mapping data into it.
pub struct Plot {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
    xs: Scale,
    ys: Scale,
}

impl Plot {
    /// A plot at (x, y) of `w` × `h` pixels; the axes' ranges are widened to
    /// whole tick steps (at most 10 on x, 6 on y).
    pub fn new(x: f64, y: f64, w: f64, h: f64, xa: &Axis, ya: &Axis) -> Plot {
        Plot {
            x,
            y,
            w,
            h,
            xs: Scale::new(xa, 10),
            ys: Scale::new(ya, 6),
        }
    }

    /// Pixel x of data value `v`.
    pub fn px(&self, v: f64) -> f64 {
        self.x + self.xs.frac(v) * self.w
    }

    /// Pixel y of data value `v`.
    pub fn py(&self, v: f64) -> f64 {
        self.y + self.h - self.ys.frac(v) * self.h
    }

    /// Background, grid, frame, tick marks with their values, and both
    /// axis titles (the unit in parentheses).
    pub fn axes(&self, svg: &mut Svg) {
        let (x0, x1, y0, y1) = (self.x, self.x + self.w, self.y, self.y + self.h);
        svg.raw(&format!(
            "<rect class=\"plot\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fbfbfb\" stroke=\"#888\"/>\n",
            c(x0),
            c(y0),
            c(self.w),
            c(self.h)
        ));
        for (v, label) in self.ys.ticks() {
            let y = self.py(v);
            svg.raw(&format!(
                "<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#e4e4e4\"/><line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#888\"/>\n",
                c(x0),
                c(x1),
                c(y),
                c(y),
                c(x0 - 5.0),
                c(x0),
                c(y),
                c(y)
            ));
            svg.text(x0 - 8.0, y + 4.0, "end", "class=\"tick-y\"", &label);
        }
        for (v, label) in self.xs.ticks() {
            let x = self.px(v);
            svg.raw(&format!(
                "<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#eeeeee\"/><line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#888\"/>\n",
                c(x),
                c(x),
                c(y0),
                c(y1),
                c(x),
                c(x),
                c(y1),
                c(y1 + 5.0)
            ));
            svg.text(x, y1 + 18.0, "middle", "class=\"tick-x\"", &label);
        }
        svg.text(
            (x0 + x1) / 2.0,
            y1 + 36.0,
            "middle",
            "class=\"axis-title\"",
            &self.xs.title.clone(),
        );
        let (tx, ty) = (x0 - 62.0, (y0 + y1) / 2.0);
        svg.raw(&format!(
            "<text class=\"axis-title\" x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" transform=\"rotate(-90 {0} {1})\">{2}</text>\n",
            c(tx),
            c(ty),
            esc(&self.ys.title)
        ));
    }

    /// A line through `pts` (data units) with a marker at every point.
    pub fn line(&self, svg: &mut Svg, pts: &[(f64, f64)], s: &Series) {
        if pts.is_empty() {
            return;
        }
        let mut d = String::new();
        for (k, &(x, y)) in pts.iter().enumerate() {
            d += &format!(
                "{}{},{} ",
                if k == 0 { "M" } else { "L" },
                c(self.px(x)),
                c(self.py(y))
            );
        }
        self.path(svg, d.trim_end(), s);
        for &(x, y) in pts {
            svg.marker(s, self.px(x), self.py(y), s.marker_size);
        }
    }

    /// A step line: `pts[k].1` holds from `pts[k].0` to the next point's x
    /// (the last for one unit), rising from 0 at the first. Markers sit at
    /// the middle of about a dozen steps, shifted per series by `i` of `n`
    /// so that the markers of equal lines do not cover each other.
    pub fn steps(&self, svg: &mut Svg, pts: &[(f64, f64)], s: &Series, i: usize, n: usize) {
        if pts.is_empty() {
            return;
        }
        let mut d = format!("M{},{} ", c(self.px(pts[0].0)), c(self.py(0.0)));
        let mut mids = Vec::with_capacity(pts.len());
        let mut last_y = f64::NAN;
        for (k, &(x, y)) in pts.iter().enumerate() {
            let next = pts.get(k + 1).map(|p| p.0).unwrap_or(x + 1.0);
            let (x0, x1, py) = (self.px(x), self.px(next), self.py(y));
            if py != last_y || k == 0 {
                d += &format!("L{},{} ", c(x0), c(py));
            }
            d += &format!("L{},{} ", c(x1), c(py));
            last_y = py;
            mids.push(((x0 + x1) / 2.0, py));
        }
        self.path(svg, d.trim_end(), s);
        let every = pts.len().div_ceil(12).max(1);
        let shift = every * i / n.max(1);
        for (x, y) in mids.into_iter().skip(shift).step_by(every) {
            svg.marker(s, x, y, s.marker_size);
        }
    }

    fn path(&self, svg: &mut Svg, d: &str, s: &Series) {
        svg.raw(&format!(
            "<path class=\"series\" d=\"{d}\" fill=\"none\" {} stroke-linejoin=\"round\"/>\n",
            s.stroke_attrs(s.width, s.opacity)
        ));
    }

    /// A dashed horizontal line at data value `v`, labelled at its right
    /// end above (or below) the line.
    pub fn hline(&self, svg: &mut Svg, v: f64, color: &str, label: &str, above: bool) {
        let y = self.py(v);
        svg.raw(&format!(
            "<line class=\"ref\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"1.2\" stroke-dasharray=\"6 4\"/>\n",
            c(self.x),
            c(self.x + self.w),
            c(y),
            c(y),
            esc(color)
        ));
        svg.text(
            self.x + self.w - 4.0,
            if above { y - 4.0 } else { y + 13.0 },
            "end",
            &format!("fill=\"{}\"", esc(color)),
            label,
        );
    }

    /// A black ring around the point (x, y) with a label beside it.
    pub fn mark(&self, svg: &mut Svg, x: f64, y: f64, label: &str) {
        let (px, py) = (self.px(x), self.py(y));
        svg.raw(&format!(
            "<circle class=\"chosen\" cx=\"{}\" cy=\"{}\" r=\"10\" fill=\"none\" stroke=\"black\" stroke-width=\"1.8\"/>\n",
            c(px),
            c(py)
        ));
        // Right of the ring unless that runs out of the plot.
        let right = px + 14.0 + text_width(label) <= self.x + self.w;
        let (tx, anchor) = if right {
            (px + 14.0, "start")
        } else {
            (px - 14.0, "end")
        };
        let ty = if py - 14.0 > self.y + 12.0 {
            py - 12.0
        } else {
            py + 22.0
        };
        svg.text(
            tx,
            ty,
            anchor,
            "font-weight=\"bold\" stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\"",
            label,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps_are_round() {
        assert_eq!(nice_step(10.0, 10), 1.0);
        assert_eq!(nice_step(7.3, 6), 2.0);
        assert_eq!(nice_step(113.0, 10), 20.0);
        assert_eq!(nice_step(0.9, 6), 0.2);
        assert_eq!(nice_step(22.0, 10), 2.5);
    }

    #[test]
    fn byte_axis_ticks_in_the_unit_of_its_top() {
        let s = Scale::new(&Axis::new("live memory", Unit::Bytes, 0.0, 4_500_000.0), 6);
        assert_eq!(s.title, "live memory (MB)");
        let labels: Vec<String> = s.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels, ["0", "1", "2", "3", "4", "5"]);
        let s = Scale::new(&Axis::new("x", Unit::Percent, 0.0, 0.7), 10);
        let labels: Vec<String> = s.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(
            labels,
            ["0.0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7"]
        );
        let s = Scale::new(&Axis::new("step", Unit::Count, 0.0, 3.0), 10);
        let labels: Vec<String> = s.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels, ["0", "1", "2", "3"]);
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&apos;");
    }
}
