"""The ``scan`` kernel form (``render_scan``): a cumsum's triangular contraction computed as a
prefix sum, in the Triton interpreter, against numpy (float64 for floats, exact for integers) at
ragged lengths (one block, a ragged block, several blocks with a carried sum), every
exclusive/reverse combination, any axis, zero-size rows and rank 1; and its simulated time
against the contraction it replaces."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.devices import H200
from lumc.backends.reference import run_reference
from lumc.backends.simulator import simulate_kernel_time
from lumc.backends.triton import TritonKernel, configs
from lumc.backends.triton.launch import to_numpy
from lumc.backends.scan_structure import scan_of
from lumc.ir import dtypes as dt
from lumc.ir.library.reduce import prefix_contraction
from lumc.ir.tensor import Tensor

from triton_cases import make_kernel


def numpy_scan(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX CumSum in numpy (float64 for floats; integers wrap in their dtype)."""
    v = x.astype(np.float64) if x.dtype.kind == "f" else x
    if reverse:
        v = np.flip(v, axis)
    s = np.cumsum(v, axis=axis, dtype=v.dtype)
    if exclusive:
        s = s - v if v.dtype.kind != "f" else np.concatenate(
            [np.zeros_like(np.take(s, [0], axis=axis)), np.delete(s, -1, axis=axis)], axis=axis) \
            if s.shape[axis] else s
    return np.flip(s, axis) if reverse else s


def finite_operand(a):
    """The library's float cumsum operand: ``x`` where finite, else 0."""
    return a.lt(a.scalar_like(np.inf)).where(
        a.scalar_like(-np.inf).lt(a).where(a, a.scalar_like(0.0)), a.scalar_like(0.0))


def scan_kernel(shape, dtype, axis, exclusive, reverse):
    op = finite_operand if dtype.is_float else (lambda a: a)
    return make_kernel("scan", lambda a: prefix_contraction(op(a), axis, exclusive, reverse),
                       [(shape, dtype)])


def run_interpreted(kernel, x, config=None):
    tk = TritonKernel(kernel)
    return to_numpy(tk(x, config=config)[0])


COMBOS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("length", [1, 7, 1000, 4097])
@pytest.mark.parametrize("exclusive,reverse", COMBOS)
@pytest.mark.parametrize("dtype", [dt.i64, dt.f32])
def test_scan_kernel_matches_numpy(length, exclusive, reverse, dtype):
    """Two rows along the last axis; 4097 walks five 1024-wide blocks (the interpreter's config)
    with a carried sum, 1000 one ragged block."""
    rng = np.random.default_rng(length)
    if dtype.is_float:
        x = rng.standard_normal((2, length)).astype(np.float32)
    else:
        x = rng.integers(-2 ** 40, 2 ** 40, (2, length)).astype(np.int64)
    k = scan_kernel((2, length), dtype, 1, exclusive, reverse)
    got = run_interpreted(k, x)
    want = numpy_scan(x, 1, exclusive, reverse)
    assert got.shape == x.shape and got.dtype == x.dtype
    if dtype.is_float:
        scale = np.cumsum(np.abs(x.astype(np.float64)), axis=1)[:, -1:]
        np.testing.assert_allclose(got, want, rtol=0, atol=float(scale.max()) * 4e-7 + 1e-6)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,axis", [((5, 300, 3), 1), ((300,), 0), ((0, 9), 1),
                                        ((4, 0), 1), ((6, 33), 0)])
@pytest.mark.parametrize("exclusive,reverse", [(False, True), (True, False)])
def test_scan_kernel_any_axis_rank_one_and_empty(shape, axis, exclusive, reverse):
    """Not the last axis, a rank-1 scan, zero rows and a zero-length scan; int32 exact, with
    a 100-wide block (three and a ragged fourth) on the 300-long axes."""
    x = np.random.default_rng(3).integers(-1000, 1000, shape).astype(np.int32)
    k = scan_kernel(shape, dt.i32, axis, exclusive, reverse)
    cfg = configs.make(4, 1, BLOCK=128) if shape[axis] >= 128 else None
    got = run_interpreted(k, x, cfg)
    np.testing.assert_array_equal(got, numpy_scan(x, axis, exclusive, reverse).astype(np.int32))


