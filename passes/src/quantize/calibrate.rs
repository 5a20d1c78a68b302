//! Activation ranges for static quantization, from values an executor
//! produced on calibration batches.
//!
//! The executor is the caller's (the facade runs the float model and feeds
//! every batch's values here); this file only turns values into the
//! `(lo, hi)` ranges that [`Quantize::ranges`](super::Quantize) reads:
//! - `minmax`: the least and greatest finite value over all batches;
//! - `percentile:P`: the P-th percentile of |x| over a bounded sample,
//!   clipped to min/max;
//! - `entropy`: TensorRT's entropy calibration, the |x| threshold that
//!   minimizes the KL divergence of the clipped 128-level histogram from
//!   the full one (2048 bins), clipped to min/max.
//!
//! ```text
//! batches (values of "h")      ranges
//!   [-1.0, 0.5, 3.0]            minmax:        h = (-1.0, 3.0)
//!   [-0.5, 2.0, 250.0]   ==>    percentile:50: h = (-1.0, 2.0)
//! ```

use crate::PassError;
use std::collections::BTreeMap;

/// How activation ranges are taken from the calibration data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Calibrate {
    MinMax,
    /// The P-th percentile of |x| (P in (0, 100]), within min/max.
    Percentile(f64),
    /// The |x| threshold minimizing the KL divergence of the clipped,
    /// 128-level histogram from the full one (2048 bins).
    Entropy,
}

impl Calibrate {
    /// `minmax`, `percentile` (99.999), `percentile:P`, `entropy`.
    pub fn parse(s: &str) -> Result<Calibrate, PassError> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "minmax" => Ok(Calibrate::MinMax),
            "entropy" => Ok(Calibrate::Entropy),
            "percentile" => Ok(Calibrate::Percentile(99.999)),
            _ => match s.strip_prefix("percentile:") {
                Some(p) => match p.parse::<f64>() {
                    Ok(p) if p > 0.0 && p <= 100.0 => Ok(Calibrate::Percentile(p)),
                    _ => Err(PassError(format!(
                        "--calibrate {s}: the percentile must be a number in (0, 100]"
                    ))),
                },
                None => Err(PassError(format!(
                    "--calibrate {s}: expected minmax, percentile[:P] or entropy"
                ))),
            },
        }
    }

    pub fn name(&self) -> String {
        match self {
            Calibrate::MinMax => "minmax".into(),
            Calibrate::Percentile(p) => format!("percentile:{p}"),
            Calibrate::Entropy => "entropy".into(),
        }
    }
}

/// Values kept per activation for `percentile` and `entropy`, over all
/// batches together.
const SAMPLE: usize = 1 << 18;

/// Collects, per activation, min/max and (for `percentile`/`entropy`) an
/// evenly strided sample of the finite values, batch by batch.
pub struct RangeCollector {
    how: Calibrate,
    batches: usize,
    lo: Vec<f32>,
    hi: Vec<f32>,
    samples: Vec<Vec<f32>>,
}

impl RangeCollector {
    /// For `activations` values, over `batches` batches (which sizes the
    /// sample each batch adds).
    pub fn new(activations: usize, batches: usize, how: Calibrate) -> RangeCollector {
        RangeCollector {
            how,
            batches: batches.max(1),
            lo: vec![f32::INFINITY; activations],
            hi: vec![f32::NEG_INFINITY; activations],
            samples: vec![Vec::new(); activations],
        }
    }

    /// Adds one batch's values of activation `i`. Non-finite values are
    /// left out (the caller refuses non-finite calibration inputs; what the
    /// model itself computes as Inf does not set a range).
    pub fn add(&mut self, i: usize, values: &[f32]) {
        for &x in values {
            if x.is_finite() {
                self.lo[i] = self.lo[i].min(x);
                self.hi[i] = self.hi[i].max(x);
            }
        }
        if self.how != Calibrate::MinMax {
            let step = (values.len() / (SAMPLE / self.batches).max(1)).max(1);
            self.samples[i].extend(values.iter().step_by(step).filter(|x| x.is_finite()));
        }
    }

    /// The ranges by name (`names[i]` is activation `i`); an activation
    /// that never had a finite value has none.
    pub fn finish(self, names: &[String]) -> BTreeMap<String, (f32, f32)> {
        let mut out = BTreeMap::new();
        for (i, n) in names.iter().enumerate().take(self.lo.len()) {
            let (lo, hi) = (self.lo[i], self.hi[i]);
            if !lo.is_finite() || !hi.is_finite() {
                continue;
            }
            let t = match self.how {
                Calibrate::MinMax => None,
                Calibrate::Percentile(p) => Some(percentile_abs(&self.samples[i], p)),
                Calibrate::Entropy => Some(entropy_threshold(&self.samples[i])),
            };
            let range = match t {
                Some(t) if t > 0.0 => (lo.max(-t), hi.min(t)),
                _ => (lo, hi),
            };
            out.insert(n.clone(), range);
        }
        out
    }
}

