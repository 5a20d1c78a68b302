"""``graphopt.torch.checkpoint``: graphopt's recomputation plan, applied in
PyTorch with selective activation checkpointing.

How it works, step by step:

1. The module is exported with torch's dynamo exporter
   (``torch.onnx.export(..., dynamo=True, optimize=False)``), in its current
   mode. The exporter keeps the ``torch.export`` program it translated
   (``ONNXProgram.exported_program``), and marks every ONNX node with the fx
   node it came from (``pkg.torch.onnx.fx_node``).
2. graphopt differentiates the ONNX graph (``Session.grad``, without
   simplification, so that forward nodes keep their fx names) and solves
   recomputation under the budget (``Session.remat``). The remat report's
   ``torch_policy`` is the decision per fx node: ``save`` (the backward
   pass reads its output) or ``recompute``.
3. Each decision is checked against the exported program: the fx node must
   exist there with the same target. Op calls without a checked decision are
   saved and listed in the report (``unmapped``).
4. The wrapped module runs the exported program's nodes one by one on the
   original module's parameters and buffers. The nodes are cut into regions
   so that no recomputed value crosses a region's border; a region holding a
   value graphopt dropped runs under ``torch.utils.checkpoint`` with a
   selective-checkpoint policy (``MUST_SAVE`` for ``save`` nodes,
   ``PREFER_RECOMPUTE`` for the others), so torch recomputes it when the
   backward pass reaches it; the other regions run as plain autograd.
   Random ops in a region that recomputes are all recomputed, from the RNG
   state the region started with (``preserve_rng_state``): none is skipped
   by the cache, so each draws exactly what it drew in the forward.

The plan holds for the example inputs' shapes: other shapes raise
``GraphoptError``. In eval mode, or with gradients off, the wrapper calls the
module itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import operator
import re
from typing import Any, Optional, Sequence, Union

import torch
import torch.utils._pytree as pytree
from torch.utils.checkpoint import CheckpointPolicy, checkpoint as _torch_checkpoint
from torch.utils.checkpoint import create_selective_checkpoint_contexts

import graphopt

_SAVE = CheckpointPolicy.MUST_SAVE
_RECOMPUTE = CheckpointPolicy.PREFER_RECOMPUTE
#: Steps between a dropped value's producer and a reader beyond which the
#: reader gets its own copy of the value (``_rederive``).
_FAR = 8


@dataclasses.dataclass
class CheckpointReport:
    """What ``checkpoint`` planned. Bytes are graphopt's planner's (activations
    and gradients of one step, weights excluded)."""

    #: The budget in bytes, as graphopt read it.
    budget_bytes: int
    #: Peak of the step without recomputation, and with the plan.
    store_all_peak_bytes: int
    planned_peak_bytes: int
    #: Extra FLOPs of the recomputation, and as a percent of the step's.
    extra_flops: int
    extra_flops_pct: float
    strategy: str
    #: Op calls (fx nodes that run an operator) by what torch does with them.
    saved_ops: int
    recomputed_ops: int
    #: Random ops (dropout...) in regions that recompute: recomputed from
    #: the RNG state their region started with, so they draw the same.
    random_ops_recomputed: int
    #: Op calls without a checked decision (saved): ``(fx node, why)``.
    unmapped: list
    #: Values graphopt's backward reads that no fx node produces (saved).
    unmapped_values: list
    #: Regions the forward is cut into, and how many of them recompute.
    regions: int
    checkpointed_regions: int
    #: Dropped values computed a second time in the forward, next to a
    #: reader far from their producer (see ``_rederive``).
    rederived: int = 0
    #: The per-fx-node decision graphopt returned (``graphopt remat --torch-policy``'s file).
    policy: dict = dataclasses.field(repr=False, default_factory=dict)

    def __str__(self) -> str:
        mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
        lines = [
            f"graphopt checkpoint ({self.strategy}): planned peak {mib(self.planned_peak_bytes)} "
            f"of {mib(self.store_all_peak_bytes)} store-all (budget {mib(self.budget_bytes)}), "
            f"+{self.extra_flops_pct:.2f}% FLOPs",
            f"  op calls: {self.saved_ops} saved, {self.recomputed_ops} recomputed "
            f"({self.random_ops_recomputed} random, with their RNG state); {self.checkpointed_regions} of "
            f"{self.regions} regions recompute"
            + (f"; {self.rederived} dropped values computed again next to a far reader" if self.rederived else ""),
        ]
        if self.unmapped:
            shown = ", ".join(f"{n} ({why})" for n, why in self.unmapped[:5])
            more = f" and {len(self.unmapped) - 5} more" if len(self.unmapped) > 5 else ""
            lines.append(f"  not mapped, saved: {shown}{more}")
        if self.unmapped_values:
            lines.append(f"  graphopt values without an fx node: {len(self.unmapped_values)}")
        return "\n".join(lines)


def _fail(msg: str) -> "graphopt.GraphoptError":
    return graphopt.GraphoptError(" ".join(str(msg).split()))


def _first_line(e: BaseException) -> str:
    """The first line of the innermost cause (torch's exporter wraps the
    error that says what went wrong in one that says which step failed),
    without terminal colour codes."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _export(module: torch.nn.Module, args: tuple):
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return torch.onnx.export(module, args, dynamo=True, optimize=False, verbose=False)
    except Exception as e:  # the exporter raises many kinds
        raise _fail(
            f"cannot export {type(module).__name__} with torch.onnx.export(dynamo=True): {_first_line(e)}"
        ) from None


