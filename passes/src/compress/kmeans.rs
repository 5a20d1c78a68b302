//! One-dimensional k-means for `cluster`.
//!
//! On a line, every cluster of a k-means solution is a run of the sorted
//! values, bounded by the midpoints between neighbouring centroids. So
//! after one sort, a Lloyd iteration is `k` binary searches and `k` means
//! from prefix sums: O(k log n), not O(n k). Seeding is k-means++ (each
//! next centroid drawn with probability proportional to the squared
//! distance to the nearest one so far) on an evenly spaced sample of the
//! sorted values, from a fixed seed: the same weights always give the
//! same palette. The best of [`RESTARTS`] seedings (least squared error
//! after Lloyd) is kept.

/// Seedings tried; the least squared error wins.
pub const RESTARTS: u64 = 3;
/// Values the k-means++ seeding draws from (an evenly spaced sample).
const SAMPLE: usize = 4096;
/// Lloyd iterations at most (they stop when no boundary moves).
const ITERATIONS: usize = 100;

/// A palette: centroids (ascending) and the squared error of assigning
/// every value to its nearest one.
#[derive(Clone, Debug)]
pub struct Palette {
    pub centroids: Vec<f32>,
    pub sse: f64,
}

/// The k-means palette of at most `k` centroids for finite `values`
/// (fewer when they hold fewer distinct values: then it is exact).
pub fn palette(values: &[f32], k: usize, seed: u64) -> Palette {
    let mut sorted: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    sorted.sort_by(f64::total_cmp);
    let mut distinct: Vec<f64> = sorted.clone();
    distinct.dedup();
    if distinct.len() <= k {
        return Palette {
            centroids: distinct.iter().map(|&v| v as f32).collect(),
            sse: 0.0,
        };
    }
    let n = sorted.len();
    let mut s1 = vec![0.0; n + 1];
    let mut s2 = vec![0.0; n + 1];
    for (i, &x) in sorted.iter().enumerate() {
        s1[i + 1] = s1[i] + x;
        s2[i + 1] = s2[i] + x * x;
    }
    let step = n.div_ceil(SAMPLE).max(1);
    let sample: Vec<f64> = sorted.iter().step_by(step).copied().collect();
    let mut best: Option<(Vec<f64>, f64)> = None;
    for r in 0..RESTARTS {
        let mut c = seed_plus_plus(&sample, k, seed ^ (r.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        lloyd(&sorted, &s1, &mut c);
        let e = sse(&sorted, &s1, &s2, &c);
        if best.as_ref().is_none_or(|b| e < b.1) {
            best = Some((c, e));
        }
    }
    let (c, e) = best.expect("at least one restart");
    Palette {
        centroids: c.iter().map(|&v| v as f32).collect(),
        sse: e,
    }
}

/// The index of the nearest centroid (ascending `centroids`) for each value.
pub fn assign(values: &[f32], centroids: &[f32]) -> Vec<u8> {
    let mids: Vec<f32> = centroids.windows(2).map(|w| midpoint(w[0], w[1])).collect();
    values
        .iter()
        .map(|&x| {
            // A value on a midpoint goes to the lower centroid.
            mids.partition_point(|&m| m < x) as u8
        })
        .collect()
}

fn midpoint(a: f32, b: f32) -> f32 {
    ((a as f64 + b as f64) / 2.0) as f32
}

/// A tiny deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// k-means++ seeding on the (sorted) sample; centroids ascending.
fn seed_plus_plus(sample: &[f64], k: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng(seed);
    let mut c = vec![sample[(rng.next() % sample.len() as u64) as usize]];
    let mut d2: Vec<f64> = sample.iter().map(|&x| (x - c[0]).powi(2)).collect();
    while c.len() < k {
        let total: f64 = d2.iter().sum();
        if total <= 0.0 {
            break;
        }
        let mut t = rng.unit() * total;
        let mut pick = sample.len() - 1;
        for (i, &w) in d2.iter().enumerate() {
            if t < w {
                pick = i;
                break;
            }
            t -= w;
        }
        let x = sample[pick];
        c.push(x);
        for (d, &s) in d2.iter_mut().zip(sample) {
            *d = d.min((s - x).powi(2));
        }
    }
    c.sort_by(f64::total_cmp);
    c.dedup();
    c
}

/// Start of each centroid's run of `sorted` (and `n` at the end).
fn runs(sorted: &[f64], c: &[f64]) -> Vec<usize> {
    let mut b = Vec::with_capacity(c.len() + 1);
    b.push(0);
    for w in c.windows(2) {
        let m = (w[0] + w[1]) / 2.0;
        b.push(sorted.partition_point(|&x| x < m));
    }
    b.push(sorted.len());
    b
}

fn lloyd(sorted: &[f64], s1: &[f64], c: &mut [f64]) {
    let mut last = Vec::new();
    for _ in 0..ITERATIONS {
        let b = runs(sorted, c);
        if b == last {
            break;
        }
        for j in 0..c.len() {
            let (lo, hi) = (b[j], b[j + 1]);
            if hi > lo {
                c[j] = (s1[hi] - s1[lo]) / (hi - lo) as f64;
            }
        }
        c.sort_by(f64::total_cmp);
        last = b;
    }
}

fn sse(sorted: &[f64], s1: &[f64], s2: &[f64], c: &[f64]) -> f64 {
    let b = runs(sorted, c);
    (0..c.len())
        .map(|j| {
            let (lo, hi) = (b[j], b[j + 1]);
            let n = (hi - lo) as f64;
            let (a, q) = (s1[hi] - s1[lo], s2[hi] - s2[lo]);
            (q - 2.0 * c[j] * a + n * c[j] * c[j]).max(0.0)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_distinct_values_are_kept_exactly() {
        let v = [0.5f32, -1.0, 0.5, 2.0, -1.0];
        let p = palette(&v, 4, 1);
        assert_eq!(p.centroids, vec![-1.0, 0.5, 2.0]);
        assert_eq!(p.sse, 0.0);
        let idx = assign(&v, &p.centroids);
        assert_eq!(idx, vec![1, 0, 1, 2, 0]);
    }

    #[test]
    fn finds_well_separated_clusters() {
        // Three tight clusters around -5, 0 and 7.
        let mut v = Vec::new();
        for i in 0..300 {
            let j = (i % 7) as f32 * 0.01;
            v.push(match i % 3 {
                0 => -5.0 + j,
                1 => j,
                _ => 7.0 + j,
            });
        }
        let p = palette(&v, 3, 7);
        assert_eq!(p.centroids.len(), 3);
        for (c, want) in p.centroids.iter().zip([-5.0f32, 0.0, 7.0]) {
            assert!((c - want).abs() < 0.05, "{:?}", p.centroids);
        }
        // The squared error is what assigning to the centroids gives.
        let idx = assign(&v, &p.centroids);
        let e: f64 = v
            .iter()
            .zip(&idx)
            .map(|(&x, &i)| (x as f64 - p.centroids[i as usize] as f64).powi(2))
            .sum();
        assert!((e - p.sse).abs() < 1e-6 * e.max(1e-9), "{e} {}", p.sse);
    }

    #[test]
    fn beats_a_uniform_grid_on_a_gaussian_and_is_deterministic() {
        // Box-Muller normals from a fixed generator.
        let mut r = Rng(5);
        let v: Vec<f32> = (0..20000)
            .map(|_| {
                let (a, b) = (r.unit().max(1e-12), r.unit());
                ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
            })
            .collect();
        let p = palette(&v, 16, 42);
        assert_eq!(p.centroids.len(), 16);
        // A uniform 16-level grid over [min, max] (what an affine int4
        // grid does with one scale).
        let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let grid: Vec<f32> = (0..16).map(|i| lo + (hi - lo) * i as f32 / 15.0).collect();
        let gi = assign(&v, &grid);
        let ge: f64 = v
            .iter()
            .zip(&gi)
            .map(|(&x, &i)| (x as f64 - grid[i as usize] as f64).powi(2))
            .sum();
        assert!(p.sse < 0.5 * ge, "k-means {} grid {ge}", p.sse);
        let again = palette(&v, 16, 42);
        assert_eq!(again.centroids, p.centroids);
    }
}