def test_scan_kernel_sign_of_zero_and_infinities():
    """The scan of the finite part: a zero sum is +0.0, as the contraction it computes (the
    reference's sum starts from +0.0; the library's cumsum gives a run of -0.0 its sign itself),
    an infinity reads as 0 (the library counts infinities in separate scans)."""
    x = np.array([[-0.0, -0.0, 1.0, -1.0], [np.inf, -0.0, 2.0, -np.inf]], np.float32)
    k = scan_kernel(x.shape, dt.f32, 1, False, False)
    got = run_interpreted(k, x)
    want = np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 2.0, 2.0]], np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.signbit(got).tolist() == np.signbit(want).tolist()
    ref = run_reference(k.meaning, {"in0": x})["out0"].reshape(x.shape)
    assert np.signbit(got).tolist() == np.signbit(ref).tolist()


def test_scan_needs_a_finite_operand():
    """A float contraction of raw data is not a scan (``0 * inf`` is NaN there, not here)."""
    k = make_kernel("scan", lambda a: prefix_contraction(a, 1), [((2, 9), dt.f32)])
    red = next(n for n in k.meaning.nodes() if n.op == "SumReduce")
    assert scan_of(red) is None
    assert scan_of(next(n for n in scan_kernel((2, 9), dt.f32, 1, 0, 0).meaning.nodes()
                        if n.op == "SumReduce")) is not None


def test_simulated_scan_beats_the_contraction_at_4096():
    """At L = 4096 the scan moves the row once (no L x L mask, no L^2 multiply-adds): its best
    simulated config is several times faster than the contraction's best on the same rows."""
    scan = scan_kernel((2, 4096), dt.f32, 1, False, False)
    mm = make_kernel("matmul", lambda a: prefix_contraction(finite_operand(a), 1),
                     [((2, 4096), dt.f32)])
    assert scan.flops() == 2 * 4096 * 3    # an add and two compares per element, no mask
    t_scan = min(simulate_kernel_time(scan, c.kwargs(), H200)
                 for c in configs.config_space("scan", {"M": 2, "K": 4096}))
    from lumc.backends.triton import render
    rk = render(mm)
    times = []
    for c in configs.config_space(rk.config_space, rk.problem):
        try:
            times.append(simulate_kernel_time(mm, c.kwargs(), H200))
        except ValueError:      # a config over the shared memory of a block
            pass
    t_mm = min(times)
    assert t_scan * 2 < t_mm, (t_scan, t_mm)


@pytest.mark.parametrize("exclusive,reverse", COMBOS)
def test_one_scan_module_serves_every_size_of_a_range(exclusive, reverse):
    """A range's scan kernel is rendered at the probe prime and its sizes made arguments
    (``size_generic``): a reversed scan's start ``L - 1`` must follow the size too."""
    from lumc.backends.triton.size_generic import SizedKernel
    from lumc.ir.symbolic import probing
    p = 61
    with probing([p]):
        k = scan_kernel((2, p), dt.i64, 1, exclusive, reverse)
        sk = SizedKernel(k, {p: "L0"})
    assert sk.rendered.size_args == ("L0",)
    for n in (1, 6, 64, 1500):
        x = np.random.default_rng(n).integers(-99, 99, (2, n)).astype(np.int64)
        got = to_numpy(sk(x, sizes={"L0": n})[0])
        np.testing.assert_array_equal(got, numpy_scan(x, 1, exclusive, reverse), err_msg=str(n))


def _red(kernel):
    return next(n for n in kernel.meaning.nodes() if n.op == "SumReduce")


@pytest.mark.parametrize("src,dst,finite", [(dt.i32, dt.f16, False), (dt.u16, dt.f16, False),
                                            (dt.i16, dt.f16, True), (dt.i64, dt.f32, True),
                                            (dt.u64, dt.bf16, True)])
