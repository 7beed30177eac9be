"""A fresh-user walkthrough's defects, one test each: what the CLI and the Python API did with
inputs a new user gives (a traceback, a silent choice, a wrong hint or a misleading number).

Models are built here with onnx.helper and compiled for the simulated H200 with small budgets.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import lumc
from lumc.compiler.frontends import models

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli, one_line_error  # noqa: E402


pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


def _save(tmp_path, name, nodes, inputs, outputs, inits=()):
    p = tmp_path / f"{name}.onnx"
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


@pytest.fixture
def tokens(tmp_path):
    """MiniLM's interface: ``y = input_ids * attention_mask`` (int64 [B, S] each)."""
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"])
            for n in ("input_ids", "attention_mask")]
    return _save(tmp_path, "tok", [helper.make_node("Mul", ["input_ids", "attention_mask"], ["y"],
                                                    name="mul")],
                 ints, [helper.make_tensor_value_info("y", TensorProto.INT64, ["B", "S"])])


def test_random_draws_only_the_inputs_not_given_by_a_known_models_recipe(tokens, tmp_path,
                                                                         monkeypatch):
    """``--input attention_mask=... --random`` on MiniLM: its recipe assumed every input missing
    (KeyError traceback). The given mask is kept, input_ids drawn at the mask's size."""
    minilm = models.MODEL_INFO["minilm-l3"]
    monkeypatch.setattr(models, "identify_model", lambda path: minilm)
    monkeypatch.setattr(models, "identify_bytes", lambda data: minilm)
    mask = tmp_path / "m.npy"
    np.save(mask, np.array([[1, 1, 1, 0, 0]], np.int64))
    art = tmp_path / "tok.lumc"
    res = lumc_cli("compile", tokens, "--budget", "5s", "--device", "sim:h200", "--shape", "B=1",
                   "--shape", "S=5", "-o", art, "--quiet")
    assert res.exit_code == 0, res.output
    for model in (tokens, art):
        out = tmp_path / "out.npz"
        res = lumc_cli("run", model, "--input", f"attention_mask={mask}", "--random", "-o", out)
        assert res.exit_code == 0, res.output
        assert "attention_mask [1, 5] int64, input_ids [1, 5] int64 (random)" in res.output
        y = np.load(out)["y"]
        assert y.shape == (1, 5) and (y[0, 3:] == 0).all() and y[0, 0] == 101   # [CLS] kept


