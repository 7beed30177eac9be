"""The precision policy end to end on small ONNX models (sim:h200): weights stored as asked,
quality measured against the fp32 model and float64, the gate, and the report fields."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.precision import (PrecisionPolicy, contraction_reduced_axes,
                                          measure_quality, output_quality, store_weights)
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir import dtypes as dt
from lumc.ir.errors import InputError
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor


def classifier(m=16, k=256, h=192, n=10, seed=0):
    """x[m, k] -> relu(x @ w1 + b1) @ w2 + b2 -> softmax: class probabilities."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((k, h)) / np.sqrt(k)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal((h,)).astype(np.float32) * 0.1, "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((h, n)) * 2 / np.sqrt(h)).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(rng.standard_normal((n,)).astype(np.float32) * 0.1, "b2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"]),
             helper.make_node("Add", ["z", "b2"], ["zb"]),
             helper.make_node("Softmax", ["zb"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [w1, b1, w2, b2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def numpy_reference(model, x):
    init = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    h = np.maximum(x.astype(np.float64) @ init["w1"] + init["b1"], 0)
    z = h @ init["w2"] + init["b2"]
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture()
def db(tmp_path):
    return TuningDatabase(tmp_path / "tuning.sqlite")


@pytest.mark.parametrize("precision,weights", [("bf16", "same"), ("fp8", "same"), ("fp32", "int8")])
def test_reduced_precision_compile_measures_its_quality(precision, weights, db):
    model = classifier()
    cm = lumc.compile(model, budget="40s", device="sim:h200", db=db, use_egraph=False,
                      precision=precision, weights=weights)
    r = cm.report_dict()
    assert r["precision"] == precision and r["weights"] == weights
    q = r["quality"]
    assert q is not None and q["passed"], q
    out = q["outputs"]["y"]
    assert {"max_abs", "max_rel", "cosine", "kl_mean", "kl_max", "top1"} <= set(out)
    # the report's figures are the compiled program's own, against float64
    x = np.random.default_rng(5).standard_normal((16, 256)).astype(np.float32)
    got = cm(x)
    ref = numpy_reference(model, x)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= r["tolerance"]
    assert err > 1e-6                       # reduced precision really ran (fp32 is ~1e-7 here)
    kl = np.sum(ref * (np.log(ref) - np.log(np.clip(got, 1e-30, None))), -1).mean()
    assert kl < 0.05
    contractions = [k for k in r["per_kernel"] if k["form"] == "matmul"]
    assert contractions and all("precision" in k for k in r["per_kernel"])
    if precision == "bf16":
        assert all(k["precision"] == "bf16" for k in contractions)
        assert r["weight_storage"]["bytes_after"] * 2 == r["weight_storage"]["bytes_before"]
    if weights == "int8":
        assert r["weight_storage"]["int8"] == 2
    if precision in ("bf16", "fp8"):
        # each contraction's check ran its own precision's branch of the source in the CPU
        # interpreter (judged against the emulation), not the fp32 branch
        rows = db._conn.execute("SELECT config, note FROM timings WHERE config = ?",
                                (f"numerics-check:{precision}",)).fetchall()
        assert rows and all(f"PRECISION={precision}" in note and note.startswith("checked")
                            for _, note in rows), rows


def test_fp32_default_is_tensor_core_split_tf32(db):
    cm = lumc.compile(classifier(), budget="30s", device="sim:h200", db=db, use_egraph=False)
    r = cm.report_dict()
    assert r["precision"] == "fp32" and r["quality"] is None
    precs = {k["precision"] for k in r["per_kernel"] if k["form"] == "matmul"}
    assert precs <= {"tf32x3", "ieee"} and precs
    assert r["max_rel_error"] <= 1e-4


def test_gate_that_cannot_be_met_falls_back_and_says_so(db):
    cm = lumc.compile(classifier(), budget="60s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16", tolerance=1e-9)
    r = cm.report_dict()
    assert r["precision"] == "fp32"
    assert any("misses the quality gate" in w for w in r["warnings"])


def test_int8_weights_over_the_gate_fall_back_to_the_model_weights(db):
    cm = lumc.compile(classifier(), budget="60s", device="sim:h200", db=db, use_egraph=False,
                      weights="int8", tolerance=1e-9)
    r = cm.report_dict()
    assert r["precision"] == "fp32" and r["weights"] == "same"
    # the stored weights alone miss the gate: caught before the e-graph and the search run
    assert any("weights int8 miss the quality gate on their own" in w for w in r["warnings"])
    assert r["quality"] is None            # an exact fp32 compile now


def test_bad_policy_is_one_line():
    with pytest.raises(InputError, match="^unknown precision='"):      # as the call spells it
        PrecisionPolicy("fp4")
    with pytest.raises(InputError, match="^unknown weights='"):
        PrecisionPolicy("fp32", "fp4")
    with pytest.raises(InputError, match="max_kl"):
        PrecisionPolicy("bf16", max_kl=-1.0)


def test_int8_weights_dequantize_bit_exactly_per_output_channel():
    rng = np.random.default_rng(3)
    x = Tensor(input_node("x", (5, 64), dt.f32))
    w_val = rng.standard_normal((64, 48)).astype(np.float32) * np.linspace(0.1, 3, 48, dtype=np.float32)
    w = Tensor.const(w_val)
    y = x @ w
    g = Graph({"x": x.node}, {"y": y.node})
    assert contraction_reduced_axes(w.node, g.users()) == (0,)
    q8, stats = store_weights(g, PrecisionPolicy("fp32", "int8"))
    assert stats["int8"] == 1
    # the numpy dequantizer: per column scale amax/127, round half to even, clip
    scale = np.abs(w_val).max(axis=0, keepdims=True) / np.float32(127)
    q = np.clip(np.rint(w_val / scale), -127, 127).astype(np.int8)
    deq = q.astype(np.float32) * scale.astype(np.float32)
    xv = rng.standard_normal((5, 64)).astype(np.float32)
    got = ReferenceExecutor(q8)({"x": xv})["y"]
    np.testing.assert_array_equal(got, ReferenceExecutor(
        Graph({"x": x.node}, {"y": (x @ Tensor.const(deq)).node}))({"x": xv})["y"])


def test_quality_figures_against_float64():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    q = np.array([[0.6, 0.3, 0.1], [0.2, 0.1, 0.7]])
    f = output_quality(q, p)
    kl = (p * np.log(p / q)).sum(-1)
    assert f["kl_mean"] == pytest.approx(kl.mean(), rel=1e-12)
    assert f["kl_max"] == pytest.approx(kl.max(), rel=1e-12)
    assert f["top1"] == 1.0
    assert f["cosine"] == pytest.approx(float(p.ravel() @ q.ravel() / np.linalg.norm(p) / np.linalg.norm(q)))
    logits = output_quality(np.array([[2.0, 0.0]]), np.array([[0.0, 2.0]]), logits=True)
    assert logits["top1"] == 0.0 and logits["kl_mean"] > 1.0
    assert "kl_mean" not in output_quality(np.ones((2, 3)), np.ones((2, 3)))   # not probabilities
    # a rounded softmax summing to a hair over 1: its KL from the reference is 0, not negative
    near = output_quality(p * (1 + 1e-6), p)
    assert near["kl_mean"] == 0.0 and near["kl_max"] == 0.0, near


def test_quality_figures_of_non_finite_and_empty_outputs():
    """Matching inf/NaN outputs made the report's max abs error NaN (inf - inf) with a numpy
    warning; a zero-size logits output had a mean KL of no rows, NaN, which failed --max-kl; a
    logit row holding +inf (softmax NaN in the fp32 model too) made the mean KL NaN."""
    ref = np.array([[np.inf, 1.0, -np.inf, np.nan], [2.0, -3.0, 0.5, 4.0]])
    got = ref + np.array([[0.0, 0.25, 0.0, 0.0], [0.0, 0.0, -0.5, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = output_quality(got, ref)
    fin = np.isfinite(ref)
    assert f["max_abs"] == np.abs(got[fin] - ref[fin]).max() == 0.5
    assert f["max_rel"] == 0.5 / 4.0
    moved = got.copy()
    moved[0, 0] = 1.0                     # an inf the plan lost is infinitely off, both ways
    assert output_quality(moved, ref)["max_abs"] == output_quality(moved, ref)["max_rel"] == np.inf
    # a row of logits with +inf (no distribution in fp32 either) is left out of the KL
    lg = np.array([[np.inf, 0.0, 1.0], [0.0, 1.0, 2.0]])
    lq = lg + np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.1]])
    f = output_quality(lq, lg, logits=True)
    e, eq = np.exp(lg[1] - 2.0), np.exp(lq[1] - 2.1)
    pr, qr = e / e.sum(), eq / eq.sum()
    assert f["kl_mean"] == pytest.approx((pr * np.log(pr / qr)).sum(), rel=1e-9)
    assert f["max_abs"] == pytest.approx(0.1)
    # a zero-size output has no rows to judge: no KL, and --max-kl passes it
    empty = np.zeros((0, 4), np.float32)
    assert "kl_mean" not in output_quality(empty, empty, logits=True)
    pol = PrecisionPolicy("bf16", max_kl=1e-6, logits=("y",))
    q = measure_quality({"y": empty}, {"y": empty}, pol, ["y"])
    assert q["passed"] and q["kl_mean"] is None, q


def test_a_distribution_with_a_nan_row_is_still_judged_by_kl():
    """A softmax output with one NaN row (a NaN input row) was not a distribution at all: its KL
    and top-1 were silently left out of the gate, and --max-kl was refused as having nothing to
    judge. Its finite rows are judged now."""
    rng = np.random.default_rng(2)
    z = rng.standard_normal((5, 6))
    ref = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    zq = z + 0.05 * rng.standard_normal(z.shape)
    got = np.exp(zq) / np.exp(zq).sum(-1, keepdims=True)
    ref[2], got[2] = np.nan, np.nan
    pol = PrecisionPolicy("bf16", max_kl=1e-6)
    pol.check_max_kl({"y": ref}, ["y"])                 # a distribution: not refused
    q = measure_quality({"y": got}, {"y": ref}, pol, ["y"])
    fin = [0, 1, 3, 4]
    kl = (ref[fin] * np.log(ref[fin] / got[fin])).sum(-1)
    assert q["kl_mean"] == pytest.approx(kl.mean(), rel=1e-9)
    assert q["outputs"]["y"]["top1"] == np.mean(ref[fin].argmax(-1) == got[fin].argmax(-1))
    assert not q["passed"] and q["reason"].startswith("mean KL"), q
    # a NaN row where the fp32 model has none is still a mismatch (max rel error inf)
    bad = got.copy()
    bad[2] = ref[1]
    assert measure_quality({"y": got}, {"y": np.where(np.isnan(ref), bad, ref)}, pol,
                           ["y"])["max_rel"] == np.inf


def test_the_cosine_stated_as_a_lower_bound_is_rounded_down():
    """The quality line printed the smallest cosine rounded to 6 decimals after 'cosine >=': a
    plan 1.4e-3 off (cosine 0.9999995) read 'cosine >= 1.000000'. It is rounded down now."""
    from lumc.compiler.runtime.report_text import quality_line
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((64, 32))
    got = ref * (1 + 1e-3 * rng.standard_normal(ref.shape))
    pol = PrecisionPolicy("tf32")
    q = measure_quality({"y": got}, {"y": ref}, pol, ["y"])
    cos = float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref))
    assert 0.999999 < cos < 1.0 and q["min_cosine"] == pytest.approx(cos, abs=1e-15)
    line = quality_line({"quality": q, "precision": "tf32", "weights": "same"})
    shown = float(line.split("cosine >= ")[1].split(",")[0])
    assert shown <= cos < shown + 1e-6 and "cosine >= 0.999999" in line, line
    same = measure_quality({"y": ref}, {"y": ref}, pol, ["y"])
    assert "cosine >= 1.000000" in quality_line({"quality": same, "precision": "tf32",
                                                 "weights": "same"})


def test_torch_module_and_backend_take_the_policy(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 10),
                            torch.nn.Softmax(-1)).eval()
    x = torch.randn(8, 64)
    f = lumc.compile(m, budget="30s", example_inputs=(x,), device="sim:h200", precision="bf16")
    r = f.specializations[0].compiled.report_dict()
    assert r["precision"] == "bf16" and r["quality"]["passed"]
    with torch.no_grad():
        want = m.double()(x.double()).numpy()          # float64 reference
    m.float()
    got = f(x).numpy()
    assert 1e-6 < np.abs(got - want).max() <= r["tolerance"]
    g = torch.compile(m, backend="lumc", options={"budget": "30s", "device": "sim:h200",
                                                  "precision": "bf16"})
    np.testing.assert_allclose(g(x).detach().numpy(), got, rtol=0, atol=1e-6)   # as eager: grad
    with pytest.raises(Exception, match="precision="):
        torch.compile(m, backend="lumc", options={"precision": "int4"})(x)


