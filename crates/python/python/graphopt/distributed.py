"""graphopt.distributed: several processes under ``mpirun``, one
communicator (MPI, the same one ``graphopt train --distributed`` joins).

Start the script on N processes; each trains on its share of every batch::

    # mpirun -np 2 python train.py
    import graphopt, graphopt.distributed as dist

    world = dist.init()                         # MPI starts here (once per process)
    s = graphopt.load("model.onnx")
    t = s.train("train.npz", batch=64, target="y", distributed="zero1")
    if world.rank == 0:
        t.save("trained.onnx")                  # every rank holds the same weights

``Session.train(distributed="dp" | "zero1" | "zero2")`` is
``train --distributed``; ``Session.train(pipeline=DIR)`` runs this rank's
stage of ``Session.partition(...)``'s cut (rank 0 ends with the whole trained
model); ``Session.plan_distributed(scheme, ranks, ...)`` is
``plan --distributed``. A distributed ``train`` joins the world itself when
``init`` was not called.

The package needs MPI compiled in (``HAS_MPI``; ``--auditwheel skip`` keeps
the system's MPI out of the wheel)::

    pip install ./crates/python --config-settings=build-args="--features mpi --auditwheel skip"

MPI ends with ``finalize()``, which runs at exit after a clean one. A process
that exits on an uncaught exception does not finalize, so that ``mpirun``
ends the other ranks at once instead of leaving them waiting (a process that
catches the error and exits with ``sys.exit(1)`` should call ``os._exit(1)``
instead, for the same reason). A collective that waits longer than
``comm_timeout`` seconds (default 300) ends its process with a line saying
which call waited.
"""

from __future__ import annotations

import atexit
import sys

from ._graphopt import HAS_MPI, World
from ._graphopt import distributed_finalize as _finalize
from ._graphopt import distributed_init as _init
from ._graphopt import distributed_launched as launched

__all__ = ["HAS_MPI", "World", "finalize", "init", "launched"]

_failed = False
_hook = sys.excepthook


def _note_failure(kind, value, tb):
    global _failed
    _failed = True
    _hook(kind, value, tb)


def _at_exit():
    # CPython sets sys.last_value (3.12: last_exc) for an uncaught exception
    # whatever the hook; _failed covers a hook that does not chain.
    if not (_failed or getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)):
        _finalize()


sys.excepthook = _note_failure
atexit.register(_at_exit)


def init(comm_timeout: float | None = None) -> World:
    """Joins the processes ``mpirun`` started and returns this one's
    :class:`World` (rank, size, collectives on numpy arrays). Later calls
    return the same world. Raises :class:`graphopt.GraphoptError` in a process
    no MPI launcher started, or in a package built without MPI."""
    return _init(comm_timeout)


def finalize() -> None:
    """Ends MPI in this process (every rank calls it; it runs at exit after a
    clean one). MPI cannot start again afterwards."""
    _finalize()