@pytest.fixture
def mlp(tmp_path):
    """``y = relu(x @ W)``, x: f32[N, 64] (N dynamic); nodes named 'a' and 'r'."""
    w = np.ones((64, 64), np.float32)
    return _save(tmp_path, "mlp", [helper.make_node("MatMul", ["x", "W"], ["a"], name="a"),
                                   helper.make_node("Relu", ["a"], ["y"], name="r")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
                 [onnx.numpy_helper.from_array(w, "W")])


def test_bind_of_a_tensor_input_is_refused_in_one_line(mlp, tmp_path):
    """``--bind x=1`` on x: [N, 64] became a rank-0 constant and failed inside the MatMul
    ('IndexError: tuple index out of range')."""
    for value, got in (("1", "got 1 value"), ("1,2", "got 2 values")):
        res = lumc_cli("compile", mlp, "--budget", "5s", "--device", "sim:h200", "--shape", "N=4",
                       "--bind", f"x={value}", "-o", tmp_path / "x.lumc")
        line = one_line_error(res, "--bind x", "tensor input [N, 64]", got, "scalar")
        assert "MatMul" not in line and "IndexError" not in line
    assert not (tmp_path / "x.lumc").exists()
    assert "fix a scalar input" in " ".join(lumc_cli("compile", "--help").output.split())


@pytest.fixture(scope="module")
def ranged(tmp_path_factory):
    """``y = a + b`` (a, b: f32[1, S]) compiled for S in 1..16: ``(model path, artifact path)``."""
    root = tmp_path_factory.mktemp("ranged")
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "S"]) for n in ("a", "b")]
    model = _save(root, "two", [helper.make_node("Add", ["a", "b"], ["y"], name="add")], ins,
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S"])])
    art = root / "two.lumc"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LUMC_CACHE_DIR", str(root / "cache"))
        res = lumc_cli("compile", model, "--budget", "10s", "--device", "sim:h200", "--shape",
                       "S=1..16", "-o", art, "--quiet")
    assert res.exit_code == 0, res.output
    return model, art


def test_a_range_artifact_refuses_shapes_that_disagree_like_the_model(ranged, tmp_path):
    """``--shape a=1x8 --shape b=1x9`` ran at [1, 9] both on the artifact, dropping a=1x8; the
    .onnx refused. Both refuse now, in the same words (and an array against --shape likewise)."""
    for target in ranged:
        one_line_error(lumc_cli("run", target, "--shape", "a=1x8", "--shape", "b=1x9", "--random"),
                       "node 'b'", "dynamic dim S is 8 elsewhere but 9 in --shape b")
    np.save(tmp_path / "a.npy", np.ones((1, 8), np.float32))
    one_line_error(lumc_cli("run", ranged[1], "--input", f"a={tmp_path / 'a.npy'}", "--shape",
                            "S=9", "--random"), "dynamic dim S is 9 elsewhere but 8 in input 'a'")
    res = lumc_cli("run", ranged[1], "--input", f"a={tmp_path / 'a.npy'}", "--random", "--check")
    assert res.exit_code == 0, res.output
    assert "a [1, 8] float32, b [1, 8] float32 (random)" in res.output


def test_a_range_artifact_given_no_size_names_the_unset_dim_and_its_range(ranged, tmp_path):
    """``run dyn.lumc --random`` ran silently at the range's largest size although run --help
    says a dim left unset is an error; bench (the same choice) likewise."""
    art = ranged[1]
    for cmd in (("run", art, "--random"), ("bench", art, "--repeats", "1")):
        one_line_error(lumc_cli(*cmd), "dynamic dims S unset", "compiled for S in 1..16",
                       "--shape S=<size> (or the whole input: --shape a=1x<S>)")
    res = lumc_cli("bench", art, "--shape", "S=3", "--repeats", "1")
    assert res.exit_code == 0, res.output
    many = tmp_path / "two48.lumc"          # explicit sizes: not the first plan either
    res = lumc_cli("compile", ranged[0], "--budget", "10s", "--device", "sim:h200", "--shape",
                   "S=4,8", "-o", many, "--quiet")
    assert res.exit_code == 0, res.output
    one_line_error(lumc_cli("run", many, "--random"), "dynamic dim S unset",
                   "compiled for S=4, 8", "give --shape S=4 (or another size it was compiled for)")
    res = lumc_cli("run", many, "--random", "--shape", "S=8")
    assert res.exit_code == 0 and "a [1, 8] float32 (random)" in res.output, res.output


def test_the_summary_says_not_checked_when_no_candidate_compiled(mlp, tmp_path, monkeypatch):
    """``--budget 1s``: '0 compiled ... 0 timed; max rel error 0.00e+00' read as verified-exact,
    but no kernel's code ran (the 0 is the plan on the reference executor)."""
    cm = lumc.compile(str(mlp), budget="10s", device="sim:h200", shapes={"N": 4})
    monkeypatch.setattr("lumc.compiler.core.pipeline.compile_model", lambda *a, **k: cm)
    assert cm._report["candidates_compiled"] > 0
    res = lumc_cli("compile", mlp, "--budget", "10s", "--shape", "N=4", "-o", tmp_path / "a.lumc")
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "numerics checks" in ln)
    assert f"max rel error {cm._report['max_rel_error']:.2e}" in line, line
    cm._report.update(candidates_compiled=0, candidates_timed=0, max_rel_error=0.0)
    res = lumc_cli("compile", mlp, "--budget", "1s", "--shape", "N=4", "-o", tmp_path / "b.lumc")
    assert res.exit_code == 0, res.output
    search = next(ln for ln in res.output.splitlines() if "search:" in ln)
    line = next(ln for ln in res.output.splitlines() if "numerics checks" in ln)
    assert "0 compiled" in search and "max rel error not checked" in line, (search, line)
    assert "0.00e+00" not in line