def test_backend_refuses_a_weights_format_it_cannot_store(tmp_path, monkeypatch):
    # Dynamo lifts the parameters to inputs: options={"weights": "nvfp4"} compiled an fp32 plan
    # whose report said 'no weight of the model is read only by matrix products'
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(8, 32)
    with pytest.raises(Exception, match=r"options\['weights'\]='nvfp4' cannot apply under torch"):
        torch.compile(m, backend="lumc", options={"budget": "20s", "weights": "nvfp4"})(x)
    torch._dynamo.reset()
    g = torch.compile(m, backend="lumc", options={"budget": "20s", "weights": "same"})
    with torch.no_grad():
        want = m.double()(x.double()).numpy()
    m.float()
    np.testing.assert_allclose(g(x).detach().numpy(), want, rtol=0, atol=1e-5)


def test_backend_says_when_the_gate_compiled_another_precision(tmp_path, monkeypatch):
    """torch.compile's backend compiles silently and its report is out of reach: options=
    {'precision': 'bf16', 'tolerance': 1e-9} ran the graph at fp32 (the gate refused bf16) and said
    nothing. It warns with the compile's fallback line now, and the result is fp32's."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        want = m.double()(x.double()).numpy()
    m.float()
    g = torch.compile(m, backend="lumc", options={"budget": "20s", "device": "sim:h200",
                                                  "precision": "bf16", "tolerance": 1e-9})
    with pytest.warns(UserWarning, match=r"^lumc: torch.compile graph: precision bf16 \(weights "
                                         r"same\) misses the quality gate \(max rel error .* > "
                                         r"tolerance 1e-09\); compiled at fp32"):
        got = g(x).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    torch._dynamo.reset()


def test_a_precision_note_of_one_contraction_the_gate_raised():
    """The note of an fp8 plan whose one contraction the gate raised to bf16 read 'of 1
    contractions, 1 at bf16; 1 raised to pass the quality gate; the others were faster there'
    (there were no others), and fp32 with --weights 'the 1 contraction compute'."""
    from lumc.compiler.core.precision_gate import precision_note
    assert precision_note(PrecisionPolicy("fp8"), {"kernel_precision": [None, "bf16"],
                                                   "raised_kernels": 1}) == \
        "precision fp8: of 1 contraction, 1 at bf16; 1 raised to pass the quality gate"
    assert precision_note(PrecisionPolicy("fp32", "int8"), {"kernel_precision": ["tf32x3"]}) == (
        "weights int8 at precision fp32: only the weights' storage is reduced (dequantized in "
        "each contraction's prologue); the 1 contraction computes at fp32 accuracy (1 at tf32x3)")


def test_the_notes_say_which_precision_the_contractions_really_run_at(db):
    """--precision fp8 whose plan runs some contractions at bf16 (faster there, or raised by the
    gate) said only 'precision fp8'; the report's notes now give the mix (and the artifact's label
    stays the policy, with its kernels' precisions beside it)."""
    from lumc.compiler.core.precision_gate import precision_note
    pol = PrecisionPolicy("fp8")
    assert precision_note(pol, None) is None
    assert precision_note(pol, {"kernel_precision": ["fp8", None, "fp8"]}) is None
    note = precision_note(pol, {"kernel_precision": ["bf16", None, "fp8", "bf16"],
                                "raised_kernels": 1})
    assert note == ("precision fp8: of 3 contractions, 1 at fp8, 2 at bf16; 1 raised to pass the "
                    "quality gate; the others were faster there, or no config of the lower "
                    "precision applies")
    assert precision_note(PrecisionPolicy("auto"), {"kernel_precision": ["fp8", "fp8"]}) == \
        "precision auto: of 2 contractions, 2 at fp8"
    # wired into the compile: a note exactly when a contraction is not at fp8
    cm = lumc.compile(classifier(), budget="60s", device="sim:h200", db=db, use_egraph=False,
                      precision="fp8", max_kl=1e-9, logits=("y",))
    r = cm.report_dict()
    kp = [p for p in r["quality"]["kernel_precision"] if p is not None] if r["quality"] else []
    notes = [w for w in r["warnings"] if w.startswith("precision fp8: of ")]
    if r["precision"] == "fp8":
        assert bool(notes) == (set(kp) != {"fp8"}), (kp, r["warnings"])
    else:          # the gate could not be met at fp8 even raised: the fallback is said instead
        assert any("misses the quality gate" in w for w in r["warnings"])
        import re       # each gate figure is said once (an fp8 plan all at bf16 is bf16's plan)
        figures = re.findall(r"\((?:mean KL|max rel error) [^)]*\)", " ".join(r["warnings"]))
        assert len(figures) == len(set(figures)), r["warnings"]


