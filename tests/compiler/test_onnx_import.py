"""The ONNX frontend: folding, constants, optional inputs, If, errors, declared specs, and outputs
against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import (check_supported, import_onnx, load_model,
                                         model_input_specs, model_output_specs)
from lumc.ir import dtypes as dt
from lumc.ir.errors import InputError, ModelError, ShapeError, UnsupportedOpError

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def run_lumc(model, feeds, input_shapes=None):
    imported = import_onnx(model, input_shapes)
    out = ReferenceExecutor(imported.graph)(feeds)
    return [out[o.name] for o in model.graph.output], imported


def run_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-6, input_shapes=None):
    ours, imported = run_lumc(model, feeds, input_shapes)
    ref = run_ort(model, feeds)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return imported


def test_shape_subgraph_folds_to_a_view():
    # Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): [2, 3, 4] -> [2, 12]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
        helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["d0v"]),
        helper.make_node("Constant", [], ["m1"], value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Concat", ["d0v", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 12])])
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    imported = assert_matches_ort(model, {"x": x}, rtol=0, atol=0)
    # the whole shape computation is gone: only the input and one reshape view remain
    assert imported.graph.op_counts() == {"Input": 1, "View": 1}
    assert imported.outputs[0].shape == (2, 12)


def test_constant_node_weights_and_initializers():
    w = RNG.standard_normal((4, 5)).astype(np.float32)
    b = RNG.standard_normal((5,)).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
        helper.make_node("Constant", [], ["k"], value_float=0.5),
        helper.make_node("Constant", [], ["axes"], value_ints=[1]),
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node("Mul", ["h", "k"], ["y0"]),
        helper.make_node("ReduceSum", ["y0", "axes"], ["y"], keepdims=0),
    ]
    model = make_model(nodes, [vi("x", [3, 4])], [vi("y", [3])],
                       initializers=[numpy_helper.from_array(b, "b")])
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    imported = assert_matches_ort(model, {"x": x})
    consts = [n.arg.value for n in imported.graph.nodes() if n.op == "Constant"]
    assert any(v.shape == (4, 5) and np.array_equal(v, w) for v in consts)
    assert list(imported.graph.inputs) == ["x"]


def test_optional_inputs_given_as_empty_names():
    nodes = [
        helper.make_node("Clip", ["x", "", "hi"], ["c"]),
        helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="nearest"),
    ]
    inits = [numpy_helper.from_array(np.array(0.25, np.float32), "hi"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    model = make_model(nodes, [vi("x", [1, 2, 3, 3])], [vi("y", [1, 2, 6, 6])], inits, opset=13)
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, rtol=0, atol=0)


def _if_model(cond_node):
    then_g = helper.make_graph([helper.make_node("Add", ["x", "one"], ["t"])], "then", [],
                               [vi("t", [2, 3])],
                               initializer=[numpy_helper.from_array(np.array(1, np.float32), "one")])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["e"])], "else", [],
                               [vi("e", [2, 3])])
    nodes = [cond_node,
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    return nodes


@pytest.mark.parametrize("flag", [True, False])
def test_if_with_constant_condition_inlines_one_branch(flag):
    cond = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(flag)))
    model = make_model(_if_model(cond), [vi("x", [2, 3])], [vi("y", [2, 3])])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    imported = assert_matches_ort(model, {"x": x}, rtol=0, atol=0)
    ops = imported.graph.op_counts()
    assert "Where" not in ops and ops.get("Add", 0) == int(flag) and ops.get("Mul", 0) == int(not flag)


def test_if_with_runtime_condition_selects_between_branches():
    cond = helper.make_node("ReduceMin", ["x"], ["c0"], keepdims=0)
    cast = helper.make_node("Greater", ["c0", "zero"], ["c"])
    model = make_model([cond] + _if_model(cast), [vi("x", [2, 3])], [vi("y", [2, 3])],
                       [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    for x in (np.abs(RNG.standard_normal((2, 3))) + 0.1, -np.abs(RNG.standard_normal((2, 3)))):
        assert_matches_ort(model, {"x": x.astype(np.float32)}, rtol=0, atol=0)


def test_unsupported_ops_are_all_listed_at_once():
    nodes = [
        helper.make_node("Bernoulli", ["x"], ["nz"], name="nz_node"),
        helper.make_node("RandomUniformLike", ["x"], ["u"], name="unique_a"),
        helper.make_node("RandomUniformLike", ["x"], ["u2"], name="unique_b"),
        helper.make_node("Cast", ["x"], ["c"], name="to_complex", to=TensorProto.COMPLEX64),
        helper.make_node("FancyOp", ["x"], ["f"], name="custom", domain="com.example"),
        helper.make_node("Relu", ["x"], ["y"], name="fine"),
    ]
    model = make_model(nodes, [vi("x", [4])], [vi("y", [4])], opset=17)
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError) as e:
        check_supported(model)
    msg = str(e.value)
    for part in ("Bernoulli", "'nz_node'", "RandomUniformLike", "'unique_a'", "'unique_b'", "Cast",
                 "complex64", "'to_complex'", "FancyOp", "com.example", "opset 17"):
        assert part in msg, part
    assert "Relu" not in msg and "\n" not in msg
    with pytest.raises(UnsupportedOpError):
        import_onnx(model)


def test_unsupported_op_inside_an_if_branch_is_found():
    then_g = helper.make_graph([helper.make_node("Bernoulli", ["x"], ["t"], name="deep")], "then",
                               [], [vi("t", None, TensorProto.INT64)])
    else_g = helper.make_graph([helper.make_node("Shape", ["x"], ["e"])], "else", [],
                               [vi("e", None, TensorProto.INT64)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    model = make_model(nodes, [vi("x", [4]), vi("c", [], TensorProto.BOOL)],
                       [vi("y", None, TensorProto.INT64)])
    with pytest.raises(UnsupportedOpError, match="Bernoulli.*'deep'"):
        check_supported(model)


def _dynamic_model():
    x = helper.make_tensor_value_info("input_ids", F, ["batch", "sequence"])
    z = helper.make_tensor_value_info("z", F, [None, 4])
    y = helper.make_tensor_value_info("y", F, ["batch", "sequence"])
    nodes = [helper.make_node("Relu", ["input_ids"], ["y"]),
             helper.make_node("Relu", ["z"], ["w"])]
    return make_model(nodes, [x, z], [y, vi("w", [None, 4])])


def test_dynamic_dims_must_be_given():
    model = _dynamic_model()
    specs = model_input_specs(model)
    assert specs[0].shape == ("batch", "sequence") and specs[1].shape == ("z_dim0", 4)
    assert specs[0].dtype == dt.f32
    with pytest.raises(InputError) as e:
        import_onnx(model)
    msg = str(e.value)
    assert "'input_ids'" in msg and "['batch', 'sequence']" in msg and "--shape input_ids=" in msg
    assert "'z'" in msg and "z_dim0" in msg
    with pytest.raises(InputError, match="'z'"):
        import_onnx(model, {"input_ids": (1, 128)})
    imported = import_onnx(model, {"input_ids": (1, 128), "z": (3, 4)})
    assert [s.shape for s in imported.inputs] == [(1, 128), (3, 4)]
    assert imported.outputs[0].shape == (1, 128) and imported.warnings == []


def test_given_shapes_must_agree_with_static_dims_and_names():
    model = _dynamic_model()
    with pytest.raises(InputError, match="dim 1 is 4"):
        import_onnx(model, {"input_ids": (1, 2), "z": (3, 5)})
    with pytest.raises(InputError, match="rank"):
        import_onnx(model, {"input_ids": (1, 2, 3), "z": (3, 4)})
    with pytest.raises(InputError, match="unknown input"):
        import_onnx(model, {"input_ids": (1, 2), "z": (3, 4), "nope": (1,)})


def test_declared_output_shape_is_checked_not_trusted():
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])]
    model = make_model(nodes, [vi("x", [2, 5])], [vi("y", [2, 5])])
    imported = import_onnx(model)
    assert imported.outputs[0].shape == (5, 2)
    assert len(imported.warnings) == 1 and "'y'" in imported.warnings[0]
    assert model_output_specs(model)[0].shape == (2, 5)


def test_declared_output_dtype_mismatch_is_a_model_error():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [vi("x", [2])], [vi("y", [2], TensorProto.DOUBLE)])
    with pytest.raises(ModelError, match="'y'.*f64.*f32"):
        import_onnx(model)


def test_corrupt_truncated_and_missing_files_are_model_errors(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    w = numpy_helper.from_array(RNG.standard_normal(256).astype(np.float32), "w")
    good = make_model(nodes, [vi("x", [2])], [vi("y", [2])], [w]).SerializeToString()
    assert load_model(good).graph.node[0].op_type == "Relu"
    for bad in (good[: len(good) // 2], good[:7], b"", b"\x00\xff" * 50, b"not an onnx model"):
        with pytest.raises(ModelError) as e:
            load_model(bad)
        assert "\n" not in str(e.value)
    path = tmp_path / "m.onnx"
    path.write_bytes(good[:-20])
    with pytest.raises(ModelError, match="m.onnx"):
        import_onnx(str(path))
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "missing.onnx")


def test_opset_dependent_forms_split_squeeze_slice_pad():
    x = RNG.standard_normal((2, 6, 3)).astype(np.float32)
    # opset 11: attributes
    old = make_model([
        helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[2, 4]),
        helper.make_node("Unsqueeze", ["a"], ["a1"], axes=[0]),
        helper.make_node("Squeeze", ["a1"], ["a2"], axes=[0]),
        helper.make_node("Slice", ["b", "st", "en", "ax"], ["s"]),
        helper.make_node("ReduceMax", ["s"], ["m"], axes=[1], keepdims=1),
        helper.make_node("Pad", ["m", "pads"], ["y"], mode="edge"),
    ], [vi("x", [2, 6, 3])], [vi("y", None), vi("a2", None)], [
        numpy_helper.from_array(np.array([3], np.int64), "st"),
        numpy_helper.from_array(np.array([0], np.int64), "en"),
        numpy_helper.from_array(np.array([1], np.int64), "ax"),
        numpy_helper.from_array(np.array([0, 1, 0, 0, 2, 1], np.int64), "pads")], opset=11)
    assert_matches_ort(old, {"x": x}, rtol=0, atol=0)
    # opset 18: inputs, Split by num_outputs, Slice with a negative step
    new = make_model([
        helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3),
        helper.make_node("Unsqueeze", ["a", "zero"], ["a1"]),
        helper.make_node("Squeeze", ["a1", "zero"], ["a2"]),
        helper.make_node("Slice", ["x", "st", "en", "ax", "step"], ["s"]),
        helper.make_node("ReduceMean", ["s", "ax"], ["y"], keepdims=0),
    ], [vi("x", [2, 6, 3])], [vi("y", None), vi("a2", None), vi("c", None)], [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "st"),
        numpy_helper.from_array(np.array([-100], np.int64), "en"),
        numpy_helper.from_array(np.array([1], np.int64), "ax"),
        numpy_helper.from_array(np.array([-2], np.int64), "step")], opset=18)
    assert_matches_ort(new, {"x": x}, rtol=1e-6)


def test_small_cnn_matches_onnxruntime():
    c_in, c_out = 3, 8
    inits = [
        numpy_helper.from_array(RNG.standard_normal((c_out, c_in, 3, 3)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(RNG.standard_normal(c_out).astype(np.float32), "b"),
        numpy_helper.from_array(RNG.uniform(0.5, 1.5, c_out).astype(np.float32), "scale"),
        numpy_helper.from_array(RNG.standard_normal(c_out).astype(np.float32), "shift"),
        numpy_helper.from_array(RNG.standard_normal(c_out).astype(np.float32), "mean"),
        numpy_helper.from_array(RNG.uniform(0.5, 1.5, c_out).astype(np.float32), "var"),
        numpy_helper.from_array(RNG.standard_normal((c_out * 4 * 4, 10)).astype(np.float32) * 0.1, "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["g"], alpha=0.5),
        helper.make_node("Softmax", ["g"], ["y"], axis=-1),
    ]
    model = make_model(nodes, [vi("x", [2, c_in, 8, 8])], [vi("y", [2, 10])], inits, opset=17)
    x = RNG.standard_normal((2, c_in, 8, 8)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, rtol=1e-4, atol=1e-6)


def test_attention_block_with_dynamic_batch_matches_onnxruntime():
    d, h = 8, 2
    inits = [numpy_helper.from_array(RNG.standard_normal((d, 3 * d)).astype(np.float32) * 0.3, "wqkv"),
             numpy_helper.from_array(RNG.uniform(0.5, 1.5, d).astype(np.float32), "g"),
             numpy_helper.from_array(np.array([0, 0, h, d // h], np.int64), "heads"),
             numpy_helper.from_array(np.array(1 / np.sqrt(d // h), np.float32), "scale")]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "wqkv"], ["qkv"]),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=-1, num_outputs=3),
        helper.make_node("Reshape", ["q", "heads"], ["q4"]),
        helper.make_node("Reshape", ["k", "heads"], ["k4"]),
        helper.make_node("Reshape", ["v", "heads"], ["v4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vt"], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Reshape", ["ot", "xs"], ["y0"]),
        helper.make_node("Gelu", ["y0"], ["y"]),
    ]
    x_vi = helper.make_tensor_value_info("x", F, ["batch", 5, d])
    model = make_model(nodes, [x_vi], [helper.make_tensor_value_info("y", F, ["batch", 5, d])],
                       inits, opset=20)
    x = RNG.standard_normal((3, 5, d)).astype(np.float32)
    imported = assert_matches_ort(model, {"x": x}, rtol=1e-4, atol=1e-5,
                                  input_shapes={"x": (3, 5, d)})
    assert imported.opset == 20 and imported.outputs[0].shape == (3, 5, d)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op,ref,lo,hi", [
    ("Atan", np.arctan, -1e4, 1e4), ("Asin", np.arcsin, -1, 1), ("Acos", np.arccos, -1, 1),
    ("Sinh", np.sinh, -88, 88), ("Cosh", np.cosh, -88, 88), ("Asinh", np.arcsinh, -1e30, 1e30),
    ("Acosh", np.arccosh, 1, 1e30), ("Atanh", np.arctanh, -1, 1)])
def test_inverse_trig_and_hyperbolic_are_within_a_few_ulp(op, ref, lo, hi, dtype):
    rng = np.random.default_rng(1)
    tiny = 10.0 ** rng.uniform(-30, 0, 300) * rng.choice([-1, 1], 300)
    special = [lo, hi, 0.0, -0.0, np.nan, np.inf, -np.inf, 1 - 1e-7, -1 + 1e-7, 1e30, -1e30, 2.0]
    x = np.concatenate([rng.uniform(lo, hi, 1000), tiny, special]).astype(dtype)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    model = make_model([helper.make_node(op, ["x"], ["y"])], [vi("x", [x.size], elem)],
                       [vi("y", [x.size], elem)])
    (y,), _ = run_lumc(model, {"x": x})
    with np.errstate(all="ignore"):
        r = ref(x.astype(np.float64)).astype(dtype)
    finite = np.isfinite(r) & (r != 0)
    ulps = np.abs(y[finite].astype(np.float64) - r[finite]) / np.spacing(np.abs(r[finite]))
    assert ulps.max() <= 4, f"{op}: {ulps.max()} ulp at x={x[finite][ulps.argmax()]}"
    np.testing.assert_array_equal(y[~finite], r[~finite])     # inf, nan, zeros (with sign)


def test_sign_keeps_nan_as_onnxruntime():
    """ONNX Sign: NaN stays NaN (onnxruntime), zeros of either sign give +0.0, infinities +-1;
    PyTorch's sign (NaN -> 0) is the torch frontend's, not this one's."""
    x = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, -2.5, 3.0, 1e-40], np.float32)
    model = make_model([helper.make_node("Sign", ["x"], ["y"])], [vi("x", [x.size])], [vi("y", [x.size])])
    (y,), _ = run_lumc(model, {"x": x})
    (r,) = run_ort(model, {"x": x})
    assert np.isnan(r[0]) and not np.signbit(r[1])
    np.testing.assert_array_equal(y, r)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(r))