def test_an_integer_cast_is_finite_only_where_the_float_holds_its_range(src, dst, finite):
    """int32 70000 cast to f16 is inf (so is uint16 65535): the contraction's ``0 * inf`` is NaN
    before it, a scan would skip it. Such a cast is not a finite operand; int16 to f16 and any
    integer to f32/bf16 are."""
    k = make_kernel("scan", lambda a: prefix_contraction(a.cast(dst), 1), [((2, 5), src)])
    assert (scan_of(_red(k)) is not None) is finite
    if not finite:
        x = np.array([[1, 2, 65535, 3, 4]] * 2).astype(src.np)
        got = run_reference(k.meaning, {"in0": x})["out0"].astype(np.float64)
        assert np.isnan(got[:, :2]).all() and np.isinf(got[:, 2:]).all(), got


def test_a_padded_one_is_not_a_triangular_mask():
    """A mask ``where(j <= i, pad(ones[n, n - 1]), 0)`` has a zero last column: its contraction
    drops ``v[n - 1]`` from the last row, a prefix sum would not. A masked (padded) view of a
    scalar is not that scalar everywhere, so this is no scan."""
    n = 6

    def build(a):
        i, j = Tensor.iota((n, n), 0), Tensor.iota((n, n), 1)
        ones = Tensor.full((n, n - 1), 1, dt.i64).pad([(0, 0), (0, 1)])
        m = i.lt(j).logical_not().where(ones, Tensor.full((n, n), 0, dt.i64))
        big = (2, n, n)
        return m.reshape((1, n, n)).expand(big).mul(a.unsqueeze([1]).expand(big)).sum(2)

    k = make_kernel("scan", build, [((2, n), dt.i64)])
    assert scan_of(_red(k)) is None
    x = np.arange(1, 2 * n + 1, dtype=np.int64).reshape(2, n)
    got = run_reference(k.meaning, {"in0": x})["out0"].reshape(2, n)
    want = np.cumsum(x, 1)
    want[:, -1] -= x[:, -1]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("exclusive,reverse", COMBOS)
@pytest.mark.parametrize("dtype,shape,axis", [(dt.i64, (3, 1100, 2), 1), (dt.f32, (2, 9), 1),
                                              (dt.i32, (1, 5), 1)])
def test_the_reference_sums_a_scan_as_a_cumsum(exclusive, reverse, dtype, shape, axis, monkeypatch):
    """The reference executor evaluates a prefix-sum contraction with ``numpy.cumsum``, ``O(L)`` a
    row: as the contraction it took minutes at 4096 x 4096 (``stage_reference`` of a compile,
    past its budget). Its values are the contraction's: exact (wrapping) integers, a zero float
    sum +0.0."""
    import lumc.backends.reference as reference

    def no_einsum(*args, **kwargs):
        raise AssertionError("the scan was contracted")
    k = scan_kernel(shape, dtype, axis, exclusive, reverse)
    rng = np.random.default_rng(3)
    if dtype.is_float:
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, :3] = -0.0
        x[1, 4] = np.inf
    else:
        x = rng.integers(np.iinfo(dtype.np).min, np.iinfo(dtype.np).max, shape, dtype=dtype.np)
    want = np.asarray(run_reference(k.meaning, {"in0": x})["out0"])
    monkeypatch.setattr(reference, "_einsum_sum_of_product", no_einsum)
    got = np.asarray(run_reference(k.meaning, {"in0": x})["out0"])
    assert got.shape == want.shape and got.dtype == want.dtype
    if dtype.is_float:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
        assert not np.signbit(got[got == 0]).any()
    else:
        np.testing.assert_array_equal(got, want)
        xs = np.flip(x, axis) if reverse else x
        s = np.cumsum(xs, axis, dtype=dtype.np) - (xs if exclusive else 0)
        np.testing.assert_array_equal(got.reshape(shape), np.flip(s, axis) if reverse else s)