def test_a_fallback_from_an_fp8_plan_with_no_fp8_contraction_says_so():
    """--precision fp8 whose plan ran every contraction at bf16 missed the gate, then bf16's plan
    missed it with the same figure: 'fp8 misses (mean KL 0.000122) ... compiled at bf16 instead',
    'bf16 misses (mean KL 0.000122) ...', which read as two measurements. The fp8 line now says its
    plan was bf16's; so does an auto plan that chose nothing below bf16 (it said 'precision auto
    misses ...; compiled at bf16 instead' before bf16's line repeated the figure)."""
    from lumc.compiler.core.precision_gate import fallback_note
    fp8, bf16, fp32 = (PrecisionPolicy(p, max_kl=1e-6) for p in ("fp8", "bf16", "fp32"))
    q = {"reason": "mean KL 0.000122 > --max-kl 1e-06", "kernel_precision": ["bf16", None, "bf16"]}
    assert fallback_note(fp8, bf16, q) == (
        "precision fp8 (weights same): no contraction runs at fp8 (its plan is bf16's), and that "
        "plan misses the quality gate (mean KL 0.000122 > --max-kl 1e-06); compiled at bf16 "
        "(weights same) instead")
    assert fallback_note(bf16, fp32, q) == (
        "precision bf16 (weights same) misses the quality gate (mean KL 0.000122 > --max-kl "
        "1e-06); compiled at fp32 (weights same) instead")
    # an fp8 plan that did run fp8 contractions: the plain line
    assert fallback_note(fp8, bf16, dict(q, kernel_precision=["fp8", "bf16"])) == (
        "precision fp8 (weights same) misses the quality gate (mean KL 0.000122 > --max-kl "
        "1e-06); compiled at bf16 (weights same) instead")
    # auto whose plan is all bf16 (the next step measures that plan again), and one with fp8
    auto = PrecisionPolicy("auto", max_kl=1e-6)
    assert fallback_note(auto, bf16, q) == (
        "precision auto (weights same): its plan is bf16's, and that plan misses the quality gate "
        "(mean KL 0.000122 > --max-kl 1e-06); compiled at bf16 (weights same) instead")
    assert fallback_note(auto, bf16, dict(q, kernel_precision=["fp8", "bf16"])).startswith(
        "precision auto (weights same) misses the quality gate")


