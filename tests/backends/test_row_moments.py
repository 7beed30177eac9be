"""One pass for a layer norm's mean and variance (``lumc.backends.row_moments``): which statistics
pair, and the numerics of Chan's update in a kernel that forms the norm on load, against float64 on
rows built to break a naive one-pass variance (a large mean over a tiny spread), constant rows,
single-element rows, ragged chunks, and inf/NaN."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.row_moments import moment_pairs
from lumc.backends.triton import configs
from lumc.backends.triton.launch import TritonKernel, to_numpy
from lumc.compiler.core.kernel_builder import build_call
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node, input_node
from lumc.ir.library import norm
from lumc.ir.tensor import Tensor


def _ones(k: int) -> Tensor:
    return Tensor.const(np.ones(k, np.float32))


def _reductions(t: Tensor) -> list:
    return [n for n in Graph({}, {"y": t.node}).nodes() if n.op in ("SumReduce", "MaxReduce")]


def test_a_layer_norm_pairs_its_mean_and_variance():
    x = Tensor(input_node("x", (5, 12), dt.f32))
    red = _reductions(norm.layer_norm(x, _ones(12))[0])
    pairs = moment_pairs(red)
    assert len(pairs) == 1
    (s1, s2), = pairs.items()
    assert s1.srcs[0] is x.node and s2.srcs[0].op == "Mul"


def test_other_statistics_do_not_pair():
    """RMSNorm's mean square, and a variance scaled by 1/(L-1) (not the mean's deviations'
    mean): no pair, so they keep their own loops."""
    x = Tensor(input_node("x", (5, 12), dt.f32))
    assert moment_pairs(_reductions(norm.rms_norm(x, _ones(12)))) == {}
    m = x.sum((1,), keepdims=True).mul(Tensor(const_node(np.float32(1 / 11))))
    d = x.sub(m)
    v = d.mul(d).sum((1,), keepdims=True)
    assert moment_pairs(_reductions(v)) == {}


def _kernel(rows: int, k: int, n: int, rng):
    """``LN(x) @ W`` as one matmul kernel with the norm formed on load (no affine)."""
    x = Tensor(input_node("x", (rows, k), dt.f32))
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    y = norm.layer_norm(x, _ones(k))[0] @ Tensor.const(w)
    call = build_call([y.node], lambda node_: False, push_views=False)

    def args(xv):
        return [xv if c.op == "Input" else c.arg.value for c in call.inputs]
    return TritonKernel(call.kernel), call.kernel, w, args


def _ln64(x):
    x = x.astype(np.float64)
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("k", [3, 7, 40, 129])
def test_one_pass_statistics_match_float64_on_hard_rows(k):
    rng = np.random.default_rng(k)
    rows, n = 9, 24
    tk, kernel, w, args = _kernel(rows, k, n, rng)
    assert "mom_m2" in tk.source and tk.source.count("for s_start in range") == 1
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0] = 1e3 + x[0] * 0.1           # a large mean over a small spread: E[x^2] - E[x]^2 in
    #                                   fp32 would lose every digit of this variance
    x[1] = 3.0                         # a constant row: variance 0
    x[2] *= 1e-30                      # tiny values
    x[3] = -7.5e3 + x[3]
    want = _ln64(x) @ w.astype(np.float64)
    feed = {f"in{i}": v for i, v in enumerate(args(x))}
    ref = ReferenceExecutor(kernel.meaning)(feed)["out0"]   # f32 two-pass
    for cfg in (None, configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8,
                                   N_TILES=2, PRECISION="ieee")):
        got = to_numpy(tk(*args(x), config=cfg)[0]).astype(np.float64)
        # as close to float64 as the two-pass fp32 reference is, row by row (and never far)
        err = np.abs(got - want).max(-1)
        ref_err = np.abs(ref - want).max(-1)
        scale = np.abs(want).max(-1) + 1e-30
        assert np.all(err <= np.maximum(4 * ref_err, 2e-5 * scale)), (err, ref_err)


def test_one_pass_statistics_propagate_inf_and_nan_like_the_reference():
    rng = np.random.default_rng(0)
    tk, kernel, w, args = _kernel(6, 20, 8, rng)
    x = rng.standard_normal((6, 20)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, 5] = np.nan
    x[2, 0], x[2, 9] = np.inf, -np.inf
    got = to_numpy(tk(*args(x))[0])
    ref = ReferenceExecutor(kernel.meaning)({f"in{i}": v for i, v in enumerate(args(x))})["out0"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-4, atol=1e-4)


def test_rows_whose_squares_overflow_are_not_nan():
    """A row of magnitude 1e30: its squared deviations overflow, so the two-pass variance is +inf,
    ``rsqrt`` gives 0 and the normalized row is finite (0 here). Chan's first chunk has no running
    count: its cross term ``delta^2 * 0`` was ``inf * 0 = NaN`` and the row came out NaN."""
    rng = np.random.default_rng(4)
    tk, kernel, w, args = _kernel(4, 40, 8, rng)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    x[1] *= 1e30
    x[2] *= 1e19                        # squares just over the fp32 range
    ref = ReferenceExecutor(kernel.meaning)({f"in{i}": v for i, v in enumerate(args(x))})["out0"]
    assert np.isfinite(ref).all()
    for cfg in (None, configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8,
                                   N_TILES=2, PRECISION="ieee")):
        got = to_numpy(tk(*args(x), config=cfg)[0])
        assert not np.isnan(got).any(), np.argwhere(np.isnan(got))[:, 0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
