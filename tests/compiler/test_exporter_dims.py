"""Exporters' unnamed and placeholder dims: ``dim_value: -1`` and ``dim_param: "?"`` on several
axes are each their own dynamic dim (Paddle's ``[-1, 3, ?, ?]``), so any concrete shape of the
right rank and static dims is accepted; a real name shared by two axes still binds both."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as oh

from lumc.compiler.tools.cli import cli
from lumc.compiler.frontends.onnx_frontend import import_onnx, model_input_specs
from lumc.ir.errors import InputError


def _vi(name, dims):
    vi = oh.make_tensor_value_info(name, TP.FLOAT, [1] * len(dims))
    for k, d in enumerate(dims):
        dim = vi.type.tensor_type.shape.dim[k]
        dim.Clear()
        if isinstance(d, int):
            dim.dim_value = d
        elif d is not None:
            dim.dim_param = d
    return vi


def paddle_like(dims=(-1, 3, "?", "?")) -> onnx.ModelProto:
    g = oh.make_graph([oh.make_node("Sigmoid", ["x"], ["y"])], "det", [_vi("x", dims)],
                      [_vi("y", dims)])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def test_placeholder_dims_are_separate():
    m = paddle_like()
    (spec,) = model_input_specs(m)
    assert spec.shape[1] == 3 and len({d for d in spec.shape if isinstance(d, str)}) == 3
    imp = import_onnx(m, {"x": (1, 3, 48, 192)})
    assert imp.graph.outputs["y"].shape == (1, 3, 48, 192)
    with pytest.raises(InputError, match="dynamic dims"):
        import_onnx(m)


def test_cli_shape_of_a_paddle_input(tmp_path):
    p = tmp_path / "det.onnx"
    onnx.save(paddle_like(), p)
    res = CliRunner().invoke(cli, ["run", str(p), "--shape", "x=1x3x48x192", "--random", "--check"])
    assert res.exit_code == 0, res.output
    assert "[1, 3, 48, 192]" in res.stdout
    res = CliRunner().invoke(cli, ["run", str(p), "--shape", "x=1x4x48x192", "--random"])
    assert res.exit_code == 2 and "3" in res.stderr       # the static dim still holds


def test_a_real_name_on_two_axes_binds_both(tmp_path):
    m = paddle_like(("n", "n"))
    p = tmp_path / "sq.onnx"
    onnx.save(m, p)
    res = CliRunner().invoke(cli, ["run", str(p), "--shape", "n=5", "--random", "-o",
                                   str(tmp_path / "o.npz")])
    assert res.exit_code == 0, res.output
    with np.load(tmp_path / "o.npz") as f:
        assert f["y"].shape == (5, 5)
    x = np.zeros((1, 3, 8, 9), np.float32)
    want = ort.InferenceSession(paddle_like().SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert want.shape == (1, 3, 8, 9)
