//! Every picture graphopt draws, rendered with resvg: `plan --svg`
//! ([`graphopt::plan::svg::model_svg`]), `remat --svg` after a rewrite
//! ([`graphopt::remat_svg`]) and `remat --sweep --svg`
//! ([`graphopt::remat_sweep_svg`]). Each must parse, hold its axis titles
//! (with units), tick values and one legend entry with a marker per
//! series, and draw coloured pixels inside every plot area: none may fall
//! back to an empty frame. resvg is built without fonts, so text is
//! checked in the XML and pixels are checked for the lines and markers.

use graphopt::plan::DimValues;
use graphopt::{
    AutodiffOptions, Budget, ChoiceReason, GradOptions, Loss, PlanRequest, RematOptions,
    RematStrategy, Session,
};
use resvg::tiny_skia;
use resvg::usvg::{self, roxmltree};
use std::path::Path;
use std::time::Duration;

fn testdata(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(rel)
}

/// A plot's frame (x, y, w, h), its x tick values and its y tick values.
type PlotTicks = ((f64, f64, f64, f64), Vec<String>, Vec<String>);

/// What a picture holds, read from its XML.
struct Picture {
    texts: Vec<String>,
    /// Per plot: (x, y, w, h), x tick values, y tick values.
    plots: Vec<PlotTicks>,
    axis_titles: Vec<String>,
    /// Legend labels, each with whether its entry holds a marker.
    legend: Vec<(String, bool)>,
    pixmap: tiny_skia::Pixmap,
}

fn attr(n: &roxmltree::Node, a: &str) -> f64 {
    n.attribute(a).unwrap().parse().unwrap()
}

fn has_class(n: &roxmltree::Node, c: &str) -> bool {
    n.attribute("class") == Some(c)
}

fn read(svg: &str) -> Picture {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    let text_of = |n: roxmltree::Node| -> String {
        n.descendants()
            .filter(|d| d.is_text())
            .filter_map(|d| d.text())
            .collect()
    };
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(text_of)
        .collect();
    // Ticks follow their plot's frame in document order.
    let mut plots = Vec::new();
    let mut axis_titles = Vec::new();
    for n in doc.descendants() {
        if n.has_tag_name("rect") && has_class(&n, "plot") {
            let r = (
                attr(&n, "x"),
                attr(&n, "y"),
                attr(&n, "width"),
                attr(&n, "height"),
            );
            plots.push((r, Vec::new(), Vec::new()));
        } else if n.has_tag_name("text") && has_class(&n, "tick-x") {
            plots.last_mut().unwrap().1.push(text_of(n));
        } else if n.has_tag_name("text") && has_class(&n, "tick-y") {
            plots.last_mut().unwrap().2.push(text_of(n));
        } else if n.has_tag_name("text") && has_class(&n, "axis-title") {
            axis_titles.push(text_of(n));
        }
    }
    let legend = doc
        .descendants()
        .filter(|n| n.has_tag_name("g") && has_class(n, "legend-entry"))
        .map(|g| {
            let label = g
                .children()
                .find(|c| c.has_tag_name("text"))
                .map(text_of)
                .unwrap_or_default();
            let marker = g.descendants().any(|d| has_class(&d, "marker"));
            (label, marker)
        })
        .collect();
    let tree = usvg::Tree::from_str(svg, &usvg::Options::default()).expect("usvg parses it");
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    if let Ok(dir) = std::env::var("GRAPHOPT_SVG_DUMP") {
        let name = texts
            .first()
            .cloned()
            .unwrap_or_default()
            .replace(['/', ' ', ':'], "_");
        std::fs::write(format!("{dir}/{name}.svg"), svg).unwrap();
    }
    Picture {
        texts,
        plots,
        axis_titles,
        legend,
        pixmap,
    }
}

impl Picture {
    fn has_text(&self, s: &str) -> bool {
        self.texts.iter().any(|t| t.contains(s))
    }

    fn assert_texts(&self, want: &[&str]) {
        for w in want {
            assert!(self.has_text(w), "no text '{w}' in {:?}", self.texts);
        }
    }

    /// Pixels inside plot `k` (its frame left out) within 40 of `rgb` in
    /// every channel.
    fn pixels_near(&self, k: usize, rgb: (u8, u8, u8)) -> usize {
        self.count(k, |r, g, b| {
            r.abs_diff(rgb.0) <= 40 && g.abs_diff(rgb.1) <= 40 && b.abs_diff(rgb.2) <= 40
        })
    }

