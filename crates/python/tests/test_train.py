"""Session.train: the same training as `graphopt train`, whatever form the
data takes (an .npz path, a dict of arrays, an iterable of dict shards)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphopt
from conftest import REPO

TRAIN = REPO / "testdata" / "train"
ARGS = dict(batch=32, steps=12, target="y", optimizer="adamw", lr=0.002, shuffle=True, seed=5)


def losses(report: dict) -> list[float]:
    return [r["loss"] for r in report["log"]]


def test_train_matches_the_cli_for_every_data_form(cli, tmp_path):
    path = TRAIN / "digits_mlp.train.npz"
    out = tmp_path / "cli.onnx"
    r_cli = cli.json(
        "train", TRAIN / "digits_mlp.onnx", "--data", path, "--target", "y", "--batch", "32",
        "--steps", "12", "--optimizer", "adamw", "--lr", "0.002", "--seed", "5", "--threads", "2",
        "-o", out, "--json",
    )
    s = graphopt.load(str(TRAIN / "digits_mlp.onnx"))
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    shards = [{k: v[:500] for k, v in arrays.items()}, {k: v[500:] for k, v in arrays.items()}]
    for data in (str(path), arrays, shards):
        t = s.train(data, threads=2, **ARGS)
        r = t.report()["steps"][-1]["report"]
        assert losses(r) == losses(r_cli), type(data)
        assert r["examples"] == 1257
    # The trained session saves the inference model with the trained weights.
    t.save(str(tmp_path / "py.onnx"))
    assert (tmp_path / "py.onnx").read_bytes() == out.read_bytes()
    # The original session is unchanged.
    assert s.report()["steps"] == []


def test_train_refuses_bad_data_in_one_line():
    s = graphopt.load(str(TRAIN / "digits_mlp.onnx"))
    x = np.zeros((8, 64), np.float32)
    x[3, 5] = np.nan
    with pytest.raises(graphopt.GraphoptError, match=r"array 'x' holds NaN or Inf \(example 3\)"):
        s.train({"x": x, "y": np.zeros(8, np.int64)}, batch=4, target="y")
    with pytest.raises(graphopt.GraphoptError, match="no array 'target'"):
        s.train({"x": np.zeros((8, 64), np.float32)}, batch=4)
    with pytest.raises(TypeError, match="item 0 is not a dict"):
        s.train([1, 2], batch=4)


def test_budget_remat_and_donation_reach_python(tmp_path):
    # vit_tiny's SGD step (sum loss, batch 32): within 4 MB recomputation
    # keeps the batch whole; remat="none" splits it (as `graphopt train`).
    vit = graphopt.load(str(REPO / "testdata" / "models" / "vit_tiny.ts14.onnx"))
    x = np.random.default_rng(0).standard_normal((64, 3, 32, 32)).astype(np.float32)
    kw = dict(batch=32, steps=1, loss="sum", threads=2, budget="4MB")
    r = vit.train({"pixel_values": x}, **kw).report()["steps"][-1]["report"]
    assert r["micro_batches"] == 1 and r["recompute"]["recomputed_nodes"] > 0
    r = vit.train({"pixel_values": x}, remat="none", **kw).report()["steps"][-1]["report"]
    assert r["micro_batches"] > 1 and r["recompute"] is None
    with pytest.raises(graphopt.GraphoptError, match="--remat maybe: expected auto or none"):
        vit.train({"pixel_values": x}, remat="maybe", **kw)
    # run() honours grad's donation table unless donate=False.
    step = graphopt.load(str(TRAIN / "digits_mlp.onnx")).grad(optimizer="adamw", params_as_inputs=True)
    _, on = step.run(dims={"batch": 4}, return_report=True)
    _, off = step.run(dims={"batch": 4}, return_report=True, donate=False)
    assert on["donated_bytes"] > 0 and off["donated_bytes"] == 0