def test_weights_only_note_and_tolerance_at_fp32():
    """--weights int8 at fp32 said 'precision fp32: of 2 contractions, 2 at tf32x3; the others
    were faster there, or no config of the lower precision applies' (there is no lower
    precision: tf32x3 is fp32's own); --tolerance at fp32 with the model's weights was accepted
    and did nothing, while --max-kl and --logits there are refused."""
    from lumc.compiler.core.precision_gate import precision_note
    note = precision_note(PrecisionPolicy("fp32", "int8"),
                          {"kernel_precision": ["tf32x3", None, "tf32x3"]})
    assert note == ("weights int8 at precision fp32: only the weights' storage is reduced "
                    "(dequantized in each contraction's prologue); the 2 contractions compute at "
                    "fp32 accuracy (2 at tf32x3)")
    with pytest.raises(InputError, match=r"^tolerance gates a reduced precision"):
        PrecisionPolicy.from_user("fp32", tolerance=0.0)
    assert PrecisionPolicy.from_user("fp32", "int8", tolerance=0.0).rtol == 0.0
    assert PrecisionPolicy.from_user("bf16", tolerance=0.0).rtol == 0.0
    with pytest.raises(InputError, match="tolerance"):
        lumc.compile(classifier(), budget="10s", device="sim:h200", tolerance=1e-3)