    /// Coloured (not grey) pixels inside plot `k`.
    fn coloured(&self, k: usize) -> usize {
        self.count(k, |r, g, b| r.max(g).max(b) - r.min(g).min(b) > 50)
    }

    fn count(&self, k: usize, f: impl Fn(u8, u8, u8) -> bool) -> usize {
        let (x, y, w, h) = self.plots[k].0;
        let mut n = 0;
        for py in (y as u32 + 2)..((y + h) as u32 - 1) {
            for px in (x as u32 + 2)..((x + w) as u32 - 1) {
                let p = self.pixmap.pixel(px, py).unwrap();
                if f(p.red(), p.green(), p.blue()) {
                    n += 1;
                }
            }
        }
        n
    }

    /// Plot `k` has at least 3 ticks on each axis, numbers rising.
    fn assert_ticks(&self, k: usize) {
        let (_, xs, ys) = &self.plots[k];
        for ticks in [xs, ys] {
            assert!(ticks.len() >= 3, "ticks {ticks:?}");
            let v: Vec<f64> = ticks.iter().map(|t| t.parse().unwrap()).collect();
            assert!(v.windows(2).all(|w| w[0] < w[1]), "{ticks:?}");
            assert_eq!(v[0], 0.0, "{ticks:?}");
        }
    }

    fn assert_legend(&self, labels: &[&str]) {
        let got: Vec<&str> = self.legend.iter().map(|l| l.0.as_str()).collect();
        assert_eq!(got, labels);
        assert!(self.legend.iter().all(|l| l.1), "{:?}", self.legend);
    }
}

const BLUE: (u8, u8, u8) = (0x1f, 0x77, 0xb4);
const RED: (u8, u8, u8) = (0xd6, 0x27, 0x28);
const GREEN: (u8, u8, u8) = (0x2c, 0xa0, 0x2c);
const ORANGE: (u8, u8, u8) = (0xff, 0x7f, 0x0e);

#[test]
fn plan_picture_has_axes_legend_and_drawn_panels() {
    let s = graphopt::load(testdata("models/gpt2_tiny.ts14.onnx")).unwrap();
    let p = s.plan(&PlanRequest::default()).unwrap();
    let svg = graphopt::plan::svg::model_svg(&p.model, &p.plan).unwrap();
    let pic = read(&svg);
    pic.assert_texts(&["Memory over time", "Arena layout", "arena ", "lower bound "]);
    assert_eq!(
        pic.axis_titles,
        [
            "schedule step",
            "live memory (KB)",
            "schedule step (chosen order)",
            "arena offset (KB)"
        ]
    );
    assert_eq!(pic.plots.len(), 2);
    pic.assert_ticks(0);
    pic.assert_ticks(1);
    pic.assert_legend(&["original order", "chosen order"]);
    // Both orders drawn: the chosen one in blue, the original one in red
    // (pale and wide, with full-colour markers).
    let (blue, red) = (pic.pixels_near(0, BLUE), pic.pixels_near(0, RED));
    eprintln!(
        "memory panel: blue {blue}, red {red}; layout: {} coloured",
        pic.coloured(1)
    );
    assert!(blue > 500 && red > 500, "blue {blue}, red {red}");
    // The arena layout: one rectangle per tensor.
    assert!(pic.coloured(1) > 18_000, "{}", pic.coloured(1));
}

/// The training graph of a small two-layer MLP.
fn matmul_chain() -> Session {
    let text = std::fs::read_to_string(testdata("remat/matmul_chain.onnxtxt")).unwrap();
    Session::from_model(graphopt::text::parse_model(&text).unwrap())
}

#[test]
fn remat_picture_shows_both_timelines_and_the_budget() {
    let mut s = gpt2_train();
    let r = s
        .remat(&RematOptions {
            budget: Budget::Percent(90.0),
            dims: dims8(&s),
            ..RematOptions::default()
        })
        .unwrap();
    assert!(r.timeline_after.len() > r.timeline_before.len());
    let svg = graphopt::remat_svg("gpt2_tiny", &r);
    let pic = read(&svg);
    pic.assert_texts(&["Live memory before and after remat: gpt2_tiny", "budget "]);
    assert_eq!(pic.axis_titles, ["schedule step", "live memory (KB)"]);
    assert_eq!(pic.plots.len(), 1);
    pic.assert_ticks(0);
    pic.assert_legend(&["before (store-all)", "after remat"]);
    let (blue, red) = (pic.pixels_near(0, BLUE), pic.pixels_near(0, RED));
    eprintln!("timeline: blue {blue}, red {red}");
    assert!(blue > 450 && red > 700, "blue {blue}, red {red}");
}

