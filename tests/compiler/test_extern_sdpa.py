"""The sdpa extern: attention kernels through F.scaled_dot_product_attention (torch CPU here),
against the float64 meaning; masks and causal masks carried as SDPA's attn_mask; score functions
that are not a scale plus a mask refused."""
import numpy as np
import pytest

from lumc.backends import extern as bx
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.benchcases import _kernel
from lumc.compiler.runtime.extern import ExternKernel, run_extern_numpy
from lumc.compiler.core.measure import max_rel_error
from lumc.ir import dtypes as dt
from lumc.ir.library.norm import softmax
from lumc.ir.tensor import Tensor

B, H, LQ, LK, D = 2, 3, 13, 19, 16


def _scores(q, k):
    return (q @ k.transpose(-1, -2)) * (D ** -0.5)


def _plain(q, k, v):
    return softmax(_scores(q, k), -1) @ v


def _bool_mask(q, k, v, m):
    s = _scores(q, k)
    return softmax(m.where(s, float("-inf")), -1) @ v


def _causal(q, k, v):
    s = _scores(q, k)
    i = Tensor.iota((LQ, LK), 0, dt.i32)
    j = Tensor.iota((LQ, LK), 1, dt.i32)
    return softmax(j.lt(i + 1).where(s, float("-inf")), -1) @ v


def _bias_epilogue(q, k, v, bias):
    return (softmax(_scores(q, k) + bias, -1) @ v) * 2.0 + 1.0


def _soft_capped(q, k, v):
    return softmax((_scores(q, k) * (1 / 30.0)).tanh() * 30.0, -1) @ v


QKV = [((B, H, LQ, D), dt.f32), ((B, H, LK, D), dt.f32), ((B, H, LK, D), dt.f32)]
CASES = {
    "plain": (_plain, QKV),
    "bool-mask": (_bool_mask, QKV + [((B, 1, 1, LK), dt.bool_)]),
    "causal": (_causal, QKV),
    "bias+epilogue": (_bias_epilogue, QKV + [((B, 1, LQ, LK), dt.f32)]),
}


def _inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for shape, d in specs:
        if d == dt.bool_:
            m = rng.random(shape) < 0.7
            m[..., 0] = True                      # no fully masked row
            out.append(m)
        else:
            out.append(rng.standard_normal(shape).astype(np.float32))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_matches_float64_meaning(name):
    f, specs = CASES[name]
    k = _kernel("attention", f, specs)
    assert bx.extern_impls(k) == ["sdpa", "cublas"]
    ins = _inputs(specs)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    got = run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0]
    assert max_rel_error(got, ref) < 1e-5


def test_scores_that_are_not_scale_plus_mask_are_refused():
    k = _kernel("attention", _soft_capped, QKV)
    with pytest.raises(ValueError, match="not alpha"):
        ExternKernel(k, "sdpa")
    ins = _inputs(QKV)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    assert max_rel_error(run_extern_numpy(k, {"IMPL": "cublas"}, ins)[0], ref) < 1e-5


def test_sdpa_price_is_one_fused_launch():
    from lumc.backends.devices import H200
    k = _kernel("attention", _plain, [((4, 32, 4096, 128), dt.bf16)] * 3)
    cfg = {"IMPL": "sdpa", "PRECISION": "bf16"}
    t = bx.simulate_extern_time(k, cfg, H200)
    flops = 4 * 4 * 32 * 4096 * 4096 * 128
    assert t == pytest.approx(flops / (989.4e12 * bx.SDPA_EFFICIENCY) + 4e-6, rel=1e-3)
    assert t < bx.simulate_extern_time(k, {"IMPL": "cublas", "PRECISION": "bf16"}, H200)