/// The P-th percentile of |x| (nearest rank).
pub fn percentile_abs(v: &[f32], p: f64) -> f32 {
    if v.is_empty() {
        return 0.0;
    }
    let mut a: Vec<f32> = v.iter().map(|x| x.abs()).collect();
    a.sort_by(|x, y| x.total_cmp(y));
    let i = ((p / 100.0) * (a.len() - 1) as f64).round() as usize;
    a[i.min(a.len() - 1)]
}

/// TensorRT's entropy calibration on |x|: 2048 bins; for each threshold
/// bin i in 128..=2048, the distribution clipped at i (outliers added to
/// the last bin) against its 128-level quantization; the i with least KL.
pub fn entropy_threshold(v: &[f32]) -> f32 {
    const BINS: usize = 2048;
    const LEVELS: usize = 128;
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if amax == 0.0 || v.is_empty() {
        return amax;
    }
    let w = amax / BINS as f32;
    let mut hist = vec![0f64; BINS];
    for x in v {
        let b = ((x.abs() / w) as usize).min(BINS - 1);
        hist[b] += 1.0;
    }
    let mut best = (f64::INFINITY, BINS);
    for i in (LEVELS..=BINS).step_by(16) {
        let mut p: Vec<f64> = hist[..i].to_vec();
        p[i - 1] += hist[i..].iter().sum::<f64>();
        // Quantize the clipped p into LEVELS levels, spread back over the
        // non-empty bins of each level.
        let mut q = vec![0f64; i];
        let per = i as f64 / LEVELS as f64;
        for l in 0..LEVELS {
            let (s, e) = (
                (l as f64 * per) as usize,
                (((l + 1) as f64 * per) as usize).min(i),
            );
            let total: f64 = hist[s..e].iter().sum();
            let nz = hist[s..e].iter().filter(|&&x| x > 0.0).count();
            if nz > 0 {
                for (k, q) in q[s..e].iter_mut().enumerate() {
                    if hist[s + k] > 0.0 {
                        *q = total / nz as f64;
                    }
                }
            }
        }
        let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
        if sp == 0.0 || sq == 0.0 {
            continue;
        }
        p.iter_mut().for_each(|x| *x /= sp);
        q.iter_mut().for_each(|x| *x /= sq);
        // onnxruntime's smoothing: empty bins get 1e-4, taken evenly from
        // the others, so that mass outside q costs in proportion.
        if !smooth(&mut p) || !smooth(&mut q) {
            continue;
        }
        let kl: f64 = p.iter().zip(&q).map(|(a, b)| a * (a / b).ln()).sum();
        if kl < best.0 {
            best = (kl, i);
        }
    }
    w * best.1 as f32
}

fn smooth(d: &mut [f64]) -> bool {
    const EPS: f64 = 1e-4;
    let zeros = d.iter().filter(|&&x| x == 0.0).count();
    let nonzeros = d.len() - zeros;
    if nonzeros == 0 {
        return false;
    }
    let eps1 = EPS * zeros as f64 / nonzeros as f64;
    if eps1 >= 1.0 {
        return false;
    }
    for x in d.iter_mut() {
        *x = if *x == 0.0 { EPS } else { *x - eps1 };
    }
    d.iter().all(|&x| x > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["h".to_string(), "never".to_string()]
    }

    #[test]
    fn minmax_spans_every_batch_and_skips_non_finite() {
        let mut c = RangeCollector::new(2, 2, Calibrate::MinMax);
        c.add(0, &[-1.0, 0.5, 3.0]);
        c.add(0, &[-0.5, f32::INFINITY, 2.0, f32::NAN]);
        c.add(1, &[f32::NAN]);
        let r = c.finish(&names());
        assert_eq!(r.get("h"), Some(&(-1.0, 3.0)));
        assert!(!r.contains_key("never"), "{r:?}");
    }

    #[test]
    fn percentile_clips_the_outlier() {
        let mut c = RangeCollector::new(1, 2, Calibrate::Percentile(50.0));
        c.add(0, &[-1.0, 0.5, 3.0]);
        c.add(0, &[-0.5, 2.0, 250.0]);
        let r = c.finish(&names());
        // |x| sorted: 0.5 0.5 1 2 3 250; the median rank (2.5 -> 3) is 2.
        assert_eq!(r.get("h"), Some(&(-1.0, 2.0)));
    }

    #[test]
    fn entropy_threshold_clips_far_outliers() {
        // A Laplace-shaped sample (|x| up to ~10.6) with two far outliers.
        let mut v: Vec<f32> = (0..20000)
            .map(|i| {
                let u = (i as f32 + 0.5) / 20000.0;
                if i % 2 == 0 {
                    -u.ln()
                } else {
                    u.ln()
                }
            })
            .collect();
        v.extend([100.0, -90.0]);
        let t = entropy_threshold(&v);
        assert!(t > 2.0 && t < 50.0, "{t}");
    }

    #[test]
    fn parse_names_and_refusals() {
        for s in ["minmax", "entropy", "percentile", "percentile:99.9"] {
            let c = Calibrate::parse(s).unwrap();
            assert_eq!(Calibrate::parse(&c.name()).unwrap(), c);
        }
        let e = Calibrate::parse("percentile:0").unwrap_err();
        assert!(e.0.contains("(0, 100]"), "{e}");
        assert!(Calibrate::parse("kl").unwrap_err().0.contains("expected"));
    }
}
