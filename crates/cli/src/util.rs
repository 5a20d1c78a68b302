//! Small helpers for the commands.

use anyhow::{bail, Context};
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file beside it, then a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".graphopt-")
        .tempfile_in(dir)
        .with_context(|| format!("{}: cannot create a temporary file", path.display()))?;
    tmp.write_all(bytes)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot move into place: {}", path.display(), e.error))?;
    Ok(())
}

/// Parses `NAME=VALUE` dim bindings.
pub fn parse_dims(dims: &[String]) -> anyhow::Result<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for d in dims {
        let Some((k, v)) = d.split_once('=') else {
            bail!("--dim '{d}': expected NAME=VALUE");
        };
        let v: i64 = v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("--dim '{d}': '{v}' is not an integer"))?;
        if v < 0 {
            bail!("--dim '{d}': a dim cannot be negative");
        }
        out.push((k.trim().to_string(), v));
    }
    Ok(out)
}

/// `1234567` → `1.23 MB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Writes to stdout; a closed pipe (`graphopt inspect m.onnx | head`) is not
/// an error and not a panic.
pub fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
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
