"""Indexing and layout ops of lumc.ir.library.indexing against numpy and onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import helper, numpy_helper

from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import Graph, input_node
from lumc.ir.library.indexing import (depth_to_space, gather, gather_elements, gather_nd, one_hot,
                                      pad, range_, space_to_depth, tile, trilu)
from lumc.ir.tensor import Tensor

ort.set_default_logger_severity(3)
RNG = np.random.default_rng(7)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def build(fn, *arrays):
    ins = {f"x{k}": input_node(f"x{k}", a.shape, dt.from_numpy(a.dtype)) for k, a in enumerate(arrays)}
    y = fn(*[Tensor(n) for n in ins.values()])
    return Graph(ins, {"y": y.node})


def run(fn, *arrays):
    return ReferenceExecutor(build(fn, *arrays))({f"x{k}": a for k, a in enumerate(arrays)})["y"]


def ort_run(op, inputs: list, consts: list = (), opset=19, out=None, **attrs):
    """One-node model over runtime ``inputs`` then constant initializers ``consts`` (arrays or None);
    the output dtype is ``out`` (default: the first input's)."""
    names, feeds, vis, inits = [], {}, [], []
    for k, a in enumerate(inputs):
        names.append(f"i{k}")
        feeds[f"i{k}"] = a
        vis.append(helper.make_tensor_value_info(f"i{k}", helper.np_dtype_to_tensor_dtype(a.dtype),
                                                 a.shape))
    for k, c in enumerate(consts):
        if c is None:
            names.append("")
            continue
        names.append(f"c{k}")
        inits.append(numpy_helper.from_array(np.asarray(c), f"c{k}"))
    node = helper.make_node(op, names, ["y"], **attrs)
    et = helper.np_dtype_to_tensor_dtype(np.dtype(out if out is not None else inputs[0].dtype))
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", et, None)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    np.testing.assert_array_equal(a, b)


# ---- gathers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_runtime_and_constant_negative_indices(axis):
    x = randn(4, 5, 3)
    n = x.shape[axis]
    idx = np.array([[0, -1], [n - 1, -n], [1, 1]], np.int64)
    want = np.take(x, np.where(idx < 0, idx + n, idx), axis=axis)
    same(run(lambda t, i: gather(t, i, axis), x, idx), want)
    same(run(lambda t: gather(t, idx, axis), x), want)             # constant indices fold
    same(run(lambda t, i: gather(t, i, axis), x, idx.astype(np.int32)), want)
    same(ort_run("Gather", [x, idx], axis=axis), want)


def test_gather_scalar_and_empty_indices():
    x = randn(4, 3)
    same(run(lambda t: gather(t, np.array(-2, np.int64), 0), x), x[2])
    same(run(lambda t: gather(t, np.zeros((0,), np.int64), 1), x), x[:, :0])


@pytest.mark.parametrize("axis", [0, 1, 2, -2])
def test_gather_elements_matches_numpy_and_onnxruntime(axis):
    x = randn(4, 5, 3)
    ishape = list(x.shape)
    ishape[axis] = 6                      # longer than data along axis, shorter elsewhere allowed
    ishape[(axis + 1) % 3] -= 1
    n = x.shape[axis]
    idx = RNG.integers(-n, n, size=ishape).astype(np.int64)
    want = ort_run("GatherElements", [x, idx], axis=axis)
    got = run(lambda t, i: gather_elements(t, i, axis), x, idx)
    same(got, want)
    sub = x[tuple(slice(0, s) if k != axis % 3 else slice(None) for k, s in enumerate(ishape))]
    same(got, np.take_along_axis(sub, np.where(idx < 0, idx + n, idx), axis=axis))


@pytest.mark.parametrize("xshape,ishape,b", [
    ((4, 5, 3), (2, 2), 0),
    ((4, 5, 3), (3, 1), 0),
    ((4, 5, 3), (2, 3), 0),                # full-depth: scalars
    ((4, 5, 3), (2, 2, 3), 0),
    ((4, 5, 3), (4, 1), 1),
    ((4, 5, 3), (4, 2, 2), 1),
    ((2, 3, 5, 4), (2, 3, 2, 1), 2),
    ((2, 3, 5, 4), (2, 3, 2), 2),
])
def test_gather_nd_matches_onnxruntime(xshape, ishape, b):
    x = randn(*xshape)
    k = ishape[-1]
    hi = np.array(xshape[b:b + k])
    idx = (RNG.integers(0, 1 << 30, size=ishape) % hi).astype(np.int64)
    idx = np.where(RNG.random(ishape) < 0.3, idx - hi, idx)            # some negative indices
    same(run(lambda t, i: gather_nd(t, i, b), x, idx), ort_run("GatherND", [x, idx], batch_dims=b))


def test_gather_errors():
    x = randn(3, 4)
    with pytest.raises(ShapeError):
        run(lambda t: gather(t, np.array([0.5]), 0), x)
    with pytest.raises(ShapeError):
        run(lambda t: gather(t, np.array([0]), 2), x)
    with pytest.raises(ShapeError):
        run(lambda t: gather_nd(t, np.zeros((2, 3), np.int64)), x)


# ---- tile, pad ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 3)), ((1, 4, 2), (3, 1, 2)), ((3,), (0,)),
                                        ((2, 1), (1, 1)), ((0, 2), (2, 2))])
