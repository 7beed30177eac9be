"""A data-dependent ``If`` on a scalar input (a sample-rate switch, ``if sr == 16000``) whose other
branch does not fit the input's shapes: ``--bind sr=16000`` / ``bind=`` folds it at compile time;
without a binding the import says so in one line and names ``--bind``."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import lumc
from lumc.compiler.tools.cli import cli
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir.errors import InputError


def sample_rate_switch() -> onnx.ModelProto:
    """x [1, 512]: at 16 kHz reshaped into 4 frames of 128, at 8 kHz into 4 frames of 64 (which
    cannot hold 512 samples: that branch fails on these shapes)."""
    def branch(frame, name):
        shape = nh.from_array(np.array([4, frame], np.int64), f"s{frame}")
        return oh.make_graph([oh.make_node("Reshape", ["x", f"s{frame}"], [f"r{frame}"]),
                              oh.make_node("ReduceSum", [f"r{frame}"], [f"o{frame}"], keepdims=0)],
                             name, [], [oh.make_tensor_value_info(f"o{frame}", TP.FLOAT, None)],
                             [shape])
    nodes = [oh.make_node("Equal", ["sr", "k16"], ["is16"]),
             oh.make_node("If", ["is16"], ["y"], then_branch=branch(128, "at16k"),
                          else_branch=branch(64, "at8k"))]
    g = oh.make_graph(nodes, "vad", [oh.make_tensor_value_info("x", TP.FLOAT, [1, 512]),
                                     oh.make_tensor_value_info("sr", TP.INT64, [])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                      [nh.from_array(np.array(16000, np.int64), "k16")])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def test_bind_folds_the_if(tmp_path):
    m = sample_rate_switch()
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "sr": np.array(16000, np.int64)})[0]
    f = lumc.compile(m, budget="30s", device="sim:h200", bind={"sr": 16000},
                     db=TuningDatabase(tmp_path / "db.sqlite"))
    assert [i.name for i in f.inputs] == ["x"]
    np.testing.assert_allclose(f(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="no input of that name"):
        lumc.compile(m, budget="30s", device="sim:h200", bind={"rate": 16000})


def test_unbound_runtime_if_compiles_the_branch_that_imports(tmp_path):
    # without a binding the If is decided per call: the 16 kHz branch is compiled, and a call
    # that takes the 8 kHz one (which cannot hold 512 samples) is refused in one line
    m = sample_rate_switch()
    f = lumc.compile(m, budget="30s", device="sim:h200", db=TuningDatabase(tmp_path / "db.sqlite"))
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "sr": np.array(16000, np.int64)})[0]
    np.testing.assert_allclose(f(x, np.array(16000, np.int64)), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="did not compile at these shapes") as e:
        f(x, np.array(8000, np.int64))
    assert "\n" not in str(e.value)


def test_cli_compile_bind(tmp_path):
    p = tmp_path / "vad.onnx"
    onnx.save(sample_rate_switch(), p)
    out = tmp_path / "vad.lumc"
    res = CliRunner().invoke(cli, ["compile", str(p), "--budget", "30s", "--device", "sim:h200",
                                   "--bind", "sr=16000", "-o", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["run", str(out), "--random", "--check"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["compile", str(p), "--budget", "30s", "--bind", "sr"])
    assert res.exit_code == 2 and "--bind" in res.stderr
