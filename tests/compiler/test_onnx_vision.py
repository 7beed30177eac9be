"""Vision ops of the ONNX frontend: malformed Conv / ConvTranspose / Pad / LRN nodes are refused in
one line naming the node, the op and the reason (exit 2 at the CLI), as onnxruntime refuses them."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from lumc.compiler.frontends.onnx_frontend import import_onnx
from lumc.compiler.tools.cli import cli
from lumc.ir.errors import ShapeError

RNG = np.random.default_rng(7)


def conv_model(op: str, x_shape, w_shape, **attrs) -> onnx.ModelProto:
    w = RNG.standard_normal(w_shape).astype(np.float32)
    node = helper.make_node(op, ["x", "w"], ["y"], name="layer1", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


BAD = [
    # a kernel_shape the weight does not have: the weight's shape was used, silently
    ("Conv", (1, 3, 5, 5), (2, 3, 3, 3), dict(kernel_shape=[2, 2]),
     "kernel_shape [2, 2] does not match the weight's kernel [3, 3]"),
    ("ConvTranspose", (1, 3, 5, 5), (3, 2, 3, 3), dict(kernel_shape=[2, 2]),
     "kernel_shape [2, 2] does not match the weight's kernel [3, 3]"),
    # output_padding at or past the stride: an output of 13 rows was computed (onnxruntime refuses)
    ("ConvTranspose", (1, 3, 5, 5), (3, 2, 3, 3), dict(strides=[2, 2], output_padding=[2, 0]),
     "output_padding [2, 0] must lie in [0, max(stride, dilation))"),
    # a zero stride: "ZeroDivisionError: integer division or modulo by zero"
    ("ConvTranspose", (1, 3, 5, 5), (3, 2, 3, 3), dict(strides=[0, 1]),
     "strides [0, 1] and dilations [1, 1] must be at least 1"),
]


@pytest.mark.parametrize("op,xs,ws,attrs,reason", BAD)
def test_malformed_conv_is_one_clear_error(op, xs, ws, attrs, reason):
    with pytest.raises(ShapeError) as e:
        import_onnx(conv_model(op, xs, ws, **attrs))
    msg = str(e.value)
    assert f"node 'layer1', op {op}" in msg and reason in msg and "\n" not in msg, msg


def test_malformed_conv_exits_2_at_the_cli(tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save(conv_model("Conv", (1, 3, 5, 5), (2, 3, 3, 3), kernel_shape=[2, 2]), path)
    res = CliRunner().invoke(cli, ["compile", str(path), "--budget", "10s"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lumc: error: node 'layer1', op Conv"), lines
    assert "kernel_shape [2, 2]" in lines[0] and "Traceback" not in res.output


def test_consistent_conv_attributes_still_import():
    import_onnx(conv_model("Conv", (1, 3, 5, 5), (2, 3, 3, 3), kernel_shape=[3, 3]))
    import_onnx(conv_model("ConvTranspose", (1, 3, 5, 5), (3, 2, 3, 3), strides=[2, 1],
                           dilations=[1, 3], output_padding=[1, 2], kernel_shape=[3, 3]))


def test_zero_size_batch_compiles_with_every_kernel_checked(tmp_path, monkeypatch):
    """A zero-size batch: the simulator divided by a grid of no programs (Triton configs) and by
    no vendor tiles (cuBLAS configs), ZeroDivisionError, so every config of the conv and the
    instance norm was an error and the compile warned that its kernels could not be checked."""
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    scale, bias = np.ones(4, np.float32), np.zeros(4, np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["c", "s", "b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [0, 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "s"),
                           numpy_helper.from_array(bias, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.zeros((0, 3, 6, 6), np.float32)
    f = lumc.compile(m, budget="10s", example_inputs={"x": x}, reuse_plan=False)
    d = f.report_dict()
    assert d["warnings"] == [] and d["candidates_rejected"] == 0, (d["warnings"], d)
    assert f(x).shape == (0, 4, 6, 6)


def _one_node(op: str, x_shape, inits: dict, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"] + list(inits), ["y"], name="layer1", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("mode", ["constant", "edge"])
def test_pad_cropping_more_than_an_axis_is_one_clear_error(mode):
    """Negative pads of -9 on an axis of 4: the output axis was clamped to 0 elements, silently
    (onnxruntime refuses the node)."""
    m = _one_node("Pad", (2, 3, 4), {"p": np.array([0, 0, -9, 0, 0, 0], np.int64)}, mode=mode)
    with pytest.raises(ShapeError) as e:
        import_onnx(m)
    msg = str(e.value)
    assert "node 'layer1', op Pad" in msg and "remove 9 of its 4 elements" in msg, msg
    ok = _one_node("Pad", (2, 3, 4), {"p": np.array([0, 0, -4, 0, 0, 0], np.int64)}, mode=mode)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    from lumc.backends.reference import ReferenceExecutor
    assert ReferenceExecutor(import_onnx(ok).graph)({"x": x})["y"].shape == (2, 3, 0)


def test_lrn_of_size_0_is_one_clear_error(tmp_path):
    """``size=0`` divided ``alpha`` by it: 'ZeroDivisionError: float division by zero'."""
    path = tmp_path / "lrn.onnx"
    onnx.save(_one_node("LRN", (1, 3, 4, 4), {}, size=0), path)
    res = CliRunner().invoke(cli, ["run", str(path), "--random"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert lines == ["lumc: error: node 'layer1', op LRN (opset 18): size must be a positive "
                     "integer, got 0"], lines
