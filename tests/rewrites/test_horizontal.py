"""Horizontal fusion (``lumc.rewrites.horizontal``): every slice of a wider contraction that the
e-graph unions with a projection computes that projection, bit for bit; weights are concatenated
at compile time; the horizontal candidate is one contraction where there were three."""
import numpy as np
import pytest

from lumc.backends.devices import H200
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.runtime.program import run_program_reference
from lumc.compiler.core.extract import CostModel, EGraphView, choose, decode
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node, input_node
from lumc.ir.tensor import Tensor
from lumc.rewrites.language import Encoder, Tables, constructors
from lumc.rewrites.schedule import Limits, Saturator

from soundness import special_array


def _projections(n: int, bias: bool, rng, m=(1, 6, 10), k=10, widths=(7, 5, 9)):
    x = input_node("x", m, dt.f32)
    outs, weights = {}, []
    for i in range(n):
        w = rng.standard_normal((widths[i], k)).astype(np.float32)   # torch Linear: x @ w.T
        y = Tensor(x).matmul(Tensor(const_node(w)).permute((1, 0)))
        if bias:
            y = y.add(Tensor(const_node(rng.standard_normal(widths[i]).astype(np.float32))))
        outs[f"y{i}"] = y.node
        weights.append(w)
    return Graph({"x": x}, outs)


@pytest.mark.parametrize("n,bias", [(2, True), (3, True), (2, False), (3, False)])
def test_every_part_equals_its_projection(n, bias):
    rng = np.random.default_rng(n + 10 * bias)
    g = _projections(n, bias, rng)
    tables = Tables()
    enc = Encoder(tables)
    roots = {k: enc.encode(o) for k, o in g.outputs.items()}
    data, stats = Saturator(Limits()).saturate(enc.lines, "horizontal")
    rule = f"kernels/MatMul: x @ w1, x @ w2 -> parts of x @ concat(w1, w2) [{'bias' if bias else 'no bias'}]"
    # n projections of one x: 2^n - n - 1 concatenations, each built once
    assert stats.matches.get(rule, 0) == 2 ** n - n - 1
    view = EGraphView.from_json(data, set(constructors()))
    pick, _ = choose(view, CostModel(H200.as_ceilings()))
    feed = {"x": special_array((1, 6, 10), np.float32, rng)}
    want = ReferenceExecutor(g)(feed)
    checked = 0
    for name, var in roots.items():
        c = view.lets[var]
        # the projection's class itself, or (with a bias) the contraction under its bias add
        classes = [c] + [a for node in view.classes[c] if node.ctor == "Add" for a in node.args
                         if any(m.ctor == "MatMul" for m in view.classes.get(a, ()))]
        for cls in classes:
            for i, node in enumerate(view.classes[cls]):
                if node.ctor != "Part":
                    continue
                alt = dict(pick)
                alt[cls] = i
                got_node = decode(view, alt, [c], tables, {})[c]
                got = ReferenceExecutor(Graph(g.inputs, {"out": got_node}))(feed)["out"]
                a, b = want[name], got
                same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
                assert same.all(), f"{name}: part {i} differs at {(~same).sum()} positions"
                checked += 1
    assert checked >= n


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("flat", [False, True])
def test_horizontal_candidate_is_one_contraction_with_constant_weights(bias, flat):
    """``flat``: torch's spelling of a Linear on ``[1, T, C]`` (a 2-D product between reshapes);
    without a bias the reshape's class also holds the raw reduction, which bypassed the wide
    product (Llama's, T5's and Mistral's Q/K/V and gate/up were never merged)."""
    rng = np.random.default_rng(3)
    x = input_node("x", (1, 16, 32), dt.f32)
    t = Tensor(x)
    parts = []
    # q, k, v of one head, each read by its own row sum (a consumer that joined two of them
    # elementwise, q * k, would pair them in one kernel instead: test_triton_paired_matmul)
    for width in (32, 32, 32):
        w = Tensor(const_node(rng.standard_normal((width, 32)).astype(np.float32)))
        b = Tensor(const_node(rng.standard_normal(width).astype(np.float32)))
        y = (t.reshape((16, 32)).matmul(w.permute((1, 0))).reshape((1, 16, width)) if flat
             else t.matmul(w.permute((1, 0))))
        parts.append(y.add(b) if bias else y)
    y = parts[0].sum(-1).add(parts[1].sum(-1)).add(parts[2].sum(-1))
    g = Graph({"x": x}, {"y": y.node})
    res = egraph_candidates(g, "h200", k=8)
    wide = next(p for p in res.candidates if p.label == "egraph-horizontal")
    mats = [c for c in wide.calls if c.kernel.form == "matmul"]
    assert len(mats) == 1
    b_in = [i for i in mats[0].kernel.inputs if i.shape == (32, 96)]
    assert b_in, [i.shape for i in mats[0].kernel.inputs]
    bound = dict(zip((p.label for p in res.candidates), res.bounds))
    assert bound["egraph-horizontal"] < bound["egraph-argmin"]
    # its "+rows" twin also sums the three parts in one row kernel (fusion_rows)
    assert res.best.label in ("egraph-horizontal", "egraph-horizontal+rows"), res.best.label
    feed = {"x": rng.standard_normal((1, 16, 32)).astype(np.float32)}
    ref = ReferenceExecutor(g, "float64")(feed)["y"]
    got = run_program_reference(wide, g, feed)["y"]
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_column_part_accepts_only_whole_rows_in_order():
    """The encoder's ``colpart`` fact: a strided step is a column slice of a contraction only when
    it reads columns lo..hi of every row, rows in order (``src.reshape(-1, n)[:, lo:hi]``)."""
    from lumc.ir.views import View
    from lumc.rewrites.horizontal import column_part
    src = (2, 3, 8)
    assert column_part(src, View((2, 3, 5), (24, 8, 1), 3)) == (3, 8, 8)
    assert column_part((6, 1, 8), View((6, 1, 4), (8, 0, 1), 0)) == (0, 4, 8)    # unit dims
    assert column_part(src, View((2, 3, 1), (24, 8, 0), 7)) == (7, 8, 8)         # one column
    assert column_part(src, View((2, 3, 8), (24, 8, 1), 0)) is None              # not a slice
    assert column_part(src, View((2, 2, 5), (24, 8, 1), 3)) is None              # rows missing
    assert column_part(src, View((2, 3, 4), (24, 8, 2), 0)) is None              # every other
    assert column_part(src, View((2, 3, 4), (8, 16, 1), 0)) is None              # rows permuted
    assert column_part(src, View((2, 3, 4), (24, 8, 1), 6)) is None              # past the row
    assert column_part(src, View((2, 3, 4), (24, 8, 1), 0, ((0, 2), (0, 3), (0, 2)))) is None


