//! Test support shared by graphopt's crates. Dev-dependency only: no
//! library crate may list it under `[dependencies]`.
//!
//! # The Python environment
//!
//! Four test suites check graphopt against Python's `onnx` and
//! `onnxruntime` (the CLI's `tests-py` suites, the text crate's
//! `onnx.parser` oracle, the IR's comparison with `onnx.shape_inference`,
//! and the passes' `upgrade_opset` onnxruntime run). They all get their
//! interpreter from [`python_or_skip`], which owns ONE virtual environment:
//!
//! - `<target>/py-venv`, where `<target>` is `$CARGO_TARGET_DIR` if set
//!   (relative to the workspace root when relative) and `target/` in the
//!   workspace otherwise. It is created with `python3 -m venv` (Debian and
//!   Ubuntu need the `python3-venv` package) and never touches the system
//!   Python.
//! - The packages pinned in `tests-py/requirements.txt` are pip-installed
//!   into it once; a stamp file holding the requirements text records a
//!   successful install, so a changed pin reinstalls. Every `==` pin is
//!   checked against the installed version (`importlib.metadata`) in each
//!   test process.
//! - `GRAPHOPT_PYTHON=/path/to/python` uses that interpreter instead of the
//!   venv (nothing is installed into it; the pins are still checked).
//!
//! Tests within one binary run on parallel threads (a `OnceLock` sets the
//! environment up once per process), and several processes may share the
//! target folder (a lock file created with `create_new` serializes them).
//!
//! When the environment cannot be had (no `python3`, no `venv` module, no
//! network for pip, a wrong pin), a test prints `SKIPPED <test>: <why>` and
//! passes, unless [`require_python`] holds (`GRAPHOPT_REQUIRE_PYTHON=1` or
//! `CI=true`): then it fails with the reason.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

/// The workspace root (the folder holding the top `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Cargo's target folder: `$CARGO_TARGET_DIR` (relative to the workspace
/// root when relative), else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => workspace_root().join(d),
        _ => workspace_root().join("target"),
    }
}

/// The virtual environment's folder, `<target>/py-venv`.
pub fn venv_dir() -> PathBuf {
    target_dir().join("py-venv")
}

fn env_is(k: &str, v: &str) -> bool {
    std::env::var(k).is_ok_and(|x| x.eq_ignore_ascii_case(v))
}

/// True when a missing test prerequisite that CI has (the Python
/// environment; g++ for the CUDA kernel emulation) must fail the test
/// rather than skip it: `GRAPHOPT_REQUIRE_PYTHON=1` or `CI=true` (both as
/// `.ci/run` sets them).
pub fn require_python() -> bool {
    env_is("GRAPHOPT_REQUIRE_PYTHON", "1") || env_is("CI", "true")
}

/// True when a missing CUDA GPU must fail the GPU tests rather than skip
/// them: `GRAPHOPT_REQUIRE_GPU=1`, as `benches/device/cuda_check.sh` sets
/// it on the GPU machine. CI has no GPU, so `CI=true` does not imply it.
pub fn require_gpu() -> bool {
    env_is("GRAPHOPT_REQUIRE_GPU", "1")
}

/// True when a missing MPI (`mpirun`, or the headers the `mpi` feature
/// builds against) must fail the distributed tests rather than skip them:
/// `GRAPHOPT_REQUIRE_MPI=1` or `CI=true` (`.ci/run` installs OpenMPI).
pub fn require_mpi() -> bool {
    env_is("GRAPHOPT_REQUIRE_MPI", "1") || env_is("CI", "true")
}

/// True when a CPU without the vector instructions a kernel test targets
/// (AVX2 and FMA) must fail that test rather than skip it:
/// `GRAPHOPT_REQUIRE_SIMD=1` or `CI=true` (CI's x86-64 machines have them).
pub fn require_simd() -> bool {
    env_is("GRAPHOPT_REQUIRE_SIMD", "1") || env_is("CI", "true")
}

/// The one way a test gives up on a missing prerequisite other than the
/// Python environment (which [`python_or_skip`] handles): returns true
/// after printing `SKIPPED <test>: <why> (set <require_with> to make this
/// a failure)`, so the skip shows in the log.
///
/// # Panics
/// When `required` (from [`require_python`] or [`require_gpu`]), with
/// `why` and the setting that made it a failure.
pub fn skip_or_fail(test: &str, why: &str, required: bool, require_with: &str) -> bool {
    if required {
        panic!("{test}: required ({require_with}) but {why}");
    }
    eprintln!("SKIPPED {test}: {why} (set {require_with} to make this a failure)");
    true
}

/// The interpreter of the pinned test environment, set up on first use
/// (once per process); `Err` says why it cannot be had.
pub fn python() -> Result<PathBuf, String> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(setup).clone()
}

/// The interpreter for `test`, or `None` after printing a SKIPPED note.
///
/// # Panics
/// When [`require_python`] holds and the environment cannot be had.
pub fn python_or_skip(test: &str) -> Option<PathBuf> {
    match python() {
        Ok(p) => Some(p),
        Err(why) if require_python() => {
            panic!("{test}: Python is required (GRAPHOPT_REQUIRE_PYTHON=1 or CI=true) but {why}")
        }
        Err(why) => {
            eprintln!(
                "SKIPPED {test}: {why} (set GRAPHOPT_REQUIRE_PYTHON=1 to make this a failure)"
            );
            None
        }
    }
}

fn requirements() -> PathBuf {
    workspace_root().join("tests-py/requirements.txt")
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts/python.exe")
    } else {
        venv.join("bin/python")
    }
}

fn output(cmd: &mut Command) -> Result<Output, String> {
    cmd.output().map_err(|e| format!("cannot run {cmd:?}: {e}"))
}

