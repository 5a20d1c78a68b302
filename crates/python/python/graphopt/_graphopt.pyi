"""Type stubs of the extension module ``graphopt._graphopt`` (Rust, pyo3)."""

from __future__ import annotations

import os
from typing import Any, Iterable, Literal, Mapping, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

PathLike = Union[str, "os.PathLike[str]"]
#: A dict of numpy arrays by input name, an ``.npz`` path, or None (seeded
#: random inputs: floats uniform in [-1, 1), integers in {0, 1}).
Inputs = Union[Mapping[str, npt.ArrayLike], PathLike, None]
Dims = Mapping[str, int]
Report = dict[str, Any]

class GraphoptError(Exception):
    """A graphopt error: one line naming the file and the node or tensor, as the CLI prints it."""

    kind: Literal["io", "parse", "invalid", "unsupported", "tolerance", "budget", "verify", "runtime"]
    """What went wrong: ``graphopt::ErrorKind``."""

class Session:
    """One ONNX model and what graphopt did to it.

    ``optimize``, ``lower_precision`` and ``grad`` return a new Session and
    leave this one unchanged; ``report()`` lists the steps that made it.
    """

    @property
    def source(self) -> str | None:
        """The file the model was loaded from, or None."""
    @property
    def input_names(self) -> list[str]:
        """Names of the inputs a caller feeds (graph inputs without an initializer)."""
    @property
    def output_names(self) -> list[str]:
        """Names of the graph outputs."""
    def optimize(
        self,
        passes: str | Sequence[str] | None = None,
        opset: int | None = None,
        max_rounds: int | None = None,
        verify: bool = False,
        stop_after: int | None = None,
        skip: str | Sequence[str] | None = None,
        precision: Literal["fp16", "bf16", "fp16-weights"] | None = None,
        keep_fp32: str | Sequence[str] | None = None,
        keep_io_types: bool = True,
        any_runtime: bool = False,
        validate: bool | Literal["strict", "best-effort"] | None = None,
        inputs: Inputs = None,
        rtol: float = 1e-2,
        atol: float = 1e-3,
        force: bool = False,
        dims: Dims | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        seed: int = 7,
        range_check: bool = True,
    ) -> Session:
        """The default simplify/fuse pipeline to a fixed point, or the named passes
        (``"none"`` for none); ``opset`` raises the default-domain opset first (e.g. 20
        for LayerNormalization and Gelu fusion). ``skip`` leaves passes out: None is the
        library's policy (``fuse_conv_bn`` is left out when ``precision`` is given),
        ``[]`` keeps every pass. ``verify=True`` runs the IR verifier after every pass
        (else once, after the last). ``precision`` lowers after the pipeline with the
        ``lower_precision`` arguments, as ``graphopt optimize --precision`` does.
        Whole or not at all; returns a new Session."""
    def lower_precision(
        self,
        precision: Literal["fp16", "bf16", "fp16-weights"],
        keep_fp32: str | Sequence[str] | None = None,
        keep_io_types: bool = True,
        any_runtime: bool = False,
        validate: bool | Literal["best-effort", "strict"] | None = None,
        inputs: Inputs = None,
        rtol: float = 1e-2,
        atol: float = 1e-3,
        force: bool = False,
        dims: Dims | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        seed: int = 7,
        range_check: bool = True,
    ) -> Session:
        """fp16/bf16 compute with an autocast-like fp32 keep-list, or fp16 weight storage.

        ``validate`` runs the original and the lowered model in tract and keeps the
        nodes that break the tolerance fp32; ending over tolerance raises
        :class:`GraphoptError` unless ``force``."""
    def grad(
        self,
        loss: Literal["sum", "mean", "mse", "l1", "cross_entropy"] = "sum",
        output: str | None = None,
        class_axis: int = 1,
        trainable: str | Sequence[str] | None = None,
        frozen: str | Sequence[str] | None = None,
        input_grads: bool = False,
        optimizer: Literal["none", "sgd", "adamw"] = "none",
        lr: float | None = None,
        weight_decay: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        params_as_inputs: bool = False,
        dims: Dims | None = None,
        simplify: bool = True,
        recompute_pointwise: bool = True,
        dropout_train: bool = False,
        keep_grads: bool = False,
    ) -> Session:
        """The training graph (forward, ``loss``, ``<param>_grad``; ``sgd``/``adamw`` add
        ``<param>_new`` and drop ``<param>_grad`` unless ``keep_grads``, adamw also its moments and ``step``, with torch's defaults:
        sgd lr 0.01, adamw lr 1e-3 and weight_decay 1e-2); its report has the
        saved-for-backward bytes and the step's plan at ``dims``. Elementwise values that
        come cheaply from values the backward pass keeps anyway are recomputed there
        (``recompute_pointwise=False`` holds them, as ``--no-recompute-pointwise``). ``dropout_train``
        runs every Dropout in training mode (the report's ``dropout_train`` lists
        them; a model without one gets a ``warnings`` entry)."""
    def weights(self, names: str | Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The model's initializers as numpy arrays, by name (``names`` picks some)."""
    def train(
        self,
        data: str | os.PathLike[str] | Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]],
        batch: int,
        epochs: int | None = None,
        steps: int | None = None,
        loss: Literal["sum", "mean", "mse", "l1", "cross_entropy"] | None = None,
        output: str | None = None,
        target: str | None = None,
        class_axis: int | None = None,
        optimizer: Literal["sgd", "adamw"] | None = None,
        lr: float | None = None,
        weight_decay: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        trainable: str | Sequence[str] | None = None,
        frozen: str | Sequence[str] | None = None,
        seed: int | None = None,
        shuffle: bool = True,
        dropout_train: bool = True,
        eval: str | os.PathLike[str] | Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]] | None = None,
        metric: Literal["accuracy", "loss"] | None = None,
        micro_batches: int | None = None,
        budget: int | str | None = None,
        remat: Literal["auto", "none"] | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        every: int | None = None,
        resume: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        distributed: Literal["dp", "zero1", "zero2"] | None = None,
        bucket_size: int | str | None = None,
        pipeline: str | os.PathLike[str] | None = None,
        comm_timeout: float | None = None,
    ) -> Session:
        """Trains with graphopt's training step in graphopt's runtime, as ``graphopt
        train``; the new Session holds the trained inference model, its report the step
        log, evals and memory. ``data``/``eval``: an .npz path or a directory of shards, a
        dict of arrays with a leading example axis (the model's inputs and the target), or
        an iterable of such dicts (concatenated). Options left None take the library's
        defaults: cross_entropy, target ``target``, class axis 1, sgd, seed 0, one epoch,
        accuracy, a checkpoint every 100 steps. Under ``budget``, ``remat="auto"`` (the
        default) recomputes forward values where micro-batches alone do not fit.

        Under ``mpirun`` (see :mod:`graphopt.distributed`): ``distributed`` trains this
        rank on its share of each batch (``train --distributed``; gradients reduced in
        buckets of ``bucket_size``, default 25 MiB: all-reduced under dp and zero1, each
        piece to its slice's owner under zero2), ``pipeline`` runs this rank's stage of a
        :meth:`partition` folder (``train --pipeline``; not with ``eval``). Errors name the
        rank. ``comm_timeout`` applies when this call starts MPI."""
    def partition(
        self,
        stages: int,
        output: str | os.PathLike[str] | None = None,
        micro_batches: int | None = None,
        schedule: Literal["gpipe", "1f1b"] | None = None,
        dims: Dims | None = None,
        data: str | os.PathLike[str] | Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]] | None = None,
        batch: int | None = None,
        target: str | None = None,
        loss: Literal["sum", "mean", "mse", "l1", "cross_entropy"] | None = None,
        class_axis: int | None = None,
        optimizer: Literal["sgd", "adamw"] | None = None,
        budget: int | str | Sequence[int | str] | None = None,
    ) -> Report:
        """Cuts the model into pipeline stages, as ``graphopt partition --json``:
        ``{"manifest": ..., "planned": ...}``; writes the stage files and
        ``manifest.json`` into ``output`` when given. With ``data`` and ``batch`` each
        stage's training step is planned; ``budget`` (one size, or one per stage) picks
        the cuts whose slowest stage is least among those whose every stage fits."""
    def quantize(
        self,
        mode: Literal["dynamic", "static", "int8-weights", "int4-weights"],
        calibration: Iterable[Mapping[str, np.ndarray]] | str | os.PathLike[str] | None = None,
        calibrate: str | None = None,
        per_channel: bool | None = None,
        symmetric: bool | None = None,
        block_size: Literal[32, 64, 128] | None = None,
        exclude: str | Sequence[str] | None = None,
        max_error: float | Literal["none"] | None = None,
        measure: bool | None = None,
        dims: Dims | None = None,
    ) -> Session:
        """Quantized in standard ONNX ops (``graphopt optimize --quantize``);
        ``calibration`` is batches (dicts of arrays), an .npz or a folder of them.
        Over ``max_error`` after putting layers back to float: GraphoptError."""
    def compress(
        self,
        method: str,
        calibration: Iterable[Mapping[str, np.ndarray]] | str | os.PathLike[str] | None = None,
        exclude: str | Sequence[str] | None = None,
        max_error: float | Literal["none"] | None = None,
        measure: bool | None = None,
        dims: Dims | None = None,
        min_weight_elems: int | None = None,
    ) -> Session:
        """Weights compressed in standard ONNX ops (``graphopt optimize --compress``):
        ``"cluster:BITS[:per-channel-groups=G]"`` (k-means palettes),
        ``"lowrank[:ENERGY|:RANK|:params=F]"`` (two thin factors, activation-aware
        with ``calibration``) or ``"share[:TOL]"`` (near-equal weights merged). Over
        ``max_error`` (default 0.05) with the most sensitive layers left as they
        were: GraphoptError."""
    def prune(
        self,
        ratio: float | None = None,
        target_params: float | None = None,
        target_flops: float | None = None,
        sparsity: float | None = None,
        criterion: Literal["l1", "l2", "taylor", "random"] | None = None,
        granularity: Literal["channel", "head", "all"] | None = None,
        global_ranking: bool | None = None,
        round_to: int | None = None,
        protect: str | Sequence[str] | None = None,
        dims: Dims | None = None,
        calibration: Iterable[Mapping[str, np.ndarray]] | str | os.PathLike[str] | None = None,
        measure: bool | None = None,
        loss: Literal["sum", "mean", "mse", "l1", "cross_entropy"] | None = None,
        target: str | None = None,
    ) -> Session:
        """Structured pruning (``graphopt prune``): whole channels, hidden units and
        attention heads removed by dependency group. One of ``ratio``,
        ``target_params`` or ``target_flops`` (a fraction <= 1 or a count to keep).
        The report gives the groups, what was left alone and why, parameters and
        FLOPs before and after, and the error against the unpruned model."""
    def remat(
        self,
        budget: int | str,
        dims: Dims | None = None,
        strategy: Literal["auto", "optimal", "fast", "sqrt", "per-block"] = "auto",
        time_limit: float = 10.0,
        donate: bool | None = None,
    ) -> Session:
        """A training graph that fits ``budget`` (bytes, "2GiB" or "40%" of store-all)
        by recomputing forward values (``graphopt remat``); ``donate=False`` plans
        without the model's donation table (``--no-donate``)."""
    def remat_sweep(
        self,
        dims: Dims | None = None,
        strategies: str | Sequence[str] | None = None,
        points: int = 10,
        time_limit: float = 10.0,
        budget: int | str | None = None,
    ) -> dict[str, Any]:
        """Peak against extra FLOPs, per strategy (``graphopt remat --sweep --json``);
        ``strategies=None`` compares the library's set: auto, fast, sqrt, per-block.
        With ``budget`` (as ``remat``'s), ``chosen`` is the point it picks."""
    def plan(
        self,
        dims: Dims | None = None,
        inputs: Inputs = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        default_dim: int = 1,
        alignment: int | None = None,
        reorder: bool = True,
        strict: bool = False,
        verify: bool = False,
        threads: int | None = None,
        node_budget: int | None = None,
        time_limit: float | None = None,
        as_written: bool = False,
    ) -> Report:
        """The memory plan, with the fields of ``graphopt plan --json``
        (``weights_bytes``, ``lower_bound_bytes``, ``arena_bytes``, ``naive_bytes``,
        ``schedule``, ``tensors``, ``peak_tensors``, ``dims``, ...), of the graph ``run()``
        executes on the CPU (its arena is the one ``run()`` allocates); ``as_written=True``
        plans the model as written."""
    def max_batch(
        self,
        budget: int | str,
        dims: Dims | None = None,
        batch_dim: str | None = None,
        inputs: Inputs = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        default_dim: int = 1,
        alignment: int | None = None,
        reorder: bool = True,
        strict: bool = False,
        verify: bool = False,
        threads: int | None = None,
        node_budget: int | None = None,
        time_limit: float | None = None,
        as_written: bool = False,
    ) -> Report:
        """The largest batch whose weights + arena fit ``budget`` (bytes or "8GiB"):
        ``plan()``'s dict at that batch plus ``batch_dim``, ``max_batch``, ``budget_bytes``."""
    def plan_distributed(
        self,
        scheme: Literal["dp", "zero1", "zero2"],
        ranks: int,
        dims: Dims | None = None,
        batch_dim: str | None = None,
        budget: int | str | None = None,
        inputs: Inputs = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        default_dim: int = 1,
        alignment: int | None = None,
        reorder: bool = True,
        strict: bool = False,
        verify: bool = False,
        threads: int | None = None,
        node_budget: int | None = None,
        time_limit: float | None = None,
    ) -> Report:
        """One rank's bytes for this training graph under a data-parallel scheme, as
        ``graphopt plan --distributed S --ranks N --json``; with ``budget``, at the
        largest global batch whose per-rank bytes fit it."""
    def max_batch_remat(
        self,
        budget: int | str,
        dims: Dims | None = None,
        batch_dim: str | None = None,
        time_limit: float = 10.0,
        as_written: bool = False,
    ) -> dict[str, Any]:
        """The largest batch whose weights + arena fit ``budget`` on a training graph
        rematerialized to its least peak (``plan --max-batch --remat``): ``batch_dim``,
        ``max_batch`` and ``bytes``."""
    @overload
    def run(
        self,
        inputs: Inputs = None,
        device: Literal["cpu", "cuda"] = "cpu",
        dims: Dims | None = None,
        repeat: int = 1,
        poison: bool = False,
        threads: int | None = None,
        seed: int = 7,
        return_report: Literal[False] = False,
        allow_non_finite: bool = False,
        donate: bool | None = None,
        profile: bool = False,
    ) -> dict[str, np.ndarray]: ...
    @overload
    def run(
        self,
        inputs: Inputs = None,
        device: Literal["cpu", "cuda"] = "cpu",
        dims: Dims | None = None,
        repeat: int = 1,
        poison: bool = False,
        threads: int | None = None,
        seed: int = 7,
        *,
        return_report: Literal[True],
        allow_non_finite: bool = False,
        donate: bool | None = None,
        profile: bool = False,
    ) -> tuple[dict[str, np.ndarray], Report]: ...
    def check(
        self,
        other: Session,
        inputs: Inputs = None,
        rtol: float = 1e-5,
        atol: float = 1e-5,
        tensor_scale: bool = False,
        seed: int = 7,
        dims: Dims | None = None,
    ) -> Report:
        """Both models on the same inputs in tract, every output compared (``graphopt
        check --json``); out of tolerance is ``report["ok"] == False``, not an exception."""
    def inspect(self, dims: Dims | None = None) -> Report:
        """Inputs, outputs, ops, parameters by dtype, opsets (``graphopt inspect --json``)."""
    def save(
        self,
        path: PathLike,
        external_data: bool | int | None = None,
        location: str | None = None,
    ) -> Report:
        """Saves atomically; never over the file the session was loaded from."""
    def to_bytes(self) -> bytes:
        """The model as ONNX bytes (everything inline)."""
    def text(self, full: bool = False) -> str:
        """The model in the ONNX textual syntax (``graphopt print``)."""
    def report(self) -> Report:
        """``source``, ``steps`` (one ``{"step", "report"}`` per transform) and ``passes``."""

def load(model: PathLike | bytes | bytearray | memoryview | Any) -> Session:
    """Loads a model: a path, ONNX bytes, or an object with ``SerializeToString()``
    (``onnx.ModelProto``)."""

def passes() -> list[tuple[str, str]]:
    """Every pass: ``(name, one-line doc)``."""

def cli_main(argv: list[str]) -> int:
    """Runs the ``graphopt`` command with ``argv`` (argv[0] the program name); returns its exit status."""

HAS_MPI: bool

class World:
    """This process's place among the processes ``mpirun`` started (see
    :mod:`graphopt.distributed`)."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def engine(self) -> str: ...
    def barrier(self) -> None: ...
    def all_reduce(self, array: npt.ArrayLike) -> np.ndarray:
        """The sum over the ranks of a float32 array."""
    def all_gather(self, array: npt.ArrayLike) -> np.ndarray:
        """Every rank's float32 array, stacked in rank order."""
    def broadcast(self, array: npt.ArrayLike, root: int = 0) -> np.ndarray:
        """Rank ``root``'s array (same dtype and shape on every rank)."""

def distributed_init(comm_timeout: float | None = None) -> World: ...
def distributed_finalize() -> None: ...
def distributed_launched() -> bool: ...
