"""The quality gate on outputs that are not plain floats (sim:h200): integer outputs, logits
named by ``--logits``, and what the reports say about them."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.compiler.runtime.tuning_db import TuningDatabase


@pytest.fixture()
def db(tmp_path):
    return TuningDatabase(tmp_path / "tuning.sqlite")


def argmax_model(w: np.ndarray, m: int, scores: bool = True):
    """x[m, k] -> a = argmax(x @ w, -1) (int64) and, with ``scores``, z = x @ w (f32)."""
    k, n = w.shape
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]),
             helper.make_node("ArgMax", ["z"], ["a"], axis=-1, keepdims=0)]
    outs = [helper.make_tensor_value_info("a", TensorProto.INT64, [m])]
    if scores:
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [m, n]))
    g = helper.make_graph(nodes, "argmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          outs, [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _near_tie(m=8, k=64, n=16, seed=0):
    """Weights whose columns 0 and 1 differ by less than a bf16 ulp (bf16 ties them, so its
    argmax says 0 where fp32's says 1, on every row), and positive inputs."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) * 0.01).astype(np.float32)
    w[:, 0] = 1.0
    w[:, 1] = np.float32(1.0 + 2.0 ** -12)
    x = np.abs(rng.standard_normal((m, k))).astype(np.float32) + 0.1
    assert ((x.astype(np.float64) @ w.astype(np.float64)).argmax(-1) == 1).all()
    return w, x


def test_an_index_that_differs_beyond_a_near_tie_fails_the_gate(db):
    """An ArgMax output was left out of the quality gate: a bf16 plan whose argmax differed from
    the fp32 model's on every sample row passed on its float output's error alone. Integer
    outputs are judged exactly, an ArgMax's near-ties excepted: at a tolerance the two scores'
    gap (2.4e-4 of their size) exceeds, the plan falls back to fp32, saying which output
    differed."""
    w, x = _near_tie()
    cm = lumc.compile(argmax_model(w, 8, scores=False), budget="30s", device="sim:h200", db=db,
                      use_egraph=False, precision="bf16", tolerance=1e-5,
                      example_inputs={"x": x}, reuse_plan=False)
    r = cm.report_dict()
    assert r["precision"] == "fp32", r["quality"]
    assert any("output a: 8 of 8 integer values differ" in s for s in r["warnings"]), r["warnings"]
    np.testing.assert_array_equal(cm(x), np.ones(8))


def test_an_argmax_that_differs_only_at_near_ties_keeps_the_precision(db, tmp_path):
    """A bf16 classifier whose argmax picks, on some rows, a class whose fp32 score is within the
    tolerance of the best one's fell back to fp32 for that alone (one near-tie in 64 random rows
    was enough), though its scores met the gate. Such an index is a near-tie
    (``precision.near_ties``): the plan stays bf16, the report counts the near-ties, and ``lumc
    run --check`` judges the artifact the same way against onnxruntime."""
    from click.testing import CliRunner
    from lumc.compiler.tools.cli import cli
    w, x = _near_tie()
    model = argmax_model(w, 8)
    cm = lumc.compile(model, budget="30s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16", example_inputs={"x": x}, reuse_plan=False)
    r = cm.report_dict()
    assert r["precision"] == "bf16" and r["quality"]["passed"], r["quality"]
    assert r["quality"]["exact_outputs"] == {"a": {"differ": 8, "count": 8, "near_ties": 8}}
    assert "integer outputs: 8 of 8 values differ, all at near-ties" in cm.report()
    assert r["max_rel_error"] < 1e-2           # not inf: the near-ties are not errors
    np.testing.assert_array_equal(cm(x)[0], np.zeros(8))
    cm.save(tmp_path / "m.lumc")
    np.save(tmp_path / "x.npy", x)
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "m.lumc"), "--input",
                                   f"x={tmp_path / 'x.npy'}", "--check"])
    assert res.exit_code == 0, res.output
    assert "8 indexes at near-ties" in res.output, res.output