@pytest.mark.parametrize("name", ["plain", "causal", "bias+epilogue"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_sdpa_at_half_precision_runs_in_it_and_passes_its_check(name, precision):
    """``IMPL=sdpa PRECISION=bf16`` on fp32 operands runs SDPA in bf16 (it ran fp32 before: the
    knob did nothing while the simulator priced bf16 tensor cores): the error against the float64
    meaning is that of the half type, and the kernel is within the numerics check's tolerance of
    the flash emulation with the output stored in the half type."""
    from lumc.backends.precision import emulation
    from lumc.compiler.core.measure import PRECISION_CHECK_RTOL, STORED_HALF_RTOL
    f, specs = CASES[name]
    k = _kernel("attention", f, specs)
    ins = _inputs(specs, seed=3)
    feed = {f"in{i}": x for i, x in enumerate(ins)}
    cfg = {"IMPL": "sdpa", "PRECISION": precision}
    got = run_extern_numpy(k, cfg, ins)[0]
    f64 = ReferenceExecutor(k.meaning, "float64")(feed)["out0"]
    err = max_rel_error(got, f64)
    unit = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}[precision]
    assert unit / 8 < err < 8 * unit
    kw = emulation(k, cfg)
    assert kw["rounded"] and kw["factored"]
    emu = ReferenceExecutor(k.meaning, **kw)(feed)["out0"]
    assert max_rel_error(got, emu) <= PRECISION_CHECK_RTOL[precision] + STORED_HALF_RTOL[precision]


def test_sdpa_fp16_keeps_a_large_finite_mask_finite():
    """A -1e9 bias is -inf in fp16; clamped to fp16's range first it stays finite, and a fully
    masked row is the softmax of its scores (the float64 meaning's answer: fp32 rounds the scores
    away under -1e9 and averages the row, which is why ``sdpa_half_ok`` does not offer fp16 SDPA
    for such a mask) instead of NaN."""
    def f(q, k, v, m):
        return softmax(_scores(q, k) + m, -1) @ v
    specs = QKV + [((B, 1, 1, LK), dt.f32)]
    k = _kernel("attention", f, specs)
    ins = _inputs(specs, seed=1)
    ins[3] = np.where(np.arange(LK) < 5, 0.0, -1e9).astype(np.float32).reshape(1, 1, 1, LK)
    ins[3] = np.broadcast_to(ins[3], (B, 1, 1, LK)).copy()
    ins[3][1] = -1e9                                  # batch 1: every key masked
    got = run_extern_numpy(k, {"IMPL": "sdpa", "PRECISION": "fp16"}, ins)[0]
    f64 = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    assert np.isfinite(got).all()
    assert max_rel_error(got, f64) < 4e-3


def test_sdpa_price_counts_casts_and_a_per_call_mask():
    """Priced as it runs: an fp32 kernel at bf16 pays its casts (four eager launches), and a mask
    computed from the kernel's inputs (a padding bias) pays its eager ops every call, where a
    causal mask of iotas is computed once; the kernel reads one mask value per score."""
    from lumc.backends.devices import H200
    shape = (1, 12, 128, 64)

    def pad(q, k, v, m):
        return softmax(_scores(q, k) + m, -1) @ v

    def causal(q, k, v):
        i = Tensor.iota((128, 128), 0, dt.i32)
        j = Tensor.iota((128, 128), 1, dt.i32)
        return softmax(j.lt(i + 1).where(_scores(q, k), float("-inf")), -1) @ v
    t = {}
    for name, f, extra in (("pad", pad, [(1, 1, 1, 128)]), ("causal", causal, [])):
        for d in (dt.f32, dt.bf16):
            k = _kernel("attention", f, [(shape, d)] * 3 + [(s, d) for s in extra])
            t[name, d.name] = bx.simulate_extern_time(k, {"IMPL": "sdpa", "PRECISION": "bf16"}, H200)
    launch = H200.launch_overhead_s
    assert t["causal", "f32"] - t["causal", "bf16"] > 4 * launch
    assert t["pad", "bf16"] - t["causal", "bf16"] > 3 * launch
    assert [n.op for n in bx.sdpa_mask_nodes(_kernel("attention", causal, [(shape, dt.f32)] * 3))
            if n.op == "Input"] == []


def _shifted_causal(q, k, v):
    s = _scores(q, k)
    i = Tensor.iota((LQ, LK), 0, dt.i32)
    j = Tensor.iota((LQ, LK), 1, dt.i32)
    return softmax(j.lt(i + 4).where(s, float("-inf")), -1) @ v


@pytest.mark.parametrize("f, specs, kind", [
    (_plain, QKV, "none"), (_causal, QKV, "causal"), (_shifted_causal, QKV, "dense"),
    (_bool_mask, CASES["bool-mask"][1], "input")])
def test_sdpa_mask_kinds(f, specs, kind):
    """A constant mask is none (FlashAttention may serve it), the top-left causal triangle is
    ``is_causal`` (LQ=13 != LK=19 here), any other constant mask is computed once per device, and
    a mask of the inputs per call; each matches the float64 meaning."""
    from lumc.compiler.runtime.extern import _EXTERN
    k = _kernel("attention", f, specs)
    assert bx.sdpa_mask_kind(k) == kind
    for seed in (0, 5):
        ins = _inputs(specs, seed=seed)
        got = run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0]
        ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in
                                                       enumerate(ins)})["out0"]
        assert max_rel_error(got, ref) < 1e-5
    assert len(_EXTERN[k]["sdpa"]._sdpa._masks) == (1 if kind == "dense" else 0)