def _wide_weight_model():
    """x[8, 64] @ W[64, 32] with weights ~1e5 (fp16's largest finite value is 65504)."""
    w = (np.random.default_rng(0).standard_normal((64, 32)) * 1e5).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
                          [numpy_helper.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), w


def test_fp16_weights_beyond_range_store_as_inf_without_a_warning(db):
    model, w = _wide_weight_model()
    x = Tensor(input_node("x", (8, 64), dt.f32))
    graph = Graph({"x": x.node}, {"y": (x @ Tensor.const(w)).node})
    with warnings.catch_warnings():
        warnings.simplefilter("error")    # numpy's "overflow encountered in cast" leaked here
        stored, stats = store_weights(graph, PrecisionPolicy("fp16"))
        assert stats["converted"] == 1
        const = next(n for n in stored.nodes() if n.op == "Constant" and n.dtype == dt.f16)
        with np.errstate(over="ignore"):
            want = w.astype(np.float16)
        np.testing.assert_array_equal(const.arg.value, want)
        assert np.isinf(const.arg.value).any()
        # the whole compile: the gate refuses the fp16 weights and says so, nothing on stderr
        cm = lumc.compile(model, budget="30s", device="sim:h200", db=db, use_egraph=False,
                          precision="fp16")
    r = cm.report_dict()
    assert r["precision"] == "fp32"
    assert any("misses the quality gate" in m for m in r["warnings"])