@pytest.mark.parametrize("b_shapes", [((1,), (5,)), ((7,), (1,)), ((1,), (1,))])
def test_a_broadcast_bias_is_not_concatenated(b_shapes):
    """A one-element bias broadcast over a projection's row is no per-column bias: concatenating it
    gave the wide product's bias 1 + n2 values where it has n1 + n2 columns, and every horizontal
    candidate failed to decode. The pair rule leaves such projections apart; with per-column
    biases, the candidates decode and compute the projections."""
    rng = np.random.default_rng(5)
    x = input_node("x", (6, 10), dt.f32)
    outs = {}
    for i, (width, bshape) in enumerate(zip((7, 5), b_shapes)):
        w = Tensor(const_node(rng.standard_normal((10, width)).astype(np.float32)))
        b = Tensor(const_node(rng.standard_normal(bshape).astype(np.float32)))
        outs[f"y{i}"] = Tensor(x).matmul(w).add(b).node
    g = Graph({"x": x}, outs)
    tables = Tables()
    enc = Encoder(tables)
    for o in g.outputs.values():
        enc.encode(o)
    _, stats = Saturator(Limits()).saturate(enc.lines, "horizontal")
    assert stats.matches.get("kernels/MatMul: x @ w1, x @ w2 -> parts of x @ concat(w1, w2) "
                             "[bias]", 0) == 0
    res = egraph_candidates(g, "h200", k=8)
    feed = {"x": rng.standard_normal((6, 10)).astype(np.float32)}
    ref = ReferenceExecutor(g, "float64")(feed)
    for p in res.candidates:
        got = run_program_reference(p, g, feed)
        for k in ref:
            assert np.abs(got[k] - ref[k]).max() <= 1e-5 * np.abs(ref[k]).max()