def test_sdpa_price_skips_what_flash_skips():
    """No mask read for a constant or causal mask, and a causal one computes ~half the scores;
    another constant mask is read, one value per score."""
    from lumc.backends.devices import H200
    L = 2048

    def tri(shift):
        def f(q, k, v):
            i = Tensor.iota((L, L), 0, dt.i32)
            j = Tensor.iota((L, L), 1, dt.i32)
            return softmax(j.lt(i + shift).where(_scores(q, k), float("-inf")), -1) @ v
        return f
    ks = {name: _kernel("attention", f, [((1, 4, L, D), dt.bf16)] * 3)
          for name, f in (("plain", _plain), ("causal", tri(1)), ("shifted", tri(2)))}
    t = {name: bx.simulate_extern_time(k, {"IMPL": "sdpa"}, H200) for name, k in ks.items()}
    assert [bx.sdpa_mask_kind(ks[n]) for n in ("plain", "causal", "shifted")] == \
        ["none", "causal", "dense"]
    assert bx.sdpa_causal_share(ks["causal"]) == pytest.approx((L + 1) / (2 * L))
    assert t["causal"] < t["plain"] < t["shifted"]


def test_sdpa_on_fp32_has_no_tf32_config_and_prices_split_tf32():
    """SDPA's fp32 kernel is split TF32 whatever allow_tf32 says: one fp32 config, priced at the
    tf32x3 peak (it was priced at the TF32 peak for ``PRECISION=tf32``, 3x too fast)."""
    import dataclasses
    from lumc.backends.devices import H200
    k = _kernel("attention", _plain, [((4, 32, 2048, 128), dt.f32)] * 3)
    dev = dataclasses.replace(H200, dot_precisions={"f32": ("tf32", "ieee")})
    cfgs = [c for c in bx.extern_configs(k, dev) if c["IMPL"] == "sdpa"]
    assert cfgs == [{"IMPL": "sdpa", "PRECISION": "ieee"}]
    flops = 4 * 4 * 32 * 2048 * 2048 * 128
    t = bx.simulate_extern_time(k, cfgs[0], H200)
    assert t >= flops / (H200.dot_peak("tf32") / 3 * bx.SDPA_EFFICIENCY)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["plain", "causal"])
