"""The `graphopt` console script is the Rust CLI."""

from __future__ import annotations

import subprocess
import sys

import graphopt
from conftest import model


def test_console_script_usage_and_errors(cli, tmp_path):
    p = cli.run("--help")
    assert "optimize" in p.stdout and "plan" in p.stdout
    p = cli.run("no-such-command", check=False)
    assert p.returncode == 2 and "unrecognized subcommand" in p.stderr
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x01\x02")
    assert cli.error("inspect", bad).startswith(str(bad))


def test_cli_main_in_process(capfd):
    code = graphopt.cli_main(["graphopt", "inspect", str(model("resnet_tiny.ts14"))])
    out = capfd.readouterr().out
    assert code == 0 and "parameters" in out
    assert graphopt.cli_main(["graphopt", "inspect", "/nonexistent.onnx"]) == 1
    assert graphopt.cli_main(["graphopt", "--no-such-flag"]) == 2


def test_python_dash_m():
    p = subprocess.run([sys.executable, "-m", "graphopt._cli", "passes"], capture_output=True, text=True)
    assert p.returncode == 0 and "dce" in p.stdout
