//! Checks of what a user gives graphopt, done once in the library so that
//! the command and the Python binding answer a bad value with the same
//! line: the numeric options of every `Session` method (`validate` on each
//! options struct, called first thing by the method), and the data read
//! from files ([`ensure_finite`]: NaN or Inf in an input or calibration
//! array is an error naming the file, the batch, the array and the first
//! bad element).
//!
//! Messages name the option as the command spells it (`--threads 0: ...`),
//! as the other option errors of the library do.

use crate::check::CheckOptions;
use crate::error::{Error, Result};
use crate::grad::GradOptions;
use crate::inputs::Inputs;
use crate::optimize::OptimizeOptions;
use crate::precision::{PrecisionOptions, ValidateOptions};
use crate::remat::{Budget, RematOptions};
use crate::run::RunOptions;
use crate::session::PlanRequest;
use graphopt_autodiff::Optimizer;
use graphopt_passes::remat::Strategy;
use graphopt_plan::{DimValues, IntervalOptions, PlanOptions};
use graphopt_tract::TractTensor;
use std::time::Duration;
use tract_onnx::prelude::DatumType;

/// An error unless every float element of `arrays` is finite. `place`
/// says where they came from (`calib/b03.npz (calibration batch 3 of
/// 8)`); the error names it, the array, the first bad element's index and
/// how many are bad:
///
/// `x.npz: array 'x' holds NaN at [0, 2] (first of 3 non-finite elements
/// of 8); graphopt refuses non-finite input data`
///
/// Integer and boolean arrays are always finite. A NaN in an input runs
/// through every kernel and comes out as NaN outputs, NaN activation
/// scales or a NaN error bound, none of which says where it came from.
pub fn ensure_finite<'a>(
    place: &str,
    arrays: impl IntoIterator<Item = (&'a str, &'a TractTensor)>,
) -> Result<()> {
    for (name, t) in arrays {
        let bad = match t.datum_type() {
            DatumType::F32 => t
                .to_plain_array_view::<f32>()
                .ok()
                .and_then(|a| first_bad(a.iter().copied())),
            DatumType::F64 => t
                .to_plain_array_view::<f64>()
                .ok()
                .and_then(|a| first_bad(a.iter().copied())),
            DatumType::F16 => {
                let c = t.cast_to::<f32>().map_err(|e| Error::new(e.to_string()))?;
                c.to_plain_array_view::<f32>()
                    .ok()
                    .and_then(|a| first_bad(a.iter().copied()))
            }
            _ => None,
        };
        if let Some((i, value, count)) = bad {
            return Err(Error::new(format!(
                "{place}: array '{name}' holds {value} at {} (first of {count} non-finite \
                 elements of {}); graphopt refuses non-finite input data",
                index_of(i, t.shape()),
                t.len()
            )));
        }
    }
    Ok(())
}

/// [`ensure_finite`] for host tensors (the runtime's and Python's arrays).
pub fn ensure_finite_host<'a>(
    place: &str,
    arrays: impl IntoIterator<Item = (&'a str, &'a graphopt_exec::HostTensor)>,
) -> Result<()> {
    use graphopt_ir::DType;
    for (name, t) in arrays {
        let b = &t.data;
        let bad = match t.dtype {
            DType::F32 => first_bad(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            DType::F64 => first_bad(
                b.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))),
            ),
            DType::F16 => first_bad(
                b.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            DType::BF16 => first_bad(
                b.chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            _ => None,
        };
        if let Some((i, value, count)) = bad {
            let n: usize = t.shape.iter().product();
            return Err(Error::new(format!(
                "{place}: array '{name}' holds {value} at {} (first of {count} non-finite \
                 elements of {n}); graphopt refuses non-finite input data",
                index_of(i, &t.shape),
            )));
        }
    }
    Ok(())
}

/// A float that may be NaN or infinite.
trait Float: Copy + std::fmt::Display {
    fn finite(self) -> bool;
}

impl Float for f32 {
    fn finite(self) -> bool {
        self.is_finite()
    }
}

impl Float for f64 {
    fn finite(self) -> bool {
        self.is_finite()
    }
}

