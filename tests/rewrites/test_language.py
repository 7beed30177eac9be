"""The egglog language: generated from the op table, and a faithful IR <-> term round trip."""
import ml_dtypes
import numpy as np
import pytest

from lumc.backends.devices import H100_SXM
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.extract import CostModel, EGraphView, choose, decode
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node, node
from lumc.ir.ops import OPS
from lumc.ir.tensor import Tensor, concat
from lumc.ir.views import View
from lumc.rewrites.language import (FORMS, Encoder, Tables, constructors, declarations,
                                    triangle_kind)
from lumc.ir.movement import (apply_steps, decompose_refined, decompose_sliced, decompose_view,
                              refine_shape)
from lumc.rewrites.schedule import Limits, Saturator

RNG = np.random.default_rng(0)


def test_constructors_come_from_the_op_table_once():
    ctors = constructors()
    for name, row in OPS.items():
        assert row.egglog in ctors, name
        assert ctors[row.egglog][:row.arity] == ("Expr",) * row.arity
    assert set(FORMS) <= set(ctors)
    decl = declarations()
    for c in ctors:
        assert decl.count(f"({c} ") + decl.count(f"({c})") == 1, f"{c} declared more than once"


def _roundtrip(outs: dict, ins: dict, feed: dict):
    g = Graph({k: v.node for k, v in ins.items()}, {k: v.node for k, v in outs.items()})
    tables = Tables()
    enc = Encoder(tables)
    vars_ = {k: enc.encode(v.node) for k, v in outs.items()}
    sat = Saturator(Limits(iterations=1, expansive=False), rules=[])
    data, stats = sat.saturate(enc.lines, "roundtrip")
    view = EGraphView.from_json(data, set(constructors()))
    roots = [view.lets[v] for v in vars_.values()]
    pick, _ = choose(view, CostModel(H100_SXM.as_ceilings()))
    built = decode(view, pick, roots, tables, {})
    g2 = Graph(g.inputs, {k: built[view.lets[v]] for k, v in vars_.items()})
    want, got = ReferenceExecutor(g)(feed), ReferenceExecutor(g2)(feed)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    return stats


def test_roundtrip_views_constants_and_special_values():
    x = Tensor(input_node("x", (3, 4, 5), dt.f32))
    ids = Tensor(input_node("ids", (2, 3), dt.i64))
    table = Tensor.const(RNG.standard_normal((7, 5)).astype(np.float32))
    y = (x.transpose(0, 2) * -0.0 + np.inf).reshape((20, 3))
    p = x.pad([(1, 0), (0, 2), (0, 0)], value=np.nan).slice([0], [3], [0], [2])
    w = x.window(2, 3, 2)
    c = concat([x, x.flip(1)], 1).max(1) + x.sum((0, 2), keepdims=True).mean()
    gth = Tensor(node("Gather", (table.node, ids.node), 0)).cast(dt.f16)
    iota = Tensor.iota((3, 4), 1, dt.i32).cast(dt.f32)
    feed = {"x": RNG.standard_normal((3, 4, 5)).astype(np.float32),
            "ids": RNG.integers(0, 7, (2, 3)).astype(np.int64)}
    feed["x"][0, 0, 0] = np.nan
    _roundtrip({"y": y, "p": p, "w": w, "c": c, "g": gth, "i": iota}, {"x": x, "ids": ids}, feed)


def _read(x: np.ndarray, v: View) -> np.ndarray:
    """The elements an unmasked view reads of the flat ``x``."""
    flat = np.full(v.shape, v.offset)
    for ax, st in enumerate(v.strides):
        flat = flat + st * np.arange(v.shape[ax]).reshape([-1 if i == ax else 1
                                                           for i in range(len(v.shape))])
    return x.reshape(-1)[flat]


@pytest.mark.parametrize("t,h,d,part", [(8, 4, 8, 0), (8, 4, 8, 2), (5, 3, 2, 1), (1, 2, 4, 1),
                                          (6, 1, 4, 2)])
def test_a_per_head_split_is_a_box_of_the_refined_shape(t, h, d, part):
    """GPT-NeoX's ``x.view(t, h, 3d)[..., part*d:(part+1)*d].transpose``, read over ``[t, 3hd]``:
    no box of ``[t, 3hd]``; a box of ``[t, h, 3d]`` followed by a permute."""
    src = (t, 3 * h * d)
    v = View.contiguous(src).reshape((t, h, 3 * d)).slice([0, 0, part * d], [1, 1, 1],
                                                            [t, h, d]).permute((1, 0, 2))
    refined, box, steps = decompose_refined(src, v)
    assert apply_steps(box, steps) == v
    assert int(np.prod(refined)) == int(np.prod(src))
    if h > 1 and t > 1:
        assert refined == (t, h, 3 * d) and decompose_sliced(src, v) is None
    # its values, read through the steps, are the slice numpy takes
    x = np.arange(int(np.prod(src))).reshape(src)
    want = x.reshape(t, h, 3 * d)[..., part * d:(part + 1) * d].transpose(1, 0, 2)
    np.testing.assert_array_equal(_read(x, apply_steps(box, steps)), want)


def test_refine_shape_splits_only_where_a_stride_divides():
    assert refine_shape((8, 96), View._make((4, 8, 8), (24, 96, 1), 0, None)) == (8, 4, 24)
    assert refine_shape((8, 96), View._make((8, 8), (96, 1), 0, None)) == (8, 96)
    assert refine_shape((8, 96), View._make((5, 8), (7, 1), 0, None)) == (8, 96)   # 7 does not divide
    assert refine_shape((2, 60), View._make((2, 3, 2, 4), (60, 20, 4, 1), 0, None)) == (2, 3, 5, 4)


@pytest.mark.parametrize("shape,fn", [
    ((4, 6), lambda v: v.permute((1, 0))),
    ((2, 3, 4), lambda v: v.reshape((6, 4)).permute((1, 0)).reshape((4, 6, 1)).expand((4, 6, 5))),
    ((1, 5, 1), lambda v: v.reshape((5,)).reshape((1, 5, 1, 1)).expand((3, 5, 2, 1))),
    ((8, 12), lambda v: v.slice([0, 4], [1, 1], [8, 4]).reshape((8, 2, 2)).permute((1, 0, 2))),
])
def test_decompositions_replay_the_view(shape, fn):
    v = fn(View.contiguous(shape))
    steps = decompose_view(shape, v)
    if steps is not None:
        assert apply_steps(View.contiguous(shape), steps) == v
    else:
        box, steps = decompose_sliced(shape, v)
        assert apply_steps(box, steps) == v


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_a_triangular_mask_with_negative_zeros_is_not_the_iota_mask(dtype):
    """The encoder writes a folded 0/1 triangular constant as its iota comparison in the same
    e-class; a mask whose zeros are -0.0 compares equal to it but is not it: ``-0.0 * v`` and
    ``0.0 * v`` differ in sign (a contraction of such a mask sums to -0.0 where the iota mask's
    gives +0.0). Bit for bit, only the +0.0 mask is the iota's."""
    tri = np.tril(np.ones((5, 5))).astype(dtype)
    assert triangle_kind(tri) == (True, 0, 1)
    neg = tri.copy()
    neg[neg == 0] = -0.0
    assert np.array_equal(neg, tri)
    assert triangle_kind(neg) is None
    assert triangle_kind(np.tril(np.ones((5, 5), np.int64), -1)) == (False, 1, 0)
