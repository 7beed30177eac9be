"""Activation storage under reduced precision: the values kernels pass through HBM are stored in
bf16/fp16, rounded exactly where they are stored, while model outputs and row statistics stay fp32."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lumc
from lumc.compiler.core.activation_storage import ACTIVATION_DTYPE, store_activations
from lumc.compiler.core.fusion import greedy_program
from lumc.compiler.core.pipeline import stage_frontend
from lumc.compiler.runtime.program import run_program_reference
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir import dtypes as dt
from onnx import numpy_helper
from test_precision import classifier


def _round(x, to):
    return np.asarray(x, np.float32).astype(to).astype(np.float64)


def _emulated(model, x, to):
    """float64 numpy: the classifier with its hidden activation and logits rounded to ``to`` (the
    two values the greedy program passes between kernels), softmax statistics exact."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    h = _round(np.maximum(x.astype(np.float64) @ w["w1"] + w["b1"], 0), to)
    z = _round(h @ w["w2"] + w["b2"], to)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("to", [dt.bf16, dt.f16])
def test_stored_values_round_where_they_are_stored(to):
    model = classifier()
    graph = stage_frontend(model, None, None).graph
    p = greedy_program(graph)
    q = store_activations(p, to)
    q.validate()
    x = np.random.default_rng(3).standard_normal((16, 256)).astype(np.float32)
    got = run_program_reference(q, graph, {"x": x})["y"].astype(np.float64)
    plain = run_program_reference(p, graph, {"x": x})["y"].astype(np.float64)
    want = _emulated(model, x, to.np)
    # equal up to a rare one-ulp flip where f32 and float64 sums fall on opposite sides of a
    # rounding midpoint; the unrounded program differs by far more
    err, err_plain = np.abs(got - want), np.abs(plain - want)
    assert np.mean(err <= 2e-6) >= 0.9      # a flip in one hidden value moves its whole row
    assert err.max() <= (0.1 if to == dt.bf16 else 0.5) * err_plain.max()   # fp16: 3 more bits
    assert err.mean() <= 0.05 * err_plain.mean()
    # the model output keeps its dtype; the reduction kernels' statistics stay f32
    assert q.outputs["y"].dtype == dt.f32
    for c in q.calls:
        if c.kernel.form == "reduction":
            assert all(n.dtype == dt.f32 for n in c.outputs)
    narrow = [n for c in q.calls for n in c.outputs if n.dtype == to]
    assert len(narrow) == 2
    # bytes follow the stored dtype
    assert sum(c.kernel.min_bytes() for c in q.calls) < sum(c.kernel.min_bytes() for c in p.calls)


def test_fp32_policies_store_nothing():
    graph = stage_frontend(classifier(), None, None).graph
    p = greedy_program(graph)
    for pol in ("fp32", "tf32"):
        assert store_activations(p, ACTIVATION_DTYPE[pol]) is p


def test_bf16_compile_passes_bf16_between_kernels(tmp_path):
    db = TuningDatabase(tmp_path / "t.sqlite")
    model = classifier()
    fp32 = lumc.compile(model, budget="30s", device="sim:h200", db=db, use_egraph=False)
    cm = lumc.compile(model, budget="40s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16")
    r = cm.report_dict()
    assert r["quality"]["passed"]
    assert r["bytes_moved"] < fp32.report_dict()["bytes_moved"]
    inner = [n for c in cm.program.calls[:-1] for n in c.outputs if n.dtype.is_float]
    assert any(n.dtype == dt.bf16 for n in inner)
    x = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    y = cm(x)
    assert y.dtype == np.float32
    ref = _emulated(model, x, ml_dtypes.bfloat16)
    assert np.abs(y - ref).max() <= r["tolerance"]


def test_row_values_a_contraction_writes_stay_fp32():
    """Post-LN fusion: the up-projection writes the normalization's row values (mean, rstd) for
    the down-projection; under bf16 storage the projections' products are stored narrow, the row
    values are statistics and stay fp32, and the program still computes the block."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.library import activations, norm
    from lumc.ir.tensor import Tensor
    rng = np.random.default_rng(7)
    x = Tensor(input_node("x", (1, 12, 32), dt.f32))
    wa, w1, w2 = (Tensor.const((rng.standard_normal(s) / 6).astype(np.float32))
                  for s in ((32, 32), (32, 64), (64, 32)))
    y = norm.layer_norm(x @ wa + x, Tensor.const(np.ones(32, np.float32)),
                        Tensor.const(np.zeros(32, np.float32)))[0]
    graph = Graph({"x": x.node}, {"z": (activations.relu(y @ w1) @ w2 + y).node})
    prog = next(p for p in egraph_candidates(graph, "h200", k=16).candidates
                if p.label.endswith("+norm-on-load"))
    rows = [n for c in prog.calls for n in c.outputs[1:]]
    assert rows, [len(c.outputs) for c in prog.calls]
    q = store_activations(prog, dt.bf16)
    q.validate()
    outs = {id(n): n for c in q.calls for n in c.outputs}
    assert all(id(r) in outs and r.dtype == dt.f32 for r in rows)
    assert sum(n.op == "Cast" and n.dtype == dt.bf16 for n in outs.values()) >= 2
    xv = rng.standard_normal((1, 12, 32)).astype(np.float32)
    got = run_program_reference(q, graph, {"x": xv})["z"]
    want = ReferenceExecutor(graph, "float64")({"x": xv})["z"]
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
