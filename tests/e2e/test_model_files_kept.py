"""A model saved with external data is two files: ``m.onnx`` and its weights ``m.data``. No output
of lumc may replace either: ``lumc compile m.onnx -o m.data`` (or ``--report``, ``lumc run -o``,
``lumc bench --json``, ``f.save``) wrote the artifact over the weights, and the model was gone
(only the ``.onnx`` file itself was refused). ``f.save`` of ``lumc.compile('m.onnx')`` replaced
``m.onnx`` itself too."""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.compiler.runtime.tuning_db import TuningDatabase

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli, one_line_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("cache_dir")

W = (np.arange(24, dtype=np.float32).reshape(4, 6) - 11.5) / 7


@pytest.fixture
def ext_model(tmp_path):
    """``y = x @ W`` (x: f32[2, 4]) saved as ``m.onnx`` with ``W`` in ``m.data``; both paths."""
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "ext",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
                          [numpy_helper.from_array(W, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data",
              size_threshold=0)
    return tmp_path / "m.onnx", tmp_path / "m.data"


def _model_still_runs(model, tmp_path):
    """The model's files are intact: onnx loads them and lumc runs them to ``x @ W``."""
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    res = lumc_cli("run", model, "--input", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "y.npz")
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"],
                               x.astype(np.float64) @ W.astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize("args", [
    ("compile", "{m}", "--budget", "10s", "--device", "sim:h200", "-o", "{d}"),
    ("compile", "{m}", "--budget", "10s", "--device", "sim:h200", "-o", "{t}/a.lumc",
     "--report", "{t}/./m.data"),
    ("run", "{m}", "--random", "-o", "{d}"),
    ("bench", "{m}", "--budget", "10s", "--device", "sim:h200", "--json", "{d}"),
], ids=["compile-o", "compile-report", "run-o", "bench-json"])
def test_no_output_replaces_the_models_external_data(ext_model, tmp_path, args, monkeypatch):
    model, data = ext_model
    monkeypatch.setattr("lumc.compiler.core.pipeline.compile_model",
                        lambda *a, **k: pytest.fail("compiled although the output is refused"))
    before = data.read_bytes()
    argv = [a.format(m=model, d=data, t=tmp_path) for a in args]
    one_line_error(lumc_cli(*argv), "m.onnx's external data file", "would destroy it")
    assert data.read_bytes() == before
    assert not (tmp_path / "a.lumc").exists()
    _model_still_runs(model, tmp_path)


def test_api_save_never_replaces_the_models_files(ext_model, tmp_path):
    model, data = ext_model
    before = model.read_bytes(), data.read_bytes()
    f = lumc.compile(str(model), budget="30s", device="sim:h200",
                     db=TuningDatabase(tmp_path / "db.sqlite"))
    for target in (data, model, tmp_path / "." / "m.data"):
        with pytest.raises(lumc.LumcError, match="would destroy it"):
            f.save(target)
    assert (model.read_bytes(), data.read_bytes()) == before
    _model_still_runs(model, tmp_path)
    f.save(tmp_path / "ok.lumc")                 # any other path is written, and runs right
    x = np.full((2, 4), 0.5, np.float32)
    np.testing.assert_allclose(np.asarray(lumc.load(tmp_path / "ok.lumc")(x)),
                               x.astype(np.float64) @ W.astype(np.float64), rtol=1e-6)