def _nothing_measured(monkeypatch):
    """The search sees its deadline already spent: it returns the untimed fallback."""
    from lumc.compiler.core import pipeline
    from lumc.compiler.core.budget import Deadline
    real = pipeline.run_search
    monkeypatch.setattr(pipeline, "run_search",
                        lambda keys, b, n, m, deadline, **kw: real(keys, b, n, m, Deadline(0.0), **kw))


def test_the_untimed_fallback_has_its_kernels_checked_after_the_budget(mlp, tmp_path, monkeypatch):
    """``--budget 1s`` returned the best-bound program with no kernel's code run and 'max rel error
    0.0' in the JSON (README: every returned program is checked). Its kernels are checked past the
    deadline, within the grace, and the report says so; one that fails is an error, not an
    artifact."""
    _nothing_measured(monkeypatch)
    res = lumc_cli("compile", mlp, "--budget", "10s", "--shape", "N=4", "-o", tmp_path / "a.lumc",
                   "--report", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "a.json").read_text())
    assert r["candidates_compiled"] == 0 and r["best_time_s"] is None
    assert r["checked_after_budget"] == r["kernels"] >= 1
    line = next(ln for ln in res.output.splitlines() if "numerics checks" in ln)
    assert "checked after it" in line and "not checked" not in line, line
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ np.ones((64, 64)), 0)
    got = lumc.load(tmp_path / "a.lumc")(x)
    np.testing.assert_allclose(got, want, rtol=1e-5)

    from lumc.compiler.core.measure import KernelMeasurer
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "fresh"))
    # every config wrong (the vendor replay's too: a fallback kernel failing at its default
    # takes another config that passes, lumc.compiler.core.untimed)
    wrong = (False, "rejected: max rel error 1 > 1e-05 on f32")
    monkeypatch.setattr(KernelMeasurer, "_check_once", lambda self, e, p=None: wrong)
    monkeypatch.setattr(KernelMeasurer, "_check", lambda self, e, i, c: wrong)
    res = lumc_cli("compile", mlp, "--budget", "10s", "--shape", "N=4", "-o", tmp_path / "b.lumc")
    assert res.exit_code == 2 and not (tmp_path / "b.lumc").exists(), res.output
    assert "failed its check past the deadline" in res.output, res.output
    assert "at its other configs too" in res.output, res.output


def test_a_forward_writing_a_buffer_is_told_so_not_to_call_eval():
    """``self.cnt.add_(1)`` in forward ended '(call module.eval() before compiling)', which does not
    stop that write; eval() is said only for batch norm running statistics in training mode."""
    torch = pytest.importorskip("torch")
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cnt", torch.zeros(1))
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            self.cnt.add_(1)
            return self.lin(x)

    for m in (Counter(), Counter().eval()):
        with pytest.raises(lumc.UnsupportedOpError) as e:
            lumc.compile(m, budget="10s", example_inputs=(torch.randn(2, 4),))
        msg = str(e.value)
        assert "writes to buffer 'cnt' in place" in msg and "eval()" not in msg, msg
        assert "torch.compile(m, backend=\"lumc\")" in msg
    # a training-mode batch norm's running statistics: eval() is the fix (the op check usually
    # refuses it first, so its specs are built here)
    from types import SimpleNamespace

    from lumc.compiler.frontends.torch_frontend.capture import _mutation_error
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(4))
    spec = [SimpleNamespace(kind=SimpleNamespace(name=k), target=t) for k, t in
            (("BUFFER_MUTATION", "0.running_mean"), ("USER_OUTPUT", None))]
    assert "call module.eval()" in str(_mutation_error(net, spec))
    assert "call module.eval()" not in str(_mutation_error(net.eval(), spec))


