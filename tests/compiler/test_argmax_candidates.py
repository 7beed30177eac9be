"""ONNX ``ArgMax``/``ArgMin`` through the e-graph: every candidate decodes to a well-typed program
(none is lost to a decode error) and every candidate's values match onnxruntime (numpy where the
input holds NaN: lumc returns the first NaN's index, as numpy and torch; onnxruntime skips NaN).

The models are saturated one after another in the process's one egglog engine, as a compile of
several regions (or several compiles) does: egglog 13.2 kept a region's global ``let`` names past
``pop``, and a later region reusing them read another term (an i64 constant as a ``Where``
condition), so candidates failed to decode."""
from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lumc.compiler.core import egraph_pipeline
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.frontends.onnx_frontend import import_onnx
from lumc.compiler.runtime.program import run_program_reference

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(node, x_type, shape, inits=()):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_type, shape)],
                          [helper.make_tensor_value_info("y", I64, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def _numpy_arg(x, op, axis, keepdims, last):
    """numpy's arg-extreme (NaN wins, first occurrence), or the last occurrence when asked."""
    f = np.argmax if op == "ArgMax" else np.argmin
    if last:
        r = x.shape[axis] - 1 - f(np.flip(x, axis), axis=axis)
    else:
        r = f(x, axis=axis)
    return np.expand_dims(r, axis).astype(np.int64) if keepdims else r.astype(np.int64)


def _candidates_match(model, x, want, caplog):
    graph = import_onnx(model).graph
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lumc.egraph"):
        res = egraph_candidates(graph, "h200", k=8)
    assert not [r for r in caplog.records if "failed to decode" in r.getMessage()], \
        [r.getMessage() for r in caplog.records]
    labels = [p.label for p in res.candidates]
    assert "greedy-fallback" not in labels, labels
    for p in res.candidates:
        p.validate()
        got = run_program_reference(p, graph, {"x": x})["y"]
        assert got.dtype == np.int64 and got.shape == want.shape, (p.label, got.shape, want.shape)
        np.testing.assert_array_equal(got, want, err_msg=p.label)


RNG = np.random.default_rng(4)
TIES = np.array([[1, 3, 3, 0], [2, 2, -1, 2], [5, 5, 5, 5]], np.float32)
NANS = np.array([[1, np.nan, 3, np.nan], [0, -1, -1, 0], [np.nan, 2, 2, 2]], np.float32)


def _ort(m, x):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_every_candidate_decodes_and_matches_after_other_regions(op, caplog, monkeypatch):
    # a fresh engine, then the user trial's sequence: an integer ReduceMin, an ArgMax with
    # select_last_index, an ArgMax (all four candidates of the last failed to decode)
    monkeypatch.setattr(egraph_pipeline, "_SATURATORS", {})
    before = _model(helper.make_node("ReduceMin", ["x", "ax"], ["y"], keepdims=0), I64, [2, 2],
                    [("ax", np.array([-1], np.int64))])
    xi = np.array([[3, -9], [-1, 4]], np.int64)
    _candidates_match(before, xi, _ort(before, xi), caplog)
    for last in (1, 0):
        m = _model(helper.make_node(op, ["x"], ["y"], axis=1, select_last_index=last), F, [1, 4])
        x = np.array([[1, 3, 3, 0]], np.float32)
        _candidates_match(m, x, _ort(m, x), caplog)
    for axis in (1, -1, 0, -2):
        for keepdims in (0, 1):
            for last in (0, 1):
                node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims,
                                        select_last_index=last)
                m = _model(node, F, [3, 4])
                for x in (TIES, RNG.standard_normal((3, 4)).astype(np.float32)):
                    _candidates_match(m, x, _ort(m, x), caplog)
                # NaN: numpy's answer (onnxruntime ignores NaN)
                _candidates_match(m, NANS, _numpy_arg(NANS, op, axis, keepdims, last), caplog)
