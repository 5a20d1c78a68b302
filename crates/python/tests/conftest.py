"""Shared fixtures of the graphopt Python package tests.

Run by `cargo test --workspace` (crates/cli/tests/python_package.rs builds the wheel,
installs it into a fresh venv and runs pytest here). The CLI the results
are compared with is the `graphopt` console script the wheel installed
(`GRAPHOPT_CLI`), which runs the Rust CLI's code (graphopt_cli).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MODELS = REPO / "testdata" / "models"


def cli_path() -> str:
    p = os.environ.get("GRAPHOPT_CLI") or shutil.which("graphopt")
    if not p:
        # A missing CLI is a broken install, never a reason to skip.
        raise RuntimeError("no `graphopt` command: set GRAPHOPT_CLI or install the wheel")
    return p


class Cli:
    """The `graphopt` command."""

    def __init__(self, path: str):
        self.path = path

    def run(self, *args, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([self.path, *map(str, args)], capture_output=True, text=True, cwd=REPO)
        if check and p.returncode != 0:
            raise AssertionError(f"graphopt {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def json(self, *args) -> dict:
        return json.loads(self.run(*args).stdout)

    def error(self, *args) -> str:
        """The one-line message of a failing command (after `error: `)."""
        p = self.run(*args, check=False)
        assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
        return lines[0][len("error: "):]


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli(cli_path())


def model(name: str) -> Path:
    return MODELS / f"{name}.onnx"


def npz_inputs(name: str) -> dict:
    import numpy as np

    with np.load(MODELS / f"{name}.inputs.npz") as z:
        return {k: z[k] for k in z.files}


def strip_times(v):
    """A report without wall-clock fields (time_ms, latency, RSS)."""
    if isinstance(v, dict):
        return {
            k: strip_times(x)
            for k, x in v.items()
            if not (k.startswith("time") or k.endswith("_ms") or k.endswith("_seconds") or k == "seconds" or k.startswith("latency") or k == "peak_rss_bytes")
        }
    if isinstance(v, list):
        return [strip_times(x) for x in v]
    return v