def test_topk_and_scatters_match_onnxruntime():
    inits = [numpy_helper.from_array(np.array([3], np.int64), "k"),
             numpy_helper.from_array(np.array([[1, 0], [2, 1], [1, 0]], np.int64), "nd_idx"),
             numpy_helper.from_array(np.array([[0, 2, 1, 0], [2, 1, 0, 1]], np.int64), "el_idx")]
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["vals", "idx"], axis=1, largest=1),
        helper.make_node("TopK", ["x", "k"], ["svals", "sidx"], axis=0, largest=0),
        helper.make_node("ScatterND", ["x", "nd_idx", "u3"], ["nd"], reduction="add"),
        helper.make_node("ScatterElements", ["x", "el_idx", "u24"], ["el"], axis=0),
        helper.make_node("ScatterElements", ["x", "el_idx", "u24"], ["elmax"], axis=0,
                         reduction="max"),
    ]
    model = make_model(nodes, [vi("x", [3, 4]), vi("u3", [3]), vi("u24", [2, 4])],
                       [vi(n, None) for n in ("vals", "svals", "nd", "el", "elmax")]
                       + [vi("idx", None, TensorProto.INT64), vi("sidx", None, TensorProto.INT64)],
                       inits, opset=18)
    x = np.array([[1, 5, 5, 2], [0, -1, 7, 7], [3, 3, 3, -2]], np.float32)   # ties on purpose
    u3 = RNG.standard_normal(3).astype(np.float32)
    u24 = RNG.standard_normal((2, 4)).astype(np.float32)
    # ScatterElements without reduction has no duplicate targets here (ORT leaves their order open)
    assert_matches_ort(model, {"x": x, "u3": u3, "u24": u24}, rtol=1e-6, atol=1e-6)