/// The first non-finite element (its flat index, row-major, and value as
/// text) and how many there are.
fn first_bad<T: Float>(v: impl Iterator<Item = T>) -> Option<(usize, String, usize)> {
    let mut first = None;
    let mut count = 0;
    for (i, x) in v.enumerate() {
        if !x.finite() {
            count += 1;
            first.get_or_insert((i, x.to_string()));
        }
    }
    first.map(|(i, x)| (i, x, count))
}

/// `[i0, i1, ...]`: a row-major flat index in `shape`.
fn index_of(mut flat: usize, shape: &[usize]) -> String {
    let mut idx = vec![0usize; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = flat % d;
            flat /= d;
        }
    }
    format!(
        "[{}]",
        idx.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// `s` seconds as a time limit: finite and above 0 (a negative or NaN
/// number of seconds is no limit at all, and `Duration` cannot hold it).
pub fn seconds(option: &str, s: f64) -> Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        return Err(Error::new(format!(
            "{option} {s}: expected a positive number of seconds"
        )));
    }
    Duration::try_from_secs_f64(s)
        .map_err(|_| Error::new(format!("{option} {s}: too many seconds")))
}

fn time_limit(option: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::new(format!(
            "{option} 0: expected a positive number of seconds"
        )));
    }
    Ok(())
}

/// A tolerance: finite and at least 0.
fn tolerance(option: &str, x: f64) -> Result<()> {
    if !(x.is_finite() && x >= 0.0) {
        return Err(Error::new(format!(
            "{option} {x}: expected a number at least 0"
        )));
    }
    Ok(())
}

fn threads(option: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::new(format!(
            "{option} 0: expected at least 1 thread"
        )));
    }
    Ok(())
}

/// Kernel threads of a run: at least 1, at most what this process can run
/// at once.
pub(crate) fn run_threads(option: &str, n: usize) -> Result<()> {
    threads(option, n)?;
    let max = graphopt_exec::cpu::par::max_threads();
    if n > max {
        return Err(Error::new(format!(
            "{option} {n}: this machine runs at most {max} threads at once"
        )));
    }
    Ok(())
}

/// `NAME=VALUE` dim bindings: no dim is negative.
pub(crate) fn dims(bound: &[(String, i64)]) -> Result<()> {
    for (k, v) in bound {
        if *v < 0 {
            return Err(Error::new(format!(
                "--dim {k}={v}: a dim cannot be negative"
            )));
        }
    }
    Ok(())
}

fn dim_values(d: &DimValues) -> Result<()> {
    dims(&d.bound)?;
    for (k, s) in &d.shapes {
        if let Some(x) = s.iter().find(|&&x| x < 0) {
            return Err(Error::new(format!(
                "--shape {k}: dim {x} cannot be negative"
            )));
        }
    }
    if let Some(x) = d.default.filter(|&x| x < 0) {
        return Err(Error::new(format!(
            "--default-dim {x}: a dim cannot be negative"
        )));
    }
    Ok(())
}

fn plan_options(o: &PlanOptions) -> Result<()> {
    if o.alignment == 0 || !o.alignment.is_power_of_two() {
        return Err(Error::new(format!(
            "--alignment {}: expected a power of two (1, 2, 4, ..., 256)",
            o.alignment
        )));
    }
    threads("--threads", o.threads)?;
    if let Some(t) = o.time_limit {
        time_limit("--time-limit", t)?;
    }
    Ok(())
}

impl Inputs {
    /// An error when the inputs given (an npz, or tensors) hold NaN or Inf
    /// (see [`ensure_finite`]); seeded random inputs always pass. Reads
    /// the npz: [`Inputs::materialize`] checks on its own, this is for
    /// callers that must refuse bad data before a step that would only
    /// note the failure (the fp16 range check).
    pub fn ensure_finite(&self, model: &graphopt_ir::Model) -> Result<()> {
        match self {
            Inputs::Random {
                dims: d,
                default_dim,
                ..
            } => {
                dims(d)?;
                if *default_dim < 0 {
                    return Err(Error::new(format!(
                        "default dim {default_dim}: a dim cannot be negative"
                    )));
                }
                Ok(())
            }
            _ => self.materialize(model).map(|_| ()),
        }
    }
}