def test_tile_matches_numpy(shape, reps):
    x = randn(*shape)
    same(run(lambda t: tile(t, reps), x), np.tile(x, reps))


def _np_pad(x, pads, mode, value=0):
    """numpy oracle: crop negative pads, then np.pad with the ONNX mode names."""
    r = x.ndim
    sl = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[r + i], 0)) for i in range(r))
    y = x[sl]
    width = [(max(pads[i], 0), max(pads[r + i], 0)) for i in range(r)]
    if mode == "constant":
        return np.pad(y, width, mode="constant", constant_values=value)
    return np.pad(y, width, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 2, 3, 0], [0, -1, 2, 2], [-2, 3, 1, -1], [3, 1, 2, 4]])
def test_pad_modes_match_onnxruntime(mode, pads):
    x = randn(4, 5)
    got = run(lambda t: pad(t, pads, mode, 1.5), x)
    want = ort_run("Pad", [x], [np.array(pads, np.int64), np.array(1.5, np.float32)], mode=mode)
    same(got, want)
    same(got, _np_pad(x, pads, mode, 1.5))


def test_pad_axes_and_large_reflect():
    x = randn(2, 3, 4)
    same(run(lambda t: pad(t, [2, 1], "edge", axes=[-1]), x),
         ort_run("Pad", [x], [np.array([2, 1], np.int64), None, np.array([-1], np.int64)],
                 mode="edge"))
    # pads larger than the axis: reflect keeps bouncing, wrap keeps cycling (numpy semantics)
    y = randn(3)
    same(run(lambda t: pad(t, [7, 5], "reflect"), y), np.pad(y, (7, 5), mode="reflect"))
    same(run(lambda t: pad(t, [7, 5], "wrap"), y), np.pad(y, (7, 5), mode="wrap"))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data())
def test_pad_random(shape, data):
    mode = data.draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    r = len(shape)
    pads = [data.draw(st.integers(-(shape[i % r] - 1), 4)) for i in range(2 * r)]
    for i in range(r):                    # keep at least one element per axis after cropping
        while shape[i] + min(pads[i], 0) + min(pads[r + i], 0) < 1:
            pads[i] += 1
    x = randn(*shape)
    same(run(lambda t: pad(t, pads, mode, -2.0), x), _np_pad(x, pads, mode, -2.0))


def test_pad_constant_integer_and_negative_zero():
    x = RNG.integers(0, 9, size=(2, 3)).astype(np.int32)
    same(run(lambda t: pad(t, [1, 0, 0, 2], "constant", 7), x),
         np.pad(x, ((1, 0), (0, 2)), constant_values=7))
    got = run(lambda t: pad(t, [1, 1], "constant", -0.0), randn(2))
    assert np.signbit(got[0]) and np.signbit(got[-1])
    with pytest.raises(ShapeError):
        run(lambda t: pad(t, [1, 1], "symmetric"), randn(3))


# ---- one_hot, trilu, range ----------------------------------------------------------------------
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_matches_onnxruntime(axis):
    idx = np.array([[0, 3, -1], [-5, 5, 2]], np.int64)        # -5 and 5 are out of range: all off
    values = np.array([-1.0, 2.5], np.float32)
    got = run(lambda i: one_hot(i, 5, values, axis), idx)
    same(got, ort_run("OneHot", [idx], [np.array(5, np.int64), values], axis=axis, out=np.float32))


def test_one_hot_float_indices_and_tensor_values():
    idx = np.array([0.0, 2.7, -1.2], np.float32)           # truncated toward zero: 0, 2, -1
    vals = np.array([0, 1], np.float32)
    same(run(lambda i, v: one_hot(i, 4, v), idx, vals),
         ort_run("OneHot", [idx], [np.array(4.0, np.float32), vals], out=np.float32))
    ids = np.array([[3, -4]], np.int64)
    vals = np.array([5, -6], np.int64)
    same(run(lambda i, v: one_hot(i, 4, v, 1), ids, vals),
         ort_run("OneHot", [ids], [np.array(4, np.int64), vals], out=np.int64, axis=1))


@pytest.mark.parametrize("k", [-4, -1, 0, 1, 2, 7])
@pytest.mark.parametrize("upper", [True, False])
def test_trilu_matches_numpy(k, upper):
    x = randn(2, 4, 6)
    x[0, 3, 0] = np.nan
    got = run(lambda t: trilu(t, k, upper), x)
    want = np.triu(x, k) if upper else np.tril(x, k)
    same(got, want)
    same(got, ort_run("Trilu", [x], [np.array(k, np.int64)], upper=int(upper)))


