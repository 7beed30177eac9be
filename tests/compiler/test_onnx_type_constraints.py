"""Inputs an op's schema binds to one type parameter must agree: a model where they do not is
invalid (onnxruntime refuses it), and lumc refuses it in one line naming the node, instead of
widening every input to a compute type and returning a result of another dtype.

The case is real: torch.onnx.export (dynamo=False, opset 17) of a ``.half()`` BertModel writes
LayerNormalization nodes with an f32 ``X`` and f16 ``Scale``/``B``."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import import_onnx
from lumc.ir.errors import ModelError


def _layer_norm_model(param_dtype) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    scale = numpy_helper.from_array(rng.standard_normal(8).astype(param_dtype), "scale")
    bias = numpy_helper.from_array(rng.standard_normal(8).astype(param_dtype), "bias")
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], name="ln0",
                            axis=-1, epsilon=1e-5)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
                              [scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_mixed_layer_norm_types_are_refused_naming_the_node():
    model = _layer_norm_model(np.float16)
    with pytest.raises(Exception):       # onnxruntime: type parameter T bound to two types
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(ModelError) as e:
        import_onnx(model)
    msg = str(e.value)
    assert "'ln0'" in msg and "LayerNormalization" in msg and "f32" in msg and "f16" in msg
    assert "'scale'" in msg and "\n" not in msg


def test_matching_layer_norm_types_still_import_and_match():
    model = _layer_norm_model(np.float32)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    ours = ReferenceExecutor(import_onnx(model).graph)({"x": x})["y"]
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    x64 = x.astype(np.float64)
    init = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ours, want * init["scale"] + init["bias"], rtol=1e-5, atol=1e-5)


def test_homogeneous_variadic_inputs_are_checked():
    # Concat's variadic inputs share T; a mismatch there is refused too
    node = helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
                                            helper.make_tensor_value_info("b", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(ModelError, match="'cat'.*Concat"):
        import_onnx(model)


@pytest.mark.parametrize("op,dtype,opset,ok", [
    ("ReduceSum", TensorProto.INT8, 18, False),      # ReduceSum's T: no 8- or 16-bit integers
    ("ReduceMean", TensorProto.UINT8, 18, False),
    ("ReduceMax", TensorProto.INT8, 18, True),       # ReduceMax allows int8 from opset 12
    ("ReduceMax", TensorProto.BOOL, 18, False),      # ... and bool from opset 20
    ("ReduceMax", TensorProto.BOOL, 20, True),
    ("ReduceSum", TensorProto.INT32, 18, True),
])
def test_an_input_type_its_schema_does_not_allow_is_refused(op, dtype, opset, ok):
    """A ReduceSum over int8 is an invalid model (onnxruntime refuses to load it); lumc imported it
    and summed with int8 wrapping. An allowed type still imports and matches onnxruntime."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    x = np.array([[1, 0, 1], [0, 1, 1]]).astype(np_dtype)
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    node = helper.make_node(op, ["x", "axes"], ["y"], name="red", keepdims=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, [2, 3])],
                              [helper.make_tensor_value_info("y", dtype, [2])], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        sess = None
    if not ok:
        assert sess is None
        with pytest.raises(ModelError, match=f"'red'.*{op}.*does not allow") as e:
            import_onnx(model)
        assert "\n" not in str(e.value)
        return
    ours = ReferenceExecutor(import_onnx(model).graph)({"x": x})["y"]
    if sess is not None:          # onnxruntime may lack a kernel for an allowed type
        np.testing.assert_array_equal(ours, sess.run(None, {"x": x})[0])
    ref = {"ReduceSum": np.sum, "ReduceMax": np.max}[op](x, axis=1)
    np.testing.assert_array_equal(ours, ref.astype(np_dtype))
