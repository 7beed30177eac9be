"""Pointwise and gather kernels through the Triton interpreter, against the reference executor.

Ragged sizes 1, 7, 127, 1023, 4097; contiguous, transposed, broadcast, strided/flipped/padded
views; fp32 and fp16; Where, Cast, Gather; exact special constants; C fmod; int64 indexing.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node, input_node, node
from lumc.ir.kernels import Kernel
from lumc.ir.library.indexing import gather
from lumc.ir.tensor import Tensor
from lumc.backends.triton import TritonKernel, render
from lumc.backends.triton.launch import to_numpy
from triton_cases import check, make_kernel

SIZES = [1, 7, 127, 1023, 4097]
FLOATS = [dt.f32, dt.f16]


def _chain(a, b):
    return ((a * b + 1.0).exp() - a.sigmoid()).abs().sqrt() / (b * b + 1.0)


VARIANTS = {
    # contiguous elementwise chain over two same-shape inputs
    "contiguous": (lambda n: [((n,), None), ((n,), None)], _chain),
    # a is read transposed in place: [3, n] viewed as [n, 3]
    "transposed": (lambda n: [((3, n), None), ((n, 3), None)],
                   lambda a, b: _chain(a.transpose(0, 1), b)),
    # broadcast: [n, 1] against [1, 5]
    "broadcast": (lambda n: [((n, 1), None), ((1, 5), None)], lambda a, b: a * b + a.exp()),
    # strided, flipped and padded reads (offsets, negative strides, masks reading zero)
    "sliced": (lambda n: [((2 * n + 1,), None), ((n + 3,), None)],
               lambda a, b: a.slice([0], [2 * n_of(a)], [0], [2]).flip(0).pad([(2, 1)]) + b),
    # comparisons, Where and Cast (float -> int -> float, float -> bool)
    "where_cast": (lambda n: [((n,), None), ((n,), None)],
                   lambda a, b: a.lt(b).where(a * 3.0, (b * 4.0).cast(dt.i32).cast(a.dtype))
                   + b.cast(dt.bool_).cast(a.dtype)),
}


def n_of(a) -> int:
    return (a.shape[0] - 1) // 2


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("d", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_pointwise_variants(variant, d, n):
    specs, fn = VARIANTS[variant]
    k = make_kernel("pointwise", fn, [(s, d) for s, _ in specs(n)])
    check(k)


@pytest.mark.parametrize("n", SIZES)
def test_gather_rows_with_epilogue(n):
    """Embedding-style gather of rows, scaled: index values hit the first and last rows."""
    def build(table, idx):
        return gather(table, idx, axis=0) * 2.0 + 1.0
    k = make_kernel("gather", build, [((n, 5), dt.f32), ((3, 4), dt.i64)])
    idx = np.array([[0, n - 1, 0, n // 2], [n - 1, 1 % n, 0, 0], [n // 3, 0, n - 1, 0]])
    tbl = np.random.default_rng(1).standard_normal((n, 5)).astype(np.float32)
    check(k, {"in0": tbl, "in1": idx.astype(np.int64)})


def test_gather_inner_axis_negative_index_normalized():
    """ONNX Gather along axis 1 with negative indices (normalized by the library)."""
    k = make_kernel("gather", lambda t, i: gather(t, i, axis=1), [((4, 9, 3), dt.f16), ((5,), dt.i32)])
    check(k, {"in0": np.random.default_rng(2).standard_normal((4, 9, 3)).astype(np.float16),
              "in1": np.array([-1, 0, 8, -9, 3], dtype=np.int32)})


def _const_kernel(values, d):
    x = input_node("in0", (len(values),), d)
    # each value is a scalar constant kept inside the meaning, broadcast over the input
    outs = {}
    for i, v in enumerate(values):
        s = Tensor(const_node(np.array(v, dtype=d.np))).reshape((1,)).expand((len(values),))
        outs[f"out{i}"] = (Tensor(x) * 0.0 + s).node
    return Kernel("pointwise", Graph({"in0": x}, outs))


@pytest.mark.parametrize("d", [dt.f32, dt.f16, dt.f64], ids=str)
def test_exact_special_constants(d):
    """inf, -inf, NaN, -0.0, the smallest subnormal and the largest finite value keep their bits."""
    fi = np.finfo(d.np)
    values = [np.inf, -np.inf, np.nan, -0.0, float(fi.smallest_subnormal), float(fi.max),
              -float(fi.max), float(fi.tiny)]
    k = _const_kernel(values, d)
    src = render(k).source
    assert "float('inf')" in src and "float('-inf')" in src and "float('nan')" in src
    x = np.ones(len(values), dtype=d.np)
    outs = TritonKernel(k)(x)
    for v, o in zip(values, outs):
        got = to_numpy(o)
        want = (np.ones(len(values), dtype=d.np) * 0 + np.array(v, dtype=d.np)).astype(d.np)
        if np.isnan(v):
            assert np.isnan(got).all()
        else:
            # bit-exact: -0.0 stays negative, subnormals are not flushed
            assert got.view(f"u{d.itemsize}").tolist() == want.view(f"u{d.itemsize}").tolist(), v


def test_exact_integer_extremes():
    vals = [np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0, -1]
    x = input_node("in0", (4,), dt.i64)
    outs = {f"out{i}": (Tensor(x) + Tensor(const_node(np.array(v, dtype=np.int64)))
                        .reshape((1,)).expand((4,)) * 1).node for i, v in enumerate(vals)}
    k = Kernel("pointwise", Graph({"in0": x}, outs))
    check(k, {"in0": np.zeros(4, dtype=np.int64)})


def test_fmod_signs_float_and_int():
    """ONNX Mod(fmod=1): the result takes the dividend's sign, for floats and integers."""
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 7.0], dtype=np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, np.inf], dtype=np.float32)
    k = make_kernel("pointwise", lambda x, y: x.fmod(y), [((7,), dt.f32), ((7,), dt.f32)])
    check(k, {"in0": a, "in1": b}, tol=(0, 0))
    ai = np.array([7, -7, 7, -7, 0, 9, -9], dtype=np.int32)
    bi = np.array([3, 3, -3, -3, 5, 4, 4], dtype=np.int32)
    k = make_kernel("pointwise", lambda x, y: x.fmod(y), [((7,), dt.i32), ((7,), dt.i32)])
    check(k, {"in0": ai, "in1": bi})
    k = make_kernel("pointwise", lambda x, y: x.mod(y), [((7,), dt.i32), ((7,), dt.i32)])
    check(k, {"in0": ai, "in1": bi})


