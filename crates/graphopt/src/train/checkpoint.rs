//! Checkpoints: npz files of the state and the position in the data.

use super::data::read_npz;
use super::{State, TrainOptions};
use crate::error::{Error, Result};
use graphopt_exec::HostTensor;
use graphopt_ir::DType;
use std::path::{Path, PathBuf};

pub(super) const STEP_KEY: &str = "__step";
pub(super) const SEED_KEY: &str = "__seed";
pub(super) const BATCH_KEY: &str = "__batch";
pub(super) const EXAMPLES_KEY: &str = "__examples";
pub(super) const SHUFFLE_KEY: &str = "__shuffle";

pub(super) fn scalar_i64(v: i64) -> HostTensor {
    HostTensor::from_i64(&[], &[v])
}

pub(super) fn read_i64(t: &HostTensor) -> Option<i64> {
    (t.dtype == DType::I64 && t.data.len() == 8)
        .then(|| i64::from_le_bytes(t.data[..8].try_into().expect("8 bytes")))
}

/// The checkpoint `resume` names: the file, or the latest `step-*.npz` in
/// the folder.
pub(super) fn checkpoint_file(p: &Path) -> Result<PathBuf> {
    if !p.is_dir() {
        return Ok(p.to_path_buf());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(p)
        .map_err(|e| Error::io(p, "read", e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|f| {
            f.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-") && n.ends_with(".npz"))
        })
        .collect();
    files.sort();
    files.pop().ok_or_else(|| {
        Error::new(format!(
            "--resume {}: no step-*.npz checkpoint",
            p.display()
        ))
    })
}

/// Restores `state` from checkpoint `file`; returns the steps it had done.
pub(super) fn resume(
    file: &Path,
    state: &mut State,
    n: usize,
    opts: &TrainOptions,
) -> Result<usize> {
    let arrays = read_npz(file)?;
    let get = |k: &str| arrays.iter().find(|(n, _)| n == k).map(|(_, t)| t);
    let meta = |k: &str| get(k).and_then(read_i64);
    let expect = [
        (SEED_KEY, opts.seed as i64, "--seed"),
        (BATCH_KEY, opts.batch as i64, "--batch"),
        (EXAMPLES_KEY, n as i64, "the data's example count"),
        (SHUFFLE_KEY, opts.shuffle as i64, "--no-shuffle"),
    ];
    for (k, want, what) in expect {
        if meta(k) != Some(want) {
            return Err(Error::new(format!(
                "--resume {}: it was written with another {what} ({} there, {want} now)",
                file.display(),
                meta(k).map_or("none".to_string(), |v| v.to_string())
            )));
        }
    }
    let start = meta(STEP_KEY)
        .filter(|&s| s >= 0)
        .ok_or_else(|| Error::new(format!("--resume {}: no {STEP_KEY}", file.display())))?
        as usize;
    for (name, t) in state.iter_mut() {
        let c = get(name).ok_or_else(|| {
            Error::new(format!(
                "--resume {}: no array '{name}' (a checkpoint of another model?)",
                file.display()
            ))
        })?;
        if c.dtype != t.dtype || c.shape != t.shape {
            return Err(Error::new(format!(
                "--resume {}: array '{name}' is {}{:?}, the model's is {}{:?}",
                file.display(),
                c.dtype.name(),
                c.shape,
                t.dtype.name(),
                t.shape
            )));
        }
        *t = c.clone();
    }
    Ok(start)
}
