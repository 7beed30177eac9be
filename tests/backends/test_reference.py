"""The reference executor: the einsum fast path equals the naive evaluation, float64 mode, errors."""
import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor, run_reference
from lumc.ir import dtypes as dt
from lumc.ir.errors import InputError
from lumc.ir.graph import Graph, input_node
from lumc.ir.ops import OPS
from lumc.ir.tensor import Tensor, concat


def naive(graph, inputs):
    """Evaluate every node with its table reference, materializing everything."""
    vals = {}
    for n in graph.nodes():
        if n.op == "Input":
            vals[id(n)] = inputs[n.arg.name]
        else:
            vals[id(n)] = OPS[n.op].reference([vals[id(s)] for s in n.srcs], n.arg)
    return {k: vals[id(n)] for k, n in graph.outputs.items()}


@pytest.mark.parametrize("case", ["matmul", "batched", "both_broadcast", "conv1d", "shared_mul"])
def test_einsum_path_matches_naive(case):
    rng = np.random.default_rng(0)
    a = Tensor(input_node("a", (3, 4, 5), dt.f32))
    b = Tensor(input_node("b", (5, 6), dt.f32))
    if case == "matmul":
        y = a.reshape((12, 5)).matmul(b)
    elif case == "batched":
        y = a.matmul(b).sum(0)
    elif case == "both_broadcast":
        # a dim broadcast in both operands and reduced scales the sum by its extent
        x = a.reshape((3, 4, 5, 1)).expand((3, 4, 5, 7))
        w = b.slice([0], [1], [1]).reshape((1, 1, 5, 1)).expand((3, 4, 5, 7))
        y = x.mul(w).sum([2, 3])
    elif case == "conv1d":
        win = a.pad([(0, 0), (0, 0), (1, 1)]).window(2, 3)        # [3, 4, 5, 3]
        k = b.slice([0], [3], [1]).slice([0], [4], [0]).reshape((1, 4, 1, 3)).expand((3, 4, 5, 3))
        y = win.mul(k).sum([1, 3])
    else:
        m = a.mul(a)
        y = m.sum(2).add(m.max(2))          # the Mul has a non-reduce user: materialized
    g = Graph({"a": a.node, "b": b.node}, {"y": y.node})
    ins = {"a": rng.standard_normal((3, 4, 5)).astype(np.float32),
           "b": rng.standard_normal((5, 6)).astype(np.float32)}
    got = run_reference(g, ins)["y"]
    ref = naive(g, ins)["y"]
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_float64_mode_is_more_accurate():
    x = Tensor(input_node("x", (1, 100000), dt.f16))
    y = x.mul(x.scalar_like(0.1)).sum(1)
    g = Graph({"x": x.node}, {"y": y.node})
    xs = np.full((1, 100000), 0.3, np.float16)
    exact = float(np.float16(0.3)) * 0.1 * 100000
    native = run_reference(g, {"x": xs})["y"]
    wide = run_reference(g, {"x": xs}, precision="float64")["y"]
    assert wide.dtype == np.float16 and native.dtype == np.float16
    assert abs(float(wide[0]) - exact) <= abs(float(native[0]) - exact)
    assert abs(float(wide[0]) - exact) / exact < 1e-3