def test_api_names_an_unknown_dim_in_shapes(mlp):
    """``shapes={"M": 4}`` on a model whose dim is N said "input 'x' has dynamic dims ['N']" (and
    with N given too, M was ignored); the API names M as the CLI names --shape M."""
    for shapes in ({"M": 4}, {"N": 4, "M": 4}, {"M": (1, 16)}):
        with pytest.raises(lumc.InputError) as e:
            lumc.compile(str(mlp), budget="10s", device="sim:h200", shapes=shapes)
        msg = str(e.value)
        assert "shapes={'M': ...}: no input or dynamic dim of that name" in msg, msg
        assert "inputs: x; dynamic dims: N" in msg and "\n" not in msg


def test_counts_of_one_are_singular(tmp_path):
    """'1 kernels', 'all 1 outputs match', '1 more size buckets': one of a thing is singular in the
    compile summary, run, --check, inspect and a budget refusal."""
    relu = _save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    art = tmp_path / "relu.lumc"
    res = lumc_cli("compile", relu, "--budget", "10s", "--device", "sim:h200", "-o", art)
    assert res.exit_code == 0 and "  1 kernel, best" in res.output, res.output
    res = lumc_cli("run", art, "--random", "--check")
    assert res.exit_code == 0, res.output
    assert ", 1 kernel, running on" in res.output, res.output
    assert "check: the output matches onnxruntime" in res.output, res.output
    res = lumc_cli("inspect", art)
    assert res.exit_code == 0 and "1 kernel on sim:h200" in res.output, res.output
    assert "1 kernels" not in res.output
    # a range compile's budget refusal (made before its buckets' work)
    from lumc.compiler.core.buckets import too_small
    assert "for 1 size bucket (" in str(too_small(10.0, 1.0, 1))
    assert "for 3 size buckets (" in str(too_small(10.0, 1.0, 3))


def test_options_that_would_do_nothing_are_refused_or_recorded(tmp_path):
    """--tolerance, --max-kl and --logits gate a reduced precision: at fp32 with the model's weights they would
    judge nothing, and --max-kl with no distribution output and no --logits too; --rtol/--atol set --check's tolerance: without --check nothing is compared.
    Each is one line, exit 2. --fast-math is recorded in the report and shown by inspect."""
    relu = _save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    for extra, word in ((["--max-kl", "1e-3"], "--max-kl"), (["--logits", "y"], "--logits"),
                        (["--tolerance", "0"], "--tolerance")):    # --tolerance was accepted
        res = lumc_cli("compile", relu, "--budget", "10s", "--device", "sim:h200", *extra)
        one_line_error(res, word, "reduced precision")
    # at bf16 --max-kl judges distributions: relu's output is none, and no --logits names one
    # (it was silently ignored: the compile stayed at bf16 with no KL measured)
    res = lumc_cli("compile", relu, "--budget", "10s", "--device", "sim:h200",
                   "--precision", "bf16", "--max-kl", "1e-3", "-o", tmp_path / "b.lumc")
    one_line_error(res, "--max-kl", "no output of the model is a distribution", "--logits")
    assert not (tmp_path / "b.lumc").exists()
    res = lumc_cli("compile", relu, "--budget", "10s", "--device", "sim:h200",
                   "--precision", "bf16", "--max-kl", "1e-3", "--logits", "y",
                   "-o", tmp_path / "b.lumc")
    assert res.exit_code == 0, res.output
    for opt in ("--rtol", "--atol"):
        one_line_error(lumc_cli("run", relu, "--random", opt, "1e-3"), opt, "add --check")
    art, rep = tmp_path / "f.lumc", tmp_path / "f.json"
    res = lumc_cli("compile", relu, "--budget", "10s", "--device", "sim:h200", "--fast-math",
                   "-o", art, "--report", rep)
    assert res.exit_code == 0, res.output
    import json
    assert json.loads(rep.read_text())["fast_math"] is True
    res = lumc_cli("inspect", art)
    assert res.exit_code == 0 and "compiled with --fast-math" in res.output, res.output
    art2 = tmp_path / "g.lumc"
    assert lumc_cli("compile", relu, "--budget", "10s", "--device", "sim:h200",
                    "-o", art2).exit_code == 0
    assert "--fast-math" not in lumc_cli("inspect", art2).output