def test_near_ties_count_only_indices_whose_fp32_scores_are_within_tolerance():
    """``near_ties``: where two indices differ, the picked one's fp32 score within ``rtol`` of the
    reference pick's, relative to the slice's largest finite |score|; NaN scores and indices
    outside the axis are never ties; any axis, with or without the kept dim."""
    from lumc.compiler.core.precision import integer_error, near_ties
    s = np.array([[10.0, 9.99, 1.0],      # 0 vs 1: gap 1e-3 of 10, a near-tie at 1e-2
                  [10.0, 9.99, 1.0],      # 0 vs 2: gap 0.9 of 10, not one
                  [np.nan, 1.0, 1.0],     # a NaN slice: never a tie
                  [5.0, 5.0, 5.0]])       # equal: no difference to count
    ref = np.zeros(4, np.int64)          # the fp32 picks: 0 on every row
    got = np.array([1, 2, 1, 0])
    assert near_ties(got, ref, s, 1, False, 1e-2) == 1
    assert near_ties(got, ref, s, 1, False, 1e-4) == 0
    assert near_ties(got[:, None], ref[:, None], s, 1, True, 1e-2) == 1
    assert near_ties(got, ref, s.T, 0, False, 1e-2) == 1                 # axis 0
    assert near_ties(np.array([7, 0, 0, 0]), ref, s, 1, False, 1.0) == 0   # outside the axis
    tie = (s, 1, True, False)
    assert integer_error(np.array([1, 0, 0, 0]), ref, tie, 1e-2) == 0.0
    assert integer_error(got, ref, tie, 1e-2) == float("inf")
    assert integer_error(got, ref, None, 1e-2) == float("inf")


def test_equal_integer_outputs_are_reported(db):
    rng = np.random.default_rng(1)
    m, k, n = 8, 64, 16
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[:, 3] += 4.0                          # a clear winner: no near-tie for bf16 to flip
    x = np.abs(rng.standard_normal((m, k))).astype(np.float32)
    cm = lumc.compile(argmax_model(w, m), budget="30s", device="sim:h200", db=db,
                      use_egraph=False, precision="bf16", example_inputs={"x": x},
                      reuse_plan=False)
    r = cm.report_dict()
    assert r["precision"] == "bf16" and r["quality"]["passed"]
    assert r["quality"]["exact_outputs"] == {"a": {"differ": 0, "count": 8}}
    assert "integer outputs equal" in cm.report()
    np.testing.assert_array_equal(cm(x)[0], np.full(m, 3))


@pytest.mark.parametrize("out,n,why", [("a", 16, "that output is i64"),
                                       ("z", 1, r"that output has shape \[8, 1\]")])
def test_logits_naming_an_output_without_score_rows_is_one_line(out, n, why, db, monkeypatch):
    """``--logits`` naming an integer output, or one with one score per row, was accepted and the
    KL gate (``--max-kl``) then measured nothing: the compile passed 'KL' unmeasured. Refused in
    one line before any search."""
    from lumc.compiler.core import pipeline
    from lumc.ir.errors import InputError

    def no_search(*a, **k):
        raise AssertionError("the search ran before the refusal")
    monkeypatch.setattr(pipeline, "stage_candidates", no_search)
    w = np.random.default_rng(2).standard_normal((64, n)).astype(np.float32)
    with pytest.raises(InputError, match=why) as e:
        lumc.compile(argmax_model(w, 8), budget="20s", device="sim:h200", db=db,
                     use_egraph=False, precision="bf16", max_kl=1e-3, logits=(out,),
                     reuse_plan=False)
    assert "\n" not in str(e.value) and f"logits={out!r}" in str(e.value)


