"""Weight-only fp8 and NVFP4 storage: the stored graph's dequantized weights against a numpy
quantizer and dequantizer written here from the formats' definitions (not from
``lumc.compiler.core.weight_quant``), bit for bit, and small compiles end to end (sim:h200)."""
from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import lumc
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.precision import (WEIGHTS, WEIGHTS_TOLERANCE, PrecisionPolicy,
                                          contraction_reduced_axes, store_weights)
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir import dtypes as dt
from lumc.ir.errors import InputError
from lumc.ir.graph import Graph, input_node
from lumc.ir.library.conv import conv
from lumc.ir.tensor import Tensor

# e2m1 (OCP MX spec, "FP4 E2M1"): code bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def e2m1_codes(x: np.ndarray) -> np.ndarray:
    """Round to nearest e2m1, ties to the even code, saturating at 6; the sign bit kept (so a
    negative that rounds to zero is -0, code 8)."""
    mag = np.minimum(np.abs(x.astype(np.float64)), 6.0)
    d = np.abs(mag[..., None] - E2M1.astype(np.float64))
    best = d.min(axis=-1, keepdims=True)
    ties = d == best
    # among the nearest, the even code (mantissa bit 0) wins; otherwise the only one
    even = ties & (np.arange(8) % 2 == 0)
    code = np.where(ties.sum(-1) > 1, np.argmax(even, axis=-1), np.argmax(ties, axis=-1))
    return (code + 8 * np.signbit(x)).astype(np.uint8)