def test_a_reused_plan_says_whose_candidate_counts_it_shows(tmp_path, monkeypatch):
    """A compile that reuses a stored plan re-timed nothing: the candidate counts it prints are the
    earlier compile's, and the summary says so."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    relu = _save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    outs = []
    for k in range(2):
        res = lumc_cli("compile", relu, "--budget", "10s", "--device", "sim:h200",
                       "-o", tmp_path / f"r{k}.lumc")
        assert res.exit_code == 0, res.output
        outs.append(res.output)
    assert "whose plan this reuses" not in outs[0]
    assert "reused the plan" in outs[1] and "search (the earlier compile's, whose plan this " \
        "reuses):" in outs[1], outs[1]


def test_check_verdict_says_which_tolerance_is_the_dtypes():
    """--rtol given, atol by dtype: the verdict said 'atol 1e-05 + rtol 1e-06 by dtype', as if
    both were the dtype's."""
    from lumc.compiler.tools.output_check import OutputCheck, tolerance_note
    c = {"y": OutputCheck(0.0, 0.0, True, "", 1e-4, 1e-5, 0.0)}
    assert tolerance_note(c, None, None) == "atol 1e-05 + rtol 0.0001 by dtype; ints exact"
    assert tolerance_note(c, 1e-6, None) == "atol 1e-05 (by dtype) + rtol 1e-06; ints exact"
    assert tolerance_note(c, None, 0.5) == "atol 0.5 + rtol 0.0001 (by dtype); ints exact"
    assert tolerance_note(c, 1e-6, 0.5) == "atol 0.5 + rtol 1e-06; ints exact"


def test_an_input_with_two_unset_dims_names_both_in_its_hint(tokens):
    """MiniLM without --shape: the hint said '--shape input_ids=... or --shape B=N'; a user who
    gave B=1 as told was then refused a second time for S. The hint names every unset dim."""
    for cmd in (("run", tokens, "--random"),
                ("compile", tokens, "--budget", "5s", "--device", "sim:h200", "--quiet")):
        one_line_error(lumc_cli(*cmd), "dynamic dims B, S unset",
                       "give --shape B=<size> --shape S=<size> (or the whole input: "
                       "--shape input_ids=<B>x<S>)")


