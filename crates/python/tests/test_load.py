"""Loading from paths, bytes and ModelProto objects; errors on corrupt files
carry the CLI's one-line message."""

from __future__ import annotations

import pathlib

import onnx
import pytest

import graphopt
from conftest import model


def test_load_forms_agree():
    path = model("bert_tiny.ts14")
    want = graphopt.load(str(path)).to_bytes()
    raw = path.read_bytes()
    assert graphopt.load(path).to_bytes() == want  # os.PathLike
    assert graphopt.load(raw).to_bytes() == want
    assert graphopt.load(bytearray(raw)).to_bytes() == want
    assert graphopt.load(memoryview(raw)).to_bytes() == want
    assert graphopt.load(onnx.load(str(path))).to_bytes() == want
    assert graphopt.load(raw).source is None
    assert graphopt.load(path).source == str(path)


def test_load_external_data():
    s = graphopt.load(model("gpt2_tiny.ts14.extdata"))
    assert s.inspect()["external_data"] is True
    assert graphopt.load(s.to_bytes()).inspect()["parameter_bytes"] == s.inspect()["parameter_bytes"]


def test_load_wrong_type():
    with pytest.raises(TypeError):
        graphopt.load(12)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda raw: raw[: len(raw) // 2], id="truncated"),
        pytest.param(lambda raw: b"\xff" * 64, id="garbage"),
        pytest.param(lambda raw: b"", id="empty"),
    ],
)
def test_corrupt_file_error_equals_cli(cli, tmp_path, make):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(make(model("bert_tiny.ts14").read_bytes()))
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(bad)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == cli.error("inspect", bad)
    assert msg.startswith(str(bad))


def test_missing_file_error_equals_cli(cli, tmp_path):
    p = tmp_path / "nope.onnx"
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(p)
    assert str(e.value) == cli.error("inspect", p)


def test_corrupt_bytes():
    with pytest.raises(graphopt.GraphoptError):
        graphopt.load(b"\x0a\xff\xff\xff")


def test_errors_are_graphopt_errors(cli):
    s = graphopt.load(model("bert_tiny.ts14"))
    with pytest.raises(graphopt.GraphoptError) as e:
        s.optimize(passes="no_such_pass")
    assert str(e.value) == cli.error("optimize", model("bert_tiny.ts14"), "-o", "/tmp/x.onnx", "--passes", "no_such_pass")
    assert "fuse_layer_norm" in str(e.value)  # the valid names are listed
    with pytest.raises(graphopt.GraphoptError) as e:
        s.lower_precision("fp8")
    assert str(e.value) == cli.error("optimize", model("bert_tiny.ts14"), "-o", "/tmp/x.onnx", "--precision", "fp8")
    with pytest.raises(graphopt.GraphoptError) as e:
        s.grad(loss="hinge")
    assert str(e.value) == cli.error("grad", model("bert_tiny.ts14"), "-o", "/tmp/x.onnx", "--loss", "hinge")
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(model("if_loop.helper13")).grad()
    assert str(e.value) == cli.error("grad", model("if_loop.helper13"), "-o", "/tmp/x.onnx")
    with pytest.raises(graphopt.GraphoptError):
        s.plan(dims={"batch": -1})
    assert issubclass(graphopt.GraphoptError, Exception)


def test_run_input_errors():
    s = graphopt.load(model("resnet_tiny.ts14"))
    import numpy as np

    x = np.zeros((1, 3, 32, 32), np.float32)
    name = s.input_names[0]
    with pytest.raises(graphopt.GraphoptError, match="is not an input"):
        s.run({name: x, "extra": x})
    with pytest.raises(graphopt.GraphoptError, match="is missing"):
        s.run({})
    with pytest.raises(graphopt.GraphoptError, match="not supported"):
        s.run({name: np.zeros((1, 3, 32, 32), np.complex64)})
