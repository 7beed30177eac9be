"""Views against numpy's own movement ops, on ragged, zero-size and negative-step cases."""
import numpy as np
from hypothesis import given, settings, strategies as st

from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor
from lumc.ir.views import View
from lumc.backends.reference import run_reference


def run(x_np, fn):
    x = Tensor(input_node("x", x_np.shape, dt.from_numpy(x_np.dtype)))
    y = fn(x)
    return run_reference(Graph({"x": x.node}, {"y": y.node}), {"x": x_np})["y"]


dims = st.lists(st.integers(0, 5), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(shape=dims, data=st.data())
def test_permute_slice_reshape_chain(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    perm = data.draw(st.permutations(range(len(shape))))
    starts, ends, steps = [], [], []
    for d in shape:
        step = data.draw(st.sampled_from([1, 2, 3, -1, -2]))
        starts.append(data.draw(st.integers(-d - 1, d + 1)))
        ends.append(data.draw(st.integers(-d - 2, d + 2)))
        steps.append(step)
    ref = np.transpose(x, perm)
    ref = ref[tuple(slice(s, e, p) for s, e, p in zip(starts, ends, steps))]
    got = run(x, lambda t: t.permute(perm).slice(starts, ends, None, steps))
    np.testing.assert_array_equal(got, ref)
    flat = run(x, lambda t: t.permute(perm).slice(starts, ends, None, steps).reshape([-1]) if ref.size else t.reshape([-1]))
    np.testing.assert_array_equal(flat, ref.reshape(-1) if ref.size else x.reshape(-1))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
def test_pad_then_slice_then_expand(shape, data):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    pads = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape]
    ref = np.pad(x, pads)
    got = run(x, lambda t: t.pad(pads))
    np.testing.assert_array_equal(got, ref)
    # a padded view sliced with a negative step, then reshaped with an extra unit dim, then broadcast
    ref2 = ref[tuple(slice(None, None, -1) for _ in shape)][None]
    ref2 = np.broadcast_to(ref2, (2,) + ref2.shape)
    got2 = run(x, lambda t: t.pad(pads).slice([-1] * len(shape), [-(2 ** 40)] * len(shape), None,
                                             [-1] * len(shape)).unsqueeze([0]).expand(ref2.shape))
    np.testing.assert_array_equal(got2, ref2)


def test_pad_with_value_keeps_negative_zero_inside():
    x = np.array([-0.0, 1.0], dtype=np.float32)
    got = run(x, lambda t: t.pad([(1, 2)], value=-1.5))
    np.testing.assert_array_equal(got, [-1.5, -0.0, 1.0, -1.5, -1.5])
    assert np.signbit(got[1])


def test_window_matches_sliding_window_view():
    x = np.arange(2 * 11, dtype=np.float32).reshape(2, 11)
    got = run(x, lambda t: t.window(1, size=3, stride=2, dilation=2))
    ref = np.lib.stride_tricks.sliding_window_view(x, 5, axis=1)[:, ::2, ::2]
    np.testing.assert_array_equal(got, ref)


def test_window_over_padding_stacks_views():
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    got = run(x, lambda t: t.pad([(0, 0), (1, 1)]).window(1, 3))
    ref = np.lib.stride_tricks.sliding_window_view(np.pad(x, [(0, 0), (1, 1)]), 3, axis=1)
    np.testing.assert_array_equal(got, ref)


def test_reshape_merges_when_strides_allow_and_stacks_otherwise():
    v = View.contiguous((2, 3, 4)).permute((0, 2, 1))
    assert v.reshape((2, 12)) is None          # transposed dims cannot merge
    assert v.reshape((1, 2, 4, 3, 1)) is not None  # unit dims come and go
    w = View.contiguous((6, 4)).reshape((2, 3, 2, 2))
    assert w is not None and w.is_contiguous
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = run(x, lambda t: t.permute([0, 2, 1]).reshape([2, 12]))
    np.testing.assert_array_equal(got, x.transpose(0, 2, 1).reshape(2, 12))


def test_zero_size_dims():
    x = np.zeros((0, 3), dtype=np.float32)
    assert run(x, lambda t: t.permute([1, 0])).shape == (3, 0)
    assert run(x, lambda t: t.reshape([3, 0, 5])).shape == (3, 0, 5)
    np.testing.assert_array_equal(run(x, lambda t: t.sum(0)), np.zeros(3, np.float32))


def test_index_expressions_agree_with_evaluation():
    v = View.contiguous((4, 5)).permute((1, 0)).slice([4, 0], [-1, 2], [5, 2]).pad([(1, 0), (0, 1)])
    flat, valid = v.index_expr(["i", "j"])
    src = np.arange(20)
    out = np.zeros(v.shape, dtype=np.int64)
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            ok = eval(valid, {}, {"i": i, "j": j}) if valid else True
            out[i, j] = src[eval(flat, {}, {"i": i, "j": j})] if ok else 0
    from lumc.ir.ops import apply_view
    np.testing.assert_array_equal(out, apply_view(src, v))