def _target_name(node: torch.fx.Node) -> str:
    t = node.target
    return f"torch.ops.{t}" if isinstance(t, torch._ops.OpOverload) else str(t)


def _is_random(node: torch.fx.Node) -> bool:
    """Does the node draw random numbers: an op tagged nondeterministic_seeded
    (dropout, bernoulli, rand...), or one with a nonzero ``dropout_p``
    argument (scaled_dot_product_attention in training)?"""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in t.tags:
        return True
    for k, a in enumerate(t._schema.arguments):
        if a.name == "dropout_p":
            v = node.kwargs.get(a.name, node.args[k] if k < len(node.args) else a.default_value)
            return bool(v)
    return False


class _Ref:
    """A value of the environment, by name, in a step's arguments."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Step:
    """One op call of the exported program (or a second copy of one), ready
    to run: its arguments name the values they read (``_Ref``)."""

    __slots__ = ("name", "fn", "args", "kwargs", "policy", "random", "reads", "frees")

    def __init__(self, name: str, fn: Any, args: Any, kwargs: Any, policy: CheckpointPolicy, random: bool):
        self.name = name
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.policy = policy
        self.random = random
        #: Names of the values it reads, in order, each once.
        self.reads: list = []
        torch.fx.node.map_aggregate(
            (args, kwargs), lambda x: self.reads.append(x.name) if isinstance(x, _Ref) and x.name not in self.reads else None
        )
        #: Values whose last reader this step is (set by ``checkpoint``).
        self.frees: list = []

    @staticmethod
    def of(node: torch.fx.Node, policy: CheckpointPolicy) -> "_Step":
        ref = functools.partial(torch.fx.node.map_arg, fn=lambda n: _Ref(n.name))
        return _Step(node.name, node.target, ref(node.args), ref(node.kwargs), policy, _is_random(node))

    def reading(self, old: str, new: str) -> None:
        """Read value ``new`` where it read ``old``."""
        swap = lambda x: _Ref(new) if isinstance(x, _Ref) and x.name == old else x  # noqa: E731
        self.args = torch.fx.node.map_aggregate(self.args, swap)
        self.kwargs = torch.fx.node.map_aggregate(self.kwargs, swap)
        self.reads = [new if r == old else r for r in self.reads]


def _load(env: dict, a: Any) -> Any:
    return torch.fx.node.map_aggregate(a, lambda x: env[x.name] if isinstance(x, _Ref) else x)


def _rederive(steps: list, dropped: set, far: int, most: int = 16) -> int:
    """A dropped value read by a step more than ``far`` steps after its
    producer is computed again right before that reader: its producer and
    the dropped values it reads in turn (its cone, at most ``most`` steps,
    none random), from the values graphopt keeps. The far reader reads the
    copy. This is what graphopt's plan does in the backward pass (recompute
    a dropped value from kept ones), done once more in the forward, so that
    the dropped value need not live across the steps between (which would
    put all of them in one checkpoint region, recomputed at once). The
    copies are added to ``dropped`` and spliced into ``steps``; returns how
    many far readers got one."""
    pos = {s.name: i for i, s in enumerate(steps)}
    # Cones and copies are built from the steps as they were, before any
    # far reader was rewired to read a copy.
    by_name = {s.name: _Step(s.name, s.fn, s.args, s.kwargs, s.policy, s.random) for s in steps}
    readers: dict = {}
    for i, s in enumerate(steps):
        for r in s.reads:
            readers.setdefault(r, []).append(i)

    def cone(name: str) -> Optional[list]:
        out, stack = set(), [name]
        while stack:
            v = stack.pop()
            st = by_name.get(v)
            if st is None or v not in dropped or v in out:
                continue
            if st.random or len(out) >= most:
                return None
            out.add(v)
            stack.extend(st.reads)
        return sorted(out, key=pos.__getitem__)

    before: dict = {}
    made = 0
    for p in [by_name[s.name] for s in steps]:
        if p.name not in dropped:
            continue
        i = pos[p.name]
        far_readers = [j for j in readers.get(p.name, []) if j - i > far]
        if not far_readers:
            continue
        members = cone(p.name)
        if members is None:
            continue
        for j in far_readers:
            made += 1
            renamed: dict = {}
            for m in members:
                st = by_name[m]
                c = _Step(f"{m}__again{made}", st.fn, st.args, st.kwargs, _RECOMPUTE, False)
                for old, new in renamed.items():
                    if old in c.reads:
                        c.reading(old, new)
                renamed[m] = c.name
                dropped.add(c.name)
                before.setdefault(j, []).append(c)
            steps[j].reading(p.name, renamed[p.name])
    if made:
        spliced = []
        for j, s in enumerate(steps):
            spliced.extend(before.get(j, ()))
            spliced.append(s)
        steps[:] = spliced
    return made


class _Region:
    """Consecutive steps; ``inputs`` are the names it reads from before it,
    ``outputs`` the names read after it (or returned)."""

    def __init__(self, steps: list, checkpointed: bool):
        self.steps = steps
        self.checkpointed = checkpointed
        self.inputs: list = []
        self.outputs: list = []
        #: Values to keep though their last reader ran (the outputs).
        self.keep: frozenset = frozenset()
        #: Values of the caller's environment whose last reader is in here.
        self.frees: list = []


def _cut(steps: list, users: dict, recompute: set) -> list:
    """Regions: a border goes after step i when no value in ``recompute``
    (fx names) made at or before i is read after i,
    and step i+1 is not a ``getitem`` of a tuple made before it."""
    pos = {s.name: i for i, s in enumerate(steps)}
    # The last reader of each recomputed value, by step index.
    open_until = [0] * len(steps)
    for i, s in enumerate(steps):
        last = i
        if s.name in recompute:
            for u in users.get(s.name, ()):
                last = max(last, pos.get(u, last))
        open_until[i] = last
    regions, start, reach = [], 0, 0
    for i, s in enumerate(steps):
        reach = max(reach, open_until[i])
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if reach <= i and (nxt is None or nxt.fn is not operator.getitem):
            regions.append(steps[start : i + 1])
            start = i + 1
    return regions


class CheckpointedModule(torch.nn.Module):
    """``module`` whose training forward runs under graphopt's
    recomputation plan (see ``graphopt.torch.checkpoint``). ``.module`` is
    the wrapped module (its parameters are the ones trained), ``.report``
    the ``CheckpointReport``."""

    def __init__(self, module: torch.nn.Module, program, regions: list, report: CheckpointReport, example: list):
        super().__init__()
        self.module = module
        self.report = report
        # Lifted tensor constants; the program itself is not kept (it may
        # hold copies of the state).
        self._constants = dict(getattr(program, "constants", {}) or {})
        self._regions = regions
        self._example = example
        sig = program.graph_signature
        self._in_spec = program.call_spec.in_spec
        self._out_spec = program.call_spec.out_spec
        # Placeholders in order: ("param"|"buffer"|"constant"|"input", target).
        kinds = {
            torch.export.graph_signature.InputKind.PARAMETER: "param",
            torch.export.graph_signature.InputKind.BUFFER: "buffer",
            torch.export.graph_signature.InputKind.CONSTANT_TENSOR: "constant",
            torch.export.graph_signature.InputKind.USER_INPUT: "input",
        }
        self._inputs = []
        for spec in sig.input_specs:
            kind = kinds.get(spec.kind)
            if kind is None:
                raise _fail(f"exported program input {spec.arg.name}: kind {spec.kind} is not supported")
            self._inputs.append((spec.arg.name, kind, spec.target))
        self._outputs = []
        for spec in sig.output_specs:
            kind = spec.kind.name
            if kind not in ("USER_OUTPUT", "BUFFER_MUTATION"):
                raise _fail(f"exported program output {spec.arg.name}: kind {kind} is not supported")
            self._outputs.append((spec.arg.name, kind, spec.target))
        # Buffers the step updates (BatchNorm's running statistics) enter
        # the graph as copies: autograd may save the value read (BatchNorm's
        # backward does), and the update after the forward must not change
        # what it saved.
        self._mutated = {t for _, kind, t in self._outputs if kind == "BUFFER_MUTATION"}

    def _placeholders(self, args: tuple, kwargs: dict) -> dict:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec or len(flat) != len(self._example):
            raise _fail(
                f"inputs do not match the {len(self._example)} example inputs checkpoint was planned for"
            )
        for k, (x, (shape, dtype)) in enumerate(zip(flat, self._example)):
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or x.dtype != dtype:
                got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise _fail(
                    f"input {k}: {got} does not match the example {shape} {dtype} that the plan is "
                    "for (call graphopt.torch.checkpoint again for other shapes)"
                )
        env, given = {}, iter(flat)
        constants = self._constants
        for name, kind, target in self._inputs:
            if kind == "param":
                env[name] = self.module.get_parameter(target)
            elif kind == "buffer":
                b = self.module.get_buffer(target)
                env[name] = b.detach().clone() if target in self._mutated else b
            elif kind == "constant":
                env[name] = constants[target]
            else:
                env[name] = next(given)
        return env

    def forward(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return self.module(*args, **kwargs)
        env = self._placeholders(args, kwargs)
        for region in self._regions:
            if region.checkpointed:
                vals = _torch_checkpoint(
                    _run_region,
                    region,
                    *[env[n] for n in region.inputs],
                    use_reentrant=False,
                    context_fn=_CONTEXT,
                    preserve_rng_state=True,
                )
                env.update(zip(region.outputs, vals))
                for n in region.frees:
                    env.pop(n, None)
            else:
                _run_steps(region.steps, env)
        outs = []
        with torch.no_grad():
            for name, kind, target in self._outputs:
                if kind == "BUFFER_MUTATION":
                    self.module.get_buffer(target).copy_(env[name])
                else:
                    outs.append(env[name])
        return pytree.tree_unflatten(outs, self._out_spec)


# The policy of the step running now (set by _run_steps, read by the
# selective-checkpoint policy function).
_current = [_SAVE]


def _policy(ctx, op, *args, **kwargs):
    return _current[0]


# Every sub-op of a node shares the node's policy, so an op that mutates a
# tensor an earlier sub-op of the same node returned (the math path of
# attention does) is itself served from the cache when that tensor is:
# nothing is applied twice, and torch's check for cached tensors mutated
# later can be relaxed.
_CONTEXT = functools.partial(create_selective_checkpoint_contexts, _policy, allow_cache_entry_mutation=True)


def _run_steps(steps: list, env: dict, keep: frozenset = frozenset()) -> None:
    """Runs ``steps`` on ``env``, dropping each value after its last reader
    (``_Step.frees``) unless it is in ``keep``, as eager execution would."""
    for s in steps:
        _current[0] = s.policy
        env[s.name] = s.fn(*_load(env, s.args), **_load(env, s.kwargs))
        for n in s.frees:
            if n not in keep:
                env.pop(n, None)
    _current[0] = _SAVE


def _run_region(region: _Region, *inputs):
    env = dict(zip(region.inputs, inputs))
    _run_steps(region.steps, env, region.keep)
    return tuple(env[n] for n in region.outputs)


def checkpoint(
    module: torch.nn.Module,
    example_inputs: Union[torch.Tensor, Sequence[torch.Tensor]],
    budget: Union[int, str] = "60%",
    *,
    loss: str = "sum",
    strategy: str = "auto",
    time_limit: Optional[float] = None,
) -> CheckpointedModule:
    """Wraps ``module`` so that its training forward saves and recomputes what
    graphopt's recomputation plan says, under ``budget``.

    ``budget`` is the step's peak of activations and gradients (weights
    excluded), as graphopt's planner measures it: bytes, a size such as
    ``"2GiB"``, or a percent of the peak without recomputation (``"60%"``).
    ``loss`` is graphopt's loss over the module's first output (``"sum"``,
    ``"mean"``, ``"mse"``, ``"l1"``, ``"cross_entropy"``): it shapes the
    backward pass graphopt plans for; train with any loss of the same
    structure. ``strategy`` is ``graphopt remat``'s (``auto``, ``optimal``,
    ``fast``, ``sqrt``, ``per-block``).

    Returns a ``CheckpointedModule``; its ``.report`` is the
    ``CheckpointReport``. Raises ``GraphoptError`` (module left as it was)
    for a module the exporter cannot export, a budget below the least peak
    recomputation reaches, and example inputs the module does not take.
    """
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    flat = pytree.tree_leaves(args)
    if not flat or not all(isinstance(x, torch.Tensor) for x in flat):
        raise _fail("example_inputs: expected a tensor or a sequence of tensors")
    onx = _export(module, args)
    program = onx.exported_program
    proto = onx.model_proto
    initializers = {t.name for t in proto.graph.initializer}
    trainable = [n for n, p in module.named_parameters() if p.requires_grad and n in initializers]
    session = graphopt.load(proto.SerializeToString())
    kw = {} if time_limit is None else {"time_limit": time_limit}
    train = session.grad(loss=loss, trainable=trainable, simplify=False, recompute_pointwise=False)
    planned = train.remat(budget=budget, strategy=strategy, **kw)
    r = planned.report()["steps"][-1]["report"]
    policy = r.get("torch_policy")
    if policy is None:
        raise _fail("the exported graph names no fx node (pkg.torch.onnx.fx_node): cannot map the plan")

    nodes = {n.name: n for n in program.graph.nodes}
    decided: dict = {}
    by_output: dict = {}
    unmapped: list = []
    for d in policy["nodes"]:
        n = nodes.get(d["node"])
        if n is None or n.op != "call_function":
            unmapped.append((d["node"], "not in the exported program"))
        elif n.target is operator.getitem and d["target"] == "operator.getitem":
            # One output of a multi-output op (split, chunk): the op is to
            # be saved when any of its outputs is.
            parent = n.args[0].name
            by_output.setdefault(parent, []).append(d["policy"])
        elif _target_name(n) != d["target"]:
            unmapped.append((d["node"], f"target {_target_name(n)} where the ONNX node says {d['target']}"))
        else:
            decided[d["node"]] = d["policy"]
    for parent, policies in by_output.items():
        if parent not in decided:
            decided[parent] = "save" if "save" in policies else "recompute"

    # Nodes the user outputs depend on; the rest only update buffers
    # (BatchNorm's num_batches_tracked) and have no ONNX counterpart.
    user_outs = {s.arg.name for s in program.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"}
    needed, stack = set(), [n for n in program.graph.nodes if n.name in user_outs]
    while stack:
        n = stack.pop()
        if n.name not in needed:
            needed.add(n.name)
            stack.extend(n.all_input_nodes)

    steps, recompute = [], set()
    for n in program.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is operator.getitem:
            parent = n.args[0].name
            steps.append(_Step.of(n, _RECOMPUTE if parent in recompute else _SAVE))
            if parent in recompute:
                recompute.add(n.name)
            continue
        d = decided.get(n.name)
        if d is None:
            if n.name in needed and not any(u == n.name for u, _ in unmapped):
                unmapped.append((n.name, "no ONNX node names it"))
            policy_n = _SAVE
        else:
            policy_n = _SAVE if d == "save" else _RECOMPUTE
        if policy_n is _RECOMPUTE:
            recompute.add(n.name)
        steps.append(_Step.of(n, policy_n))

    # Regions are cut around the values graphopt dropped (the backward pass
    # reads them, recomputed); a value it recomputes only because its
    # backward never reads it may cross a border (torch keeps it there only
    # if its own backward formulas need it, as eager would).
    dropped = {d["node"] for d in policy["nodes"] if d["reason"] == "dropped" and d["node"] in recompute}
    dropped |= {s.name for s in steps if s.fn is operator.getitem and s.reads[0] in dropped}
    rederived = _rederive(steps, dropped, _FAR)

    outputs = {a.name for n in program.graph.nodes if n.op == "output" for a in n.all_input_nodes}
    users: dict = {}
    for st in steps:
        for v in st.reads:
            users.setdefault(v, []).append(st.name)
    for o in outputs:
        users.setdefault(o, []).append("<output>")
    # Free every value after its last reader (the program's outputs stay).
    index = {st.name: i for i, st in enumerate(steps)}
    last: dict = {}
    for i, st in enumerate(steps):
        for v in st.reads:
            last[v] = i
    for o in outputs:
        last[o] = len(steps)
    for name, i in last.items():
        if i < len(steps):
            steps[i].frees.append(name)
    regions, random_recomputed = [], 0
    for part in _cut(steps, users, dropped):
        names = {st.name for st in part}
        region = _Region(part, checkpointed=any(st.name in dropped for st in part))
        for st in part:
            for v in st.reads:
                if v not in names and v not in region.inputs:
                    region.inputs.append(v)
        if region.checkpointed:
            # Random ops (dropout, attention with dropout) in a region that
            # recomputes are recomputed too, all of them: the region replays
            # from the RNG state it started with (preserve_rng_state), so
            # every draw repeats only if none is skipped by a cache.
            for st in part:
                if st.random:
                    st.policy = _RECOMPUTE
                    random_recomputed += 1
        region.outputs = [st.name for st in part if any(u not in names for u in users.get(st.name, ()))]
        region.keep = frozenset(region.outputs)
        end = index[part[-1].name]
        region.frees = [n for n in region.inputs if last.get(n, len(steps)) <= end]
        regions.append(region)

    ops = [s for s in steps if s.fn is not operator.getitem]
    report = CheckpointReport(
        budget_bytes=r["budget_bytes"],
        store_all_peak_bytes=r["lower_bound_before_bytes"],
        planned_peak_bytes=r["lower_bound_after_bytes"],
        extra_flops=max(0, r["flops_after"] - r["flops_before"]),
        extra_flops_pct=100.0 * max(0, r["flops_after"] - r["flops_before"]) / max(1, r["flops_before"]),
        strategy=r["strategy"],
        saved_ops=sum(1 for s in ops if s.policy is _SAVE),
        recomputed_ops=sum(1 for s in ops if s.policy is _RECOMPUTE),
        random_ops_recomputed=random_recomputed,
        unmapped=unmapped,
        unmapped_values=list(policy["unmapped"]),
        regions=len(regions),
        checkpointed_regions=sum(1 for g in regions if g.checkpointed),
        rederived=rederived,
        policy=policy,
    )
    example = [(tuple(x.shape), x.dtype) for x in flat]
    return CheckpointedModule(module, program, regions, report, example)
