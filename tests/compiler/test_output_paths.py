"""Every output path gives the same values: reference executor, Triton backend (interpreter on
CPU) and a compiled, saved and loaded artifact agree on shape, dtype and value, for rank-0 outputs,
negative indices of Gather/GatherElements/GatherND, and graph inputs that feed nothing."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from lumc.compiler.runtime.tuning_db import TuningDatabase
from three_paths import assert_same, run_compiled, run_reference, run_triton


def _model(nodes, ins, outs, inits=(), opset=17):
    g = oh.make_graph(nodes, "g", ins, outs, list(inits))
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def _three(model, feeds, tmp_path):
    want = _ort(model, feeds)
    ref = run_reference(model, feeds)
    assert_same(ref, want, "reference")
    assert_same(run_triton(model, feeds), ref, "triton")
    assert_same(run_compiled(model, feeds, tmp_path, TuningDatabase(tmp_path / "db.sqlite")), ref,
                "compiled")
    return ref


X = oh.make_tensor_value_info("x", TP.FLOAT, [3, 4])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
def test_rank0_outputs(op, tmp_path):
    y = oh.make_tensor_value_info("y", TP.FLOAT, [])
    z = oh.make_tensor_value_info("z", TP.FLOAT, [])
    m = _model([oh.make_node(op, ["x"], ["y"], keepdims=0),
                oh.make_node("Mul", ["y", "y"], ["z"])], [X], [y, z])
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    ref = _three(m, {"x": x}, tmp_path)
    assert ref["y"].shape == () and ref["z"].shape == ()


CASES = {
    "Gather": ({"axis": 1}, [5], np.array([-1, 0, -4, 3, -2])),
    "GatherElements": ({"axis": 1}, [3, 2], np.array([[-1, 0], [-4, 3], [2, -3]])),
    "GatherND": ({}, [3, 2], np.array([[-1, -2], [0, -4], [-3, 3]])),
}


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("idx_type", [TP.INT64, TP.INT32], ids=["i64", "i32"])
def test_negative_indices(op, idx_type, tmp_path):
    attrs, ishape, idx = CASES[op]
    if op == "GatherND" and idx_type == TP.INT32:
        pytest.skip("GatherND indices are int64 only (ONNX spec)")
    i = oh.make_tensor_value_info("i", idx_type, ishape)
    y = oh.make_tensor_value_info("y", TP.FLOAT, None)
    # an epilogue after the gather, so the gather is fused with arithmetic
    m = _model([oh.make_node(op, ["x", "i"], ["g"], **attrs), oh.make_node("Add", ["g", "g"], ["y"])],
               [X, i], [y])
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    npt = np.int64 if idx_type == TP.INT64 else np.int32
    _three(m, {"x": x, "i": idx.astype(npt)}, tmp_path)


def test_unused_input_kept_in_signature(tmp_path):
    """``u`` is read only by ``Shape`` (folded away): still an input of the artifact, accepted at
    call time and named in the report."""
    import lumc
    u = oh.make_tensor_value_info("u", TP.FLOAT, [4])
    y = oh.make_tensor_value_info("y", TP.FLOAT, [3, 4])
    s = oh.make_tensor_value_info("s", TP.INT64, [1])
    m = _model([oh.make_node("Relu", ["x"], ["y"]), oh.make_node("Shape", ["u"], ["s"])], [X, u], [y, s])
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32),
             "u": np.ones(4, np.float32)}
    ref = _three(m, feeds, tmp_path)
    np.testing.assert_array_equal(ref["s"], [4])
    f = lumc.compile(m, budget="30s", device="sim:h200", db=TuningDatabase(tmp_path / "d2.sqlite"))
    assert [i.name for i in f.inputs] == ["x", "u"]
    assert f.report_dict()["unused_inputs"] == ["u"]
    assert "unused inputs" in f.report() and "u" in f.report().splitlines()[-1]
    f.save(tmp_path / "u.lumc")
    g = lumc.load(tmp_path / "u.lumc")
    assert [i.name for i in g.inputs] == ["x", "u"]
    y_out, s_out = g(feeds["x"], feeds["u"])
    np.testing.assert_array_equal(y_out, np.maximum(feeds["x"], 0))
