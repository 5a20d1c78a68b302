"""graphopt.torch on a small module. Skipped when torch is not installed
(CI does not install torch; this is the one skip allowed there)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI does not install it)")
pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")

import graphopt  # noqa: E402
import graphopt.torch as gt  # noqa: E402


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def test_export_runs_like_torch():
    m = mlp().eval()
    x = torch.randn(4, 64)
    s = gt.export(m, (x,))
    assert isinstance(s, graphopt.Session)
    out = s.run({s.input_names[0]: x.numpy()})
    got = next(iter(out.values()))
    with torch.no_grad():
        want = m(x).numpy()
    assert abs(got - want).max() < 1e-4


def test_memory_report_inference_and_training():
    m = mlp()
    x = torch.randn(32, 64)
    inf = gt.memory_report(m, (x,))
    assert inf.mode == "inference"
    assert inf.parameters == sum(p.numel() for p in m.parameters())
    assert inf.weights_bytes == 4 * inf.parameters
    assert inf.arena_bytes >= inf.activation_lower_bound_bytes > 0
    tr = gt.memory_report(m, (x,), training=True)
    assert tr.mode == "training" and tr.saved_for_backward_bytes > 0
    assert tr.arena_bytes > inf.arena_bytes
    # Nothing in two Linear layers is cheaper to recompute than to keep:
    # the frontier is the store-all point alone, at no extra FLOPs.
    assert tr.remat_frontier is not None and not tr.notes, tr.notes
    assert [(p["peak_fraction"], p["extra_flops_pct"]) for p in tr.remat_frontier] == [(1.0, 0.0)]
    assert "saved for backward" in str(tr)
    assert m.training  # the module's mode is restored


def test_max_batch_grows_with_budget():
    m = mlp()
    x = torch.randn(2, 64)
    small = gt.max_batch(m, (x,), 1 << 20)
    big = gt.max_batch(m, (x,), 16 << 20)
    assert 1 <= small < big
    assert gt.max_batch(m, (x,), 16 << 20, training=True) < big


def test_train_loads_the_trained_weights_back():
    # graphopt trains the module on a loader's batches and writes the
    # weights back: the module's loss on the data then equals what torch
    # reaches with the same optimizer on the same batches.
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    y = torch.randint(0, 10, (64,))
    loader = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    ours = mlp()
    theirs = mlp()
    theirs.load_state_dict(ours.state_dict())
    r = gt.train(ours, (x[:16],), loader, steps=8, optimizer="sgd", lr=0.1, shuffle=False)
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    losses = []
    for step in range(8):
        xb, yb = loader[step % 4]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(theirs(xb), yb)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    got = [s["loss"] for s in r["log"]]
    assert max(abs(a - b) / b for a, b in zip(got, losses)) < 1e-5, (got, losses)
    for (n, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), n


def test_memory_report_with_a_budget_picks_a_point_and_a_batch():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)) for _ in range(3)]
    )
    x = torch.randn(1024, 128)
    r = gt.memory_report(m, (x,), training=True, budget="80%")
    # 80% of the store-all peak is below it: the point picked recomputes.
    assert r.budget_bytes is not None and r.chosen is not None, r
    assert r.chosen["peak_bytes"] <= r.budget_bytes
    assert r.chosen["extra_flops_pct"] > 0
    store_all = max(p["peak_bytes"] for p in r.remat_frontier)
    assert r.budget_bytes < store_all
    # The example batch fits with recomputation; twice the budget fits more.
    assert r.max_batch is not None and r.max_batch >= 1024, r.max_batch
    bigger = gt.memory_report(m, (x,), training=True, budget=2 * r.budget_bytes)
    assert bigger.max_batch > r.max_batch
    text = str(r)
    assert "<- chosen" in text and f"with recomputation: {r.max_batch}" in text
    with pytest.raises(graphopt.GraphoptError, match="training=True"):
        gt.memory_report(m, (x,), budget="60%")
