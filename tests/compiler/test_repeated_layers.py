"""Repeated layers saturated once: identical layers (other weights) become regions of their own
(``partition.layer_cuts``), only the first copy of each structure is saturated, and the others'
programs, decoded with their own weights, agree with the reference executor."""
import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.core.partition import partition
from lumc.compiler.runtime.program import run_program_reference
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import norm
from lumc.ir.tensor import Tensor

RNG = np.random.default_rng(11)


def _layers(n: int, d=16, seq=8) -> Graph:
    x = Tensor(input_node("x", (seq, d), dt.f32))
    h = x
    for _ in range(n):   # attention over h with its own q/k/v weights, residual, layer norm, MLP
        wq, wk, wv, w1, w2 = (Tensor.const(RNG.standard_normal((d, d)).astype(np.float32) * 0.2)
                              for _ in range(5))
        a = norm.softmax((h @ wq) @ (h @ wk).transpose(-1, -2), -1) @ (h @ wv)
        h = norm.layer_norm(a + h, Tensor.const(RNG.standard_normal(d).astype(np.float32)),
                            Tensor.const(np.zeros(d, np.float32)))[0]
        h = norm.layer_norm(((h @ w1).exp() @ w2) + h, Tensor.const(np.ones(d, np.float32)),
                            Tensor.const(np.zeros(d, np.float32)))[0]
    return Graph({"x": x.node}, {"y": h.node})


def test_identical_layers_are_saturated_once():
    g = _layers(8)
    regions = partition(g, max_ops=400)
    assert len(regions) >= 8   # cut at the layers, not in 200-400 node windows
    res = egraph_candidates(g, "h200", k=2)
    reused = [s for s in res.regions if s.stages and s.stages[0][0] == "reused"]
    assert len(reused) >= len(regions) - 4 and all(s.seconds == 0.0 for s in reused)
    forms = res.best.form_counts()
    # a layer norm is a kernel, or formed on load in the contractions that read it (post-LN)
    on_load = sum(": normalization formed on load in" in line for line in res.best.notes)
    assert forms.get("layernorm", 0) + on_load == 16
    assert forms.get("softmax", 0) + forms.get("attention", 0) == 8
    feed = {"x": RNG.standard_normal((8, 16)).astype(np.float32)}
    got = run_program_reference(res.best, g, feed)["y"]
    want = ReferenceExecutor(g, "float64")(feed)["y"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_few_layers_keep_window_cuts():
    g = _layers(2)
    assert len(partition(g, max_ops=400)) == 1


def test_the_pieces_at_both_ends_are_cut_off_what_is_not_a_layer():
    """What precedes the first repeated piece and what follows the last (a pooled head) are
    regions of their own: the end pieces are layer pieces like the others, and no region
    saturates a layer piece together with what is not a layer."""
    g = _layers(8)
    h = Tensor(g.outputs["y"])
    w = Tensor.const(RNG.standard_normal((16, 16)).astype(np.float32))
    g2 = Graph(g.inputs, {"y": (h.sum((0,), keepdims=True) @ w).exp().node})
    res = egraph_candidates(g2, "h200", k=2)
    sizes = [s.enodes for s in res.regions]
    piece = max(sizes[1:-1])
    assert sizes[0] < piece and sizes[-1] < piece, sizes      # the ends alone, no layer piece
    fresh = [s for s in res.regions if not (s.stages and s.stages[0][0] == "reused")]
    assert len(fresh) <= 4, [s.stages[:1] for s in res.regions]
    feed = {"x": RNG.standard_normal((8, 16)).astype(np.float32)}
    got = run_program_reference(res.best, g2, feed)["y"]
    want = ReferenceExecutor(g2, "float64")(feed)["y"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