def test_gpu_sdpa_constant_and_causal_masks_run_on_flash_attention(name):
    """With only the FlashAttention backend enabled, SDPA raises when given any attn_mask: the
    extern runs a constant (plain) and a causal mask through it, in bf16 on fp32 operands too."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from lumc.backends.triton.launch import to_numpy
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    qkv = [((B, H, 64, 64), dt.f32)] * 3

    def causal(q, k, v):
        i = Tensor.iota((64, 64), 0, dt.i32)
        j = Tensor.iota((64, 64), 1, dt.i32)
        return softmax(j.lt(i + 1).where(_scores(q, k), float("-inf")), -1) @ v
    k = _kernel("attention", _plain if name == "plain" else causal, qkv)
    ek = ExternKernel(k, "sdpa")
    ins = _inputs(qkv)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    xs = [torch.from_numpy(x).cuda() for x in ins]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        got = to_numpy(ek(*xs, config={"IMPL": "sdpa", "PRECISION": "bf16"})[0])
    assert max_rel_error(got, ref) < 3e-2


def test_sdpa_half_configs_only_where_the_mask_survives_the_cast():
    """SDPA takes its mask in the half type: a constant bias that bf16 rounds (ALiBi-like), a float
    input's bias (unknown values), and in fp16 a -1e9 mask (clamped to -65504, no longer swamping
    a fully masked row) get no half SDPA config; no mask, causal, and a bool padding mask do."""
    import dataclasses
    from lumc.backends.devices import H200
    dev = dataclasses.replace(H200, dot_precisions={"f32": ("bf16", "fp16", "ieee")})

    def alibi(q, k, v):
        i = Tensor.iota((LQ, LK), 0, dt.i32).cast(dt.f32)
        j = Tensor.iota((LQ, LK), 1, dt.i32).cast(dt.f32)
        return softmax(_scores(q, k) + (j - i) * 0.3, -1) @ v

    def shifted_1e9(q, k, v):
        i = Tensor.iota((LQ, LK), 0, dt.i32)
        j = Tensor.iota((LQ, LK), 1, dt.i32)
        return softmax(_scores(q, k) + j.lt(i + 4).where(0.0, -1e9), -1) @ v

    def precs(f, specs):
        k = _kernel("attention", f, specs)
        return sorted(c.get("PRECISION") for c in bx.extern_configs(k, dev) if c["IMPL"] == "sdpa")
    assert precs(_plain, QKV) == ["bf16", "fp16", "ieee"]
    assert precs(_causal, QKV) == ["bf16", "fp16", "ieee"]
    assert precs(_bool_mask, CASES["bool-mask"][1]) == ["bf16", "fp16", "ieee"]
    assert precs(alibi, QKV) == ["ieee"]
    assert precs(_bias_epilogue, CASES["bias+epilogue"][1]) == ["ieee"]
    assert precs(shifted_1e9, QKV) == ["bf16", "ieee"]


def _causal_filled(fill):
    def f(q, k, v):
        i = Tensor.iota((LQ, LK), 0, dt.i32)
        j = Tensor.iota((LQ, LK), 1, dt.i32)
        return softmax(_scores(q, k) + j.lt(i + 1).where(0.0, fill), -1) @ v
    return f


@pytest.mark.parametrize("fill, kind", [(float(np.finfo(np.float32).min), "causal"),
                                        (-1e9, "dense"), (float("-inf"), "causal")])
def test_sdpa_hf_style_causal_mask(fill, kind):
    """HF's additive causal mask (finfo.min above the diagonal) is is_causal: added to any score
    under 1e29 it rounds to itself, as -inf does; -1e9 is not (a large score shows through)."""
    k = _kernel("attention", _causal_filled(fill), QKV)
    assert bx.sdpa_mask_kind(k) == kind
    ins = _inputs(QKV, seed=2)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    assert max_rel_error(run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0], ref) < 1e-5


@pytest.mark.parametrize("f, kind", [(_causal, "causal"), (_plain, "none"),
                                     (_shifted_causal, "dense")])
def test_sdpa_mask_too_large_for_the_host_is_classified_on_its_device(monkeypatch, f, kind):
    """Over MASK_EVAL_MAX scores the host cannot evaluate the mask ("unknown", priced as dense);
    the first call computes it on its device and classifies it there: a causal one then runs
    is_causal with no mask kept (an LLM's 32 x 2048 x 2048 causal mask, 256 MiB in bf16)."""
    from lumc.compiler.runtime.extern import _EXTERN
    monkeypatch.setattr(bx, "MASK_EVAL_MAX", 0)
    monkeypatch.setattr(bx, "_MASK_KINDS", {})
    k = _kernel("attention", f, QKV)
    assert bx.sdpa_mask_kind(k) == "unknown"
    ins = _inputs(QKV, seed=4)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    for _ in range(2):
        assert max_rel_error(run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0], ref) < 1e-5
    sd = _EXTERN[k]["sdpa"]._sdpa
    assert sd.mask_kind == kind
    assert len(sd._masks) == (1 if kind == "dense" else 0)