/// The training graph of gpt2_tiny (sqrt and per-block find blocks there).
fn gpt2_train() -> Session {
    let mut s = graphopt::load(testdata("models/gpt2_tiny.ts14.onnx")).unwrap();
    s.grad(&GradOptions {
        autodiff: AutodiffOptions {
            loss: Loss::Mse,
            ..AutodiffOptions::default()
        },
        ..GradOptions::default()
    })
    .unwrap();
    s
}

/// Every symbolic dim at 8 (as `remat_models.rs` runs gpt2_tiny).
fn dims8(s: &Session) -> DimValues {
    let d: Vec<(String, i64)> = graphopt::plan::input_dim_names(s.model())
        .into_iter()
        .map(|d| (d, 8))
        .collect();
    DimValues::new(&d)
}

fn sweep(s: &mut Session, budget: Option<Budget>) -> graphopt::RematSweep {
    let strategies = [
        RematStrategy::Auto,
        RematStrategy::Fast,
        RematStrategy::Sqrt,
        RematStrategy::PerBlock,
    ];
    let dims = dims8(s);
    s.remat_sweep_with_budget(&dims, &strategies, 5, Duration::from_secs(2), budget)
        .unwrap()
}

#[test]
fn sweep_picture_marks_the_chosen_point_and_draws_its_timeline() {
    let mut s = gpt2_train();
    for budget in [None, Some(Budget::Percent(90.0))] {
        let sw = sweep(&mut s, budget);
        let ch = sw.chosen.clone().expect("a point is chosen");
        assert_eq!(ch.strategy, "auto");
        let q = &sw.frontiers[0].points[ch.index];
        assert_eq!(q.peak_bytes, ch.peak_bytes);
        if let Some(b) = sw.budget_bytes {
            assert_eq!(ch.reason, ChoiceReason::Budget);
            assert!(ch.peak_bytes <= b);
            // No point within the budget costs fewer FLOPs.
            assert!(sw.frontiers[0]
                .points
                .iter()
                .all(|p| p.peak_bytes > b || p.extra_flops >= q.extra_flops));
        } else {
            let pts: Vec<(f64, f64)> = sw.frontiers[0]
                .points
                .iter()
                .map(|p| (p.peak_fraction, p.extra_flops_pct))
                .collect();
            eprintln!("auto's frontier (peak fraction, extra FLOPs %): {pts:?}");
            assert_eq!(ch.reason, ChoiceReason::Knee);
        }
        // The timeline is the rewritten graph's: longer (the copies) and
        // peaking below store-all.
        let peak_after = *ch.timeline_after.iter().max().unwrap();
        let peak_before = *sw.timeline_before.iter().max().unwrap();
        eprintln!(
            "{:?}: point {} of {}, peak {} (timeline {}), store-all {} (timeline {}), +{:.2}% FLOPs",
            ch.reason,
            ch.index,
            sw.frontiers[0].points.len(),
            ch.peak_bytes,
            peak_after,
            sw.lower_bound_store_all_bytes,
            peak_before,
            ch.extra_flops_pct
        );
        assert!(ch.timeline_after.len() > sw.timeline_before.len());
        assert!(peak_after < peak_before);

        let svg = graphopt::remat_sweep_svg("gpt2_tiny", &sw);
        let pic = read(&svg);
        let mark = if budget.is_some() {
            "budget pick: "
        } else {
            "knee: "
        };
        pic.assert_texts(&[
            "Peak memory against recomputation: gpt2_tiny",
            "store-all ",
            "outputs ",
            mark,
            if budget.is_some() {
                "Marked: the point the budget"
            } else {
                "Marked: the knee of auto's frontier"
            },
        ]);
        // The budget's dashed lines are labelled only when one is given.
        let budget_lines = pic
            .texts
            .iter()
            .filter(|t| t.starts_with("budget "))
            .count();
        assert_eq!(budget_lines, if budget.is_some() { 3 } else { 0 });
        assert_eq!(
            pic.axis_titles,
            [
                "extra FLOPs, of the training step (%)",
                "peak live memory (KB)",
                "schedule step",
                "live memory (KB)"
            ]
        );
        assert_eq!(pic.plots.len(), 2);
        pic.assert_ticks(0);
        pic.assert_ticks(1);
        let after = format!("marked point (auto, +{:.2}% FLOPs)", ch.extra_flops_pct);
        pic.assert_legend(&[
            "auto",
            "fast",
            "sqrt",
            "per-block",
            "store-all (no recomputation)",
            after.as_str(),
        ]);
        assert_eq!(svg.matches("class=\"chosen\"").count(), 1);
        // Every strategy's colour shows in the frontier panel: auto's
        // (blue, wide and pale, larger markers) is not hidden under fast's.
        let counts: Vec<usize> = [BLUE, RED, GREEN, ORANGE]
            .iter()
            .map(|&c| pic.pixels_near(0, c))
            .collect();
        let (blue, red) = (pic.pixels_near(1, BLUE), pic.pixels_near(1, RED));
        eprintln!("frontier colours {counts:?}; timelines blue {blue}, red {red}");
        // auto and fast: lines and several markers; sqrt and per-block:
        // here one point each (a marker).
        assert!(counts[0] > 50 && counts[1] > 60, "{counts:?}");
        assert!(counts[2] > 9 && counts[3] > 9, "{counts:?}");
        assert!(blue > 450 && red > 650, "blue {blue}, red {red}");
    }
}