def _loop_body():
    # carried: acc; scan output: acc * i
    inputs = [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("acc", [2])]
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Add", ["acc", "x"], ["acc2"]),
             helper.make_node("Mul", ["acc2", "fi"], ["scan"]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    outputs = [vi("cond_out", [], TensorProto.BOOL), vi("acc2", [2]), vi("scan", [2])]
    return helper.make_graph(nodes, "body", inputs, outputs)


def test_loop_with_constant_trip_count_is_unrolled():
    inits = [numpy_helper.from_array(np.array(3, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.zeros(2, np.float32), "acc0")]
    node = helper.make_node("Loop", ["trips", "cond", "acc0"], ["acc", "scans"], body=_loop_body())
    model = make_model([node], [vi("x", [2])], [vi("acc", [2]), vi("scans", [3, 2])], inits)
    imported = assert_matches_ort(model, {"x": np.array([1.5, -2.0], np.float32)}, rtol=0, atol=0)
    assert "Loop" not in str(imported.graph.dump())


def test_loop_with_runtime_trip_count_is_unsupported():
    inits = [numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.zeros(2, np.float32), "acc0")]
    node = helper.make_node("Loop", ["n", "cond", "acc0"], ["acc", "scans"], body=_loop_body(),
                            name="the_loop")
    model = make_model([node], [vi("x", [2]), vi("n", [], TensorProto.INT64)],
                       [vi("acc", [2]), vi("scans", None)], inits)
    with pytest.raises(UnsupportedOpError, match="the_loop.*Loop.*trip count.*runtime"):
        import_onnx(model)


def test_scan_with_reverse_directions_matches_onnxruntime():
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "xt"], ["s2"]), helper.make_node("Mul", ["s2", "xt"], ["y"])],
        "body", [vi("s", [3]), vi("xt", [3])], [vi("s2", [3]), vi("y", [3])])
    node = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[1], scan_output_directions=[1])
    model = make_model([node], [vi("s0", [3]), vi("x", [3, 4])],
                       [vi("s_final", [3]), vi("ys", [3, 4])], opset=16)
    feeds = {"s0": RNG.standard_normal(3).astype(np.float32),
             "x": RNG.standard_normal((3, 4)).astype(np.float32)}
    assert_matches_ort(model, feeds, rtol=1e-6)


