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


# ---- constant rows: the mean on shifted data ------------------------------------------------------
def _constant_rows(rows: int, k: int, rng) -> np.ndarray:
    """Row 0 random; every other row one value ``c`` of random sign and magnitude (1e-3 to 1e6):
    ``fl(k * c) * fl(1/k)`` misses ``c`` for a third of them at ``k = 768``."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    c = rng.standard_normal(rows) * 10.0 ** rng.uniform(-3, 6, rows)
    x[1:] = c[1:, None].astype(np.float32)
    return x


def _ln_kernel(rows: int, k: int):
    from triton_cases import make_kernel
    return make_kernel("layernorm", lambda x: norm.layer_norm(x, _ones(k), epsilon=1e-12)[0],
                       [((rows, k), dt.f32)])


@pytest.mark.parametrize("k,block_k", [(768, None), (40, 16), (1023, 256)])
def test_layer_norm_of_a_constant_row_is_zero(k, block_k):
    """A constant row has mean ``c`` and variance 0, so LayerNorm gives 0 (eager's Welford mean
    is ``c`` exactly). The mean spelt ``sum * fl(1/k)`` is ``c`` only up to an ulp, and with
    BERT's ``eps = 1e-12`` the ulp became outputs up to 1.0 (row kernel one-pass and looped)."""
    rng = np.random.default_rng(k)
    kernel = _ln_kernel(12, k)
    x = _constant_rows(12, k, rng)
    feed = {"in0": x}
    for precision in ("native", "float64"):
        ref = ReferenceExecutor(kernel.meaning, precision)(feed)["out0"]
        np.testing.assert_array_equal(ref[1:], 0.0, err_msg=precision)
    tk = TritonKernel(kernel, None if block_k is None else "looped")
    cfg = None if block_k is None else configs.make(4, 2, BLOCK_M=2, BLOCK_K=block_k)
    got = to_numpy(tk(x, config=cfg)[0])
    assert ("Chan/Welford" in tk.source) == (block_k is not None)
    np.testing.assert_array_equal(got[1:], 0.0)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k,block_k", [(768, 1024), (40, 16), (129, 32)])
def test_layer_norm_formed_on_load_of_a_constant_row_is_zero(k, block_k):
    """The same through a contraction that forms the norm on load (``norm_prologue``'s Chan loop,
    one chunk and several): ``LN(c) @ W`` is 0."""
    rng = np.random.default_rng(k)
    x = Tensor(input_node("x", (9, k), dt.f32))
    w = (rng.standard_normal((k, 24)) / np.sqrt(k)).astype(np.float32)
    y = norm.layer_norm(x, _ones(k), epsilon=1e-12)[0] @ Tensor.const(w)
    call = build_call([y.node], lambda node_: False, push_views=False)
    xv = _constant_rows(9, k, rng)
    args = [xv if c.op == "Input" else c.arg.value for c in call.inputs]
    tk = TritonKernel(call.kernel)
    assert "mom_m2" in tk.source
    cfg = configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=block_k, GROUP_M=8, N_TILES=2,
                       PRECISION="ieee")
    got = to_numpy(tk(*args, config=cfg)[0])
    np.testing.assert_array_equal(got[1:], 0.0)
    ref = ReferenceExecutor(call.kernel.meaning)({f"in{i}": v for i, v in enumerate(args)})["out0"]
    np.testing.assert_array_equal(ref[1:], 0.0)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("d", [np.float32, np.float16, np.float64])
def test_shifted_mean_is_exact_on_constant_rows_and_keeps_inf_and_nan(d):
    from lumc.backends.row_moments import shifted_mean
    rng = np.random.default_rng(0)
    c = (rng.standard_normal(64) * 10.0 ** rng.uniform(-3, 4, 64)).astype(d)
    x = np.repeat(c[:, None], 768, axis=1)
    np.testing.assert_array_equal(shifted_mean(x, (1,), d)[:, 0], c)
    y = rng.standard_normal((4, 9)).astype(d)
    y[0, 0], y[1, 3], y[2, 2], y[3, 0] = np.inf, np.nan, -np.inf, np.nan
    with np.errstate(all="ignore"):
        plain = y.astype(np.float64).mean(1, keepdims=True).astype(d)
    np.testing.assert_array_equal(shifted_mean(y, (1,), d), plain)
    z = rng.standard_normal((3, 2, 5)).astype(np.float32)     # over two axes, first element shift
    np.testing.assert_allclose(shifted_mean(z, (1, 2), np.float64),
                               z.astype(np.float64).mean((1, 2), keepdims=True), rtol=1e-12)