@pytest.mark.parametrize("args,dtype", [((0, 10, 3), dt.i64), ((5, -3, -2), dt.i32),
                                        ((1.0, 2.0, 0.25), dt.f32), ((3, 3, 1), dt.i64),
                                        ((0.5, -1.7, -0.3), dt.f64), ((4, 1, 1), dt.i64)])
def test_range_matches_onnxruntime(args, dtype):
    g = Graph({}, {"y": range_(*args, dtype).node})
    got = ReferenceExecutor(g)({})["y"]
    want = ort_run("Range", [], [np.array(a, dtype.np) for a in args], opset=11, out=dtype.np)
    start, _, delta = (np.array(a, dtype.np) for a in args)
    spec = (start + np.arange(want.shape[0]).astype(dtype.np) * delta).astype(dtype.np)
    same(got, spec)                         # ONNX spec: output[i] = start + i * delta
    # onnxruntime accumulates ``value += delta``: equal for integers, within rounding for floats
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError):
        range_(0, 1, 0, dt.i64)


# ---- depth/space --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_matches_onnxruntime(mode):
    x = randn(2, 12, 3, 5)
    got = run(lambda t: depth_to_space(t, 2, mode), x)
    same(got, ort_run("DepthToSpace", [x], blocksize=2, mode=mode))
    # space_to_depth inverts DCR depth_to_space
    if mode == "DCR":
        same(run(lambda t: space_to_depth(depth_to_space(t, 2), 2), x), x)


def test_space_to_depth_matches_onnxruntime():
    x = randn(1, 3, 6, 9)
    same(run(lambda t: space_to_depth(t, 3), x), ort_run("SpaceToDepth", [x], blocksize=3))
    with pytest.raises(ShapeError):
        run(lambda t: space_to_depth(t, 4), x)


def test_view_ops_emit_no_compute():
    """tile / depth_to_space / edge pad are views (+ selects); no Gather, no arithmetic."""
    x = randn(1, 8, 3, 4)
    for fn in (lambda t: tile(t, (1, 2, 1, 3)), lambda t: depth_to_space(t, 2),
               lambda t: space_to_depth(t, 1), lambda t: pad(t, [0, 0, 1, 2, 0, 0, 0, 1], "edge")):
        ops = set(build(fn, x).op_counts())
        assert ops <= {"Input", "View", "Where", "Constant"}, ops


def test_gather_without_negative_indices_refuses_them():
    """``negative_indices=False`` (torch ``embedding``/``index_select``): a negative index
    reaches the ``Gather`` primitive as given and is out of range there, like one past the end;
    in range the result is ``np.take``'s."""
    from lumc.ir.errors import IndexRangeError
    x = randn(5, 3)
    idx = np.array([4, 0, 2], np.int64)
    same(run(lambda t, i: gather(t, i, 0, negative_indices=False), x, idx), x[idx])
    for bad in (-1, -5, 5):
        with pytest.raises(IndexRangeError, match=rf"gather index {bad} out of range \[0, 5\)"):
            run(lambda t, i: gather(t, i, 0, negative_indices=False), x,
                np.array([0, bad], np.int64))
    same(run(lambda t, i: gather(t, i, 0), x, np.array([0, -1], np.int64)), x[[0, 4]])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_without_negative_indices_refuses_them(axis):
    """``negative_indices=False`` (torch ``gather``): an index outside ``[0, n)`` of its axis is
    refused by a ``Gather`` over that axis, where the linear index into the flattened table alone
    read a neighbouring row (-1 on axis 1 of row 1 read row 0's last element); in range the result
    is ``np.take_along_axis``'s."""
    from lumc.ir.errors import IndexRangeError
    x = randn(3, 4)
    n = x.shape[axis]
    sub = x[:, :2] if axis == 0 else x[:2, :]       # the rows/columns the 2x2 index addresses
    idx = RNG.integers(0, n, size=(2, 2)).astype(np.int64)
    for dtype in (np.int64, np.int32):
        same(run(lambda t, i: gather_elements(t, i, axis, negative_indices=False), x,
                 idx.astype(dtype)), np.take_along_axis(sub, idx, axis=axis))
    for bad in (-1, -n, n, -n - 1):
        i = idx.copy()
        i[1, 0] = bad
        with pytest.raises(IndexRangeError, match=rf"gather index {bad} out of range \[0, {n}\)"):
            run(lambda t, j: gather_elements(t, j, axis, negative_indices=False), x, i)
    i = idx.copy()
    i[1, 0] = -1                                    # ONNX GatherElements counts it from the end
    same(run(lambda t, j: gather_elements(t, j, axis), x, i),
         np.take_along_axis(sub, np.where(i < 0, i + n, i), axis=axis))