impl RunOptions {
    /// At least one timed run and one thread; dims not negative.
    pub fn validate(&self) -> Result<()> {
        if self.repeat == 0 {
            return Err(Error::new("--repeat 0: expected at least 1 run"));
        }
        if let Some(n) = self.threads {
            run_threads("--threads", n)?;
        }
        if self.profile && self.device == crate::run::Device::Cuda {
            return Err(Error::new(
                "--profile times the CPU runtime's kernels; it is not available with --device cuda",
            ));
        }
        dims(&self.dims)
    }
}

impl CheckOptions {
    /// Tolerances finite and at least 0.
    pub fn validate(&self) -> Result<()> {
        tolerance("--rtol", self.tolerance.rtol)?;
        tolerance("--atol", self.tolerance.atol)
    }
}

impl ValidateOptions {
    /// Tolerances finite and at least 0.
    pub fn validate(&self) -> Result<()> {
        tolerance("--rtol", self.rtol)?;
        tolerance("--atol", self.atol)
    }
}

impl PrecisionOptions {
    /// The validation's tolerances, the memory dims, and the inputs of the
    /// validation and of the range check: finite (an npz of NaNs would
    /// otherwise only skip the range check, with a note).
    pub fn validate(&self, model: &graphopt_ir::Model) -> Result<()> {
        if let Some(v) = &self.validate {
            v.validate()?;
            v.inputs.ensure_finite(model)?;
        }
        if let Some(d) = &self.memory {
            dim_values(d)?;
        }
        if let Some(i) = &self.range_check {
            i.ensure_finite(model)?;
        }
        Ok(())
    }
}

impl OptimizeOptions {
    /// At least one round.
    pub fn validate(&self) -> Result<()> {
        if self.max_rounds == Some(0) {
            return Err(Error::new("max_rounds 0: expected at least 1 round"));
        }
        if let (Some(c), Some(q)) = (&self.compress, &self.quantize) {
            if matches!(c.method, crate::CompressMethod::Cluster { .. }) {
                return Err(Error::new(format!(
                    "--compress {} and --quantize {}: both store each weight in fewer bits; choose one (lowrank and share combine with --quantize)",
                    c.method.name(),
                    q.mode.name()
                )));
            }
        }
        if let Some(c) = &self.compress {
            c.validate()?;
        }
        Ok(())
    }
}

impl GradOptions {
    /// The optimizer's hyperparameters (learning rate above 0, weight
    /// decay at least 0, AdamW's betas in [0, 1) and epsilon above 0, all
    /// finite), the dims not negative.
    pub fn validate(&self) -> Result<()> {
        let positive = |option: &str, x: f64| -> Result<()> {
            if !(x.is_finite() && x > 0.0) {
                return Err(Error::new(format!(
                    "{option} {x}: expected a positive number"
                )));
            }
            Ok(())
        };
        match self.autodiff.optimizer {
            Optimizer::None => {}
            Optimizer::Sgd { lr, weight_decay } => {
                positive("--lr", lr as f64)?;
                tolerance("--weight-decay", weight_decay as f64)?;
            }
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                positive("--lr", lr)?;
                for b in [beta1, beta2] {
                    if !(0.0..1.0).contains(&b) {
                        return Err(Error::new(format!(
                            "--betas {beta1},{beta2}: each beta must be in [0, 1)"
                        )));
                    }
                }
                positive("--eps", eps)?;
                tolerance("--weight-decay", weight_decay)?;
            }
        }
        dim_values(&self.dims)
    }
}

impl RematOptions {
    /// A budget above 0, a time limit above 0, dims not negative.
    pub fn validate(&self) -> Result<()> {
        match self.budget {
            Budget::Bytes(0) => return Err(Error::new("--budget 0: expected a size above 0")),
            Budget::Percent(p) if !(p.is_finite() && p > 0.0) => {
                return Err(Error::new(format!("--budget {p}%: must be above 0%")))
            }
            _ => {}
        }
        time_limit("--time-limit", self.time_limit)?;
        dim_values(&self.dims)
    }
}