def test_torch_replay_takes_the_mean_as_the_reference_does():
    """The torch fx replay of a primitive graph (``graph_torch``: the extern kernels' and the
    eager/Inductor rivals' program) takes a pair's mean on shifted data too: a constant row is 0,
    and the rest agrees with the reference executor."""
    import torch
    from lumc.compiler.runtime.graph_torch import graph_module, shifted_mean_op
    x = Tensor(input_node("x", (6, 768), dt.f32))
    y = norm.layer_norm(x, _ones(768), epsilon=1e-12)[0]
    g = Graph({"x": x.node}, {"y": y.node})
    v = _constant_rows(6, 768, np.random.default_rng(5))
    got = graph_module(g)(torch.from_numpy(v))[0].numpy()
    np.testing.assert_array_equal(got[1:], 0.0)
    np.testing.assert_allclose(got, ReferenceExecutor(g)({"x": v})["y"], rtol=1e-5, atol=1e-5)
    z = torch.tensor([[np.inf, 1.0, 2.0], [np.nan, 1.0, 2.0], [1.0, -np.inf, 2.0]])
    m = shifted_mean_op(z, (1,), "float32", "float32")
    assert m[0, 0] == np.inf and torch.isnan(m[1, 0]) and m[2, 0] == -np.inf   # the plain mean's


def _mean_kernel(rows: int, k: int, centered: bool):
    """A row mean ``sum(x) * fl(1/k)`` without its variance: a LayerNorm's first statistic where
    the search puts its two sums in two kernels (a split reduction of few long rows); centered:
    ``x - mean`` as a per-element output (one-pass and looped row kernels)."""
    from triton_cases import make_kernel

    def build(x):
        m = x.sum((1,), keepdims=True).mul(Tensor(const_node(np.float32(1 / k))))
        return x.sub(m) if centered else m
    return make_kernel("reduction", build, [((rows, k), dt.f32)])


@pytest.mark.parametrize("variant,k,cfg", [
    (None, 768, None),
    ("looped", 1023, configs.make(4, 2, BLOCK_M=2, BLOCK_K=256)),
    ("split", 3000, configs.make(4, 2, BLOCK_M=1, BLOCK_K=256, SPLIT=4)),
    ("split", 3000, configs.make(4, 2, BLOCK_M=2, BLOCK_K=512, SPLIT=8))])
def test_a_row_mean_alone_in_its_kernel_is_exact_on_a_constant_row(variant, k, cfg):
    """A LayerNorm of few 65536-long rows computes its mean in a split reduction and its variance
    in another: that mean is on shifted data too (kernel and reference), or ``x - mean`` of a
    constant row is an ulp of ``c`` and ``eps = 1e-12`` makes the output up to 1.0."""
    rng = np.random.default_rng(k)
    centered = variant != "split"
    kernel = _mean_kernel(12, k, centered)
    x = _constant_rows(12, k, rng)
    want = 0.0 if centered else x[1:, :1]
    for precision in ("native", "float64"):
        ref = ReferenceExecutor(kernel.meaning, precision)({"in0": x})["out0"]
        np.testing.assert_array_equal(ref[1:], want, err_msg=precision)
    tk = TritonKernel(kernel, variant)
    got = to_numpy(tk(x, config=cfg)[0])
    assert "shift" in tk.source
    np.testing.assert_array_equal(got[1:], want)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
    z = x.copy()
    z[1, 5], z[2, 0], z[3, k - 1] = np.inf, np.nan, -np.inf
    got = to_numpy(tk(z, config=cfg)[0])
    ref = ReferenceExecutor(kernel.meaning)({"in0": z})["out0"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))