def test_scores_written_transposed_are_not_sdpa():
    """Scores written ``(k @ q^T)^T`` pair queries and keys the other way round in the score
    contraction: SDPA would take k for the query (0.93 off); like the Triton renderer, the plan
    refuses the view and cuBLAS serves it."""
    tril = np.tril(np.ones((LQ, LQ), bool))

    def f(q, k, v):
        s = (k @ q.transpose(-1, -2)).transpose(-1, -2) * D ** -0.5
        return softmax(Tensor.const(tril).where(s, float("-inf")), -1) @ v
    specs = [((B, H, LQ, D), dt.f32)] * 3
    k = _kernel("attention", f, specs)
    assert bx.extern_impls(k) == ["cublas"]
    ins = _inputs(specs)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    assert max_rel_error(run_extern_numpy(k, {"IMPL": "cublas"}, ins)[0], ref) < 1e-5


def test_scores_transposed_after_the_scale_are_not_sdpa():
    """The transpose may follow an op on the scores (``((k @ q^T) * c)^T``, ``(k @ q^T + 0)^T``):
    a view of a value computed from the scores moves their elements just as one of the scores
    does (SDPA took k for the query: 0.93 off); reshapes still pass."""
    tril = np.tril(np.ones((LQ, LQ), bool))

    def after_scale(q, k, v):
        s = ((k @ q.transpose(-1, -2)) * D ** -0.5).transpose(-1, -2)
        return softmax(Tensor.const(tril).where(s, float("-inf")), -1) @ v

    def reshaped(q, k, v):
        s = ((q @ k.transpose(-1, -2)) * D ** -0.5).reshape((B * H, LQ, LQ)).reshape((B, H, LQ, LQ))
        return softmax(Tensor.const(tril).where(s, float("-inf")), -1) @ v
    specs = [((B, H, LQ, D), dt.f32)] * 3
    assert bx.extern_impls(_kernel("attention", after_scale, specs)) == ["cublas"]
    k = _kernel("attention", reshaped, specs)
    assert bx.extern_impls(k) == ["sdpa", "cublas"]
    ins = _inputs(specs)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    assert max_rel_error(run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0], ref) < 1e-5


def test_device_mask_classification_ignores_the_first_calls_precision(monkeypatch):
    """An "unknown" mask is classified once; a first call at PRECISION=bf16 rounded a small bias
    (100 + 0.01 j) to one value ("none") and every later fp32 call ran without it (3e-2 off)."""
    from lumc.compiler.runtime.extern import _EXTERN
    monkeypatch.setattr(bx, "MASK_EVAL_MAX", 0)
    monkeypatch.setattr(bx, "_MASK_KINDS", {})

    def f(q, k, v):
        j = Tensor.iota((LQ, LK), 1, dt.i32).cast(dt.f32)
        return softmax(_scores(q, k) + (j * 0.01 + 100.0), -1) @ v
    k = _kernel("attention", f, QKV)
    ins = _inputs(QKV, seed=1)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    run_extern_numpy(k, {"IMPL": "sdpa", "PRECISION": "bf16"}, ins)
    assert _EXTERN[k]["sdpa"]._sdpa.mask_kind == "dense"
    assert max_rel_error(run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0], ref) < 1e-5


def test_sdpa_keeps_nan_for_a_query_whose_every_key_is_masked():
    """PyTorch's SDPA gives 0 for a fully masked query; the kernel's meaning (softmax of all
    -inf) gives NaN, and so must the sdpa implementation (the model's zeroing is its epilogue)."""
    k = _kernel("attention", _bool_mask, CASES["bool-mask"][1])
    ins = _inputs(CASES["bool-mask"][1])
    ins[3][1] = False                                   # batch 1: every key masked
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    got = run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0]
    assert np.isnan(ref[1]).all() and np.isnan(got[1]).all()
    assert max_rel_error(got[0], ref[0]) < 1e-5