fn tail(o: &Output) -> String {
    let s = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = s.trim_end().lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// Checks that `py` imports the packages and has every `==` pin of the
/// requirements text installed at exactly that version.
fn check_pins(py: &Path, reqs: &str) -> Result<(), String> {
    const CHECK: &str = r##"
import sys, importlib.metadata as md
bad = []
for line in sys.argv[1].splitlines():
    line = line.split("#")[0].strip()
    if "==" not in line:
        continue
    name, want = (s.strip() for s in line.split("=="))
    try:
        got = md.version(name)
    except md.PackageNotFoundError:
        got = None
    if got != want:
        bad.append(f"{name}=={want} (installed: {got})")
if bad:
    sys.exit("wrong or missing packages: " + ", ".join(bad))
import onnx, onnxruntime, numpy
"##;
    let o = output(Command::new(py).args(["-c", CHECK, reqs]))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} lacks the pinned packages: {}",
            py.display(),
            tail(&o)
        ))
    }
}

fn setup() -> Result<PathBuf, String> {
    let req_path = requirements();
    let reqs = std::fs::read_to_string(&req_path)
        .map_err(|e| format!("cannot read {}: {e}", req_path.display()))?;
    if let Some(py) = std::env::var_os("GRAPHOPT_PYTHON").filter(|p| !p.is_empty()) {
        let py = PathBuf::from(py);
        check_pins(&py, &reqs).map_err(|e| format!("GRAPHOPT_PYTHON: {e}"))?;
        return Ok(py);
    }
    let venv = venv_dir();
    let py = venv_python(&venv);
    let stamp = venv.join("graphopt-requirements.txt");
    let ready = || std::fs::read_to_string(&stamp).is_ok_and(|s| s == reqs) && py.exists();
    if !ready() {
        std::fs::create_dir_all(target_dir())
            .map_err(|e| format!("cannot create {}: {e}", target_dir().display()))?;
        let _lock = Lock::acquire(&target_dir().join("py-venv.lock"))?;
        // Another process may have finished while we waited.
        if !ready() {
            install(&venv, &py, &req_path, &reqs, &stamp)?;
        }
    }
    check_pins(&py, &reqs)?;
    Ok(py)
}

fn install(
    venv: &Path,
    py: &Path,
    req_path: &Path,
    reqs: &str,
    stamp: &Path,
) -> Result<(), String> {
    let _ = std::fs::remove_file(stamp);
    if !py.exists() {
        eprintln!("creating the test Python environment {}", venv.display());
        let o = output(Command::new("python3").args(["-m", "venv"]).arg(venv))
            .map_err(|e| format!("{e} (is python3 installed?)"))?;
        if !o.status.success() {
            let _ = std::fs::remove_dir_all(venv);
            return Err(format!(
                "`python3 -m venv {}` failed (on Debian/Ubuntu install python3-venv): {}",
                venv.display(),
                tail(&o)
            ));
        }
    }
    eprintln!("installing {} into {}", req_path.display(), venv.display());
    let o = output(
        Command::new(py)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(req_path),
    )?;
    if !o.status.success() {
        return Err(format!(
            "pip install -r {} failed: {}",
            req_path.display(),
            tail(&o)
        ));
    }
    check_pins(py, reqs)?;
    std::fs::write(stamp, reqs).map_err(|e| format!("cannot write {}: {e}", stamp.display()))
}

/// A lock file held while the venv is created or installed into, so that
/// concurrent test processes do not pip-install into it at once. A lock
/// older than 20 minutes is taken to be left over from a killed process.
struct Lock(PathBuf);

impl Lock {
    fn acquire(path: &Path) -> Result<Lock, String> {
        let start = SystemTime::now();
        loop {
            match OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(Lock(path.to_path_buf()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let age = File::open(path)
                        .and_then(|f| f.metadata())
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok());
                    if age.is_some_and(|a| a > Duration::from_secs(20 * 60)) {
                        let _ = std::fs::remove_file(path);
                        continue;
                    }
                    if start
                        .elapsed()
                        .is_ok_and(|w| w > Duration::from_secs(30 * 60))
                    {
                        return Err(format!("timed out waiting for the lock {}", path.display()));
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(format!("cannot create the lock {}: {e}", path.display())),
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `n` seeded values in [-1, 1) (xorshift64, the top 24 bits): the test
/// data the kernel tests share.
pub fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `‖got − want‖ / ‖want‖`, summed in f64 (0 for an all-zero `want` equal
/// to `got`).
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "rel_l2 of different lengths");
    let d: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let s: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    if d == 0.0 {
        0.0
    } else {
        (d / s).sqrt()
    }
}

/// Whether `a` and `b` hold the same floats bit for bit (NaNs and signed
/// zeros included), and as many.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `n` bytes from a fixed seed (an LCG's high bits): the quantized kernel
/// tests' data.
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_checked() {
        // A pin no interpreter can satisfy must be reported, whatever the
        // interpreter: this is the check that makes a wrong version fail.
        if let Ok(py) = python() {
            let err = check_pins(&py, "onnx==0.0.0-not-a-version\n").unwrap_err();
            assert!(err.contains("onnx==0.0.0-not-a-version"), "{err}");
            check_pins(&py, &std::fs::read_to_string(requirements()).unwrap()).unwrap();
        } else {
            // Panics when Python is required.
            python_or_skip("pins_are_checked");
        }
    }

    #[test]
    fn a_required_prerequisite_fails_and_an_optional_one_skips() {
        assert!(skip_or_fail("t", "no g++", false, "CI=true"));
        let e =
            std::panic::catch_unwind(|| skip_or_fail("t", "no g++", true, "CI=true")).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert_eq!(msg, "t: required (CI=true) but no g++");
    }
}
