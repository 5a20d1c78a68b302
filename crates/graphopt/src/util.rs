//! Small shared helpers: atomic writes, dim bindings, op histograms.

use crate::error::{Error, Result};
use std::path::Path;

pub use crate::validate::{ensure_finite, seconds, validate_interval_options};
pub use graphopt_plan::{human_bytes, parse_size};

/// Writes `bytes` to `path` atomically: a temporary file beside it, then a
/// rename, so a reader never sees half a file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".graphopt-")
        .tempfile_in(dir)
        .map_err(|e| {
            Error::new(format!(
                "{}: cannot create a temporary file: {e}",
                path.display()
            ))
        })?;
    tmp.write_all(bytes)
        .map_err(|e| Error::new(format!("{}: cannot write: {e}", path.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path).map_err(|e| {
        Error::new(format!(
            "{}: cannot move into place: {}",
            path.display(),
            e.error
        ))
    })?;
    Ok(())
}

/// Parses `NAME=VALUE` dim bindings.
pub fn parse_dims(dims: &[String]) -> Result<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for d in dims {
        let Some((k, v)) = d.split_once('=') else {
            return Err(Error::new(format!("--dim '{d}': expected NAME=VALUE")));
        };
        let v: i64 = v
            .trim()
            .parse()
            .map_err(|_| Error::new(format!("--dim '{d}': '{v}' is not an integer")))?;
        if v < 0 {
            return Err(Error::new(format!("--dim '{d}': a dim cannot be negative")));
        }
        out.push((k.trim().to_string(), v));
    }
    Ok(out)
}

/// Node count per op type (domain-qualified), subgraphs included.
pub fn op_histogram(g: &graphopt_ir::Graph) -> std::collections::BTreeMap<String, usize> {
    fn walk(g: &graphopt_ir::Graph, ops: &mut std::collections::BTreeMap<String, usize>) {
        for n in g.nodes() {
            *ops.entry(g.node(n).qualified_op()).or_default() += 1;
        }
        for (_, s) in g.subgraphs() {
            walk(s, ops);
        }
    }
    let mut ops = std::collections::BTreeMap::new();
    walk(g, &mut ops);
    ops
}

/// Milliseconds with microsecond resolution.
pub fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// A float for JSON: non-finite values as strings ("inf", "NaN").
pub fn finite(x: f64) -> serde_json::Value {
    if x.is_finite() {
        serde_json::json!(x)
    } else {
        serde_json::json!(x.to_string())
    }
}

/// Parses `NAME=D0,D1,...` input shapes (`NAME=` for a scalar).
pub fn parse_shapes(shapes: &[String]) -> Result<Vec<(String, Vec<i64>)>> {
    let mut out = Vec::new();
    for s in shapes {
        let Some((k, v)) = s.rsplit_once('=') else {
            return Err(Error::new(format!(
                "--shape '{s}': expected NAME=D0,D1,..."
            )));
        };
        let dims = v
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                d.parse::<i64>().ok().filter(|&x| x >= 0).ok_or_else(|| {
                    Error::new(format!(
                        "--shape '{s}': '{d}' is not a dim (a non-negative integer)"
                    ))
                })
            })
            .collect::<Result<Vec<i64>>>()?;
        out.push((k.trim().to_string(), dims));
    }
    Ok(out)
}

/// The shapes of the arrays in a numpy `.npz`, by name: what an input file
/// binds when a plan is made for it.
pub fn npz_shapes(path: &Path) -> Result<Vec<(String, Vec<i64>)>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::new(format!("{}: cannot read: {e}", path.display())))?;
    let arrays = graphopt_tract::npz::read(&bytes)
        .map_err(|e| Error::new(format!("{}: {e:#}", path.display())))?;
    Ok(arrays
        .into_iter()
        .map(|(k, t)| (k, t.shape().iter().map(|&d| d as i64).collect()))
        .collect())
}

/// A transform run by [`Capture`]: the transform's report and the pass
/// statistics (warnings included) made from it.
pub(crate) type CaptureFn<R> = Box<
    dyn Fn(
        &mut graphopt_ir::Model,
    ) -> std::result::Result<(R, graphopt_passes::PassStats), graphopt_passes::PassError>,
>;

/// A transform with a full report (`lower_precision`, `quantize`) run as a
/// pass of the manager, so that `--dump-ir`, `--stop-after` and
/// `--time-passes` see it, keeping its report in `out` for the caller.
pub(crate) struct Capture<R> {
    pub name: &'static str,
    pub run: CaptureFn<R>,
    pub out: std::rc::Rc<std::cell::RefCell<Option<R>>>,
}

impl<R> graphopt_passes::Pass for Capture<R> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn run(
        &self,
        model: &mut graphopt_ir::Model,
    ) -> std::result::Result<graphopt_passes::PassStats, graphopt_passes::PassError> {
        let (r, stats) = (self.run)(model)?;
        *self.out.borrow_mut() = Some(r);
        Ok(stats)
    }
    fn exact(&self) -> bool {
        false
    }
}
