"""Every Session method on testdata models, with results equal to the CLI's."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

import graphopt
from conftest import MODELS, model, npz_inputs, strip_times

PLAN_MODELS = [
    ("bert_tiny.ts14", ["batch=2", "sequence=16"]),
    ("gpt2_tiny.dynamo18", []),
    ("resnet_tiny.ts14", ["batch=4"]),
    ("mobilenet_v3_small.ts11", []),
    ("t5_encoder_tiny.dynamo18", []),
    ("whisper_encoder_tiny.ts14", []),
    ("vit_tiny.ts14", []),
]


def dims_dict(dims):
    return {k: int(v) for k, v in (d.split("=") for d in dims)}


def dim_args(dims):
    return [a for d in dims for a in ("--dim", d)]


def test_version_and_passes(cli):
    assert graphopt.__version__ in cli.run("--version").stdout
    lines = [l for l in cli.run("passes").stdout.splitlines() if l.strip()]
    names = [p for p, _ in graphopt.passes()]
    assert [l.split()[0] for l in lines] == names
    assert "fuse_layer_norm" in names


@pytest.mark.parametrize("name,dims", PLAN_MODELS)
def test_plan_equals_cli(cli, name, dims):
    s = graphopt.load(model(name))
    got = s.plan(dims=dims_dict(dims), verify=True, node_budget=20_000)
    want = cli.json("plan", model(name), "--json", "--verify", "--nodes", "20000", *dim_args(dims))
    assert got == want
    assert got["arena_bytes"] >= got["lower_bound_bytes"] > 0


def test_plan_shapes_from_inputs_equal_cli(cli):
    name = "bert_tiny.ts14"
    got = graphopt.load(model(name)).plan(inputs=npz_inputs(name))
    want = cli.json("plan", model(name), "--json", "--inputs", MODELS / f"{name}.inputs.npz")
    assert got == want
    got_path = graphopt.load(model(name)).plan(inputs=str(MODELS / f"{name}.inputs.npz"))
    assert got_path == want


def test_max_batch_equals_cli(cli):
    name = "bert_tiny.ts14"
    s = graphopt.load(model(name))
    got = s.max_batch("16MiB", dims={"sequence": 32}, node_budget=2000)
    want = cli.json(
        "plan", model(name), "--json", "--budget", "16MiB", "--max-batch", "--dim", "sequence=32", "--nodes", "2000"
    )
    assert got == want
    assert got["max_batch"] > 1 and got["budget_bytes"] == 16 << 20
    assert got["weights_bytes"] + got["arena_bytes"] <= 16 << 20
    with pytest.raises(graphopt.GraphoptError, match="budget"):
        s.max_batch("lots")


def test_inspect_equals_cli(cli):
    for name in ["bert_tiny.ts14", "gpt2_tiny.ts14.extdata", "resnet_tiny.ts9"]:
        got = graphopt.load(model(name)).inspect(dims={"batch": 2})
        assert got == cli.json("inspect", model(name), "--json", "--dim", "batch=2")


def test_optimize_bytes_and_report_equal_cli(cli, tmp_path):
    name = "bert_tiny.ts14"
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    cli.run("optimize", model(name), "-o", out, "--opset", "20", "--report", rep, "-q")
    want = json.loads(rep.read_text())
    s = graphopt.load(model(name))
    o = s.optimize(opset=20)
    assert o.to_bytes() == out.read_bytes()
    r = o.report()["steps"][-1]
    assert r["step"] == "optimize"
    r = r["report"]
    assert r["before"]["nodes"] == want["nodes_before"] and r["after"]["nodes"] == want["nodes_after"]
    assert r["before"]["ops"] == want["ops_before"] and r["after"]["ops"] == want["ops_after"]
    assert r["fusions"] == want["fusions"] and "fuse_layer_norm" in r["fusions"]
    assert (r["opset_before"], r["opset_after"]) == (want["opset_before"], want["opset_after"]) == (14, 20)
    assert strip_times(o.report()["passes"]) == strip_times(want["passes"])
    # The original session is unchanged.
    assert s.report()["steps"] == [] and s.to_bytes() != o.to_bytes()
    assert graphopt.load(model(name)).to_bytes() == s.to_bytes()


def test_optimize_named_passes(cli, tmp_path):
    name = "resnet_tiny.ts14"
    out = tmp_path / "o.onnx"
    cli.run("optimize", model(name), "-o", out, "--passes", "fuse_conv_bn,dce", "-q")
    s = graphopt.load(model(name))
    assert s.optimize(passes=["fuse_conv_bn", "dce"]).to_bytes() == out.read_bytes()
    assert s.optimize(passes="fuse_conv_bn,dce").to_bytes() == out.read_bytes()


def test_lower_precision_equals_cli(cli, tmp_path):
    name = "bert_tiny.ts14"
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    cli.run("optimize", model(name), "-o", out, "--passes", "none", "--precision", "fp16", "--validate",
            "--dim", "batch=2", "--report", rep, "-q")
    want = json.loads(rep.read_text())
    low = graphopt.load(model(name)).optimize(passes="none").lower_precision("fp16", validate=True, dims={"batch": 2})
    assert low.to_bytes() == out.read_bytes()
    got = low.report()["steps"][-1]["report"]
    assert strip_times(got) == strip_times(want["precision"])
    assert got["validation"]["ok"] and got["weights_bytes_after"] < got["weights_bytes_before"]


def test_grad_equals_cli(cli, tmp_path):
    name = "resnet_tiny.ts14"
    out, rep = tmp_path / "t.onnx", tmp_path / "r.json"
    cli.run("grad", model(name), "-o", out, "--loss", "mse", "--optimizer", "sgd", "--dim", "batch=2", "--report", rep)
    want = json.loads(rep.read_text())
    t = graphopt.load(model(name)).grad(loss="mse", optimizer="sgd", dims={"batch": 2})
    assert t.to_bytes() == out.read_bytes()
    got = t.report()["steps"][-1]
    assert got["step"] == "grad"
    assert strip_times(got["report"]) == strip_times(want)
    assert got["report"]["saved_activation_bytes"] > 0
    assert "loss" in t.output_names and "target" in t.input_names


def test_grad_dropout_train_equals_cli(cli, tmp_path):
    import onnx
    import onnx.parser

    src = tmp_path / "dropout.onnx"
    fixture = MODELS.parent / "autodiff" / "nn" / "dropout.onnxtxt"
    onnx.save(onnx.parser.parse_model(fixture.read_text()), src)
    out = tmp_path / "t.onnx"
    cli.run("grad", src, "-o", out, "--dropout-train")
    t = graphopt.load(src).grad(dropout_train=True)
    assert t.to_bytes() == out.read_bytes()
    rep = t.report()["steps"][-1]["report"]
    assert rep["dropout_train"] == ["d", "e"] and rep["warnings"] == []
    # A model without Dropout: the option is a no-op, with a warning.
    rep = graphopt.load(model("resnet_tiny.ts14")).grad(dropout_train=True).report()["steps"][-1]["report"]
    assert rep["dropout_train"] == [] and "no Dropout node" in rep["warnings"][0]


@pytest.mark.parametrize("name", ["bert_tiny.ts14", "resnet_tiny.ts14", "gpt2_tiny.dynamo18", "bert_tiny.ts14.int8"])
def test_run_outputs_equal_cli(cli, tmp_path, name):
    out = tmp_path / "out.npz"
    want_report = cli.json("run", model(name), "--inputs", MODELS / f"{name}.inputs.npz", "-o", out, "--json")
    s = graphopt.load(model(name))
    got, report = s.run(npz_inputs(name), return_report=True)
    with np.load(out) as z:
        assert list(got) == list(z.files) == s.output_names
        for k in z.files:
            assert got[k].dtype == z[k].dtype and got[k].shape == z[k].shape
            assert got[k].tobytes() == z[k].tobytes(), k
    ignore = {"inputs", "threads", "planned_now"}
    assert {k: v for k, v in strip_times(report).items() if k not in ignore} == {
        k: v for k, v in strip_times(want_report).items() if k not in ignore
    }
    # The same from the .npz path.
    again = s.run(str(MODELS / f"{name}.inputs.npz"))
    assert all(again[k].tobytes() == got[k].tobytes() for k in got)


def test_run_random_inputs_equal_cli(cli, tmp_path):
    name = "resnet_tiny.ts14"
    out = tmp_path / "out.npz"
    cli.run("run", model(name), "--dim", "batch=3", "-o", out, "--poison")
    got = graphopt.load(model(name)).run(dims={"batch": 3}, poison=True)
    with np.load(out) as z:
        assert all(got[k].tobytes() == z[k].tobytes() for k in z.files)
        assert got[z.files[0]].shape[0] == 3


def test_run_cuda_like_cli(cli):
    name = "resnet_tiny.ts14"
    p = cli.run("run", model(name), "--device", "cuda", check=False)
    s = graphopt.load(model(name))
    if p.returncode == 0:  # a build and machine with the CUDA backend
        s.run(device="cuda")
    else:
        with pytest.raises(graphopt.GraphoptError) as e:
            s.run(device="cuda")
        assert "error: " + str(e.value) == p.stderr.strip()
    with pytest.raises(graphopt.GraphoptError, match="expected cpu or cuda"):
        s.run(device="tpu")


def test_check_equals_cli(cli, tmp_path):
    name = "bert_tiny.ts14"
    low = tmp_path / "low.onnx"
    cli.run("optimize", model(name), "-o", low, "--precision", "fp16", "-q")
    p = cli.run("check", model(name), low, "--json", check=False)
    want = json.loads(p.stdout)
    a, b = graphopt.load(model(name)), graphopt.load(low)
    got = a.check(b)
    assert got == want and got["ok"] is False and p.returncode == 1
    loose = a.check(b, rtol=1e-2, atol=1e-3, tensor_scale=True)
    assert loose == cli.json("check", model(name), low, "--json", "--rtol", "1e-2", "--atol", "1e-3", "--tensor-scale")
    assert loose["ok"] is True
    # Inputs from a dict or an npz path: the CLI's --inputs.
    via_npz = cli.json("check", model(name), model(name), "--json", "--inputs", MODELS / f"{name}.inputs.npz")
    got = a.check(a, inputs=npz_inputs(name))
    assert got["outputs"] == via_npz["outputs"] and got["ok"]


def test_save(cli, tmp_path):
    name = "gpt2_tiny.ts14.extdata"
    s = graphopt.load(model(name))
    out = tmp_path / "g.onnx"
    r = s.save(out)
    assert r["external_bytes"] > 0 and (tmp_path / "g.onnx.data").exists()
    cli.run("optimize", model(name), "-o", tmp_path / "c.onnx", "--passes", "none", "-q")
    assert out.with_name("g.onnx.data").read_bytes() == (tmp_path / "c.onnx.data").read_bytes()
    inline = s.save(tmp_path / "i.onnx", external_data=False)
    assert inline["external_bytes"] == 0 and (tmp_path / "i.onnx").read_bytes() == s.to_bytes()
    # Never over the source; the CLI's message.
    with pytest.raises(graphopt.GraphoptError) as e:
        s.save(model(name))
    assert str(e.value).endswith("the output would overwrite the input; choose another output path")


def test_chain_and_report():
    s = graphopt.load(model("bert_tiny.ts14"))
    t = s.optimize(opset=20).grad()
    steps = [x["step"] for x in t.report()["steps"]]
    assert steps == ["optimize", "grad"]
    assert t.report()["source"].endswith("bert_tiny.ts14.onnx")
    assert len(t.report()["passes"]) > 0
    assert "graphopt.Session" in repr(t)


def test_text_equals_cli(cli):
    name = "mlp_fp16.ts14"
    s = graphopt.load(model(name))
    assert s.text() == cli.run("print", model(name)).stdout
    assert s.text(full=True) == cli.run("print", model(name), "--full").stdout


def test_gil_released_during_long_calls():
    s = graphopt.load(model("resnet_tiny.ts14"))
    window = {}

    def work():
        window["start"] = time.perf_counter()
        # 100 runs: well past the 50 ms window below (20 runs took 47 ms
        # once the runtime fused resnet_tiny's Relus into its Convs).
        s.run(dims={"batch": 8}, repeat=100, threads=1)
        window["end"] = time.perf_counter()

    t = threading.Thread(target=work)
    ticks = []
    t.start()
    while t.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    t.join()
    inside = [x for x in ticks if window["start"] < x < window["end"]]
    # With the GIL held for the whole call, this thread could not tick
    # inside the window at all.
    assert window["end"] - window["start"] > 0.05
    assert len(inside) >= 10, (len(inside), window)


def test_concurrent_calls_on_shared_sessions():
    a = graphopt.load(model("resnet_tiny.ts14"))
    b = a.optimize()
    results, errors = [], []

    def work(x, y):
        try:
            results.append((x.check(y, rtol=1e-3, atol=1e-4)["ok"], x.input_names))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=p) for p in [(a, b), (b, a), (a, a)] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors and results == [(True, a.input_names)] * 6


def test_quantize_equals_cli(cli, tmp_path):
    name = "bert_tiny.ts14"
    out, rep = tmp_path / "q.onnx", tmp_path / "r.json"
    calib = MODELS / f"{name}.inputs.npz"
    cli.run("optimize", model(name), "-o", out, "--quantize", "int8-weights", "--calibration", calib,
            "--report", rep)
    want = json.loads(rep.read_text())["quantize"]
    q = graphopt.load(model(name)).optimize().quantize("int8-weights", calibration=calib)
    assert q.to_bytes() == out.read_bytes()
    got = q.report()["steps"][-1]["report"]
    assert strip_times(got) == strip_times(want)
    assert got["weights_bytes_after"] < 0.5 * got["weights_bytes_before"]
    # Calibration batches as dicts give the same model as the npz they came from.
    with np.load(calib) as z:
        batch = {k: z[k] for k in z.files}
    s = graphopt.load(model(name)).optimize().quantize("static", calibration=[batch])
    t = graphopt.load(model(name)).optimize().quantize("static", calibration=calib)
    assert s.to_bytes() == t.to_bytes()
    assert "DequantizeLinear" in s.text()
    with pytest.raises(graphopt.GraphoptError, match="block.size 48"):
        graphopt.load(model(name)).quantize("int4-weights", block_size=48)


def test_compress_equals_cli(cli, tmp_path):
    name = "bert_tiny.ts14"
    out, rep = tmp_path / "c.onnx", tmp_path / "r.json"
    calib = MODELS / f"{name}.inputs.npz"
    cli.run("optimize", model(name), "-o", out, "--compress", "cluster:6", "--calibration", calib,
            "--report", rep)
    want = json.loads(rep.read_text())["compress"]
    c = graphopt.load(model(name)).optimize().compress("cluster:6", calibration=calib)
    assert c.to_bytes() == out.read_bytes()
    got = c.report()["steps"][-1]["report"]
    assert strip_times(got) == strip_times(want)
    assert got["layers"] and got["weights_bytes_after"] < 0.4 * got["weights_bytes_before"]
    assert "Gather" in c.text() and "palette_codebook" in c.text()
    with pytest.raises(graphopt.GraphoptError, match="bits must be 2, 3, 4, 6 or 8"):
        graphopt.load(model(name)).compress("cluster:5")
    with pytest.raises(graphopt.GraphoptError, match="--max-error 1e-9: cluster:2 meets the bound only"):
        graphopt.load(model(name)).compress("cluster:2", calibration=calib, max_error=1e-9)


def test_prune_equals_cli(cli, tmp_path):
    name = "bert_tiny.dynamo18"
    out, rep = tmp_path / "p.onnx", tmp_path / "r.json"
    calib = MODELS / f"{name}.inputs.npz"
    cli.run("prune", model(name), "-o", out, "--ratio", "0.5", "--calibration", calib, "--report", rep)
    want = json.loads(rep.read_text())
    p = graphopt.load(model(name)).prune(ratio=0.5, calibration=calib)
    assert p.to_bytes() == out.read_bytes()
    got = p.report()["steps"][-1]["report"]
    assert strip_times(got) == strip_times(want)
    assert any(g["kind"] == "heads" and g["removed"] == 1 for g in got["groups"])
    assert got["params_after"] < 0.7 * got["params_before"]
    with pytest.raises(graphopt.GraphoptError, match="give one of --ratio"):
        graphopt.load(model(name)).prune()
    with pytest.raises(graphopt.GraphoptError, match="--protect nope"):
        graphopt.load(model(name)).prune(ratio=0.3, protect=["nope"])


def test_prune_taylor_and_sparsity_equal_cli(cli, tmp_path):
    digits = MODELS.parent / "train"
    src, data = digits / "digits_cnn.onnx", digits / "digits_cnn.train.npz"
    out, rep = tmp_path / "t.onnx", tmp_path / "t.json"
    cli.run("prune", src, "-o", out, "--ratio", "0.5", "--criterion", "taylor", "--calibration", data,
            "--loss", "cross_entropy", "--target", "y", "--report", rep)
    p = graphopt.load(src).prune(ratio=0.5, criterion="taylor", calibration=data, loss="cross_entropy",
                                 target="y")
    assert p.to_bytes() == out.read_bytes()
    got = p.report()["steps"][-1]["report"]
    assert strip_times(got) == strip_times(json.loads(rep.read_text()))
    assert got["criterion"] == "taylor"
    with pytest.raises(graphopt.GraphoptError, match="--criterion taylor needs --calibration"):
        graphopt.load(src).prune(ratio=0.5, criterion="taylor")
    s = graphopt.load(src).prune(sparsity=0.8, calibration=data)
    sp = s.report()["steps"][-1]["report"]["sparsity"]
    assert sp["stored_sparse"] == sp["weights"] > 0 and sp["file_bytes_after"] < sp["file_bytes_before"]


def test_remat_equals_cli(cli, tmp_path):
    name = "gpt2_tiny.ts14"
    train_path, out, rep = tmp_path / "t.onnx", tmp_path / "r.onnx", tmp_path / "r.json"
    cli.run("grad", model(name), "-o", train_path, "--loss", "sum")
    want = cli.json("remat", train_path, "-o", out, "--budget", "90%", "--dim", "batch=8", "--dim", "seq=8",
                    "--json")
    t = graphopt.load(train_path)
    r = t.remat("90%", dims={"batch": 8, "seq": 8})
    assert r.to_bytes() == out.read_bytes()
    got = r.report()["steps"][-1]["report"]
    assert strip_times(got) == strip_times(want)
    assert got["arena_after_bytes"] <= got["budget_bytes"] or got["lower_bound_after_bytes"] <= got["budget_bytes"]
    sweep = t.remat_sweep(dims={"batch": 8, "seq": 8}, strategies=["auto", "sqrt"], points=4)
    assert [f["strategy"] for f in sweep["frontiers"]] == ["auto", "sqrt"]
    assert all(p["peak_fraction"] <= 1.0 for f in sweep["frontiers"] for p in f["points"])
    with pytest.raises(graphopt.GraphoptError, match="strategy"):
        t.remat("50%", strategy="bogus")
