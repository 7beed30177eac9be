"""``--precision auto`` chooses a reduced precision per contraction only where it buys time."""
from __future__ import annotations

import numpy as np
import pytest

import lumc
from lumc.compiler.runtime.tuning_db import TuningDatabase
from tests.compiler.test_precision import classifier, numpy_reference


def _count_compiles(monkeypatch) -> list:
    """The precision of each ``pipeline._compile_policy`` call of a compile, in order."""
    from lumc.compiler.core import pipeline
    calls = []
    real = pipeline._compile_policy

    def counting(fe, deadline, *a, policy, **k):
        calls.append(policy.precision)
        return real(fe, deadline, *a, policy=policy, **k)
    monkeypatch.setattr(pipeline, "_compile_policy", counting)
    return calls


@pytest.mark.parametrize("m,k,h", [(16, 256, 192), (2048, 512, 512)])
def test_auto_reduces_a_contraction_only_where_it_is_faster(tmp_path, m, k, h):
    """A launch-bound model times the same at fp8, bf16 and fp32 (sim:h200), and auto took fp8
    with bf16 weights: 1000x the error for nothing. It now keeps the fp32 plan, which it compiles
    too, and says so; a model large enough that bf16/fp8 tensor cores win is still reduced."""
    model = classifier(m=m, k=k, h=h)
    cm = lumc.compile(model, budget="60s", device="sim:h200", use_egraph=False,
                      db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto")
    r = cm.report_dict()
    assert r["auto"]["kept"] == ("fp32" if m == 16 else "reduced")
    assert r["auto"]["fp32_time_s"] > 0 and r["auto"]["reduced_time_s"] > 0
    assert r["budget_s"] == 60 and r["compile_s"] > 0.5 * r["stage_seconds"]["search"]
    mm = [kk for kk in r["per_kernel"] if kk["form"] == "matmul"]
    x = np.random.default_rng(5).standard_normal((m, k)).astype(np.float32)
    ref = numpy_reference(model, x)
    err = np.abs(cm(x) - ref).max() / np.abs(ref).max()
    if m == 16:
        assert r["precision"] == "fp32" and r["quality"] is None
        assert r["auto"]["reduced_time_s"] >= 0.99 * r["auto"]["fp32_time_s"]
        assert {kk["precision"] for kk in mm} <= {"tf32x3", "ieee"}, mm
        assert err < 1e-5
        assert any(w.startswith("precision auto: the reduced plan (") and "compiled at fp32" in w
                   for w in r["warnings"]), r["warnings"]
    else:    # the first layer (2048 x 512 x 512) is compute-heavy enough to go below tf32x3
        assert r["precision"] == "auto" and r["quality"]["passed"]
        assert r["best_time_s"] < 0.99 * r["auto"]["fp32_time_s"]
        assert mm[0]["precision"] in ("bf16", "fp8"), mm
        assert 1e-5 < err <= r["tolerance"]


def test_the_fallback_passes_over_a_precision_whose_plan_it_measured():
    """An fp8 (or auto) plan none of whose contractions ran below bf16 is bf16's plan, with the
    weights bf16 stores: compiling bf16 next measured the same figure again (and said it twice).
    The next policy is fp32 then; a plan with an fp8 contraction still tries bf16."""
    from lumc.compiler.core.precision import PrecisionPolicy
    from lumc.compiler.core.precision_gate import fallback_policy

    def down(p, dots, weights="same"):
        d = fallback_policy(PrecisionPolicy(p, weights), {"kernel_precision": dots})
        return d.precision, d.weights
    assert down("fp8", ["bf16", None, "bf16"]) == ("fp32", "same")
    assert down("fp8", ["fp8", "bf16"]) == ("bf16", "same")
    assert down("auto", ["tf32x3", "bf16"]) == ("fp32", "same")
    assert down("auto", ["fp8", "tf32x3"]) == ("bf16", "same")
    assert down("fp8", []) == ("bf16", "same")                # nothing measured: one step
    assert down("bf16", ["bf16"]) == ("fp32", "same")
    assert down("fp16", ["fp16"]) == ("fp32", "same")
    assert down("fp32", ["tf32x3"], "int8") == ("fp32", "same")


def test_auto_that_misses_the_gate_returns_its_fp32_plan_once(tmp_path, monkeypatch):
    """auto over a gate no reduced plan meets falls back to fp32, whose plan it compiled already:
    that plan is returned (not compiled a third time), with the fallback's line."""
    calls = _count_compiles(monkeypatch)
    cm = lumc.compile(classifier(), budget="60s", device="sim:h200", use_egraph=False,
                      db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto",
                      tolerance=1e-9)
    r = cm.report_dict()
    assert r["precision"] == "fp32" and r["auto"]["kept"] == "fp32"
    assert r["auto"]["reduced_time_s"] is None
    assert calls == ["fp32", "auto"], calls
    notes = [w for w in r["warnings"] if w.startswith("precision auto")]
    assert len(notes) == 1 and "misses the quality gate" in notes[0] and \
        "compiled at fp32" in notes[0], r["warnings"]
    x = np.random.default_rng(5).standard_normal((16, 256)).astype(np.float32)
    ref = numpy_reference(classifier(), x)
    assert np.abs(cm(x) - ref).max() / np.abs(ref).max() < 1e-5


def test_an_auto_fallback_line_does_not_call_a_tf32x3_plan_fp32s():
    """auto whose gate raised every contraction to tf32x3 and still missed (its weights and
    activations are stored in bf16) said 'its plan is tf32x3's, and that plan misses the quality
    gate ...; compiled at fp32 instead': fp32's plan is tf32x3's, and it passed."""
    from lumc.compiler.core.precision import PrecisionPolicy
    from lumc.compiler.core.precision_gate import fallback_note
    auto, fp32 = PrecisionPolicy("auto", tolerance=1e-3), PrecisionPolicy("fp32", tolerance=1e-3)
    q = {"reason": "max rel error 0.00556 > tolerance 0.001",
         "kernel_precision": ["tf32x3", "tf32x3", None]}
    line = fallback_note(auto, fp32, q)
    assert "its plan is tf32x3's" not in line, line
    assert line == ("precision auto (weights same): no contraction runs below bf16 (at tf32x3, "
                    "over weights and activations stored in bf16), and that plan misses the "
                    "quality gate (max rel error 0.00556 > tolerance 0.001); compiled at fp32 "
                    "(weights same) instead")




def test_auto_falling_back_through_bf16_still_returns_its_fp32_plan(tmp_path, monkeypatch):
    """An auto plan with an fp8 contraction that misses the gate falls back to bf16 first
    (``fallback_policy``); when bf16 missed too, fp32 was compiled a second time, compared with
    auto's own fp32 plan as 'the reduced plan (..., fallen back to fp32)', and the two fallback
    lines were lost. auto's fp32 plan is returned, with both lines."""
    import dataclasses
    from lumc.compiler.core import pipeline
    real_fb = pipeline.fallback_policy
    monkeypatch.setattr(pipeline, "fallback_policy", lambda p, q: (
        dataclasses.replace(p, precision="bf16") if p.precision == "auto" else real_fb(p, q)))
    calls = _count_compiles(monkeypatch)
    cm = lumc.compile(classifier(), budget="30s", device="sim:h200", use_egraph=False,
                      db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto",
                      tolerance=1e-9)
    r = cm.report_dict()
    assert calls == ["fp32", "auto", "bf16"], calls
    assert r["precision"] == "fp32" and r["auto"]["kept"] == "fp32"
    assert r["auto"]["reduced_time_s"] is None, r["auto"]
    notes = [w for w in r["warnings"] if "misses the quality gate" in w]
    assert [n.split()[1] for n in notes] == ["auto", "bf16"], r["warnings"]
    assert not any("is not 1% faster" in w for w in r["warnings"]), r["warnings"]


def test_auto_keeps_its_fp32_plan_when_the_reduced_compile_fails(tmp_path, monkeypatch):
    """A small budget: the reduced compile timed nothing and its untimed fallback's fp8 kernel
    failed its check past the deadline (a LumcError, 'give a larger budget'), and the whole
    compile failed with auto's fp32 plan compiled and checked. That plan is returned, with a
    note; an InputError (the user's options) still fails the compile."""
    from lumc.compiler.core import pipeline
    from lumc.ir.errors import InputError, LumcError
    real = pipeline._compile_policy
    err = [LumcError("m: nothing was measured within the budget; give a larger budget")]

    def failing(fe, deadline, *a, policy, **k):
        if policy.precision == "auto":
            raise err[0]
        return real(fe, deadline, *a, policy=policy, **k)
    monkeypatch.setattr(pipeline, "_compile_policy", failing)
    cm = lumc.compile(classifier(), budget="20s", device="sim:h200", use_egraph=False,
                      db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto")
    r = cm.report_dict()
    assert r["precision"] == "fp32" and r["auto"]["kept"] == "fp32"
    assert any(w.startswith("precision auto: the reduced plan failed (m: nothing was measured")
               for w in r["warnings"]), r["warnings"]
    err[0] = InputError("bad option")
    with pytest.raises(InputError, match="bad option"):
        lumc.compile(classifier(), budget="20s", device="sim:h200", use_egraph=False,
                     db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto", reuse_plan=False)


def test_the_kept_fp32_plans_line_names_its_quantized_weights():
    """--precision auto --weights int8 kept the fp32 plan with int8 weights (max rel error 7e-3)
    and said 'compiled at fp32 accuracy'."""
    from types import SimpleNamespace
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.precision_gate import auto_or_fp32

    def plan(precision, weights, t):
        r = {"precision": precision, "weights": weights, "best_time_s": t, "warnings": []}
        return SimpleNamespace(_report=r, report_dict=lambda: r, simulated=True)
    for weights, tail in (("int8", "compiled at fp32 (weights int8)"),
                          ("same", "compiled at fp32 accuracy, with the model's weights")):
        kept = auto_or_fp32(plan("auto", weights, 1e-5), plan("fp32", weights, 1e-5),
                            Deadline(10.0))
        assert kept._report["warnings"][-1].endswith(tail), kept._report["warnings"]


def test_a_kept_fp32_plan_cut_by_its_share_does_not_blame_the_whole_budget():
    """auto fell back to its fp32 plan, whose search ran out of its 40% share: the summary said
    'compiled ... in 5.01 s of 12 s: budget', the budget shown half unspent."""
    from types import SimpleNamespace
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.precision_gate import auto_or_fp32
    r = {"precision": "fp32", "weights": "same", "best_time_s": 1e-5, "warnings": [],
         "stopped_because": "budget"}
    exact = SimpleNamespace(_report=r, report_dict=lambda: r, simulated=True)
    kept = auto_or_fp32(exact, exact, Deadline(12.0))
    why = kept._report["stopped_because"]
    assert why.startswith("budget") and "fp32 plan's share" in why, why


def test_auto_over_a_size_range_says_it_compared_no_fp32_plan(tmp_path):
    """Over a range's buckets auto stores bf16 weights once for all and compiles no fp32 plan to
    compare with: a launch-bound model kept bf16 weights (5e-3 off) for no time, and nothing
    said that the comparison the README describes was not made."""
    model = classifier()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "B"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "B"
    vm = lumc.compile(model, budget="30s", device="sim:h200", shapes={"B": "1..64"},
                      db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto")
    r = vm.report_dict()
    assert any(w.startswith("precision auto over size ranges: no fp32 plan") for w in
               r["warnings"]), r["warnings"]


def test_auto_refuses_a_max_kl_with_nothing_to_judge_before_its_fp32_plan(tmp_path, monkeypatch):
    """--max-kl on a model with no distribution output is refused before the search; at auto it
    was refused only after the fp32 plan (40% of the budget) was compiled, which never judges."""
    from onnx import helper
    from lumc.ir.errors import InputError
    calls = _count_compiles(monkeypatch)
    model = classifier()
    model.graph.node[-1].CopyFrom(helper.make_node("Relu", ["zb"], ["y"]))   # scores, no softmax
    with pytest.raises(InputError, match="max_kl gates"):
        lumc.compile(model, budget="20s", device="sim:h200", use_egraph=False,
                     db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto", max_kl=1e-3)
    assert calls == [], calls


def test_a_reduced_plan_kept_over_an_untimed_fp32_plan_is_not_reused_at_a_larger_budget(
        tmp_path):
    """auto at a small budget: its fp32 plan's share timed nothing and the reduced plan was kept
    by default; a recompile with a budget 6x larger reused that plan (its own search had
    converged), the comparison never made. Such a plan is reused at its own budget only."""
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.plan_reuse import _reuse_plan, stamp_plan_key
    cm = lumc.compile(classifier(), budget="20s", device="sim:h200", use_egraph=False,
                      db=TuningDatabase(tmp_path / "t.sqlite"))
    cm._report.update(budget_s=4.0, stopped_because="converged", precision="auto",
                      auto={"kept": "reduced", "fp32_time_s": None,
                            "fp32_stopped_because": "budget (auto's fp32 plan's share)"})
    path = tmp_path / "k.lumc"
    stamp_plan_key(cm, path)
    cm.save(path)
    assert _reuse_plan(path, 30.0, Deadline(30.0)) is None
    assert _reuse_plan(path, 4.0, Deadline(4.0)) is not None


def test_a_reduced_plan_kept_over_an_untimed_fp32_plan_says_so():
    """auto's fp32 plan untimed within its share: the reduced plan (bf16 weights) was kept with
    no line saying that nothing compared it ('of 1 contraction, 1 at tf32x3' only)."""
    from types import SimpleNamespace
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.precision_gate import auto_or_fp32

    def plan(precision, t):
        r = {"precision": precision, "weights": "same", "best_time_s": t, "warnings": []}
        return SimpleNamespace(_report=r, report_dict=lambda: r, simulated=True)
    kept = auto_or_fp32(plan("auto", 1e-5), plan("fp32", None), Deadline(5.0))
    assert kept._report["auto"]["kept"] == "reduced"
    assert any("fp32 plan was not timed" in w for w in kept._report["warnings"])


def test_a_reduced_plan_kept_over_an_fp32_plan_its_share_cut_short_says_so():
    """argmax.onnx at 10 s: auto's fp32 plan, its search cut by its 40% share after 2 configs,
    timed 14.5 us (10.5 us at fp32 alone); the reduced plan at 10.45 us was kept as '1% faster'
    with nothing said about the comparison."""
    from types import SimpleNamespace
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.precision_gate import auto_or_fp32

    def plan(precision, t, why):
        r = {"precision": precision, "weights": "same", "best_time_s": t, "warnings": [],
             "stopped_because": why}
        return SimpleNamespace(_report=r, report_dict=lambda: r, simulated=True)
    kept = auto_or_fp32(plan("auto", 10.45e-6, "converged"), plan("fp32", 14.5e-6, "budget"),
                        Deadline(10.0))
    assert kept._report["auto"]["kept"] == "reduced"
    assert any("fp32 plan's search ran out of its share" in w and "14.5 us" in w
               for w in kept._report["warnings"]), kept._report["warnings"]


def test_a_whole_budget_spent_is_not_blamed_on_the_fp32_plans_share():
    """At --budget 1s both plans ran out of time: 'budget (auto's fp32 plan's share ...)' said
    only the share ran out."""
    from types import SimpleNamespace
    from lumc.compiler.core.budget import Deadline
    r = {"precision": "fp32", "weights": "same", "best_time_s": None, "warnings": [],
         "stopped_because": "budget"}
    exact = SimpleNamespace(_report=r, report_dict=lambda: r, simulated=True)
    from lumc.compiler.core.precision_gate import auto_or_fp32
    t = [0.0]
    deadline = Deadline(1.0, clock=lambda: t[0])
    t[0] = 2.0                      # both plans ran past the whole budget
    kept = auto_or_fp32(exact, exact, deadline)
    assert kept._report["stopped_because"] == "budget"


def test_an_fp32_search_its_share_cut_short_goes_on_with_the_budget_left(tmp_path, monkeypatch):
    """auto's fp32 plan searched in 40% of the budget, cut short (argmax at 10 s: 14.5 us after
    2 configs, 10.5 us alone), lost to a reduced plan 0.4% faster than fp32 searched whole. When
    the reduced compile leaves budget, the fp32 search goes on and the comparison is against
    what it reaches. Forced here: the first fp32 plan reports a cut-short search at twice its
    time."""
    from lumc.compiler.core import pipeline
    calls = []
    real = pipeline._compile_policy

    def counting(fe, deadline, *a, policy, **k):
        calls.append(policy.precision)
        cm = real(fe, deadline, *a, policy=policy, **k)
        if calls == ["fp32"]:
            cm._report.update(stopped_because="budget", best_time_s=2 * cm._report["best_time_s"])
        return cm
    monkeypatch.setattr(pipeline, "_compile_policy", counting)
    cm = lumc.compile(classifier(), budget="60s", device="sim:h200", use_egraph=False,
                      db=TuningDatabase(tmp_path / "t.sqlite"), precision="auto")
    r = cm.report_dict()
    assert calls == ["fp32", "auto", "fp32"], calls
    assert r["auto"]["kept"] == "fp32" and r["auto"]["fp32_stopped_because"].startswith("converged")
    assert r["auto"]["fp32_time_s"] <= 1.01 * r["auto"]["reduced_time_s"]
    assert not any("searched less" in w or "ran out of its share" in w for w in r["warnings"])