def test_shape_argument_computed_from_runtime_data_is_unsupported():
    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "xi"], ["y"], name="data_shaped")]
    model = make_model(nodes, [vi("x", [2])], [vi("y", None)])
    with pytest.raises(UnsupportedOpError, match="'data_shaped'.*Reshape.*runtime data"):
        import_onnx(model)


def test_bad_attributes_and_constant_indices_name_the_node():
    bad_perm = make_model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0], name="tp")],
                          [vi("x", [2, 3])], [vi("y", None)])
    with pytest.raises(ShapeError, match="'tp'.*Transpose"):
        import_onnx(bad_perm)
    oob = make_model([helper.make_node("Gather", ["c", "i"], ["y"], name="g")], [], [vi("y", None)],
                     [numpy_helper.from_array(np.arange(3, dtype=np.float32), "c"),
                      numpy_helper.from_array(np.array([5], np.int64), "i")])
    with pytest.raises(ModelError, match="'g'.*Gather.*out of range"):
        import_onnx(oob)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 0.6, 0.6], [1, 1, 1.7, 0.3], [1, 1, 2, 3]])
def test_opset10_resize_matches_onnxruntime(mode, scales):
    x = np.arange(2 * 3 * 7 * 5, dtype=np.float32).reshape(2, 3, 7, 5)
    model = make_model([helper.make_node("Resize", ["x", "s"], ["y"], mode=mode)],
                       [vi("x", list(x.shape))], [vi("y", None)],
                       [numpy_helper.from_array(np.array(scales, np.float32), "s")], opset=10)
    assert_matches_ort(model, {"x": x}, rtol=1e-6, atol=1e-4)


