"""graphopt.distributed: Python processes under mpirun join one communicator,
train data-parallel and pipelined, and equal one process; the planning calls
equal the CLI's.

The mpirun tests need the package built with MPI (`HAS_MPI`; the test
harness builds it so when `mpirun` is on PATH) and skip otherwise, except
under CI=true or GRAPHOPT_REQUIRE_MPI=1, where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import graphopt
import graphopt.distributed as dist
from conftest import REPO

TRAIN = REPO / "testdata" / "train"
MLP = TRAIN / "digits_mlp.onnx"
CNN = TRAIN / "digits_cnn.onnx"
ARGS = dict(batch=32, steps=6, target="y", optimizer="adamw", lr=0.002, seed=5, threads=1)
REQUIRED = os.environ.get("CI") == "true" or os.environ.get("GRAPHOPT_REQUIRE_MPI") == "1"


def mpirun() -> str:
    m = shutil.which("mpirun")
    if dist.HAS_MPI and m:
        return m
    why = "needs MPI: mpirun on PATH and the package built with --features mpi"
    if REQUIRED:
        pytest.fail(why)
    pytest.skip(why)


def launch(tmp_path, n: int, body: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Runs `body` on `n` ranks (`world`, `graphopt`, `dist`, `np`, `out`
    defined; it sets `res`, which each rank writes as JSON)."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import json, sys\nimport numpy as np\nimport graphopt\nimport graphopt.distributed as dist\n"
        "out = sys.argv[1]\nworld = dist.init(comm_timeout=60)\nres = {}\n"
        + textwrap.dedent(body)
        + "\njson.dump(res, open(f'{out}/rank{world.rank}.json', 'w'))\n"
    )
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-np", str(n), sys.executable, str(script), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    ranks = []
    for r in range(n):
        f = tmp_path / f"rank{r}.json"
        ranks.append(json.loads(f.read_text()) if f.exists() else None)
    return p, ranks


def losses(report: dict) -> list[float]:
    return [r["loss"] for r in report["log"]]


def test_collectives_and_data_parallel_training_equal_one_process(tmp_path):
    p, ranks = launch(
        tmp_path,
        2,
        f"""
        r = world.rank
        res["world"] = [world.rank, world.size, world.engine]
        res["sum"] = world.all_reduce(np.full((2, 2), r + 1, np.float32)).tolist()
        res["gather"] = world.all_gather(np.array([r, 10 * r], np.float32)).tolist()
        res["bcast"] = world.broadcast(np.arange(3, dtype=np.int64) * (r + 7), root=1).tolist()
        res["again"] = [dist.init().rank, dist.init().size]  # the same world again
        s = graphopt.load({str(MLP)!r})
        for scheme in ("dp", "zero1", "zero2"):
            t = s.train({str(TRAIN / "digits_mlp.train.npz")!r}, distributed=scheme, **{ARGS!r})
            rep = t.report()["steps"][-1]["report"]
            res[scheme] = {{"losses": [x["loss"] for x in rep["log"]], "dist": rep["distributed"],
                           "w": {{k: v.tolist() for k, v in t.weights().items()}}}}
        # A size that differs from the root's: every rank still takes part,
        # this one raises.
        try:
            world.broadcast(np.zeros(3 if world.rank == 1 else 4, np.float32), root=1)
            res["mismatch"] = None
        except graphopt.GraphoptError as e:
            res["mismatch"] = str(e)
        world.barrier()
        # After finalize, the world's calls raise (MPI is over).
        dist.finalize()
        try:
            world.barrier()
            res["after"] = None
        except graphopt.GraphoptError as e:
            res["after"] = str(e)
        """,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for r, res in enumerate(ranks):
        assert res["world"] == [r, 2, "mpi"]
        assert res["sum"] == [[3.0, 3.0], [3.0, 3.0]]
        assert res["gather"] == [[0.0, 0.0], [1.0, 10.0]]
        assert res["bcast"] == [0, 8, 16]
        assert res["again"] == [r, 2]
        if r == 1:
            assert res["mismatch"] is None
        else:
            assert res["mismatch"] == "broadcast: rank 1 sent 12 bytes, this rank's array has 16"
        assert res["after"] == "barrier: graphopt.distributed.finalize() already ended MPI in this process"
    # One process summing the same two halves as two micro-batches: the
    # same bits (two ranks add as one process adds two micro-batches).
    one = graphopt.load(str(MLP)).train(str(TRAIN / "digits_mlp.train.npz"), micro_batches=2, **ARGS)
    want = losses(one.report()["steps"][-1]["report"])
    w1 = one.weights()
    for scheme in ("dp", "zero1", "zero2"):
        for r, res in enumerate(ranks):
            got = res[scheme]
            assert got["losses"] == want, (scheme, r)
            d = got["dist"]
            assert (d["scheme"], d["rank"], d["ranks"], d["local_batch"]) == (scheme, r, 2, 16)
            for k, v in w1.items():
                assert np.array_equal(np.asarray(got["w"][k], v.dtype), v), (scheme, r, k)
        # zero1/zero2: each rank holds half the optimizer state.
        per = ranks[0][scheme]["dist"]["per_rank"]
        dp = ranks[0]["dp"]["dist"]["per_rank"][0]["optimizer_state_bytes"]
        if scheme != "dp":
            assert per[0]["optimizer_state_bytes"] < 0.51 * dp + 64, per


def test_pipeline_stages_train_as_one_process(tmp_path, cli):
    cut = tmp_path / "cut"
    s = graphopt.load(str(CNN))
    data = str(TRAIN / "digits_cnn.train.npz")
    r = s.partition(2, output=str(cut), data=data, batch=32, target="y", optimizer="adamw")
    # The CLI cuts and plans the same.
    c = cli.json("partition", CNN, "--stages", "2", "-o", tmp_path / "cli", "--data", data,
                 "--batch", "32", "--target", "y", "--optimizer", "adamw", "--json")
    assert r == c
    assert [x["stage"] for x in r["planned"]] == [0, 1]
    p, ranks = launch(
        tmp_path,
        2,
        f"""
        s = graphopt.load({str(CNN)!r})
        t = s.train({data!r}, pipeline={str(cut)!r}, **{ARGS!r})
        rep = t.report()["steps"][-1]["report"]
        res["losses"] = [x["loss"] for x in rep["log"]]
        if world.rank == 0:
            res["w"] = {{k: v.tolist() for k, v in t.weights().items()}}
        """,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    one = graphopt.load(str(CNN)).train(data, micro_batches=2, **ARGS)
    want = losses(one.report()["steps"][-1]["report"])
    assert ranks[0]["losses"] == want
    for k, v in one.weights().items():
        assert np.array_equal(np.asarray(ranks[0]["w"][k], v.dtype), v), k


def test_a_failing_rank_names_itself_and_the_others_end(tmp_path):
    # Rank 1 asks for a batch its data does not have: it raises (and does
    # not finalize); rank 0, waiting in a collective, is ended by mpirun,
    # long before its 60 s timeout.
    import time

    t0 = time.monotonic()
    p, ranks = launch(
        tmp_path,
        2,
        f"""
        s = graphopt.load({str(MLP)!r})
        batch = 32 if world.rank == 0 else 100000
        s.train({str(TRAIN / "digits_mlp.train.npz")!r}, distributed="dp", batch=batch, target="y")
        """,
        timeout=120,
    )
    took = time.monotonic() - t0
    assert p.returncode != 0
    assert "rank 1: " in p.stderr and "--batch 100000" in p.stderr, p.stderr
    assert ranks == [None, None]
    assert took < 30, took


def test_outside_mpirun_init_refuses_in_one_line():
    with pytest.raises(graphopt.GraphoptError) as e:
        dist.init()
    msg = str(e.value)
    if dist.HAS_MPI:
        assert "not started by an MPI launcher" in msg and "\n" not in msg, msg
    else:
        assert "built without MPI" in msg and e.value.kind == "unsupported", msg
    with pytest.raises(graphopt.GraphoptError, match="not started by an MPI launcher|built without MPI"):
        graphopt.load(str(MLP)).train(str(TRAIN / "digits_mlp.train.npz"), distributed="dp", **ARGS)
    with pytest.raises(graphopt.GraphoptError, match="expected dp, zero1 or zero2"):
        graphopt.load(str(MLP)).train(str(TRAIN / "digits_mlp.train.npz"), distributed="zero3", **ARGS)
    assert dist.launched() is False


def test_plan_distributed_and_budgeted_partition_equal_the_cli(tmp_path, cli):
    step = tmp_path / "cnn_train.onnx"
    cli.run("grad", CNN, "--optimizer", "adamw", "--loss", "cross_entropy", "-o", step)
    s = graphopt.load(str(step))
    for scheme in ("dp", "zero1", "zero2"):
        py = s.plan_distributed(scheme, 2, dims={"batch": 32})
        c = cli.json("plan", step, "--distributed", scheme, "--ranks", "2", "--dim", "batch=32", "--json")
        assert py == c, scheme
    py = s.plan_distributed("zero2", 4, budget="1MB")
    c = cli.json("plan", step, "--distributed", "zero2", "--ranks", "4", "--budget", "1MB", "--max-batch", "--json")
    assert py == c
    with pytest.raises(graphopt.GraphoptError, match="no cut into 2 stages fits"):
        graphopt.load(str(CNN)).partition(2, data=str(TRAIN / "digits_cnn.train.npz"), batch=32,
                                          target="y", budget="100KB")


def test_the_readme_example_runs_under_mpirun(tmp_path):
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = [b for b in blocks if b.startswith("import graphopt, graphopt.distributed as dist")]
    assert len(example) == 1, "the README's graphopt.distributed example moved"
    out = tmp_path / "trained.onnx"
    script = tmp_path / "readme.py"
    script.write_text(example[0].replace('"trained.onnx"', repr(str(out))))
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    # Rank 0 wrote the trained model; it differs from the untrained one.
    trained = graphopt.load(str(out)).weights()
    before = graphopt.load(str(MLP)).weights()
    assert trained.keys() == before.keys()
    assert any(not np.array_equal(trained[k], before[k]) for k in before)
