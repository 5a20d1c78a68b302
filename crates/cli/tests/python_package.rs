//! The Python package (`crates/python`), tested as a user gets it: the
//! wheel is built with maturin, installed with pip into a fresh virtual
//! environment under `target/py-pkg/venv`, and `pytest crates/python/tests`
//! runs there
//! (every Session method against the `graphopt` console script the wheel
//! installed, numpy round trips, errors, `graphopt.torch` when torch is
//! importable).
//!
//! Build cost: the wheel is built with `--profile dev` into the workspace's
//! target folder, so the dependencies `cargo test --workspace` compiled are
//! reused and only pyo3, numpy and the bindings are new. This test lives in
//! the CLI crate (the console script is the CLI) rather than in
//! `crates/python`: an integration test there would make `cargo test`
//! build the extension too, with another pyo3 configuration than maturin's
//! (its build script reads maturin's `PYO3_*` variables), and each of the
//! two builds would then rebuild pyo3 after the other.
//! That holds only while `cargo build -p graphopt-python` (what maturin
//! runs) resolves the same features as the workspace build:
//! [`wheel_build_resolves_the_workspace_features`] checks it.
//!
//! Python comes from `graphopt-testutil`'s pinned venv, which has maturin
//! and pytest (`tests-py/requirements.txt`); the fresh venv sees its
//! packages (numpy, onnx, pytest) through a `.pth` file, so pip resolves the
//! wheel's `numpy` dependency without the network. Without that venv the
//! test is skipped with a note, and fails when `CI=true` or
//! `GRAPHOPT_REQUIRE_PYTHON=1`. The torch tests skip when torch is not
//! installed (CI does not install it); that is the one skip allowed,
//! besides `graphopt.distributed`'s mpirun tests where OpenMPI is not
//! installed (the wheel is built with `--features mpi` where it is).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Builds the wheel into `dir`; returns its path.
fn build_wheel(py: &Path, root: &Path, target: &Path, dir: &Path, mpi: bool) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    let t0 = Instant::now();
    run(Command::new(py)
        .args(["-m", "maturin", "build", "--profile", "dev", "--quiet"])
        // MPI stays the system's: not copied into the wheel.
        .args(if mpi {
            &["--features", "mpi", "--auditwheel", "skip"][..]
        } else {
            &[]
        })
        .arg("-m")
        .arg(root.join("crates/python/Cargo.toml"))
        .arg("--out")
        .arg(dir)
        .env("CARGO_TARGET_DIR", target)
        .current_dir(root));
    eprintln!(
        "python_package: wheel built in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("wheel folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "one wheel expected in {}", dir.display());
    let name = wheels[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.contains("-cp39-abi3-"),
        "the wheel is abi3 for Python >= 3.9: {name}"
    );
    wheels[0].clone()
}

#[test]
fn python_package() {
    let Some(py) = graphopt_testutil::python_or_skip("python_package") else {
        return;
    };
    let root = graphopt_testutil::workspace_root();
    let target = graphopt_testutil::target_dir();
    let work = target.join("py-pkg");
    // With MPI when it is installed (graphopt.distributed's tests run
    // under mpirun; CI installs OpenMPI and requires them).
    let mpi = has_mpi();
    let wheel = build_wheel(&py, &root, &target, &work.join("wheels"), mpi);

    // A fresh venv, seeing the pinned venv's packages through a .pth file.
    // Without pip of its own (ensurepip takes ~10 s): the pinned venv's pip
    // installs into it (`pip --python`).
    let venv = work.join("venv");
    let _ = std::fs::remove_dir_all(&venv);
    run(Command::new(&py)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv));
    let vpy = venv.join("bin/python");
    let site = |p: &Path| {
        text(&run(Command::new(p).args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])))
    };
    std::fs::write(
        Path::new(&site(&vpy)).join("graphopt-test-deps.pth"),
        format!("{}\n", site(&py)),
    )
    .expect("write .pth");
    run(Command::new(&py)
        .args(["-m", "pip", "--python"])
        .arg(&vpy)
        .args(["install", "-q", "--disable-pip-version-check", "--no-index"])
        .arg(&wheel));

    let t0 = Instant::now();
    let out = Command::new(&vpy)
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .arg(root.join("crates/python/tests"))
        .env("GRAPHOPT_CLI", venv.join("bin/graphopt"))
        .env_remove("PYTHONPATH")
        .current_dir(&root)
        .output()
        .expect("pytest runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for l in stdout
        .lines()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .iter()
        .rev()
    {
        eprintln!("pytest: {l}");
    }
    eprintln!(
        "python_package: pytest took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
    // Only the torch tests may skip (torch is not a CI requirement), and
    // the MPI ones where MPI is not installed and not required.
    for l in stdout.lines().filter(|l| l.starts_with("SKIPPED")) {
        assert!(
            l.contains("torch") || l.contains("onnxscript") || (!mpi && l.contains("needs MPI")),
            "a test skipped for a reason other than a missing torch: {l}"
        );
    }
}

/// Whether OpenMPI's launcher and compiler wrapper are installed (what the
/// `mpi` feature builds and runs with).
fn has_mpi() -> bool {
    ["mpirun", "mpicc"].iter().all(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Features per package (`name version features`) of a `cargo tree`.
fn features(args: &[&str]) -> std::collections::BTreeMap<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = run(Command::new(cargo)
        .args(["tree", "--offline", "--prefix", "none", "-f", "{p}|{f}"])
        .args(args)
        .current_dir(graphopt_testutil::workspace_root()));
    text(&out)
        .lines()
        .filter_map(|l| {
            let (p, f) = l.trim_end_matches(" (*)").split_once('|')?;
            // `name vX.Y.Z (path)`: key on name and version.
            let key = p.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
            Some((key, f.to_string()))
        })
        .collect()
}

/// The wheel build (`cargo build -p graphopt-python`, as maturin runs it)
/// must give every shared dependency the features `cargo test --workspace`
/// gave it; else it rebuilds them (tract: ~10 minutes on 2 cores). A new
/// dev-dependency that turns on a feature shows up here: pin the same
/// feature in crates/python/Cargo.toml (see `bit-vec` there).
#[test]
fn wheel_build_resolves_the_workspace_features() {
    let ws = features(&["--workspace", "-e", "normal,build,dev"]);
    let py = features(&["-p", "graphopt-python", "-e", "normal,build"]);
    let differ: Vec<String> = py
        .iter()
        .filter_map(|(k, f)| match ws.get(k) {
            Some(w) if w != f => Some(format!("{k}: workspace [{w}], wheel [{f}]")),
            _ => None,
        })
        .collect();
    assert!(
        differ.is_empty(),
        "the wheel build would rebuild these with other features:\n{}",
        differ.join("\n")
    );
}