@pytest.mark.parametrize("policy", ["bf16", "fp16", "auto"])
def test_vectors_stay_fp32_under_a_half_policy(policy):
    """A norm's scale and shift and a bias keep fp32 (as under autocast): their bytes are nothing,
    and a cast of them kept the LayerNorm out of the next matmul's prologue (an extra kernel that
    made bf16 slower than fp32 on a small block)."""
    from lumc.ir.library.norm import layer_norm
    rng = np.random.default_rng(0)
    x = Tensor(input_node("x", (8, 64), dt.f32))
    g, b = (Tensor.const(rng.standard_normal(64).astype(np.float32)) for _ in range(2))
    w = Tensor.const(rng.standard_normal((64, 32)).astype(np.float32))
    bias = Tensor.const(rng.standard_normal((1, 32)).astype(np.float32))
    y = layer_norm(x, g, b)[0] @ w + bias
    stored, stats = store_weights(Graph({"x": x.node}, {"y": y.node}), PrecisionPolicy(policy))
    assert stats["converted"] == 1
    consts = [n for n in stored.nodes() if n.op == "Constant" and n.numel >= 32]
    assert sorted((n.shape, n.dtype.name) for n in consts) == sorted(
        [((64,), "f32"), ((64,), "f32"), ((1, 32), "f32"),
         ((64, 32), "f16" if policy == "fp16" else "bf16")])