@pytest.mark.parametrize("d,k,den", [(dt.bf16, 64, 63), (dt.f16, 768, 767), (dt.f32, 768, 767)])
def test_a_sum_scaled_by_another_reciprocal_is_no_mean(d, k, den):
    """``sum(x) * fl(1/(k-1))`` is no row mean: it keeps its spelling in the reference (and so in
    the kernels, ``find_means``). Within a tolerance of ``2 eps`` bf16's ``fl(1/63)`` passed for
    ``1/64``, and a row of ones gave 1.0 where the graph says 1.0156."""
    from lumc.backends.row_moments import find_means
    x = Tensor(input_node("x", (3, k), d))
    y = x.sum((1,), keepdims=True).mul(Tensor(const_node(np.array(1 / den, d.np))))
    g = Graph({"x": x.node}, {"y": y.node})
    assert find_means(g.nodes()) == []
    ones = np.ones((3, k), d.np)
    want = (np.array(np.float32(k), d.np) * np.array(1 / den, d.np)).astype(d.np)
    np.testing.assert_array_equal(ReferenceExecutor(g)({"x": ones})["y"], np.full((3, 1), want))


@pytest.mark.parametrize("d", [dt.bf16, dt.f16, dt.f32, dt.f64])
def test_a_mean_in_any_float_dtype_is_found(d):
    from lumc.backends.row_moments import find_means
    x = Tensor(input_node("x", (3, 768), d))
    y = x.sum((1,), keepdims=True).mul(Tensor(const_node(np.array(1 / 768, d.np))))
    assert len(find_means(Graph({"x": x.node}, {"y": y.node}).nodes())) == 1


def _trending_rows(k: int) -> np.ndarray:
    """Rows whose first chunk is far from the row's mean (a ramp, a ramp plus noise): the shifted
    values do not cancel, and a running sum over ``k / BLOCK_K`` chunks rounds at every step."""
    rng = np.random.default_rng(7)
    return np.stack([np.linspace(-1e4, 3e4, k) + rng.standard_normal(k),
                     rng.standard_normal(k) * 1e3 + np.arange(k)]).astype(np.float32)


def test_a_looped_shifted_mean_of_long_rows_is_within_an_ulp():
    """The shifted sum of a looped kernel is Kahan-compensated across chunks, as the sum it
    replaces: uncompensated, 256 chunks of a 65536-long ramp put the mean 3 ulps off (the
    ``sum * fl(1/k)`` it replaces was 0.2 ulp; ``row_moments`` promises an ulp)."""
    k = 65536
    x = _trending_rows(k)
    exact = x.astype(np.float64).mean(1)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    cfg = configs.make(4, 2, BLOCK_M=2, BLOCK_K=256)
    tk = TritonKernel(_mean_kernel(2, k, False), "looped")
    got = to_numpy(tk(x, config=cfg)[0]).astype(np.float64).ravel()
    assert (np.abs(got - exact) <= ulp).all(), np.abs(got - exact) / ulp
    # the Chan loop's mean (a LayerNorm's, ``x - mean`` with unit variance scale): same bound
    from triton_cases import make_kernel

    def build(xt):
        mean, var = norm._moments(xt, (1,))
        return mean, var
    kern = make_kernel("layernorm", build, [((2, k), dt.f32)])
    tk = TritonKernel(kern, "looped")
    assert "Chan/Welford" in tk.source
    got = to_numpy(tk(x, config=cfg)[0]).astype(np.float64).ravel()
    assert (np.abs(got - exact) <= ulp).all(), np.abs(got - exact) / ulp


@pytest.mark.parametrize("variant,cfg", [
    (None, None), ("looped", configs.make(4, 2, BLOCK_M=2, BLOCK_K=64)),
    ("split", configs.make(4, 2, BLOCK_M=1, BLOCK_K=128, SPLIT=4))])
def test_a_row_mean_near_the_top_of_the_range_stays_finite(variant, cfg):
    """Rows of 3e37 and 1e36, and one 3e37 among ones: their means are finite, as the reference
    (a float64 sum) gives. The first chunk's plain sum overflowed fp32, so the shift fell back to 0
    and the shifted sum overflowed too: inf where the mean is 3e37. (A row whose fp32 sum overflows
    in some order, +-3e37 alternating, is left out: its result depends on the order on any
    machine.)"""
    kernel = _mean_kernel(3, 768, centered=False)
    x = np.ones((3, 768), np.float32)
    x[0], x[1], x[2, 0] = 3e37, 1e36, 3e37
    ref = ReferenceExecutor(kernel.meaning)({"in0": x})["out0"]
    np.testing.assert_array_equal(ref[:2, 0], np.float32([3e37, 1e36]))
    got = to_numpy(TritonKernel(kernel, variant)(x, config=cfg)[0])
    np.testing.assert_array_equal(got[:2], ref[:2])
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-6)
    assert ref[2, 0] == np.float32((float(np.float32(3e37)) + 767) / 768)


