"""What ``lumc compile`` and ``lumc inspect`` say about a reduced-precision compile of several plans
(one per size): each plan's measured quality. A MatMul with a constant weight and a dynamic batch,
built here; compiles are small (simulated H200)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli  # noqa: E402

pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


def test_every_plan_of_a_size_list_says_its_measured_quality(tmp_path):
    """A bf16 compile into one plan per size printed each plan's time but no precision and no
    measured quality (a single-plan compile prints them), and ``lumc inspect`` said only
    'precision bf16, weights same': the figures were in the report JSON alone."""
    w = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [numpy_helper.from_array(w, "W")])
    model, art, rep = tmp_path / "dyn.onnx", tmp_path / "d.lumc", tmp_path / "d.json"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    res = lumc_cli("compile", model, "--budget", "30s", "--device", "sim:h200", "--shape",
                   "batch=2,16", "--precision", "bf16", "--no-egraph", "--quiet", "-o", art,
                   "--report", rep)
    assert res.exit_code == 0, res.output
    variants = json.loads(rep.read_text())["variants"]
    shown = lumc_cli("inspect", art)
    assert shown.exit_code == 0, shown.output
    for v in variants:
        q = v["quality"]
        assert v["precision"] == "bf16" and q["passed"]
        line = (f"precision bf16 (weights same) vs fp32: max rel error {q['max_rel']:.2e} "
                f"(tolerance {q['tolerance']:g})")
        assert line in res.output, res.output
        assert line in shown.output, shown.output
    # the figures are of what runs: bf16's error, within its tolerance, against float64
    cm = lumc.load(art)
    for b in (2, 16):
        x = np.random.default_rng(b).standard_normal((b, 128)).astype(np.float32)
        ref = x.astype(np.float64) @ w.astype(np.float64)
        err = np.abs(cm(x) - ref).max() / np.abs(ref).max()
        assert 1e-5 < err <= variants[0]["quality"]["tolerance"]