def test_input_errors_name_the_input():
    x = Tensor(input_node("x", (2, 3), dt.f32))
    ex = ReferenceExecutor(Graph({"x": x.node}, {"y": x.exp().node}))
    with pytest.raises(InputError, match="missing input 'x'"):
        ex({})
    with pytest.raises(InputError, match=r"shape \(3, 2\), expected \(2, 3\)"):
        ex({"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(InputError, match="dtype float64"):
        ex({"x": np.zeros((2, 3))})


def test_intermediates_are_freed():
    # a long chain keeps memory flat: values are dropped when their last user has run
    x = Tensor(input_node("x", (256, 256), dt.f32))
    y = x
    for _ in range(50):
        y = y.mul(1.0001)
    ex = ReferenceExecutor(Graph({"x": x.node}, {"y": y.node}))
    out = ex({"x": np.ones((256, 256), np.float32)})["y"]
    np.testing.assert_allclose(out, np.float32(1.0001) ** 50 * np.ones((256, 256)), rtol=1e-5)


def test_work_along_a_dim_every_operand_broadcasts_is_done_once():
    # densenet's BatchNorm + ReLU over a convolution's product space: a concat of channel groups
    # (masked views), scaled, shifted, clamped and summed over the input channels, every operand
    # broadcast along the output channels (64). The values are the naive evaluation's; the
    # elementwise values stay broadcast views (stride 0) along that dim instead of 64 copies
    rng = np.random.default_rng(1)
    x1 = Tensor(input_node("x1", (1, 3, 5, 5), dt.f32))
    x2 = Tensor(input_node("x2", (1, 5, 5, 5), dt.f32))
    s = Tensor(input_node("s", (8,), dt.f32))
    wide = [t.reshape((1, 1) + t.shape[1:]).expand((1, 64) + t.shape[1:]) for t in (x1, x2)]
    xc = concat(wide, 2)                                           # [1, 64, 8, 5, 5]
    sc = s.reshape((1, 1, 8, 1, 1)).expand((1, 64, 8, 5, 5))
    r = xc.mul(sc).add(xc.scalar_like(0.5)).maximum(0.0)
    y = r.sum(2).add(r.max(2))
    g = Graph({"x1": x1.node, "x2": x2.node, "s": s.node}, {"y": y.node})
    ins = {"x1": rng.standard_normal((1, 3, 5, 5)).astype(np.float32),
           "x2": rng.standard_normal((1, 5, 5, 5)).astype(np.float32),
           "s": rng.standard_normal(8).astype(np.float32)}
    out, kept = ReferenceExecutor(g).run_keeping(ins, {id(xc.node), id(r.node)})
    ref = naive(g, ins)["y"]
    assert out["y"].shape == ref.shape == (1, 64, 5, 5)
    np.testing.assert_allclose(out["y"], ref, rtol=1e-6, atol=1e-6)
    whole = np.concatenate([ins["x1"], ins["x2"]], 1)[:, None]      # the numpy spelling
    want = np.maximum(whole * ins["s"][:, None, None] + np.float32(0.5), 0)
    np.testing.assert_array_equal(kept[id(r.node)], np.broadcast_to(want, (1, 64, 8, 5, 5)))
    for v in (kept[id(xc.node)], kept[id(r.node)]):
        assert v.strides[1] == 0


@pytest.mark.parametrize("case", ["matmul", "both_broadcast", "conv1d", "shared_mul"])
def test_terms_precision_sums_absolute_values(case):
    """``precision="terms"``: every float sum over its terms' absolute values, as the graph of
    ``summand_magnitudes`` in float64, its contractions still one einsum."""
    from lumc.backends.reference import summand_magnitudes
    rng = np.random.default_rng(0)
    a = Tensor(input_node("a", (3, 4, 5), dt.f32))
    b = Tensor(input_node("b", (5, 6), dt.f32))
    if case == "matmul":
        y = a.reshape((12, 5)).matmul(b).sum(1)
    elif case == "both_broadcast":
        x = a.reshape((3, 4, 5, 1)).expand((3, 4, 5, 7))
        w = b.slice([0], [1], [1]).reshape((1, 1, 5, 1)).expand((3, 4, 5, 7))
        y = x.mul(w).sum([2, 3])
    elif case == "conv1d":
        win = a.pad([(0, 0), (0, 0), (1, 1)]).window(2, 3)
        k = b.slice([0], [3], [1]).slice([0], [4], [0]).reshape((1, 4, 1, 3)).expand((3, 4, 5, 3))
        y = win.mul(k).sum([1, 3])
    else:
        p = a.mul(a.add(a.scalar_like(-0.5)))          # read by two sums and a max
        y = p.sum(2).add(p.sum(2)).add(p.max(2))
    g = Graph({"a": a.node, "b": b.node}, {"y": y.node})
    ins = {"a": rng.standard_normal((3, 4, 5)).astype(np.float32),
           "b": rng.standard_normal((5, 6)).astype(np.float32)}
    got = ReferenceExecutor(g, "terms")(ins)["y"]
    want = ReferenceExecutor(summand_magnitudes(g), "float64")(ins)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert (got >= np.abs(ReferenceExecutor(g, "float64")(ins)["y"]) - 1e-6).all()