def test_max_kl_with_no_distribution_to_judge_is_refused_before_the_search(tmp_path, monkeypatch):
    """``max_kl`` (``--max-kl``) at bf16 on a model none of whose outputs is a distribution, with no
    ``logits=`` naming one, was silently ignored (bf16, ``kl_mean`` None, no note). Now one line,
    raised before the e-graph runs: static and size-range compiles. A softmax output is judged."""
    torch = pytest.importorskip("torch")
    from lumc.compiler.core import pipeline
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    seq = torch.export.Dim("seq", min=1, max=64)

    def no_search(*a, **k):
        raise AssertionError("the e-graph ran before the refusal")

    with monkeypatch.context() as mp:
        mp.setattr(pipeline, "stage_candidates", no_search)
        for args, dyn in (((torch.randn(8, 64),), None), ((torch.randn(2, 16, 64),), ({1: seq},))):
            with pytest.raises(InputError, match="no output of the model is a distribution") as e:
                lumc.compile(m, example_inputs=args, dynamic_shapes=dyn, budget="20s",
                             device="sim:h200", precision="bf16", max_kl=1e-12)
            assert "\n" not in str(e.value) and "logits='NAME'" in str(e.value)
    # a distribution output: the KL gate measures it, against float64 eager
    sm = torch.nn.Sequential(m, torch.nn.Softmax(-1)).eval()
    x = torch.randn(8, 64)
    f = lumc.compile(sm, example_inputs=(x,), budget="10s", device="sim:h200", precision="bf16",
                     max_kl=1e-2)
    q = f.specializations[0].compiled.report_dict()["quality"]
    assert q["passed"] and q["kl_mean"] is not None and 0 < q["kl_mean"] <= 1e-2
    with torch.no_grad():
        want = sm.double()(x.double()).numpy()
    sm.float()
    got = f(x).numpy().astype(np.float64)
    kl = (want * np.log(want / np.clip(got, 1e-30, None))).sum(-1).mean()
    assert kl <= 1e-2 and np.abs(got - want).max() <= q["tolerance"]


def test_reports_say_the_precision_the_plans_run_at(tmp_path, monkeypatch):
    """``f.report()`` of an fp16 compile that fell back to fp32 read like an fp32 compile (the
    fallback only in ``report_dict()['warnings']``); a bf16 range compile's report dropped every
    bucket's precision, quality, weight storage and warnings. Both say them now, in the compile
    summary's words (``lumc.compiler.runtime.report_text``)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).eval()
    with torch.no_grad():
        m[0].weight.mul_(1e6)                   # > 65504: fp16 weights would be inf
    x = torch.randn(8, 64)
    f = lumc.compile(m, example_inputs=(x,), budget="20s", device="sim:h200", precision="fp16")
    txt = f.report()
    assert "precision fp32 (weights same): no reduced precision" in txt, txt
    assert "note: precision fp16 (weights same) misses the quality gate" in txt, txt
    assert "compiled at fp32 (weights same) instead" in txt, txt
    with torch.no_grad():
        want = m.double()(x.double()).numpy()
    m.float()
    got = f(x).numpy()
    assert np.isfinite(got).all() and np.abs(got - want).max() / np.abs(want).max() < 1e-5

    m2 = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).eval()
    m2_64 = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64)).double().eval()
    m2_64.load_state_dict(m2.state_dict())
    seq = torch.export.Dim("seq", min=1, max=64)
    g = lumc.compile(m2, example_inputs=(torch.randn(2, 16, 64),), dynamic_shapes=({1: seq},),
                     budget="20s", device="sim:h200", precision="bf16")
    rd = g.report_dict()
    assert len(rd["variants"]) > 1
    for v in rd["variants"]:
        q = v["quality"]
        assert v["precision"] == "bf16" and v["weights"] == "same", v
        assert q["passed"] and 1e-5 < q["max_rel"] <= v["tolerance"] == q["tolerance"], q
        assert isinstance(v["weight_storage"], dict) and isinstance(v["warnings"], list)
        n = v["representative"]["seq"]
        xx = torch.randn(2, n, 64)
        with torch.no_grad():
            want = m2_64(xx.double()).numpy()
        err = np.abs(np.asarray(g(xx), np.float64) - want).max() / np.abs(want).max()
        assert 1e-5 < err <= v["tolerance"], (n, err)        # bf16 indeed, within the gate
    txt = g.report()
    assert txt.count("precision bf16 (weights same) vs fp32: max rel error") == len(rd["variants"])


def test_a_16_bit_models_report_says_its_plan_computes_in_the_models_own_type(tmp_path,
                                                                               monkeypatch):
    """A bf16 module compiled at the default policy (fp32: nothing reduced) computes in bf16, as
    the module does; its report said 'no reduced precision' as for an fp32 model. It names the
    model's own type now; an fp32 model's line is unchanged."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                            torch.nn.Linear(64, 32)).eval()
    x = torch.randn(4, 32)
    f = lumc.compile(m.to(torch.bfloat16), example_inputs=(x.bfloat16(),), budget="20s",
                     device="sim:h200")
    assert ("precision fp32 (weights same): no reduced precision below the model's own bf16, "
            "no quality gate") in f.report()
    with torch.no_grad():
        want = m(x.bfloat16()).double()
    assert (f(x.bfloat16()).double() - want).abs().max() <= 0.05 * want.abs().max()
    from lumc.compiler.runtime.report_text import precision_lines
    r = {"precision": "fp32", "weights": "same", "inputs": {"x": [[4, 32], "f32"]},
         "outputs": {"y": [[4, 32], "f32"]}}
    assert precision_lines(r, exact=True) == [
        "precision fp32 (weights same): no reduced precision, no quality gate"]