#[test]
fn a_budget_no_point_fits_is_said_and_marks_nothing() {
    let mut s = matmul_chain();
    let sw = s
        .remat_sweep_with_budget(
            &DimValues::default(),
            &[RematStrategy::Auto],
            4,
            Duration::from_secs(2),
            Some(Budget::Bytes(1)),
        )
        .unwrap();
    assert!(sw.chosen.is_none());
    let svg = graphopt::remat_sweep_svg("m", &sw);
    let pic = read(&svg);
    pic.assert_texts(&["No point of auto's frontier fits the budget 1 B"]);
    assert!(!svg.contains("class=\"chosen\""));
    pic.assert_legend(&["auto", "store-all (no recomputation)"]);
}

#[test]
fn pictures_are_byte_identical_run_to_run() {
    let mut a = matmul_chain();
    let mut b = matmul_chain();
    let sa = graphopt::remat_sweep_svg(
        "m",
        &a.remat_sweep(
            &DimValues::default(),
            &[RematStrategy::Auto, RematStrategy::Fast],
            4,
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let sb = graphopt::remat_sweep_svg(
        "m",
        &b.remat_sweep(
            &DimValues::default(),
            &[RematStrategy::Auto, RematStrategy::Fast],
            4,
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    assert_eq!(sa, sb);
}

#[test]
fn train_picture_draws_the_loss_and_the_eval_metric() {
    let mut s = graphopt::load(testdata("train/digits_mlp.onnx")).unwrap();
    let data = graphopt::MappedData::open(&testdata("train/digits_mlp.train.npz")).unwrap();
    let eval = graphopt::MappedData::open(&testdata("quant/digits_mlp.test.npz")).unwrap();
    let mut opts = graphopt::TrainOptions::new(128);
    opts.target = "y".into();
    opts.optimizer = graphopt::OptimizerSpec::named("adamw");
    opts.length = graphopt::TrainLength::Epochs(2);
    let r = s.train(&data, Some(&eval), &opts).unwrap();
    assert_eq!((r.steps, r.evals.len()), (18, 2));
    let svg = graphopt::train_svg("digits_mlp", &r);
    let pic = read(&svg);
    pic.assert_texts(&["Training: digits_mlp", "18 steps of 128 examples"]);
    assert_eq!(
        pic.axis_titles,
        ["step", "loss", "step", "eval accuracy (%)"]
    );
    assert_eq!(pic.plots.len(), 2);
    pic.assert_ticks(0);
    pic.assert_ticks(1);
    pic.assert_legend(&["training loss", "eval accuracy"]);
    let (loss, acc) = (pic.pixels_near(0, BLUE), pic.pixels_near(1, GREEN));
    assert!(loss > 300 && acc > 150, "loss {loss}, accuracy {acc}");
}