@pytest.mark.parametrize("block_k", [1024, 32])
def test_a_one_pass_variance_layer_norm_formed_on_load_is_zero_on_a_constant_row(block_k):
    """JAX's spelling, ``var = max(E[x^2] - mean^2, 0)``, formed on load in a contraction: its mean
    and mean square are no moments pair, so the mean was ``sum * fl(1/K)``, an ulp off a constant
    row's value, and ``(x - mean) / sqrt(var + 1e-12)`` came out O(1) where the reference (which
    takes every row mean on shifted data) gives 0. The lone mean is shifted in the kernel too."""
    k, n = 129, 24
    rng = np.random.default_rng(7)
    x = Tensor(input_node("x", (9, k), dt.f32))
    inv = Tensor(const_node(np.float32(1 / k)))
    mean = x.sum((1,), keepdims=True).mul(inv)
    var = x.mul(x).sum((1,), keepdims=True).mul(inv).sub(mean.mul(mean))
    var = var.maximum(var.scalar_like(0.0))
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    y = x.sub(mean).mul(var.add(1e-12).sqrt().recip()) @ Tensor.const(w)
    call = build_call([y.node], lambda node_: False, push_views=False)
    xv = _constant_rows(9, k, rng)
    args = [xv if c.op == "Input" else c.arg.value for c in call.inputs]
    tk = TritonKernel(call.kernel)
    assert call.kernel.form == "matmul" and "shifted_sum" in tk.source
    cfg = configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=block_k, GROUP_M=8, N_TILES=2,
                       PRECISION="ieee")
    got = to_numpy(tk(*args, config=cfg)[0])
    ref = ReferenceExecutor(call.kernel.meaning)({f"in{i}": v for i, v in enumerate(args)})["out0"]
    np.testing.assert_array_equal(ref[1:], 0.0)
    np.testing.assert_array_equal(got[1:], 0.0)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-4)


def test_a_sum_only_its_mean_reads_is_not_summed_twice_but_a_kept_one_is_exact():
    """The reference takes a row mean from the sum's operand; a sum nothing else reads is then not
    computed again, while a sum asked for (a kernel boundary: ``run_keeping``) or read elsewhere
    keeps its own value, the float32 sum."""
    x = Tensor(input_node("x", (4, 768), dt.f32))
    s = x.sum((1,), keepdims=True)
    mean = s.mul(Tensor(const_node(np.float32(1 / 768))))
    g = Graph({"x": x.node}, {"m": mean.node})
    v = _constant_rows(4, 768, np.random.default_rng(2))
    ex = ReferenceExecutor(g)
    out, kept = ex.run_keeping({"x": v}, {id(s.node)})
    np.testing.assert_array_equal(out["m"][1:, 0], v[1:, 0])
    np.testing.assert_array_equal(kept[id(s.node)], v.sum(1, keepdims=True, dtype=np.float32))
    np.testing.assert_array_equal(ex({"x": v})["m"], out["m"])
    both = Graph({"x": x.node}, {"m": mean.node, "s": s.node})
    got = ReferenceExecutor(both)({"x": v})
    np.testing.assert_array_equal(got["s"], v.sum(1, keepdims=True, dtype=np.float32))


@pytest.mark.parametrize("precision", ["native", "float64"])
def test_a_mean_only_a_sum_reads_keeps_its_sum(precision):
    """A mean of a kept-dims mean (ONNX ``GlobalAveragePool`` then ``ReduceMean`` over the size-1
    dims) is a product read only by a sum, which the einsum evaluates from the first sum's value:
    that value must be the sum, not the row mean standing in for it (the result was the mean
    times ``1/L`` again: 20x too small at L = 20, in the quality gate and ``run --check``'s
    float64 judge)."""
    x = Tensor(input_node("x", (2, 16, 4, 5), dt.f32))
    y = x.mean((2, 3), keepdims=True).mean((2, 3))
    g = Graph({"x": x.node}, {"y": y.node})
    v = np.random.default_rng(0).standard_normal((2, 16, 4, 5)).astype(np.float32)
    got = ReferenceExecutor(g, precision)({"x": v})["y"]
    assert got.shape == (2, 16)
    np.testing.assert_allclose(got, v.astype(np.float64).mean((2, 3)), rtol=1e-6, atol=1e-7)
