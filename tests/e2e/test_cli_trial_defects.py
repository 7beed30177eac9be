"""The second new-user trial's defects (2026-12-04), one test each: what the CLI and the Python API
said, or failed to say, on inputs a user gives.

Models are built here: a MatMul with a constant weight (``linear``) and a select on a rank-0 bool
(``select``). Compiles are few and small (simulated H200).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.compiler.core.why_not import why_not_lines

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli, one_line_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


@pytest.fixture
def select(tmp_path):
    """``y = c ? x : -x`` with ``c`` a rank-0 bool input."""
    g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["nx"], name="neg"),
         helper.make_node("Where", ["c", "x", "nx"], ["y"], name="where")], "select",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    p = tmp_path / "select.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def test_a_weight_storage_refused_for_its_quality_is_said_in_the_summary_and_inspect(linear,
                                                                                     tmp_path):
    out = tmp_path / "linear.lumc"
    res = lumc_cli("compile", linear, "--budget", "30s", "--device", "sim:h200", "--weights",
                   "int8", "--tolerance", "1e-9", "-o", out)
    assert res.exit_code == 0, res.output
    assert "note: weights int8 miss the quality gate on their own" in res.output, res.output
    shown = lumc_cli("inspect", out)
    assert shown.exit_code == 0, shown.output
    assert "precision fp32, weights same" in shown.output
    assert "note: weights int8 miss the quality gate on their own" in shown.output


def test_logits_naming_no_output_is_refused(linear, tmp_path):
    res = lumc_cli("compile", linear, "--budget", "20s", "--device", "sim:h200", "--precision",
                   "fp16", "--logits", "nope", "-o", tmp_path / "x.lumc")
    one_line_error(res, "--logits nope", "outputs: y")
    assert not (tmp_path / "x.lumc").exists()


def test_run_random_draws_a_rank0_bool_as_an_array(select):
    res = lumc_cli("run", select, "--random", "--check")
    assert res.exit_code == 0, res.output
    assert "y" in res.output


def test_run_refuses_an_input_given_twice(select, tmp_path):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.ones(3, np.float32))
    np.save(b, np.ones(4, np.float32))
    res = lumc_cli("run", select, "--input", f"x={a}", "--input", f"x={b}", "--random")
    one_line_error(res, "--input x", "given twice")


def test_run_help_says_range_artifacts_take_shape():
    res = lumc_cli("run", "--help")
    assert "size ranges" in " ".join(res.output.split()), res.output


def test_unknown_devices_name_the_documented_ones(linear, tmp_path):
    for dev in ("sim:a100", "cuda:x"):
        res = lumc_cli("compile", linear, "--budget", "10s", "--device", dev,
                       "-o", tmp_path / "x.lumc")
        line = one_line_error(res, dev)
        assert "sim:h100" in line and "sim:h200" in line, line


def test_a_bound_model_keeps_its_file_name(select, tmp_path):
    cm = lumc.compile(str(select), budget="20s", device="sim:h200", bind={"c": True})
    assert cm.report_dict()["model"] == "select.onnx"
    x = np.array([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_array_equal(cm.run({"x": x})["y"], x)


def test_api_shape_errors_name_the_python_argument(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])])
    p = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    with pytest.raises(lumc.InputError, match=r"shapes=\{'batch': <size>\}"):
        lumc.compile(str(p), budget="10s", device="sim:h200")


def test_api_refuses_options_of_the_other_frontend_in_one_line(linear):
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(4, 4)
    for kw in ({"fast_math": True}, {"shapes": {"b": 2}}, {"use_egraph": False}):
        with pytest.raises(lumc.InputError, match=f"{next(iter(kw))}= is not an option for a "
                                                  "torch module"):
            lumc.compile(m, budget="10s", example_inputs=(torch.randn(2, 4),), **kw)
    with pytest.raises(lumc.InputError, match="dynamic_shapes= is not an option for an ONNX"):
        lumc.compile(str(linear), budget="10s", dynamic_shapes={})
    # workers= is an option of both (its decorator's signature says so)
    import inspect
    from lumc.compiler.core.pipeline import compile_model
    from lumc.compiler.core.torch_compile import compile_module
    assert "workers" in inspect.signature(compile_model).parameters
    assert "workers" in inspect.signature(compile_module).parameters


def test_why_not_says_when_no_candidate_had_fewer_kernels():
    doc = {"pairs": [], "candidates": [], "compared": 7}
    assert why_not_lines(doc) == [
        "candidates: none of the 7 e-graph candidates had fewer kernels than the chosen program"]
    assert why_not_lines({"pairs": [], "candidates": [], "compared": 0}) == []


def test_a_range_compile_names_its_range_in_shape_errors(tmp_path):
    """A wrong static dim at a size-range plan said 'compiled for (2, 8, 16)': the plan re-sized
    to the call's seq, not what the compile serves."""
    torch = pytest.importorskip("torch")
    from torch.export import Dim
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)).eval()
    f = lumc.compile(m, budget="60s", device="sim:h200", example_inputs=(torch.randn(2, 16, 16),),
                     dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(lumc.InputError, match=r"has shape \(3, 8, 16\), compiled for "
                                              r"\(2, seq, 16\) with seq in 2\.\.64"):
        f(torch.randn(3, 8, 16))


def test_check_of_a_reduced_precision_artifact_names_its_tolerance(linear, tmp_path):
    out = tmp_path / "linear-bf16.lumc"
    res = lumc_cli("compile", linear, "--budget", "30s", "--device", "sim:h200", "--precision",
                   "bf16", "-o", out, "--quiet")
    assert res.exit_code == 0, res.output
    res = lumc_cli("run", out, "--random", "--check")
    assert res.exit_code == 0, res.output
    verdict = next(ln for ln in res.output.splitlines() if ln.startswith("check:"))
    assert "the compile's tolerance" in verdict and "by dtype" not in verdict, verdict


@pytest.mark.parametrize("option", [("--weights", "int8"), ("--precision", "bf16")])
def test_check_of_reduced_precision_is_judged_by_the_model_as_given(linear, tmp_path, option):
    """A reduced-precision artifact stores its weights rounded (bf16) or quantized (int8) in its
    graph; the float64 judge of ``run --check`` is the source model (float weights), so that error
    counts against lumc: at a tolerance tighter than it, the check fails; at the compile's own, it
    passes."""
    out = tmp_path / "linear-reduced.lumc"
    res = lumc_cli("compile", linear, "--budget", "30s", "--device", "sim:h200", *option,
                   "-o", out, "--quiet")
    assert res.exit_code == 0, res.output
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    ys = tmp_path / "y.npz"
    res = lumc_cli("run", out, "--inputs", tmp_path / "in.npz", "--check", "--rtol", "1e-4",
                   "--atol", "1e-5", "-o", ys)
    assert ys.exists(), res.output
    w = numpy_helper.to_array(onnx.load(linear).graph.initializer[0]).astype(np.float64)
    err = np.abs(np.load(ys)["y"] - x.astype(np.float64) @ w).max()
    assert err > 1e-3, err            # the premise: the precision costs more than the tolerance
    assert res.exit_code == 1, res.output
    assert "lumc is closer" not in res.output, res.output
    res = lumc_cli("run", out, "--inputs", tmp_path / "in.npz", "--check")
    assert res.exit_code == 0, res.output
