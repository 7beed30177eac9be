"""Trial 4 (real models and numerics through the whole pipeline), 2026-12-06: one test per defect
found. Models are built here; compiles are few and small (simulated H200)."""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli  # noqa: E402

pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


def _save(tmp_path, name, nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    p = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), p)
    return p


def test_constant_of_shape_weights(tmp_path):
    """Weights made by ``ConstantOfShape`` (every weight of the onnx wheel's ``light`` models:
    squeezenet, resnet50, inception...): the matmul kernel read the weight as a scalar ``tl.dot``
    operand, which Triton refuses. ``lumc run --backend triton`` ended in a traceback, and every
    matmul config of such a kernel failed in the search (99 of squeezenet's 259), each costing an
    interpreter run: inception_v1 and densenet121 ran out of a 120 s budget."""
    import lumc
    val = numpy_helper.from_array(np.array([0.02], np.float32))
    p = _save(tmp_path, "constw", [
        helper.make_node("ConstantOfShape", ["ws"], ["w"], value=val),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 9, 9])],
        [numpy_helper.from_array(np.array([4, 8, 3, 3], np.int64), "ws")])
    x = np.random.default_rng(0).standard_normal((1, 8, 9, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    # the exact result: 0.02 times the sum of each 3x3x8 window (zero padded), relu'd
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = sum(xp[:, :, i:i + 9, j:j + 9] for i in range(3) for j in range(3)).sum(1)
    want = np.maximum(0.02 * win, 0.0)[:, None].repeat(4, 1)
    res = lumc_cli("run", p, "--input", f"x={tmp_path / 'x.npy'}", "--backend", "triton",
                   "--check", "-o", tmp_path / "y.npz")
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], want, rtol=1e-4, atol=1e-5)
    f = lumc.compile(p, budget="30s", device="sim:h200", example_inputs={"x": x},
                     reuse_plan=False, workers="local:1")
    errors = [line for line in f.report_dict()["log"] if "error:" in line]
    assert not errors, errors[:3]
    np.testing.assert_allclose(f.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_half_global_average_pool_of_a_large_map(tmp_path):
    """An f16 CNN's GlobalAveragePool over a 64x64 map of values about 30 (a squeeze-excite
    block at high resolution): lumc gave inf (its sum rounded to f16 before the division, 122880 >
    65504) on every path, where onnxruntime and the exact mean give 30."""
    import lumc
    p = _save(tmp_path, "gap16", [helper.make_node("GlobalAveragePool", ["x"], ["y"])],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4, 64, 64])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4, 1, 1])])
    x = (30 + np.random.default_rng(0).standard_normal((1, 4, 64, 64))).astype(np.float16)
    want = x.astype(np.float64).mean((2, 3), keepdims=True).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    for backend in ("reference", "triton"):
        res = lumc_cli("run", p, "--input", f"x={tmp_path / 'x.npy'}", "--check",
                       "--backend", backend, "-o", tmp_path / "y.npz")
        assert res.exit_code == 0, res.output
        np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"].astype(np.float32),
                                   want.astype(np.float32), rtol=1e-3)
    f = lumc.compile(p, budget="30s", device="sim:h200", example_inputs={"x": x},
                     reuse_plan=False, workers="local:1")
    np.testing.assert_allclose(f.run({"x": x})["y"].astype(np.float32), want.astype(np.float32),
                               rtol=1e-3)
