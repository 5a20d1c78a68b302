"""The CLI and the Python package are two front ends of one library: the same
request gives the same model bytes and the same report, field by field.

Each case below is one where a policy or a default used to live in a front
end (issue 25): the fuse_conv_bn skip before precision lowering, the
strategies `remat --sweep` compares, the optimizer's parsing and defaults.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphopt
from conftest import MODELS, model, strip_times


def test_optimize_precision_policy_equal(cli, tmp_path):
    name = "resnet_tiny.ts14"
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    cli.run("optimize", model(name), "-o", out, "--precision", "fp16", "--dim", "batch=2", "--report", rep, "-q")
    want = json.loads(rep.read_text())
    o = graphopt.load(model(name)).optimize(precision="fp16", dims={"batch": 2})
    assert o.to_bytes() == out.read_bytes()
    got = o.report()["steps"][-1]["report"]
    # The policy is the library's: both left fuse_conv_bn out, and said so.
    assert want["skipped"] == got["skipped"] == ["fuse_conv_bn"]
    assert want["skipped_by_policy"] is got["skipped_by_policy"] is True
    assert "fuse_conv_bn" not in {p["name"] for p in got["passes"]}
    for k in ["fusions", "opset_before", "opset_after", "stopped_early"]:
        assert got[k] == want[k], k
    assert (got["before"]["nodes"], got["after"]["nodes"]) == (want["nodes_before"], want["nodes_after"])
    assert (got["before"]["ops"], got["after"]["ops"]) == (want["ops_before"], want["ops_after"])
    assert strip_times(got["precision"]) == strip_times(want["precision"])
    assert strip_times(got["passes"]) == strip_times(want["passes"])
    assert got["precision"]["weights_bytes_after"] < got["precision"]["weights_bytes_before"]
    # skip=[] (the CLI's --skip '') keeps every pass: BatchNorm folds.
    out2 = tmp_path / "o2.onnx"
    cli.run("optimize", model(name), "-o", out2, "--precision", "fp16", "--dim", "batch=2", "--skip", "", "-q")
    kept = graphopt.load(model(name)).optimize(precision="fp16", dims={"batch": 2}, skip=[])
    assert kept.to_bytes() == out2.read_bytes()
    rep = kept.report()["steps"][-1]["report"]
    assert rep["skipped"] == [] and "fuse_conv_bn" in {p["name"] for p in rep["passes"]}


def test_remat_sweep_default_strategies_equal(cli, tmp_path):
    name = "gpt2_tiny.ts14"
    train = tmp_path / "t.onnx"
    cli.run("grad", model(name), "-o", train, "--loss", "sum")
    want = cli.json("remat", train, "--sweep", "--json", "--dim", "batch=4", "--dim", "seq=8", "--points", "4")
    got = graphopt.load(train).remat_sweep(dims={"batch": 4, "seq": 8}, points=4)
    # With no strategy named, both compare the library's sweep set.
    assert [f["strategy"] for f in got["frontiers"]] == ["auto", "fast", "sqrt", "per-block"]
    assert strip_times(got) == strip_times(want)
    # One named strategy: only it, on both.
    one = graphopt.load(train).remat_sweep(dims={"batch": 4, "seq": 8}, strategies="sqrt", points=4)
    want_one = cli.json("remat", train, "--sweep", "--json", "--strategy", "sqrt", "--dim", "batch=4",
                        "--dim", "seq=8", "--points", "4")
    assert strip_times(one) == strip_times(want_one)
    assert [f["strategy"] for f in one["frontiers"]] == ["sqrt"]


def test_grad_adamw_equal(cli, tmp_path):
    name = "resnet_tiny.ts14"
    out, rep = tmp_path / "t.onnx", tmp_path / "r.json"
    cli.run("grad", model(name), "-o", out, "--loss", "mse", "--optimizer", "adamw", "--lr", "0.002",
            "--betas", "0.8,0.99", "--dim", "batch=2", "--report", rep)
    want = json.loads(rep.read_text())
    t = graphopt.load(model(name)).grad(loss="mse", optimizer="adamw", lr=0.002, betas=(0.8, 0.99),
                                       dims={"batch": 2})
    assert t.to_bytes() == out.read_bytes()
    assert strip_times(t.report()["steps"][-1]["report"]) == strip_times(want)
    assert "step" in t.input_names and "step_new" in t.output_names
    # The defaults are the library's too (torch.optim.AdamW's).
    cli.run("grad", model(name), "-o", out, "--optimizer", "adamw")
    assert graphopt.load(model(name)).grad(optimizer="adamw").to_bytes() == out.read_bytes()
    # Out-of-range hyperparameters: the same one-line error from both.
    msg = cli.error("grad", model(name), "-o", out, "--optimizer", "adamw", "--betas", "0.9,1.5")
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(model(name)).grad(optimizer="adamw", betas=(0.9, 1.5))
    assert str(e.value) == msg and "--betas" in msg and e.value.kind == "invalid"


def test_error_kinds():
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(MODELS / "no-such-model.onnx")
    assert e.value.kind == "io"
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(b"\x08\x07garbage")
    assert e.value.kind == "parse"
    train = graphopt.load(model("gpt2_tiny.ts14")).grad()
    with pytest.raises(graphopt.GraphoptError) as e:
        train.remat(1, dims={"batch": 4, "seq": 8})
    assert e.value.kind == "budget" and "below the least peak" in str(e.value)
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(model("bert_tiny.ts14")).max_batch(1000)
    assert e.value.kind == "budget"
    with pytest.raises(graphopt.GraphoptError) as e:
        graphopt.load(model("bert_tiny.ts14")).run(poison=True, device="cuda")
    assert e.value.kind == "unsupported"


def test_calibration_batches_stay_in_memory(tmp_path, monkeypatch):
    name = "bert_tiny.ts14"
    with np.load(MODELS / f"{name}.inputs.npz") as z:
        batch = {k: z[k] for k in z.files}
    # No temporary folder can be made: the binding used to write the
    # batches as npz files into one, and failed here.
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("TMPDIR", str(not_a_dir))
    q = graphopt.load(model(name)).quantize("static", calibration=[batch, batch])
    assert q.report()["steps"][-1]["report"]["calibration"] == "2 batches in memory"
    # A batch naming an input the model lacks: one line, naming it.
    with pytest.raises(graphopt.GraphoptError, match="'bogus' is not an input"):
        graphopt.load(model(name)).quantize("static", calibration=[{**batch, "bogus": batch["input_ids"]}])