def test_errors_name_options_as_the_caller_spelt_them(tmp_path):
    """The same refusal names ``--max-kl`` at the CLI and ``max_kl`` to a Python caller (it named
    the CLI flag to both), and a CLI call in the process leaves Python's spelling as it was."""
    from click.testing import CliRunner
    from lumc.compiler.core.options import cli_spelling, option, options
    from lumc.compiler.tools.cli import cli
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "relu.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    res = CliRunner().invoke(cli, ["compile", str(path), "--budget", "10s", "--device",
                                   "sim:h200", "--max-kl", "0.1", "-o", str(tmp_path / "a.lumc")])
    assert res.exit_code == 2 and "lumc: error: --max-kl gates a reduced precision (--precision" \
        in res.output
    with pytest.raises(InputError, match=r"^max_kl gates a reduced precision \(precision other"):
        lumc.compile(str(path), budget="10s", device="sim:h200", max_kl=0.1)
    assert option("max-kl", 0.1) == "max_kl=0.1" and option("shape") == "shapes"
    with cli_spelling():
        assert option("max-kl", 0.1) == "--max-kl 0.1" and option("shape") == "--shape"
    assert option("workers", "ray") == "workers='ray'"
    pair = (("precision", "bf16"), ("weights", "fp8"))
    assert options(*pair) == "precision='bf16', weights='fp8'"
    with cli_spelling():
        assert options(*pair) == "--precision bf16 --weights fp8"


def test_the_gate_of_a_pooled_head_measures_the_plan_not_a_wrong_reference(db):
    """GlobalAveragePool then ReduceMean over its size-1 dims (a torch CNN's ``mean((2, 3))``
    exported after an adaptive pool) then a MatMul: the gate's fp32 reference once read 1/20 of
    the pooled mean, so a bf16 plan within 1e-3 of float64 'missed' the gate and fell back."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 10)) / 4).astype(np.float32), "w")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("ReduceMean", ["g"], ["p"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["p", "w"], ["y"])]
    g = helper.make_graph(nodes, "head",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = lumc.compile(model, budget="30s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16", tolerance=0.02)
    r = cm.report_dict()
    assert r["precision"] == "bf16", r["warnings"]
    x = (rng.standard_normal((2, 16, 4, 5)) + 1).astype(np.float32)
    ref = x.astype(np.float64).mean((2, 3)) @ numpy_helper.to_array(w).astype(np.float64)
    err = np.abs(cm(x) - ref).max() / np.abs(ref).max()
    assert 1e-6 < err < 0.02 and r["quality"]["max_rel"] < 0.02
