"""``lumc compile`` / ``lumc run ART.lumc`` / ``lumc cache`` end to end through the CLI."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def lumc(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-c", "from lumc.compiler.tools.cli import main; main()", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


@pytest.fixture()
def env(tmp_path):
    e = dict(os.environ)
    e["LUMC_CACHE_DIR"] = str(tmp_path / "cache")
    return e


@pytest.fixture()
def model_file(tmp_path):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
         helper.make_node("ReduceMax", ["t"], ["y"], axes=[1], keepdims=0)],
        "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])], [w])
    p = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), p)
    return p


def test_compile_then_run_artifact(model_file, env, tmp_path):
    out, rep = tmp_path / "m.lumc", tmp_path / "r.json"
    r = lumc("compile", str(model_file), "--budget", "30s", "--device", "sim:h200", "--shape",
             "batch=5", "-o", str(out), "--report", str(rep), "--quiet", env=env)
    assert r.returncode == 0, r.stderr
    assert "SIMULATED" in r.stdout and out.exists()
    report = json.loads(rep.read_text())
    assert report["simulated"] and report["candidates_timed"] > 0
    assert report["inputs"] == {"x": [[5, 32], "f32"]}
    model_file.unlink()                           # the artifact is self-contained
    r = lumc("run", str(out), "--random", "--check", env=env)
    assert r.returncode == 0, r.stderr
    assert "check: the output matches onnxruntime" in r.stdout    # its one output
    r = lumc("cache", "info", env=env)
    assert r.returncode == 0 and "timings" in r.stdout
    r = lumc("cache", "clear", env=env)
    assert r.returncode == 0 and "cleared" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--budget", "banana"], "not a duration"),
    (["--budget", "0"], "must be positive"),
    (["--budget", "-5s"], "must be positive"),
    (["--budget", "10s", "--device", "tpu"], "unknown device"),
])
def test_bad_compile_args(model_file, env, args, needle, tmp_path):
    r = lumc("compile", str(model_file), *args, "--shape", "batch=2", "-o", str(tmp_path / "x.lumc"),
             env=env)
    assert r.returncode == 2 and needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.lumc").exists()


def test_corrupt_artifact_is_one_line(env, tmp_path):
    bad = tmp_path / "bad.lumc"
    bad.write_bytes(b"PK\x03\x04" + os.urandom(300))
    r = lumc("run", str(bad), "--random", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_existing_artifact_survives_a_failed_compile(model_file, env, tmp_path):
    out = tmp_path / "keep.lumc"
    out.write_bytes(b"previous artifact")
    r = lumc("compile", str(model_file), "--budget", "10s", "--device", "sim:h200", "-o", str(out),
             env=env)     # dynamic dim unset: fails before writing
    assert r.returncode == 2 and out.read_bytes() == b"previous artifact"


def test_compile_says_when_an_output_is_declared_with_another_shape(env, tmp_path):
    """lumc run said 'output 'y' is declared 2x99 but computes 2x6; using 2x6', lumc compile said
    nothing, and the artifact returned [2, 6] where the model declares [2, 99]."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 99])])
    p, out = tmp_path / "d.onnx", tmp_path / "d.lumc"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    res = lumc("compile", str(p), "--budget", "10s", "-o", str(out), env=env)
    assert res.returncode == 0, res.stderr
    assert "note: output 'y' is declared 2x99 but computes 2x6; using 2x6" in res.stdout
    x = np.array([[-1.0, 2.0, -0.0, 3.5, -7.0, 0.25]] * 2, np.float32)
    np.save(tmp_path / "x.npy", x)
    res = lumc("run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "--check", "-o",
               str(tmp_path / "y.npz"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")["y"], np.maximum(x, 0))