def test_cast_saturates_and_nan_is_zero():
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 2.9, -2.9, 0.0, 127.5, -128.7],
                 dtype=np.float32)
    for to in (dt.i32, dt.i8, dt.u8, dt.bool_):
        k = make_kernel("pointwise", lambda a: a.cast(to), [((10,), dt.f32)])
        check(k, {"in0": x})


def test_recip_and_sqrt_are_ieee_in_fp32():
    """Recip through div_rn and sqrt_rn: bit-equal to numpy's correctly rounded results."""
    x = np.random.default_rng(3).uniform(0.1, 1e4, 1023).astype(np.float32)
    k = make_kernel("pointwise", lambda a: a.recip() + a.sqrt(), [((1023,), dt.f32)])
    src = check(k, {"in0": x}, tol=(0, 0)).source
    assert "div_rn" in src and "sqrt_rn" in src


def test_iota_and_integer_arithmetic():
    def build(a):
        i = Tensor.iota(a.shape, 1, dt.i64)
        return (a * i + i.fmod(Tensor.full(a.shape, 3, dt.i64))) * 2
    k = make_kernel("pointwise", build, [((7, 127), dt.i64)])
    check(k)


def test_non_contiguous_runtime_input_is_made_contiguous():
    k = make_kernel("pointwise", lambda a: a * 2.0, [((5, 7), dt.f32)])
    base = torch.randn(7, 5)
    (out,) = TritonKernel(k)(base.t())
    np.testing.assert_array_equal(out.numpy(), (base.t() * 2).numpy())


def test_several_outputs_one_program():
    k = make_kernel("pointwise", lambda a, b: (a + b, (a * b).reshape((7, 127)), a.lt(b)),
                    [((127, 7), dt.f16), ((127, 7), dt.f16)])
    src = check(k).source
    assert src.count("tl.store(") == 3


def test_zero_size_output_launches_nothing():
    k = make_kernel("pointwise", lambda a: a * 2.0, [((0, 5), dt.f32)])
    (out,) = TritonKernel(k)(np.zeros((0, 5), np.float32))
    assert tuple(out.shape) == (0, 5)


def test_int64_indexing_when_an_index_passes_2_31():
    big = make_kernel("pointwise", lambda a: a + 1.0, [((2 ** 31 + 8,), dt.f16)])
    small = make_kernel("pointwise", lambda a: a + 1.0, [((2 ** 20,), dt.f16)])
    assert "tl.program_id(0).to(tl.int64)" in render(big).source
    assert "int64" not in render(small).source.split("def launch")[0].split('"""')[-1]
    # a broadcast view whose addresses stay small but whose output is huge still switches
    wide = make_kernel("pointwise", lambda a: a.reshape((1, 4)).expand((2 ** 29, 4)) * 2.0,
                       [((4,), dt.f32)])
    assert "to(tl.int64)" in render(wide).source


def test_node_level_gather_of_computed_table():
    """A Gather whose table is itself computed (exp of an input) reads it through the evaluator."""
    t = input_node("in0", (6, 3), dt.f32)
    i = input_node("in1", (4,), dt.i64)
    g = node("Gather", (Tensor(t).exp().node, i), 0)
    k = Kernel("gather", Graph({"in0": t, "in1": i}, {"out0": g}))
    check(k, {"in0": np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32),
              "in1": np.array([5, 0, 2, 5], dtype=np.int64)})


def test_fp64_math():
    """fp64 keeps fp64 (sqrt_rn and div_rn are fp32-only in Triton)."""
    k = make_kernel("pointwise", lambda a: a.abs().sqrt() + a.recip() + a.exp() + a.sin(),
                    [((127,), dt.f64)])
    check(k)