def numpy_nvfp4(w: np.ndarray, axis: int):
    """``(packed, scales, tensor_scale, dequantized)`` by the NVFP4 recipe along ``axis``."""
    w = w.astype(np.float32)
    amax = np.float32(np.abs(w).max())
    ts = np.float32(amax / np.float32(6 * 448)) if amax > 0 else np.float32(1)
    wb = np.moveaxis(w, axis, -1)
    blocks = wb.reshape(wb.shape[:-1] + (wb.shape[-1] // 16, 16))
    bmax = np.abs(blocks).max(-1, keepdims=True)
    s = np.minimum(bmax / np.float32(6) / ts, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    denom = s.astype(np.float32) * ts
    codes = np.zeros(blocks.shape, np.uint8)
    nz = np.broadcast_to(denom > 0, blocks.shape)
    codes[nz] = e2m1_codes((blocks / np.where(denom > 0, denom, 1))[nz])
    values = np.concatenate([E2M1, -E2M1])[codes]
    deq = (values * s.astype(np.float32)) * ts
    flat = codes.reshape(wb.shape)
    packed = flat[..., 0::2] | (flat[..., 1::2] << 4)
    return (np.moveaxis(packed, -1, axis), np.moveaxis(s[..., 0], -1, axis), ts,
            np.moveaxis(deq.reshape(wb.shape), -1, axis))


def numpy_decode(packed: np.ndarray, scales: np.ndarray, ts, axis: int) -> np.ndarray:
    """Decode stored NVFP4 bytes: low nibble first along ``axis``."""
    table = np.concatenate([E2M1, -E2M1])
    p = np.moveaxis(packed, axis, -1)
    vals = np.stack([table[p & 15], table[p >> 4]], -1).reshape(p.shape[:-1] + (-1,))
    s = np.repeat(np.moveaxis(scales, axis, -1).astype(np.float32), 16, axis=-1)
    return np.moveaxis((vals * s) * np.float32(ts), -1, axis)


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def matmul_graph(w: np.ndarray, m: int = 5):
    x = Tensor(input_node("x", (m, w.shape[0]), dt.f32))
    return Graph({"x": x.node}, {"y": (x @ Tensor.const(w)).node}), x


def stored(graph: Graph, weights: str, precision: str = "fp32"):
    """The stored graph's one contraction weight (the operand under its broadcast view), its
    constants by dtype, and the stats."""
    g, stats = store_weights(graph, PrecisionPolicy(precision, weights))
    mul = next(n for n in g.nodes() if n.op == "SumReduce").srcs[0]
    w = next(s for s in mul.srcs if s.op == "View" and s.srcs[0].op != "Input").srcs[0]
    consts = {}
    for n in Graph({}, {"w": w}).nodes():
        if n.op == "Constant" and n.numel > 1:
            consts.setdefault(n.dtype.name, []).append(n.arg.value)
    return w, ReferenceExecutor(Graph({}, {"w": w}))({})["w"], consts, stats


def hard_weight(k=64, n=48, seed=0):
    """Normal weights with exact zeros, an all-zero output channel, an all-zero block along K,
    a huge outlier and a -0."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32) * np.linspace(0.01, 2, n, dtype=np.float32)
    w[rng.random((k, n)) < 0.1] = 0.0
    w[:, 3] = 0.0                 # an output channel of zeros
    w[16:32, 5] = 0.0             # one block of zeros
    w[7, 9] = 3.0e4               # an outlier: every other block's scale is tiny
    w[2, 12] = -0.0
    return w


# ---- (a) the stored graph against the numpy formats ---------------------------------------------
@pytest.mark.parametrize("shape,seed", [((64, 48), 0), ((32, 16), 1), ((256, 14), 2)])
def test_nvfp4_dequantizes_bit_exactly_like_numpy(shape, seed):
    w = hard_weight(*shape, seed=seed)
    g, _ = matmul_graph(w)
    node, got, consts, stats = stored(g, "nvfp4")
    assert stats["nvfp4"] == 1 and stats["skipped"] == 0
    packed, scales, ts, want = numpy_nvfp4(w, 0)
    assert np.array_equal(bits(got), bits(want))
    # the bytes stored are NVFP4's: packed codes (low nibble first) and e4m3 block scales
    (p,), (s,) = consts["u8"], consts["f8e4m3fn"]
    np.testing.assert_array_equal(p, packed)
    np.testing.assert_array_equal(s.view(np.uint8), scales.view(np.uint8))
    assert np.array_equal(bits(numpy_decode(p, s, ts, 0)), bits(want))
    assert (want[:, 3] == 0).all() and (want[16:32, 5] == 0).all()
    # the outlier survives; the rest keeps the 4-bit relative error
    assert want[7, 9] == pytest.approx(3.0e4, rel=0.02)
    # the whole graph computes x @ W' with W' exact
    xv = np.random.default_rng(4).standard_normal((5, shape[0])).astype(np.float32)
    ref = ReferenceExecutor(matmul_graph(want)[0])({"x": xv})["y"]
    out = ReferenceExecutor(store_weights(g, PrecisionPolicy("fp32", "nvfp4"))[0])({"x": xv})["y"]
    assert np.array_equal(bits(out), bits(ref))


def test_e2m1_rounding_ties_to_even_and_saturates():
    # the test's own rounding on the tie points
    x = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 1e9, -0.1, -2.6])
    np.testing.assert_array_equal(np.concatenate([E2M1, -E2M1])[e2m1_codes(x)],
                                  [0, 1, 1, 2, 2, 4, 4, 6, 6, -0.0, -3])
    # the compiler's on the same ties: amax 2.625 = 2688 * 2**-10 makes the tensor scale 2**-10
    # exactly, and a block of max 6 * 2**-8 gets the block scale 4, so W / (s * ts) hits the ties
    w = np.zeros((32, 4), np.float32)
    w[16, 0] = 2.625
    ties = np.float32([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5,
                       -3.5, -5, 0.1])
    w[:16, 1] = ties * np.float32(2.0 ** -8)
    _, got, _, _ = stored(matmul_graph(w)[0], "nvfp4")
    want = np.float32([6, 0, 1, 1, 2, 2, 4, 4, -0.0, -1, -1, -2, -2, -4, -4, 0]) \
        * np.float32(2.0 ** -8)
    assert np.array_equal(bits(got[:16, 1]), bits(want))
    assert got[16, 0] == 2.625
    assert np.array_equal(bits(got), bits(numpy_nvfp4(w, 0)[3]))


@pytest.mark.parametrize("k", [24, 40, 33])
def test_nvfp4_skips_a_weight_whose_k_is_not_a_multiple_of_16(k):
    w = np.random.default_rng(k).standard_normal((k, 32)).astype(np.float32)
    g, _ = matmul_graph(w)
    _, got, consts, stats = stored(g, "nvfp4")
    assert stats["nvfp4"] == 0 and stats["skipped"] == 1 and stats["bytes_after"] == 0
    assert np.array_equal(bits(got), bits(w)) and set(consts) == {"f32"}
    # under bf16 the skipped weight is stored at bf16, as the precision says
    _, low, consts, stats = stored(g, "nvfp4", precision="bf16")
    assert stats["skipped"] == 1 and set(consts) == {"bf16"}
    np.testing.assert_array_equal(low, w.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_nvfp4_blocks_a_convolution_along_its_flattened_k():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 4, 2, 2)).astype(np.float32)       # K = C*KH*KW = 16
    x = Tensor(input_node("x", (1, 4, 5, 5), dt.f32))
    g = Graph({"x": x.node}, {"y": conv(x, Tensor.const(w)).node})
    wn = next(n for n in g.nodes() if n.op == "Constant" and n.shape == w.shape)
    assert contraction_reduced_axes(wn, g.users()) == (1, 2, 3)
    q, stats = store_weights(g, PrecisionPolicy("fp32", "nvfp4"))
    assert stats["nvfp4"] == 1
    want = numpy_nvfp4(w.reshape(6, 16), 1)[3].reshape(w.shape)
    xv = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    ref_g = Graph({"x": x.node}, {"y": conv(x, Tensor.const(want)).node})
    assert np.array_equal(bits(ReferenceExecutor(q)({"x": xv})["y"]),
                          bits(ReferenceExecutor(ref_g)({"x": xv})["y"]))
    # a depthwise 3x3 (K = 9) is not
    dw = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    g3 = Graph({"x": x.node}, {"y": conv(x, Tensor.const(dw), group=4, pads=[1, 1, 1, 1]).node})
    assert store_weights(g3, PrecisionPolicy("fp32", "nvfp4"))[1]["nvfp4"] == 0


def test_fp8_dequantizes_bit_exactly_per_output_channel():
    w = hard_weight(64, 48, seed=3)
    g, _ = matmul_graph(w)
    _, got, consts, stats = stored(g, "fp8")
    assert stats["fp8"] == 1 and stats["bytes_after"] == w.size + 48 * 4
    amax = np.abs(w).max(axis=0, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    q = np.clip(w / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    want = q.astype(np.float32) * scale
    assert np.array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(consts["f8e4m3fn"][0].view(np.uint8), q.view(np.uint8))
    rel = np.abs(got - w).max(axis=0) / np.maximum(amax[0], 1e-30)
    assert rel.max() <= 2.0 ** -4 + 1e-6         # e4m3: 3 mantissa bits, half an ulp at the top


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_weights_are_skipped(bad):
    """int8 quantized a weight holding inf (its channel's scale inf: the channel dequantized to
    NaN everywhere, with numpy warnings) or NaN (stored as 0); no format stores one."""
    w = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    w[3, 4] = bad
    for fmt in ("int8", "fp8", "nvfp4"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _, got, _, stats = stored(matmul_graph(w)[0], fmt)
        assert stats["skipped"] == 1 and stats[fmt] == 0, fmt
        assert np.array_equal(bits(got), bits(w)), fmt


@pytest.mark.parametrize("fmt,qmax,ulp", [("int8", 127, 2.0 ** -7), ("fp8", 448, 2.0 ** -4)])
def test_a_channel_of_subnormal_weights_keeps_its_values(fmt, qmax, ulp):
    """A channel whose largest |w| is below qmax * 2**-149 had its scale amax / qmax flush to 0:
    fp8 stored its zeros as NaN (0 / 0) and int8 its values as 0. The scale is floored at the
    smallest subnormal, so the channel dequantizes to its values within the format's step."""
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    w = np.random.default_rng(1).standard_normal((32, 6)).astype(np.float32)
    w[:, 0] = 0.0
    w[:4, 0] = np.array([1, -1, 3, 0], np.float32) * tiny      # amax 3 subnormal steps
    w[:, 1] = 0.0
    w[5, 1] = np.float32(2e-42)                                 # one weight, under 448 steps
    w[:, 2] = 0.0                                               # all zero: scale 1, stays 0
    _, got, _, stats = stored(matmul_graph(w)[0], fmt)
    assert stats[fmt] == 1 and np.all(np.isfinite(got))
    np.testing.assert_array_equal(got[:, 0], w[:, 0])           # whole steps: exact
    np.testing.assert_array_equal(got[:, 2], 0.0)
    w64, g64 = w.astype(np.float64), got.astype(np.float64)
    amax = np.abs(w64).max(axis=0)
    # within the format's step at the channel's amax, plus the subnormal scale's own rounding
    # (half a subnormal step, up to qmax times)
    bound = amax * ulp + qmax * float(tiny) / 2
    assert np.all(np.abs(g64 - w64) <= bound), np.abs(g64 - w64).max(axis=0) / bound
    assert got[5, 1] != 0.0


def test_policy_takes_the_new_formats():
    assert {"fp8", "nvfp4"} <= set(WEIGHTS)
    assert PrecisionPolicy("fp32", "nvfp4").rtol == WEIGHTS_TOLERANCE["nvfp4"]
    assert PrecisionPolicy("bf16", "fp8").rtol == max(1e-1, WEIGHTS_TOLERANCE["fp8"])
    with pytest.raises(InputError, match="weights='fp4'.*nvfp4"):
        PrecisionPolicy("fp32", "fp4")


# ---- (c, d) end to end ---------------------------------------------------------------------------
@pytest.fixture()
def db(tmp_path):
    return TuningDatabase(tmp_path / "tuning.sqlite")


@pytest.mark.parametrize("weights", ["fp8", "nvfp4"])
def test_weight_only_compile_stores_narrow_and_measures_quality(weights, db):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_precision import classifier, numpy_reference
    model = classifier()
    base = lumc.compile(model, budget="40s", device="sim:h200", db=db, use_egraph=False)
    cm = lumc.compile(model, budget="40s", device="sim:h200", db=db, use_egraph=False,
                      weights=weights)
    r, r0 = cm.report_dict(), base.report_dict()
    assert r["weights"] == weights and r["quality"]["passed"], r["quality"]
    ws = r["weight_storage"]
    assert ws[weights] == 2 and ws["skipped"] == 0
    before = (256 * 192 + 192 * 10) * 4
    assert ws["bytes_before"] == before
    if weights == "nvfp4":       # 4.5 bits per weight + 4 per tensor + the 2 KiB decode table
        assert ws["bytes_after"] == before * (0.5 + 1 / 16) / 4 + 2 * 4 + 2048
        assert ws["bytes_after"] == pytest.approx(before * (0.5 + 1 / 16) / 4, rel=0.08)
    else:
        assert ws["bytes_after"] == before / 4 + (192 + 10) * 4
    # the same kernels as fp32, and the weights cross HBM narrow (no f32 copy is written)
    assert [k["form"] for k in r["per_kernel"]] == [k["form"] for k in r0["per_kernel"]]
    assert r0["bytes_moved"] - r["bytes_moved"] >= 0.9 * (ws["bytes_before"] - ws["bytes_after"])
    x = np.random.default_rng(5).standard_normal((16, 256)).astype(np.float32)
    ref = numpy_reference(model, x)
    err = np.abs(cm(x) - ref).max() / np.abs(ref).max()
    assert 1e-5 < err <= r["tolerance"]         # quantized weights really ran, within the gate


def test_nvfp4_compile_through_the_egraph_keeps_the_dequant_in_the_matmul(db):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_precision import classifier
    cm = lumc.compile(classifier(), budget="40s", device="sim:h200", db=db, weights="nvfp4")
    r = cm.report_dict()
    assert r["egraph_used"] and r["weights"] == "nvfp4" and r["quality"]["passed"]
    # the two products: two matmul kernels, or one mlp kernel (both chained, fusion_chain)
    forms = [k["form"] for k in r["per_kernel"]]
    assert forms.count("matmul") + 2 * forms.count("mlp") == 2, forms
    for call in cm.program.calls:    # no kernel writes a weight-shaped value of constants alone
        assert all(n.op != "Constant" or n.dtype != dt.f32 or n.numel <= 512 for n in call.inputs)
        if call.kernel.form in ("matmul", "mlp"):
            assert {n.dtype for n in call.inputs if n.op == "Constant"} >= {dt.u8, dt.f8e4m3fn}


def test_a_dequant_feeding_no_contraction_is_not_a_weight_prologue():
    from lumc.compiler.core.fusion import GreedyFusion
    w = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    x = Tensor(input_node("x", (5, 32), dt.f32))
    g, _ = store_weights(matmul_graph(w)[0], PrecisionPolicy("fp32", "nvfp4"))
    deq = next(n for n in g.nodes() if n.op == "SumReduce").srcs[0].srcs[1].srcs[0]
    fused = GreedyFusion(Graph({"x": x.node}, {"y": (x @ Tensor(deq)).node}))
    assert [c.kernel.form for c in fused.program().calls] == ["matmul"], fused.refusals
    # the same expression added to an input elementwise: the gather result is realized
    y = Tensor(input_node("z", (32, 16), dt.f32)) + Tensor(deq).exp()
    other = GreedyFusion(Graph({"z": y.node.srcs[0]}, {"y": y.node}))
    assert any("a view over a gather result" in line for line in other.refusals)


def test_weights_the_format_did_not_store_are_said(tmp_path):
    """``--weights nvfp4`` on a model whose first weight has K = 24 (not a multiple of 16), or
    ``--weights int8`` on a model without a matrix product, reported 'weights nvfp4' / 'weights
    int8' with no word that some or all weights stayed as they were. A note says so now."""
    from onnx import TensorProto, helper, numpy_helper
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((24, 64)).astype(np.float32)
    w2 = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = lumc.compile(model, budget="30s", device="sim:h200", db=db, use_egraph=False,
                      weights="nvfp4", reuse_plan=False)
    r = cm.report_dict()
    assert r["weights"] == "nvfp4" and r["weight_storage"]["nvfp4"] == 1
    assert r["weight_storage"]["skipped"] == 1
    note = ("weights nvfp4: 1 of 2 contraction weights stored as nvfp4; 1 the format cannot "
            "store stays as the model stores it")
    assert note in r["warnings"] and f"note: {note}" in cm.report()
    # the first product is exact fp32 (w1 kept), the second reads NVFP4's w2
    x = rng.standard_normal((8, 24)).astype(np.float32)
    h = x.astype(np.float64) @ w1.astype(np.float64)
    w2q = numpy_nvfp4(w2, 0)[3].astype(np.float64)
    np.testing.assert_allclose(cm(x), h @ w2q, rtol=1e-4, atol=1e-4 * np.abs(h @ w2q).max())



def test_weights_on_a_model_without_a_weight_are_refused(tmp_path, capsys):
    """``--weights int8`` on a model with no matrix product (an Exp), or whose product reads only
    inputs, compiled with a note that nothing was stored: an option that does nothing, refused in
    one line (exit 2 at the CLI) before any search, as ``--tolerance`` at fp32 is."""
    from onnx import TensorProto, helper
    from lumc.compiler.tools.cli import main
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    g = helper.make_graph([helper.make_node("Exp", ["x"], ["y"])], "exp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    exp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match=r"^weights='int8': .* has no weight read only by matrix "
                                         r"products .*nothing would be stored as int8"):
        lumc.compile(exp, budget="20s", device="sim:h200", db=db, use_egraph=False,
                     weights="int8", precision="bf16", reuse_plan=False)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "ab",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [8, 16]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [16, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])])
    path = tmp_path / "ab.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    out = tmp_path / "ab.lumc"
    with pytest.raises(SystemExit) as e:
        main(["compile", str(path), "--budget", "20s", "--device", "sim:h200", "--weights",
              "nvfp4", "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and not out.exists(), err
    assert err[0].startswith("lumc: error: --weights nvfp4: ab.onnx has no weight"), err
    # without --weights it compiles and computes the product
    cm = lumc.compile(str(path), budget="20s", device="sim:h200", db=db, use_egraph=False)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 8)))
    np.testing.assert_allclose(cm(a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_a_weights_format_that_stored_nothing_gates_at_the_precisions_tolerance(tmp_path):
    """``--precision bf16 --weights nvfp4`` on a model whose one weight has K = 24 stored no
    weight as NVFP4 (the note says so) but gated the bf16 plan at NVFP4's tolerance 0.4, not
    bf16's 0.1: a plan 0.3 off would have passed, reported as 'weights nvfp4' (a torch module's
    check against eager at 0.4 too). The plan is the model's weights at bf16, gated and reported
    so."""
    from onnx import TensorProto, helper, numpy_helper
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((24, 16)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "k24",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((4, 24)).astype(np.float32)
    cm = lumc.compile(model, budget="20s", device="sim:h200", db=db, use_egraph=False,
                      precision="bf16", weights="nvfp4", example_inputs={"x": x},
                      reuse_plan=False)
    r = cm.report_dict()
    assert r["weight_storage"]["nvfp4"] == 0 and r["weight_storage"]["skipped"] == 1
    assert (r["precision"], r["weights"], r["tolerance"]) == ("bf16", "same", 0.1), r
    assert r["quality"]["tolerance"] == 0.1 and r["quality"]["passed"]
    assert any(s.startswith("weights nvfp4: no weight is stored as nvfp4") for s in r["warnings"])
    # bf16 operands, exact products, fp32 sums: against float64 of the bf16-rounded operands
    bf = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float64)
    want = bf(x) @ bf(w)
    np.testing.assert_allclose(cm(x), want, rtol=0, atol=1e-5 * np.abs(want).max())

    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(24, 16, bias=False).eval()
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w.T.copy()))
    f = lumc.compile(lin, budget="20s", device="sim:h200", example_inputs=(torch.from_numpy(x),),
                     precision="bf16", weights="nvfp4", reuse_plan=False)
    rep = f.specializations[0].compiled.report_dict()
    assert rep["tolerance"] == 0.1 and rep["eager_check"]["rtol"] == 0.1, rep["eager_check"]
    np.testing.assert_allclose(f(torch.from_numpy(x)).detach().numpy(), want, rtol=0,
                               atol=1e-5 * np.abs(want).max())
