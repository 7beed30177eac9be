"""Incremental reference capture (``lumc.compiler.core.reference_values``): every candidate's boundary
values equal a full run of its own graph (bit for bit for the first candidate; the others may be
computed from another candidate's values of the same e-class, so up to rounding), while later
captures evaluate only the nodes between the values held and the values wanted."""
import numpy as np

from lumc.backends import reference as ref_mod
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.core.fusion import greedy_program
from lumc.compiler.core.reference_values import ReferenceValues
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node, input_node
from lumc.ir.library import norm
from lumc.ir.tensor import Tensor

RNG = np.random.default_rng(7)


def _model() -> Graph:
    x = Tensor(input_node("x", (1, 6, 16), dt.f32))
    h = x
    for _ in range(2):   # two layers: three projections of one input, attention, a layer norm
        w = [Tensor(const_node(RNG.standard_normal((16, 16)).astype(np.float32) / 4))
             for _ in range(3)]
        q, k, v = (h @ wi for wi in w)
        a = norm.softmax((q @ k.transpose(-1, -2)).mul(Tensor(const_node(np.float32(0.25)))), -1) @ v
        s = a.add(h)
        mu = s.mean((2,), keepdims=True)
        d = s.sub(mu)
        h = d.mul(d.mul(d).mean((2,), keepdims=True).add(
            Tensor(const_node(np.float32(1e-5)))).sqrt().recip())
    return Graph({"x": x.node}, {"y": h.node})


def _counting():
    """``(sizes, real __init__, an __init__ that appends each executor's graph size to sizes)``."""
    sizes = []
    real_init = ref_mod.ReferenceExecutor.__init__

    def counting_init(self, graph, *a, **k):
        sizes.append(len(graph.nodes()))
        real_init(self, graph, *a, **k)
    return sizes, real_init, counting_init


def test_incremental_capture_equals_full_runs_and_evaluates_less(monkeypatch):
    g = _model()
    progs = egraph_candidates(g, "h200", k=4).candidates + [greedy_program(g)]
    assert len(progs) >= 3
    feed = {"x": RNG.standard_normal((1, 6, 16)).astype(np.float32)}
    sizes, real_init, counting_init = _counting()
    monkeypatch.setattr(ref_mod.ReferenceExecutor, "__init__", counting_init)
    vals = ReferenceValues(g, progs, feed)
    full = sizes[0]
    for i, p in enumerate(progs):
        pg = p.graph if p.graph is not None else g
        want = {id(n): n for c in p.calls for n in (*c.inputs, *c.outputs) if n.op != "Constant"}
        monkeypatch.setattr(ref_mod.ReferenceExecutor, "__init__", real_init)
        _, expect = ReferenceExecutor(pg).run_keeping(feed, set(want))
        monkeypatch.setattr(ref_mod.ReferenceExecutor, "__init__", counting_init)
        for key, n in want.items():
            got = vals.get(key)
            assert got is not None, f"candidate {i}: no value for {n}"
            if i > 0:   # from another candidate's nodes of the same e-classes: up to rounding
                np.testing.assert_allclose(got, expect[key], rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(got, expect[key])
    later = sizes[1:]
    assert later and max(later) < full   # no capture re-ran the whole graph
    assert vals.seconds > 0
    np.testing.assert_array_equal(vals.outputs["y"], ReferenceExecutor(g)(feed)["y"])


def test_a_value_held_for_one_candidate_serves_the_others_of_its_eclass(monkeypatch):
    """Candidates that differ upstream decode distinct nodes downstream of the difference; keyed
    by e-class, the later captures evaluate fewer nodes than keyed by node."""
    g = _model()
    feed = {"x": RNG.standard_normal((1, 6, 16)).astype(np.float32)}
    evaluated, real_init, counting_init = _counting()

    def total(keep_keys: bool) -> int:
        progs = egraph_candidates(g, "h200", k=8).candidates
        if not keep_keys:
            for p in progs:
                p.value_keys = {}
        evaluated.clear()
        monkeypatch.setattr(ref_mod.ReferenceExecutor, "__init__", counting_init)
        vals = ReferenceValues(g, progs, feed)
        for p in progs:
            for c in p.calls:
                for n in (*c.inputs, *c.outputs):
                    if n.op != "Constant":
                        assert vals.get(id(n)) is not None
        monkeypatch.setattr(ref_mod.ReferenceExecutor, "__init__", real_init)
        return sum(evaluated[1:]), len(vals.alias)
    by_class, aliases = total(True)
    by_node, none = total(False)
    assert aliases > 0 and none == 0
    assert by_class < by_node
