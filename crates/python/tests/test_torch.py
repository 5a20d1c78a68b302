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
    assert tr.remat_frontier is None and any("remat" in n for n in tr.notes)
    assert "saved for backward" in str(tr)
    assert m.training  # the module's mode is restored


def test_max_batch_grows_with_budget():
    m = mlp()
    x = torch.randn(2, 64)
    small = gt.max_batch(m, (x,), 1 << 20)
    big = gt.max_batch(m, (x,), 16 << 20)
    assert 1 <= small < big
    assert gt.max_batch(m, (x,), 16 << 20, training=True) < big