def test_backend_specializes_on_inputs_that_feed_compile_time_values():
    from lumc.compiler.tools.onnx_backend import LumcBackend
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=0)]
    model = make_model(nodes, [vi("x", [2, 6]), vi("shape", [3], TensorProto.INT64),
                               vi("axes", [1], TensorProto.INT64)], [vi("y", None)], opset=18)
    with pytest.raises(UnsupportedOpError):
        import_onnx(model)
    rep = LumcBackend.prepare(model)
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    for shape, axes in (([3, 2, 2], [1]), ([4, 3, 1], [0]), ([3, 2, 2], [1])):
        (y,) = rep.run([x, np.array(shape, np.int64), np.array(axes, np.int64)])
        np.testing.assert_allclose(y, x.reshape(shape).sum(axis=tuple(axes)), rtol=1e-6)
    assert sorted(rep.constant_inputs) == ["axes", "shape"]


def test_every_library_function_a_handler_needs_is_importable():
    # a library module that fails to import would silently turn its ops into "unsupported" skips
    from lumc.compiler.frontends.onnx_frontend import HANDLERS
    from lumc.compiler.frontends.onnx_frontend.registry import missing_requirements
    missing = {op: missing_requirements(h) for op, h in HANDLERS.items() if missing_requirements(h)}
    assert missing == {}
    assert len(HANDLERS) >= 160