@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_runs_on_a_fused_kernel_not_the_math_fallback(name):
    """PyTorch's fused SDPA kernels (FlashAttention, memory-efficient, cuDNN; the CPU flash
    kernel) take only 4-D query, key and value: the extern once passed ``[batch, L, D]`` and every
    call fell back to the math kernel, which forms the score matrix. With only the flash backend
    enabled (torch's CPU flash kernel takes fp32 and any mask) the extern must still run, and match
    the float64 meaning."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    f, specs = CASES[name]
    k = _kernel("attention", f, specs)
    ins = _inputs(specs)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        got = run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0]
    assert max_rel_error(got, ref) < 1e-5


@pytest.mark.parametrize("d,offered", [(16, True), (12, False), (40, True), (320, False)])
def test_sdpa_offered_only_for_head_dims_a_fused_kernel_takes(d, offered):
    """A head dim that no fused SDPA kernel takes (not a multiple of 8, or over 256) would run the
    math fallback on a GPU, which forms the score matrix the simulator does not price: no sdpa
    config is searched there (the Triton flash kernel and cuBLAS still are)."""
    from lumc.backends.devices import H200
    qkv = [((B, H, LQ, d), dt.f32), ((B, H, LK, d), dt.f32), ((B, H, LK, d), dt.f32)]
    k = _kernel("attention", _plain, qkv)
    impls = {c["IMPL"] for c in bx.extern_configs(k, H200)}
    assert ("sdpa" in impls) == offered
    assert "cublas" in impls


def _pad_bias(q, k, v, m):
    """BERT's additive padding mask: (1 - m) * finfo.min, m an int [B, 1, 1, LK] input."""
    return softmax(_scores(q, k) + (1.0 - m.cast(dt.f32)) * float(np.finfo(np.float32).min), -1) @ v


@pytest.mark.parametrize("name,f,mspec,most", [
    ("bool padding", _bool_mask, ((B, 1, 1, LK), dt.bool_), B * LK),
    ("int padding bias", _pad_bias, ((B, 1, 1, LK), dt.i64), B * LK),
    ("per-query bias", _bias_epilogue, ((B, 1, LQ, LK), dt.f32), B * LQ * LK),
])
def test_sdpa_gets_the_mask_at_its_own_size(monkeypatch, name, f, mspec, most):
    """The mask SDPA reads is the score function at S = 0, formed where it varies only: a padding
    mask [B, 1, 1, N] reaches SDPA broadcastable ([1, B*H, 1, N] or smaller), not one value per
    score ([B*H, M, N]: at B = 8, H = 32, 4096 tokens, 17 GB of fp32). Values still match."""
    import torch
    from torch.nn import functional as F
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(None if attn_mask is None else attn_mask.shape)
        return real(q, k, v, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    specs = QKV + [mspec]
    k = _kernel("attention", f, specs)
    ins = _inputs(specs)
    if mspec[1] == dt.i64:
        ins[-1] = (np.arange(LK) < LK - 3 - np.arange(B)[:, None, None, None]).astype(np.int64)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    got = run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0]
    assert max_rel_error(got, ref) < 1e-5
    (shape,) = seen
    assert shape is not None and len(shape) == 4
    assert int(np.prod(shape)) <= most * H, (name, tuple(shape))


@pytest.mark.parametrize("value", [-1e4, 1.0, 0.0])
@pytest.mark.parametrize("axis", [2, 3])
def test_sdpa_mask_padded_with_a_constant(value, axis):
    """A mask padded with a constant (``F.pad(mask, value=-1e4)``, on the key or the query axis):
    the scalar read through the pad's masked view (a 0-d constant the broadcast mode took as 1-d
    crashed SDPA's mask with a RuntimeError); values match the float64 meaning."""
    short = list((B, 1, LQ, LK))
    short[axis] -= 4
    pads = [(0, 0)] * 4
    pads[axis] = (0, 4)

    def f(q, k, v, m):
        return softmax(_scores(q, k) + m.pad(pads, value), -1) @ v
    specs = QKV + [(tuple(short), dt.f32)]
    k = _kernel("attention", f, specs)
    ins = _inputs(specs)
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    got = run_extern_numpy(k, {"IMPL": "sdpa"}, ins)[0]
    # a query row biased by -1e4 throughout keeps its softmax, but fp32 scores of ~1 added to
    # -1e4 keep ~1e-3 of their value (ulp(1e4)): any fp32 kernel loses that much there
    assert max_rel_error(got, ref) < (1e-5 if abs(value) < 10 else 2e-3)
