"""numpy arrays in and out of Session.run for every dtype, without copies on
the way out."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import graphopt

DTYPES = [
    np.float16, np.float32, np.float64,
    np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.bool_,
]


def passthrough(dtype, op="Identity") -> bytes:
    """y = op(x) for x of `dtype` and shape [a, b]."""
    t = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = oh.make_graph(
        [oh.make_node(op, ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", t, ["a", "b"])],
        [oh.make_tensor_value_info("y", t, ["a", "b"])],
    )
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    return m.SerializeToString()


def sample(dtype, shape=(3, 5)):
    rng = np.random.default_rng(0)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip(dtype):
    s = graphopt.load(passthrough(dtype))
    x = sample(dtype)
    y = s.run({"x": x})["y"]
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.tobytes() == x.tobytes()
    assert not np.shares_memory(x, y)
    # Non-contiguous and non-native byte order inputs are made contiguous.
    wide = sample(dtype, (3, 10))
    assert s.run({"x": wide[:, ::2]})["y"].tobytes() == np.ascontiguousarray(wide[:, ::2]).tobytes()
    assert s.run({"x": x.T})["y"].tobytes() == np.ascontiguousarray(x.T).tobytes()
    if x.dtype.itemsize > 1:
        swapped = x.astype(x.dtype.newbyteorder(">"))
        assert s.run({"x": swapped})["y"].tobytes() == x.tobytes()
    # Empty arrays.
    e = s.run({"x": np.zeros((0, 4), dtype)})["y"]
    assert e.shape == (0, 4) and e.dtype == x.dtype


@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=lambda d: np.dtype(d).name)
def test_computed_output(dtype):
    s = graphopt.load(passthrough(dtype, "Neg"))
    x = sample(dtype)
    if np.issubdtype(dtype, np.signedinteger):
        x = np.clip(x, -1000, 1000).astype(dtype)
    y = s.run({"x": x})["y"]
    assert np.array_equal(y, -x)


def test_outputs_view_runtime_memory_and_outlive_the_session():
    s = graphopt.load(passthrough(np.float32, "Neg"))
    x = sample(np.float32, (64, 64))
    y = s.run({"x": x})["y"]
    # No copy on the way out: the array's memory belongs to the runtime's
    # tensor, which numpy holds as the base object.
    base = y
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert type(base).__name__ == "TensorBuffer"
    assert y.flags.c_contiguous and y.flags.writeable
    del s
    gc.collect()
    assert np.array_equal(y, -x)
    y += 1  # writable, owned by the array now
    assert np.array_equal(y, 1 - x)


def test_dims_from_input_shapes():
    s = graphopt.load(passthrough(np.float32, "Neg"))
    for shape in [(1, 1), (7, 3), (2, 100)]:
        assert s.run({"x": np.ones(shape, np.float32)})["y"].shape == shape
