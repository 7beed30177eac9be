"""Defects found using lumc's state between runs and the tools around it (plan cache, artifacts,
run, bench, size ranges), one test each. Models are built here; compiles are few and small."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli, one_line_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


@pytest.mark.parametrize("shape,given", [("n=1..8", "n=1..8"), ("n=2,4", "n=2,4"),
                                         ("x=2x3,4x3", "x=2x3,4x3"), ("x=1..3", "x=1..3")])
def test_run_of_a_model_with_several_sizes_is_one_line(tiny_path, shape, given):
    # a range reached len() of a DimRange (TypeError traceback, exit 1); a list said "got 2x4"
    res = lumc_cli("run", tiny_path, "--random", "--shape", shape)
    one_line_error(res, f"--shape {given}", "one size", "lumc compile")


def test_run_takes_the_size_a_compile_fixed_beside_a_range(tmp_path):
    """``lumc compile --shape B=1 --shape S=1..64`` then ``lumc run --shape B=1 --shape S=7``
    was refused ("--shape B: no input or compiled dynamic dim of that name"): B, dynamic in the
    model, was fixed by the compile. Its one size is accepted (and checked against onnxruntime);
    another is one line naming the size compiled."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 8])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "a.onnx")
    art, out = tmp_path / "r.lumc", tmp_path / "o.npz"
    res = lumc_cli("compile", tmp_path / "a.onnx", "--budget", "30s", "--shape", "B=1",
                   "--shape", "S=1..64", "-o", art, "--quiet")
    assert res.exit_code == 0, res.output
    res = lumc_cli("run", art, "--shape", "B=1", "--shape", "S=7", "--random", "--check",
                   "-o", out)
    assert res.exit_code == 0, res.output
    assert np.load(out)["y"].shape == (1, 7, 8)
    one_line_error(lumc_cli("run", art, "--shape", "B=2", "--shape", "S=7", "--random"),
                   "--shape B=2", "compiled with B=1")


def test_a_plan_the_cache_cannot_store_is_said(tiny_path, cache_dir, tmp_path):
    """A file where the plans folder should be: every compile skipped storing its plan without a
    word (a recompile then searched again), and ``lumc cache info`` said "0 plans". The compile
    summary now notes it (ONNX and torch module paths), and cache info names the file."""
    import numpy as np
    import torch
    import lumc
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "plans").write_text("")
    res = lumc_cli("compile", tiny_path, "--budget", "20s", "--shape", "n=2", "-o",
                   tmp_path / "t.lumc")
    assert res.exit_code == 0, res.output
    assert "note: plan cache: the plan was not stored for reuse" in res.output, res.output
    assert "plan cache:" in lumc.load(tmp_path / "t.lumc").report_dict()["warnings"][-1]
    info = lumc_cli("cache", "info")
    assert "plans is not a folder: no plan can be stored or reused" in info.output, info.output
    m = torch.nn.Linear(4, 3).eval()
    x = torch.randn(2, 4)
    f = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x,))
    torch.testing.assert_close(f(x), m(x))
    assert any(w.startswith("plan cache: the plan was not stored")
               for w in f.specializations[0].compiled.report_dict()["warnings"])


def test_check_judges_an_output_computed_through_f16_at_f16s_tolerance(tmp_path):
    """An fp16 model whose input and output stay f32 (onnxruntime's convert_float_to_float16
    with keep_io_types=True): lumc rounds every f16 op as the spec says, onnxruntime's CPU
    computes several in f32, and --check judged the f32 output at f32's tolerance: FAILED (exit
    1) for a correct run. It takes the half type's tolerance now and says so; a wrong value is
    still caught."""
    import numpy as np
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper
    from lumc.compiler.frontends.onnx_frontend import import_onnx
    from lumc.compiler.tools.output_check import computed_through
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float16)
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=TP.FLOAT16),
             helper.make_node("MatMul", ["xh", "w"], ["h"]),
             helper.make_node("Softmax", ["h"], ["s"], axis=-1),
             helper.make_node("Mul", ["s", "h"], ["p"]),
             helper.make_node("Cast", ["p"], ["y"], to=TP.FLOAT),
             helper.make_node("Relu", ["x"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [8, 32])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [8, 32]),
                           helper.make_tensor_value_info("z", TP.FLOAT, [8, 32])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    assert computed_through(import_onnx(m).graph) == {"y": np.float16}     # z: f32 throughout
    res = lumc_cli("run", tmp_path / "m.onnx", "--random", "--check")
    assert res.exit_code == 0, res.output
    assert "computed through float16: judged at its tolerance" in res.output
    assert "max_rel" in res.output and "FAIL" not in res.output
    from lumc.compiler.tools.output_check import print_outputs
    ref = {"y": np.linspace(1, 2, 8, dtype=np.float32)}
    for off, ok in ((1.001, True), (1.05, False)):
        c = print_outputs({"y": ref["y"] * off}, ref, None, None, through={"y": np.float16})
        assert c["y"].ok is ok and c["y"].rtol == 1e-2


def test_cache_info_creates_no_cache(tmp_path, monkeypatch):
    """``lumc cache info`` with a new LUMC_CACHE_DIR created the folder, the database and the
    kernels folder: a command that reports had side effects (the walkthrough's find)."""
    root = tmp_path / "new" / "cache"
    monkeypatch.setenv("LUMC_CACHE_DIR", str(root))
    res = lumc_cli("cache", "info")
    assert res.exit_code == 0 and "no cache yet at" in res.output, res.output
    assert not root.exists() and not (tmp_path / "new").exists()