def test_a_plan_the_gate_raised_reports_its_own_error_and_times(db, monkeypatch):
    """fp8 with a tolerance fp8 misses and bf16 meets: the gate raises the contraction to bf16.
    The report's end-to-end max rel error (the summary's 'numerics checks' line) was the fp8
    plan's, measured before the gate changed it (3.8e-2 against a tolerance of 1e-2, for a plan
    whose own error is 2e-3), and its times were the search's fp8 configs'. (The search keeps
    the fp8 config here only with its precision tie-break off: fp8 ties bf16 on this size.)"""
    from lumc.compiler.core import pipeline
    monkeypatch.setattr(pipeline, "config_rank", lambda cfg: 0)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 64)) / 16).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 64])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = lumc.compile(model, budget="30s", device="sim:h200", db=db, use_egraph=False,
                      precision="fp8", tolerance=1e-2, reuse_plan=False)
    r = cm.report_dict()
    assert r["quality"]["raised_kernels"] == 1 and r["quality"]["kernel_precision"] == ["bf16"]
    assert r["max_rel_error"] <= 1e-2, r["max_rel_error"]
    x = rng.standard_normal((16, 256)).astype(np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert 1e-4 < np.abs(cm(x) - ref).max() / np.abs(ref).max() <= 1e-2
    from lumc.compiler.core.precision_gate import retimed
    from lumc.compiler.core.search import SearchResult, SearchStats

    class Measurer:                          # two configs of one kernel: fp8 timed by the search
        cfgs = [{"PRECISION": "fp8"}, {"PRECISION": "bf16"}]

        def config_of(self, k, j):
            return self.cfgs[j]

        def n_configs(self, k):
            return 2

        def __call__(self, k, j):
            return type("M", (), {"seconds": [1e-6, 3e-6][j]})()
    res = SearchResult(0, {"a": 0, "b": 0}, 2e-6, 1e-6, {"a": 1e-6, "b": 1e-6}, SearchStats(), {})
    got = retimed(res, ["a", "b"], [{"PRECISION": "fp8"}, {"PRECISION": "bf16"}], Measurer())
    assert got.kernel_times == {"a": 1e-6, "b": 3e-6} and got.time_s == pytest.approx(4e-6)


def test_a_model_with_only_integer_outputs_states_no_float_error(db):
    """A bf16 model whose one output is a comparison (bool) said 'max rel error 0.00e+00
    (tolerance 0.1), cosine >= 1.000000': figures of no output, the defaults of an empty max."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["z"]),
                           helper.make_node("Greater", ["z", "t"], ["y"])], "cmp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.BOOL, [4, 16])],
                          [numpy_helper.from_array(w, "w"),
                           numpy_helper.from_array(np.float32(0.0), "t")])
    x = rng.standard_normal((4, 64)).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64) > 0
    assert np.abs(x.astype(np.float64) @ w.astype(np.float64)).min() > 1e-2   # no near-zero
    cm = lumc.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                      budget="20s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16", example_inputs={"x": x}, reuse_plan=False)
    line = cm.report().splitlines()[-1]
    assert line == "precision bf16 (weights same) vs fp32: integer outputs equal", line
    np.testing.assert_array_equal(cm(x), want)


def test_policy_options_of_the_wrong_type_in_the_api(db):
    """``logits="logits"`` (one name as a string) was read as the names 'l', 'o', 'g', ...: 'the
    model has no output l'; ``tolerance="0.1"`` raised numpy's TypeError. A string is one name,
    and a non-number is one line."""
    from lumc.ir.errors import InputError
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 10)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "lin",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 10])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((4, 64)).astype(np.float32)
    cm = lumc.compile(model, budget="20s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16", logits="logits", max_kl=1e-2, example_inputs={"x": x},
                      reuse_plan=False)
    q = cm.report_dict()["quality"]["outputs"]["logits"]

    def softmax(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    p = softmax(x.astype(np.float64) @ w.astype(np.float64))
    got = softmax(cm(x).astype(np.float64))
    kl = (p * (np.log(p) - np.log(got))).sum(-1)
    assert q["kl_mean"] == pytest.approx(kl.mean(), rel=0.05, abs=1e-9) and 0 < q["kl_mean"] < 1e-2
    for kw, word in ((dict(tolerance="0.1"), "tolerance must be a number"),
                     (dict(max_kl="1e-3", logits=["logits"]), "max_kl must be a number"),
                     (dict(tolerance=True), "tolerance must be a number"),
                     (dict(logits=[3]), "logits must be output names")):
        with pytest.raises(InputError, match=word):
            lumc.compile(model, budget="20s", device="sim:h200", db=db, precision="bf16", **kw)


def test_index_scores_survive_a_rebuild_and_a_resize():
    """``arg_scores`` is recorded as a path from the index to its scores, so a graph rebuilt node
    for node (``rebuilt``, as constant folding does; a range bucket's ``Resizer``) keeps it,
    pointing at the rebuilt scores (at their new size); an index over integers, or a node nothing
    recorded, has none."""
    from lumc.ir import dtypes as dt
    from lumc.ir.graph import input_node, toposort
    from lumc.ir.library.reduce import argmax
    from lumc.ir.provenance import arg_scores, rebuilt
    from lumc.ir.symbolic import Resizer
    from lumc.ir.tensor import Tensor
    x = Tensor(input_node("x", (7, 5), dt.f32))
    s = x.mul(x.scalar_like(2.0))
    i = argmax(s, axis=-1, keepdims=False)
    assert arg_scores(i.node) == (s.node, 1, True, False)
    assert arg_scores(s.node) is None and arg_scores(argmax(x.cast(dt.i32), 1).node) is None
    y = input_node("y", (7, 5), dt.f32)        # the same graph over another input, rebuilt
    memo = {}
    for n in toposort([i.node]):
        memo[id(n)] = y if n is x.node else rebuilt(n, [memo[id(m)] for m in n.srcs])
    got = arg_scores(memo[id(i.node)])
    assert got is not None and got[0] is memo[id(s.node)] and got[0] is not s.node
    big = Resizer({7: 11})(i.node)             # 7 is the probe of a range, re-sized to 11
    got = arg_scores(big)
    assert got is not None and got[0].shape == (11, 5) and got[1:] == (1, True, False)


@pytest.mark.parametrize("rank", [1, 2])
def test_a_flattened_torch_argmax_with_keepdim_is_judged_at_near_ties(rank, tmp_path, monkeypatch):
    """``(x @ w).argmax(keepdim=True)`` (no dim: over the flattened scores) lost its scores: the
    index was a reshape of the flat argmax, so the gate judged it exactly and a bf16 plan whose
    only difference is a near-tie fell back to fp32. It is now one argmax over ``[1, .., numel]``
    that keeps keepdim's shape; the value and shape equal eager's at fp32."""
    import torch
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    w, x = _near_tie(m=1)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.from_numpy(w))

        def forward(self, x):
            return (x @ self.w).argmax(keepdim=True)
    m = M().eval()
    xt = torch.from_numpy(x if rank == 2 else x[0])
    want = m(xt)
    assert want.shape == (1,) * rank and int(want.reshape(-1)[0]) == 1
    f = lumc.compile(m, example_inputs=(xt,), budget="15s", device="sim:h200", precision="bf16")
    got = f(xt)
    assert got.shape == want.shape and int(got.reshape(-1)[0]) == 0     # bf16 ties 0 and 1
    r = f.specializations[0].compiled.report_dict()
    assert r["precision"] == "bf16", r.get("warnings")
    assert [v["near_ties"] for v in r["quality"]["exact_outputs"].values()] == [1], r["quality"]
    assert r["eager_check"]["passed"] and r["eager_check"]["near_ties"] == 1
    g = lumc.compile(m, example_inputs=(xt,), budget="15s", device="sim:h200")     # fp32
    assert torch.equal(g(xt), want)


def _cancelling(seed=0):
    """y = x @ W, W's rows 0 and 1 1e-4 apart: for x = e0 - e1 the output is that difference,
    which bf16 weights (2^-9 relative) lose entirely; for N(0, 1) inputs bf16 is within 1%."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    w[1] = w[0] + 1e-4 * rng.standard_normal(64).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "cancel",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
                          [numpy_helper.from_array(w, "W")])
    crafted = np.zeros((4, 64), np.float32)
    crafted[:, 0], crafted[:, 1] = 1.0, -1.0
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), w, crafted


def test_the_gate_runs_on_each_compiles_own_example_inputs(db):
    """The plan key held the example inputs' shapes only: a second bf16 compile given inputs
    that miss the gate reused the first's bf16 plan (its report quoting the first inputs' 0.3%),
    and returned 100% error on the inputs the user gave. Now it gates them and falls back."""
    m, w, crafted = _cancelling()
    drawn = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    first = lumc.compile(m, budget="30s", device="sim:h200", db=db, use_egraph=False,
                         precision="bf16", example_inputs={"x": drawn})
    assert first.report_dict()["precision"] == "bf16"
    cm = lumc.compile(m, budget="30s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16", example_inputs={"x": crafted})
    r = cm.report_dict()
    assert r["precision"] == "fp32" and "reused" not in r["stopped_because"]
    assert any("misses the quality gate" in x for x in r["warnings"])
    ref = crafted.astype(np.float64) @ w.astype(np.float64)
    assert np.abs(cm(crafted) - ref).max() <= 1e-4 * np.abs(ref).max()
    again = lumc.compile(m, budget="30s", device="sim:h200", db=db, use_egraph=False,
                         precision="bf16", example_inputs={"x": crafted.copy()})
    assert "reused" in again.report_dict()["stopped_because"]     # the same inputs: reused