def test_gather_with_negative_indices_still_wraps(tmp_path, monkeypatch):
    """ONNX ``Gather`` counts a negative index from the end (torch's ``embedding`` refuses it):
    through import and through a compiled model, against onnxruntime; ``-n - 1`` is refused."""
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    table = RNG.standard_normal((10, 4)).astype(np.float32)
    model = make_model([helper.make_node("Gather", ["w", "ids"], ["y"], axis=0)],
                       [vi("ids", [1, 3], TensorProto.INT64)], [vi("y", [1, 3, 4])],
                       [numpy_helper.from_array(table, "w")])
    ids = np.array([[1, -3, -10]], np.int64)
    assert_matches_ort(model, {"ids": ids}, rtol=0, atol=0)
    np.testing.assert_array_equal(run_ort(model, {"ids": ids})[0], table[[[1, 7, 0]]])
    f = lumc.compile(model, budget="20s", device="sim:h200")
    np.testing.assert_array_equal(f(ids), table[[[1, 7, 0]]])
    with pytest.raises(InputError, match=r"op Gather: index -11 .* out of range \[-10, 10\)"):
        f(np.array([[1, -11, 0]], np.int64))


def test_an_output_listed_twice_is_returned_once_and_said():
    """A graph may list one value twice among its outputs; onnxruntime then returns it twice.
    lumc keys outputs by name and returns it once: the import says so in its warnings (which the
    compile summary and report show), so `--check`'s "the output matches" is not read as the
    whole story."""
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])],
                   [vi("y", [2, 3]), vi("y", [2, 3])])
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    assert len(ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})) == 2
    imp = import_onnx(m)
    assert list(imp.graph.outputs) == ["y"]
    np.testing.assert_array_equal(ReferenceExecutor(imp.graph)({"x": x})["y"], np.maximum(x, 0))
    assert any("'y' is listed 2 times" in w and "onnxruntime returns it 2 times" in w
               for w in imp.warnings), imp.warnings


