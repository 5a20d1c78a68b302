"""graphopt for people who hold a ``torch.nn.Module``.

``torch`` (and ``onnxscript`` for torch's dynamo exporter) is imported here
only, when this module is imported: the rest of ``graphopt`` never needs it.

    import torch, graphopt.torch
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    x = torch.randn(32, 512)
    print(graphopt.torch.memory_report(model, (x,), training=True))

Figures come from graphopt's memory planner on the exported ONNX graph
(not from running torch): weights, the activation lower bound (the peak of
live bytes in the best order graphopt finds), the arena that holds every
activation at a planned offset, and for training the bytes of forward
activations that the backward pass reads ("saved for backward").
"""

from __future__ import annotations

import dataclasses
import io
import os
import tempfile
from typing import Any, Mapping, Optional, Sequence, Union

import torch

import graphopt
from graphopt._torch_checkpoint import CheckpointedModule, CheckpointReport, checkpoint

__all__ = [
    "CheckpointReport",
    "CheckpointedModule",
    "MemoryReport",
    "checkpoint",
    "export",
    "max_batch",
    "measure_peak",
    "memory_report",
    "train",
]

ExampleInputs = Union["torch.Tensor", Sequence["torch.Tensor"]]


def _as_tuple(example_inputs: ExampleInputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    return tuple(example_inputs)


def export(
    module: "torch.nn.Module",
    example_inputs: ExampleInputs,
    dynamic_shapes: Optional[Any] = None,
    *,
    opset: Optional[int] = None,
    dynamo: bool = True,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
) -> graphopt.Session:
    """Exports ``module`` with ``torch.onnx.export`` and loads the result.

    ``dynamic_shapes`` is passed to torch's exporter as it is (torch.export's
    form, e.g. ``({0: torch.export.Dim("batch")},)``); None exports static
    shapes. ``dynamo=False`` uses the TorchScript exporter instead (then
    ``dynamic_shapes`` is read as ``dynamic_axes``). The module is exported
    in its current mode (call ``module.eval()`` first for inference).
    """
    args = _as_tuple(example_inputs)
    with tempfile.TemporaryDirectory(prefix="graphopt-export-") as d:
        path = os.path.join(d, "model.onnx")
        kwargs: dict = {}
        if opset is not None:
            kwargs["opset_version"] = opset
        if input_names is not None:
            kwargs["input_names"] = list(input_names)
        if output_names is not None:
            kwargs["output_names"] = list(output_names)
        if dynamo:
            if dynamic_shapes is not None:
                kwargs["dynamic_shapes"] = dynamic_shapes
            torch.onnx.export(module, args, path, dynamo=True, verbose=False, **kwargs)
        else:
            if dynamic_shapes is not None:
                kwargs["dynamic_axes"] = dynamic_shapes
            torch.onnx.export(module, args, path, dynamo=False, **kwargs)
        files = os.listdir(d)
        if files == ["model.onnx"]:
            # One self-contained file: load its bytes, so that nothing
            # refers to the temporary folder once it is gone.
            with open(path, "rb") as f:
                return graphopt.load(f.read())
        # External data (models past 2 GiB): the session reads the files
        # while loading them, so load before the folder goes.
        session = graphopt.load(path)
        return graphopt.load(session.to_bytes())


def _export_eval(module: "torch.nn.Module", args: tuple, dynamic_shapes: Any, dynamo: bool) -> graphopt.Session:
    """``export`` in eval mode (Dropout off, BatchNorm on running stats: the
    forms graphopt's gradient rules take), restoring the module's mode."""
    was_training = module.training
    module.eval()
    try:
        return export(module, args, dynamic_shapes, dynamo=dynamo)
    finally:
        module.train(was_training)


def _batch_shapes(args: tuple, dynamo: bool) -> Any:
    """Dim 0 of every tensor input as one symbolic ``batch`` dim."""
    if dynamo:
        batch = torch.export.Dim("batch")
        return tuple({0: batch} if isinstance(a, torch.Tensor) and a.dim() > 0 else None for a in args)
    return {f"input_{i}": {0: "batch"} for i, a in enumerate(args) if isinstance(a, torch.Tensor)}


@dataclasses.dataclass
class MemoryReport:
    """What ``memory_report`` found. Byte counts are from graphopt's planner."""

    #: "inference" or "training".
    mode: str
    #: The module's parameters (``module.parameters()``).
    parameters: int
    weights_bytes: int
    #: Peak of live activation bytes in the best order graphopt finds (for
    #: training, of everything the step computes: activations, the loss and
    #: the gradients, which are the step's outputs).
    activation_lower_bound_bytes: int
    #: The one arena that holds every activation at its planned offset.
    arena_bytes: int
    #: Training only: forward activations (and inputs) the backward pass reads.
    saved_for_backward_bytes: Optional[int] = None
    saved_input_bytes: Optional[int] = None
    #: The largest saved values, (name, bytes), largest first.
    largest_saved: list = dataclasses.field(default_factory=list)
    #: Training only: memory/recompute trade-off points from graphopt's
    #: rematerialization (``Session.remat_sweep``): dicts with ``peak_bytes``,
    #: ``peak_fraction`` (of store-all) and ``extra_flops_pct``.
    remat_frontier: Optional[list] = None
    #: With a budget: the budget in bytes (the step's activations and
    #: gradients, as ``checkpoint``'s), the frontier point it picks (fewest
    #: extra FLOPs within it; None when none fits) and the largest batch
    #: whose arena fits it beside the weights once recomputation reaches
    #: its least peak (``Session.max_batch_remat``; None when not even
    #: batch 1).
    budget_bytes: Optional[int] = None
    chosen: Optional[dict] = None
    max_batch: Optional[int] = None
    notes: list = dataclasses.field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """Weights + arena: what the planned step needs, besides the runtime's own."""
        return self.weights_bytes + self.arena_bytes

    def __str__(self) -> str:
        def mib(b: Optional[int]) -> str:
            return "-" if b is None else f"{b / 2**20:10.2f} MiB"

        bound = "activations, lower bound" if self.mode == "inference" else "activations + grads, bound"
        rows = [
            ("weights", self.weights_bytes),
            (bound, self.activation_lower_bound_bytes),
            ("arena (planned)", self.arena_bytes),
            ("weights + arena", self.total_bytes),
        ]
        if self.mode == "training":
            rows.append(("saved for backward", self.saved_for_backward_bytes))
        lines = [f"graphopt memory report ({self.mode}, {self.parameters:,} parameters)"]
        lines += [f"  {label:<28} {mib(b)}" for label, b in rows]
        if self.mode == "training":
            lines += [f"    {name:<26} {mib(b)}" for name, b in self.largest_saved[:3]]
        if self.remat_frontier:
            lines.append("  recomputation (graphopt remat): peak -> extra FLOPs")
            chosen = (self.chosen or {}).get("peak_bytes")
            lines += [
                f"    {mib(p['peak_bytes'])} ({p['peak_fraction']:.2f} of store-all)  +{p['extra_flops_pct']:.1f}%"
                + ("  <- chosen" if p["peak_bytes"] == chosen else "")
                for p in self.remat_frontier
            ]
        if self.budget_bytes is not None:
            if self.chosen is None:
                lines.append(f"  budget {mib(self.budget_bytes).strip()}: no point of the frontier fits")
            else:
                lines.append(
                    f"  budget {mib(self.budget_bytes).strip()}: peak {mib(self.chosen['peak_bytes']).strip()} "
                    f"at +{self.chosen['extra_flops_pct']:.1f}% FLOPs (graphopt.torch.checkpoint applies it)"
                )
            if self.max_batch is not None:
                lines.append(f"  largest batch within the budget, with recomputation: {self.max_batch}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def _report(
    session: graphopt.Session,
    params: int,
    training: bool,
    loss: str,
    dims: Optional[Mapping[str, int]],
    budget: Optional[Union[int, str]] = None,
) -> tuple:
    """The report, and the training session (None for inference)."""
    session = session.optimize()
    if not training:
        p = session.plan(dims=dims, as_written=True)
        return MemoryReport(
            mode="inference",
            parameters=params,
            weights_bytes=p["weights_bytes"],
            activation_lower_bound_bytes=p["lower_bound_bytes"],
            arena_bytes=p["arena_bytes"],
        ), None
    train = session.grad(loss=loss, dims=dims)
    g = train.report()["steps"][-1]["report"]
    r = MemoryReport(
        mode="training",
        parameters=params,
        weights_bytes=g["weights_bytes"],
        activation_lower_bound_bytes=g["lower_bound_bytes"],
        arena_bytes=g["arena_bytes"],
        saved_for_backward_bytes=g["saved_activation_bytes"],
        saved_input_bytes=g["saved_input_bytes"],
        largest_saved=[(s["name"], s["bytes"]) for s in g["saved"] if not s["input"] and s["bytes"]],
    )
    # The recomputation trade-off: peak (fraction of store-all) against
    # extra FLOPs, from graphopt's remat solver (the model is not changed).
    try:
        sweep = train.remat_sweep(dims=dims, strategies=["auto"], points=6, budget=budget)
        r.remat_frontier = [
            {"peak_bytes": p["peak_bytes"], "peak_fraction": p["peak_fraction"],
             "extra_flops_pct": p["extra_flops_pct"]}
            for f in sweep["frontiers"] for p in f["points"]
        ]
        if budget is not None:
            r.budget_bytes = sweep["budget_bytes"]
            c = sweep.get("chosen")
            r.chosen = None if c is None else {
                "peak_bytes": c["peak_bytes"], "extra_flops_pct": c["extra_flops_pct"],
                "recomputed_nodes": c["recomputed_nodes"],
            }
    except graphopt.GraphoptError as e:
        r.notes.append(f"remat frontier: {e}")
    return r, train


def measure_peak(fn: Any) -> int:
    """The peak of CPU bytes allocated while ``fn()`` runs, above what was
    allocated before it, from the profiler's memory events
    (``torch.profiler`` with ``profile_memory=True``: every allocation and
    free, summed in time order). Free what should not count (gradients:
    ``zero_grad(set_to_none=True)``) before the call: a free inside ``fn`` of
    a block allocated before it counts against the peak."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def memory_report(
    module: "torch.nn.Module",
    example_inputs: ExampleInputs,
    training: bool = False,
    *,
    loss: str = "sum",
    dynamo: bool = True,
    budget: Optional[Union[int, str]] = None,
) -> MemoryReport:
    """Weights, activation lower bound and arena of ``module`` at the shapes of
    ``example_inputs``; with ``training=True``, of one training step (forward,
    ``loss`` over the first output, backward), with the bytes saved for backward
    and the recomputation frontier (peak against extra FLOPs).

    ``budget`` (training only; bytes, a size such as ``"2GiB"``, or a percent
    of the store-all peak) is the step's activations and gradients, as
    ``checkpoint``'s: the report then marks the frontier point it picks (the
    fewest extra FLOPs within it) and gives the largest batch (dim 0 of every
    input) whose arena fits it beside the weights at the least peak
    recomputation reaches (``Session.max_batch_remat``). Use example inputs with a
    batch of at least 2 then, so that the exporter keeps that dim symbolic.

    The module is exported in eval mode (``export``), simplified with graphopt's default
    pipeline, and for training differentiated by graphopt (``Session.grad``).
    """
    params = sum(p.numel() for p in module.parameters())
    args = _as_tuple(example_inputs)
    if budget is None:
        return _report(_export_eval(module, args, None, dynamo), params, training, loss, None)[0]
    if not training:
        raise graphopt.GraphoptError("memory_report: budget is for training=True (see max_batch for inference)")
    batch = int(args[0].shape[0]) if args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0 else 0
    if batch < 2:
        raise graphopt.GraphoptError("memory_report: with a budget, give example inputs with a batch of at least 2")
    session = _export_eval(module, args, _batch_shapes(args, dynamo), dynamo)
    dims = {"batch": batch}
    r, train = _report(session, params, training, loss, dims, budget)
    if r.budget_bytes is not None:
        # The library's search (Session.max_batch_remat) budgets weights +
        # arena; the budget here is the step's bytes beside the weights. In
        # bytes: a percent would scale with the batch.
        try:
            r.max_batch = int(train.max_batch_remat(r.weights_bytes + r.budget_bytes, as_written=True)["max_batch"])
        except graphopt.GraphoptError as e:
            if getattr(e, "kind", None) != "budget":
                raise
    return r


def max_batch(
    module: "torch.nn.Module",
    example_inputs: ExampleInputs,
    budget: Union[int, str],
    training: bool = False,
    *,
    loss: str = "sum",
    dynamo: bool = True,
) -> int:
    """The largest batch (dim 0 of every input) whose weights + arena fit
    ``budget`` (bytes, or a size such as ``"8GiB"``), for inference or for one
    training step. Use example inputs with a batch of at least 2, so that the
    exporter keeps the dim symbolic."""
    args = _as_tuple(example_inputs)
    session = _export_eval(module, args, _batch_shapes(args, dynamo), dynamo).optimize()
    if training:
        session = session.grad(loss=loss)
    return int(session.max_batch(budget, as_written=True)["max_batch"])


def train(
    module: "torch.nn.Module",
    example_inputs: ExampleInputs,
    loader: Any,
    *,
    batch: Optional[int] = None,
    epochs: Optional[int] = None,
    steps: Optional[int] = None,
    loss: Optional[str] = None,
    class_axis: Optional[int] = None,
    optimizer: Optional[str] = None,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    betas: Optional[tuple] = None,
    eps: Optional[float] = None,
    micro_batches: Optional[int] = None,
    budget: Optional[Union[int, str]] = None,
    seed: Optional[int] = None,
    shuffle: bool = True,
    threads: Optional[int] = None,
) -> dict:
    """Trains ``module`` with graphopt's training step and loads the trained
    weights back into it; returns the training report.

    ``loader`` yields ``(inputs..., target)`` tuples of tensors (a
    ``DataLoader`` does): the examples are gathered once into arrays, and
    graphopt batches them itself (``batch``, default the loader's first
    batch size; the last partial batch of each epoch is dropped; shuffled
    from ``seed`` unless ``shuffle=False``). The module is exported with the
    TorchScript exporter in eval mode (BatchNorm on its running statistics,
    Dropout off) with a symbolic batch dim; its parameters are matched to
    the exported initializers by name, and a parameter the export renamed
    or folded (so that graphopt cannot train it under its name) is an
    error naming it. The other options are ``Session.train``'s.
    """
    import numpy as np

    args = _as_tuple(example_inputs)
    names = [f"input_{i}" for i in range(len(args))]
    xs: list[list] = [[] for _ in args]
    ys: list = []
    for item in loader:
        item = tuple(item)
        if len(item) != len(args) + 1:
            raise ValueError(f"loader items hold {len(item)} tensors; expected {len(args)} inputs and a target")
        for k, t in enumerate(item[:-1]):
            xs[k].append(t.detach().cpu().numpy())
        ys.append(item[-1].detach().cpu().numpy())
        if batch is None:
            batch = int(item[-1].shape[0])
    if not ys:
        raise ValueError("the loader yielded nothing")
    data = {n: np.concatenate(x) for n, x in zip(names, xs)}
    data["target"] = np.concatenate(ys)
    was_training = module.training
    module.eval()
    try:
        session = export(module, args, _batch_shapes(args, False), dynamo=False, input_names=names)
    finally:
        module.train(was_training)
    params = dict(module.named_parameters())
    exported = set(session.weights())
    missing = [n for n in params if n not in exported]
    if missing:
        raise ValueError(
            "these parameters are not initializers of the exported model, so graphopt cannot "
            f"train them by name: {', '.join(missing[:8])}"
        )
    trained = session.train(
        data, batch, epochs=epochs, steps=steps, loss=loss, class_axis=class_axis,
        optimizer=optimizer, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps,
        trainable=list(params), micro_batches=micro_batches, budget=budget, seed=seed,
        shuffle=shuffle, threads=threads,
    )
    weights = trained.weights(list(params))
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(torch.from_numpy(np.ascontiguousarray(weights[n])).to(p.dtype))
    return trained.report()["steps"][-1]["report"]
