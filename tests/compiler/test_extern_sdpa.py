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