def test_reshape_copying_a_dim_past_the_input_rank_is_one_clear_error():
    """A shape computed from a zero-size dim holds a 0, which allowzero=0 reads as 'copy that
    input dim'; past the input's rank that is an error (onnxruntime's too), in one line."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Constant", [], ["tail"], value=numpy_helper.from_array(
                 np.array([4], np.int64))),
             helper.make_node("Concat", ["tail", "sh"], ["t"], axis=0),
             helper.make_node("Reshape", ["x", "t"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "S"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ShapeError) as e:
        import_onnx(m, {"x": (2, 0)})      # shape [4, 2, 0]: the 0 at position 2, rank 2
    assert "position 2" in str(e.value) and "\n" not in str(e.value)


def test_minilm_inputs_at_zero_length():
    from lumc.compiler.frontends.models import _minilm_inputs
    out = _minilm_inputs({"input_ids": (2, 0), "attention_mask": (2, 0)},
                         {"input_ids": np.int64, "attention_mask": np.int64},
                         np.random.default_rng(0))
    assert out["input_ids"].shape == (2, 0) and out["attention_mask"].shape == (2, 0)


@pytest.mark.parametrize("idx,is_view", [(np.array(1), True), (np.array(-1), True),
                                         (np.array([2, 3]), True), (np.array([[3, 2, 1]]), True),
                                         (np.array([1, 1]), True), (np.array([0, 2]), False)])
def test_gather_by_a_constant_run_is_a_view(idx, is_view):
    """select / chunk / unbind as exporters write them (Gather by a constant scalar or run) read
    through a view that fuses, not a Gather kernel; any other constant index stays a Gather."""
    nodes = [helper.make_node("Constant", [], ["i"], value=numpy_helper.from_array(idx.astype(np.int64))),
             helper.make_node("Gather", ["x", "i"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(m).graph
    assert (not any(n.op == "Gather" for n in graph.nodes())) == is_view
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ReferenceExecutor(graph)({"x": x})["y"], want)


def test_gather_by_an_out_of_range_constant_still_fails_when_run():
    nodes = [helper.make_node("Constant", [], ["i"], value=numpy_helper.from_array(np.array(7))),
             helper.make_node("Gather", ["x", "i"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    graph = import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph
    assert any(n.op == "Gather" for n in graph.nodes())
    from lumc.ir.errors import IndexRangeError
    with pytest.raises(IndexRangeError, match="out of range"):
        ReferenceExecutor(graph)({"x": np.zeros((2, 4), np.float32)})
