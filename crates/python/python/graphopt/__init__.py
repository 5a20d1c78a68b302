"""graphopt: make ONNX models need less memory, and prove nothing broke.

The Python face of graphopt's Rust library (the ``graphopt`` crate's
``Session``)::

    import graphopt
    s = graphopt.load("model.onnx")            # a path, ONNX bytes or an onnx.ModelProto
    opt = s.optimize()                          # default pipeline; s is unchanged
    print(opt.plan(dims={"batch": 8})["arena_bytes"])
    outputs = opt.run({"x": x})                 # dict of numpy arrays
    opt.save("model.opt.onnx")

Every method releases the GIL while Rust works. Errors raise
:class:`GraphoptError` with the one-line message the ``graphopt`` command
prints. ``graphopt.torch`` (imported on demand; needs torch) exports a
``torch.nn.Module`` and reports its inference or training memory.
"""

from ._graphopt import GraphoptError, Session, __version__, cli_main, load, passes

__all__ = ["GraphoptError", "Session", "__version__", "cli_main", "load", "passes"]