/// The arguments of [`crate::Session::remat_sweep`]: a strategy, at least
/// two points per frontier (store-all and the least peak), a time limit
/// above 0.
pub(crate) fn remat_sweep(
    d: &DimValues,
    strategies: &[Strategy],
    points: usize,
    limit: Duration,
) -> Result<()> {
    if strategies.is_empty() {
        return Err(Error::new("remat sweep: no strategy given"));
    }
    if points < 2 {
        return Err(Error::new(format!(
            "--points {points}: expected at least 2 (store-all and the least peak)"
        )));
    }
    time_limit("--time-limit", limit)?;
    dim_values(d)
}

/// The arguments of [`crate::Session::max_batch_remat`].
pub(crate) fn max_batch_remat(d: &DimValues, limit: Duration) -> Result<()> {
    time_limit("--time-limit", limit)?;
    dim_values(d)
}

impl PlanRequest {
    /// Dims and shapes not negative; alignment a power of two; threads
    /// at least 1; a time limit above 0.
    pub fn validate(&self) -> Result<()> {
        dim_values(&self.dims)?;
        plan_options(&self.options)
    }
}

/// Options of [`graphopt_plan::plan_intervals`] (`graphopt plan
/// --intervals`): threads at least 1, a time limit above 0 (alignment 0 is
/// documented there as none).
pub fn validate_interval_options(o: &IntervalOptions) -> Result<()> {
    threads("--threads", o.threads)?;
    if let Some(t) = o.time_limit {
        time_limit("--time-limit", t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::prelude::Tensor;

    fn err(r: Result<()>) -> String {
        r.expect_err("must be refused").message().to_string()
    }

    #[test]
    fn non_finite_arrays_are_named_with_the_first_bad_index() {
        let ok = Tensor::from_shape(&[2, 2], &[1f32, 2.0, 3.0, 4.0]).unwrap();
        let ids = Tensor::from_shape(&[2], &[1i64, 2]).unwrap();
        let bad =
            Tensor::from_shape(&[2, 3], &[0f32, 1.0, 2.0, 3.0, f32::NAN, f32::INFINITY]).unwrap();
        ensure_finite("a.npz", [("x", &ok), ("ids", &ids)]).unwrap();
        let m = err(ensure_finite(
            "a.npz (batch 2 of 3)",
            [("x", &ok), ("y", &bad)],
        ));
        assert_eq!(
            m,
            "a.npz (batch 2 of 3): array 'y' holds NaN at [1, 1] (first of 2 non-finite \
             elements of 6); graphopt refuses non-finite input data"
        );
        let inf64 = Tensor::from_shape(&[3], &[0f64, f64::NEG_INFINITY, 1.0]).unwrap();
        let m = err(ensure_finite("b.npz", [("z", &inf64)]));
        assert!(m.contains("'z' holds -inf at [1] (first of 1"), "{m}");
        let f16 = inf64
            .cast_to::<tract_onnx::prelude::f16>()
            .unwrap()
            .into_owned();
        let m = err(ensure_finite("c.npz", [("h", &f16)]));
        assert!(m.contains("'h' holds -inf at [1]"), "{m}");
        let scalar = tract_onnx::prelude::tensor0(f32::NAN);
        assert!(err(ensure_finite("d", [("s", &scalar)])).contains("at []"));
    }

    #[test]
    fn run_options_are_range_checked() {
        let ok = RunOptions::default();
        ok.validate().unwrap();
        let m = err(RunOptions {
            threads: Some(0),
            ..RunOptions::default()
        }
        .validate());
        assert_eq!(m, "--threads 0: expected at least 1 thread");
        assert!(err(RunOptions {
            repeat: 0,
            ..RunOptions::default()
        }
        .validate())
        .starts_with("--repeat 0"));
        assert!(err(RunOptions {
            dims: vec![("batch".into(), -1)],
            ..RunOptions::default()
        }
        .validate())
        .contains("batch=-1"));
    }

    #[test]
    fn tolerances_and_seconds_are_range_checked() {
        let mut c = CheckOptions::default();
        c.validate().unwrap();
        c.tolerance.rtol = -1e-3;
        assert!(err(c.validate()).starts_with("--rtol -0.001"));
        c.tolerance.rtol = 0.0;
        c.tolerance.atol = f64::NAN;
        assert!(err(c.validate()).starts_with("--atol NaN"));
        assert_eq!(
            seconds("--time-limit", 1.5).unwrap(),
            Duration::from_millis(1500)
        );
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(err(seconds("--time-limit", s).map(|_| ())).starts_with("--time-limit"));
        }
        assert!(err(seconds("--time-limit", 1e300).map(|_| ())).contains("too many"));
    }

    #[test]
    fn grad_options_are_range_checked() {
        let with = |o: Optimizer| GradOptions {
            autodiff: crate::AutodiffOptions {
                optimizer: o,
                ..Default::default()
            },
            ..GradOptions::default()
        };
        with(Optimizer::adamw_default()).validate().unwrap();
        with(Optimizer::Sgd {
            lr: 0.01,
            weight_decay: 0.0,
        })
        .validate()
        .unwrap();
        let adamw = |lr, beta1, beta2, eps, weight_decay| {
            err(with(Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            })
            .validate())
        };
        assert!(adamw(0.0, 0.9, 0.999, 1e-8, 0.0).starts_with("--lr 0"));
        assert!(adamw(1e-3, 0.9, 1.0, 1e-8, 0.0).starts_with("--betas 0.9,1"));
        assert!(adamw(1e-3, -0.1, 0.9, 1e-8, 0.0).starts_with("--betas"));
        assert!(adamw(1e-3, 0.9, 0.999, 0.0, 0.0).starts_with("--eps 0"));
        assert!(adamw(1e-3, 0.9, 0.999, 1e-8, -1.0).starts_with("--weight-decay -1"));
        // An f64 learning rate beyond f32 is infinite once the SGD graph
        // stores it.
        let m = err(with(Optimizer::Sgd {
            lr: 1e39f64 as f32,
            weight_decay: 0.0,
        })
        .validate());
        assert!(m.starts_with("--lr inf"), "{m}");
    }

    #[test]
    fn plan_and_remat_options_are_range_checked() {
        PlanRequest::default().validate().unwrap();
        let with = |f: &dyn Fn(&mut PlanRequest)| {
            let mut r = PlanRequest::default();
            f(&mut r);
            r.validate()
        };
        assert!(err(with(&|r| r.options.alignment = 0)).starts_with("--alignment 0"));
        assert!(err(with(&|r| r.options.alignment = 48)).starts_with("--alignment 48"));
        with(&|r| r.options.alignment = 1).unwrap();
        assert!(err(with(&|r| r.options.threads = 0)).starts_with("--threads 0"));
        assert!(err(with(&|r| r.options.time_limit = Some(Duration::ZERO)))
            .starts_with("--time-limit 0"));
        assert!(err(with(&|r| r.dims.default = Some(-1))).starts_with("--default-dim -1"));
        assert!(
            err(with(&|r| r.dims.shapes = vec![("x".into(), vec![1, -3])]))
                .starts_with("--shape x")
        );
        RematOptions::default().validate().unwrap();
        assert!(err(RematOptions {
            budget: Budget::Bytes(0),
            ..RematOptions::default()
        }
        .validate())
        .starts_with("--budget 0"));
        assert!(err(RematOptions {
            time_limit: Duration::ZERO,
            ..RematOptions::default()
        }
        .validate())
        .starts_with("--time-limit 0"));
        let d = DimValues::default();
        let one = Duration::from_secs(1);
        remat_sweep(&d, &[Strategy::Auto], 2, one).unwrap();
        assert!(err(remat_sweep(&d, &[Strategy::Auto], 1, one)).starts_with("--points 1"));
        assert!(err(remat_sweep(&d, &[], 4, one)).contains("no strategy"));
        assert!(err(OptimizeOptions {
            max_rounds: Some(0),
            ..OptimizeOptions::default()
        }
        .validate())
        .starts_with("max_rounds 0"));
        assert!(err(validate_interval_options(&IntervalOptions {
            threads: 0,
            ..IntervalOptions::default()
        }))
        .starts_with("--threads 0"));
    }
}