def test_a_range_bucket_run_on_triton_says_its_size_in_the_users_dim(tmp_path):
    """``lumc run ART --shape S=8 --backend triton`` on an artifact for S=4..16:4 said 'one
    size-generic module per kernel of the bucket at {'L0': 2}': the kernels' internal name and the
    size in steps. It names the model's dim and its size: 'at S=8'."""
    ins = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, "S"])]
    model = _save(tmp_path, "neg", [helper.make_node("Neg", ["a"], ["y"], name="neg")], ins,
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S"])])
    art = tmp_path / "neg.lumc"
    res = lumc_cli("compile", model, "--budget", "10s", "--device", "sim:h200", "--shape",
                   "S=4..16:4", "-o", art, "--quiet")
    assert res.exit_code == 0, res.output
    res = lumc_cli("run", art, "--shape", "S=8", "--random", "--check", "--backend", "triton")
    assert res.exit_code == 0, res.output
    assert "of the bucket at S=8," in res.output and "L0" not in res.output, res.output


def test_the_fallbacks_checked_kernels_are_counted_as_distinct_ones():
    """MiniLM at --budget 1s: '57 kernels, best untimed' and then 'the fallback's 15 kernels
    checked after it' (its 15 distinct kernels, each layer's repeated). The line says so."""
    from lumc.compiler.tools.cli_compile import _max_rel_text
    text = _max_rel_text({"max_rel_error": 6.8e-7, "checked_after_budget": 15, "kernels": 57})
    assert "15 distinct kernels (of the plan's 57) checked after it" in text, text
    text = _max_rel_text({"max_rel_error": 6.8e-7, "checked_after_budget": 3, "kernels": 3})
    assert "fallback's 3 kernels checked after it" in text, text
    # a model whose outputs are all constants (empty) has nothing to compile: not "no candidate
    # compiled within the budget", which read as a budget too small
    text = _max_rel_text({"max_rel_error": 0.0, "kernels": 0, "candidates_compiled": 0})
    assert text == "0.00e+00 (no kernel: every output is a constant)", text


def test_a_misnamed_input_of_a_range_artifact_is_named_before_its_sizes(ranged, tmp_path):
    """``run ART --inputs F.npz`` whose key is not an input: the .onnx said 'unknown input'; the
    range artifact asked for --shape S=N instead, and only once that was given named the key."""
    np.savez(tmp_path / "in.npz", c=np.ones((1, 8), np.float32))
    for target in ranged:
        one_line_error(lumc_cli("run", target, "--inputs", tmp_path / "in.npz", "--random"),
                       "unknown input 'c'")


def test_an_input_fixed_by_bind_is_said_so_when_given_at_run(tmp_path):
    """``compile --bind sr=16000`` then ``run ART --input sr=8k.npy``: 'unknown input 'sr'; the
    model's inputs are x', as if the model never had it. The refusal says --bind fixed it."""
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
           helper.make_tensor_value_info("sr", TensorProto.FLOAT, [])]
    model = _save(tmp_path, "sr", [helper.make_node("Mul", ["x", "sr"], ["y"], name="mul")], ins,
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    art = tmp_path / "sr.lumc"
    res = lumc_cli("compile", model, "--budget", "5s", "--device", "sim:h200", "--bind", "sr=2",
                   "-o", art, "--quiet")
    assert res.exit_code == 0, res.output
    np.save(tmp_path / "sr.npy", np.array(3, np.float32))
    one_line_error(lumc_cli("run", art, "--input", f"sr={tmp_path / 'sr.npy'}", "--random"),
                   "unknown input 'sr'", "--bind sr=2 fixed it at compile time")


def test_the_fallback_check_reruns_a_prefetched_check_lost_with_the_pool(mlp, tmp_path,
                                                                          monkeypatch):
    """CI (2 loaded cores): the untimed fallback's kernel had its numerics check prefetched in the
    search's worker pool, the pool closed with the search, and the check's future ended in an
    error: 'checked_after_budget' read 0 and the program went out unchecked. A prefetched check
    that did not finish well before its pool closed runs again here."""
    from concurrent.futures import Future
    from lumc.compiler.core.measure import KernelMeasurer
    _nothing_measured(monkeypatch)
    real = KernelMeasurer.prefetch

    def lost(self, keys):
        real(self, keys)
        for k in keys:           # every prefetched check lost with its worker
            f = Future()
            f.set_exception(RuntimeError("worker process died"))
            self._pending[k] = f
    monkeypatch.setattr(KernelMeasurer, "prefetch", lost)
    res = lumc_cli("compile", mlp, "--budget", "10s", "--shape", "N=4", "-o", tmp_path / "a.lumc",
                   "--report", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "a.json").read_text())
    assert r["best_time_s"] is None
    assert r["checked_after_budget"] == r["kernels"] >= 1, res.output
