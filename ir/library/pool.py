"""Pooling (ONNX ``MaxPool``, ``AveragePool``, ``LpPool`` and their ``Global*`` forms).

Each pool is a padding view plus one sliding-window view per spatial axis
(:func:`lumc.ir.library.conv.sliding_windows`) followed by one reduction over the kernel taps.
Max pooling pads with the dtype's minimum (``-inf`` for floats), so padding never wins; average and
Lp pooling pad with zero and divide by a constant table of per-position counts built from the static
shapes. ``x`` is ``[N, C, *spatial]``; ``pads`` lists all begins, then all ends.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lumc.ir.errors import ShapeError
from lumc.ir.library.conv import _ints, auto_pad_pads, conv_output_size, sliding_windows
from lumc.ir.tensor import Tensor


def _pool_geometry(x: Tensor, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, op: str):
    """``(kernel, strides, dilations, pads, out_sizes)`` of a pool over ``x``'s spatial axes."""
    if x.ndim < 3:
        raise ShapeError(f"needs x [N, C, *spatial], got {x.shape}", op=op)
    nsp = x.ndim - 2
    kernel = _ints(kernel_shape, nsp, 1, "kernel_shape")
    strides = _ints(strides, nsp, 1, "strides")
    dilations = _ints(dilations, nsp, 1, "dilations")
    if auto_pad != "NOTSET":
        pads = auto_pad_pads(x.shape[2:], kernel, strides, dilations, auto_pad)
    pads = _ints(pads, 2 * nsp, 0, "pads")
    try:
        outs = [conv_output_size(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                                 pads[nsp + i], bool(ceil_mode)) for i in range(nsp)]
    except ShapeError as e:
        raise ShapeError(e.reason, op=op) from None
    return kernel, strides, dilations, pads, outs


def _tap_axes(nsp: int) -> list[int]:
    return [3 + 2 * i for i in range(nsp)]


def _merge_outputs(y: Tensor, n: int, c: int, outs) -> Tensor:
    return y.reshape((n, c) + tuple(outs))


def max_pool(x: Tensor, kernel_shape: Sequence[int], *, strides=None, pads=None, dilations=None,
             ceil_mode: bool = False, auto_pad: str = "NOTSET") -> Tensor:
    """ONNX ``MaxPool`` (output ``Y`` only; see :func:`max_pool_indices` for ``Indices``).

    Args:
        x: ``[N, C, *in]``, float or integer.
        kernel_shape, strides, dilations: per spatial axis (strides and dilations default 1).
        pads: ``[begin_0.., end_0..]``, read as the dtype's minimum (``-inf``), never as 0.
        ceil_mode: round the output size up (a last window starting past the input is dropped).
        auto_pad: ``NOTSET``, ``SAME_UPPER``, ``SAME_LOWER`` or ``VALID``.
    Returns:
        ``[N, C, *out]``; a NaN anywhere in a window gives NaN (as PyTorch; exact otherwise).
    Raises:
        ShapeError: on a bad rank or a window that does not fit.
    """
    kernel, strides, dilations, pads, outs = _pool_geometry(
        x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, "MaxPool")
    win = sliding_windows(x, 2, kernel, strides, dilations, pads, outs, x.dtype.min_value())
    return _merge_outputs(win.max(_tap_axes(len(kernel)), keepdims=True), *x.shape[:2], outs)


def max_pool_indices(x: Tensor, kernel_shape: Sequence[int], *, strides=None, pads=None,
                     dilations=None, ceil_mode: bool = False, auto_pad: str = "NOTSET",
                     storage_order: int = 0) -> tuple[Tensor, Tensor]:
    """ONNX ``MaxPool`` with both outputs: ``(Y, Indices)``.

    ``Indices`` (i64) is the flat index of the chosen element in ``x`` (``storage_order`` 0:
    row-major; 1: column-major over the spatial axes), the first maximum in the window's
    row-major tap order; where the window holds a NaN, the first NaN.
    """
    kernel, strides, dilations, pads, outs = _pool_geometry(
        x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, "MaxPool")
    nsp = len(kernel)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    win = sliding_windows(x, 2, kernel, strides, dilations, pads, outs, x.dtype.min_value())
    taps = _tap_axes(nsp)
    y = win.max(taps, keepdims=True)
    # constant tables over (o_0, k_0, o_1, k_1, ...): the tap's rank and its flat source index
    geo = [(o, k) for o, k in zip(outs, kernel)]
    grid_shape = tuple(d for ok in geo for d in ok)
    rank_tab = np.zeros(grid_shape, np.int64)
    flat_tab = np.zeros(grid_shape, np.int64)
    inside = np.ones(grid_shape, bool)
    sp_strides = list(np.cumprod((1,) + tuple(spatial[::-1]))[:-1][::-1])
    if storage_order == 1:
        sp_strides = list(np.cumprod((1,) + tuple(spatial))[:-1])
    k_strides = list(np.cumprod((1,) + tuple(kernel[::-1]))[:-1][::-1])
    for i in range(nsp):
        o = np.arange(outs[i]).reshape(-1, 1)
        k = np.arange(kernel[i]).reshape(1, -1)
        pos = o * strides[i] - pads[i] + k * dilations[i]
        shp = [1] * (2 * nsp)
        shp[2 * i], shp[2 * i + 1] = outs[i], kernel[i]
        rank_tab = rank_tab + np.broadcast_to(k * k_strides[i], pos.shape).reshape(shp)
        flat_tab = flat_tab + (pos * sp_strides[i]).reshape(shp)
        inside = inside & ((pos >= 0) & (pos < spatial[i])).reshape(shp)
    big = int(np.prod(kernel))
    rank_tab = np.where(inside, rank_tab, big)    # padding taps never win
    rank_t = Tensor.const(rank_tab.reshape((1, 1) + grid_shape))
    hit = win.eq(y)
    if x.dtype.is_float:
        hit = hit.logical_or(win.isnan())
    first = hit.where(rank_t, Tensor.const(np.int64(big))).min(taps, keepdims=True)
    chosen = rank_t.eq(first)
    flat = chosen.where(Tensor.const(flat_tab.reshape((1, 1) + grid_shape)),
                        Tensor.const(np.int64(0))).sum(taps, keepdims=True)
    plane = int(np.prod(spatial))
    base = Tensor.iota((n, c), 0).mul(c * plane).add(Tensor.iota((n, c), 1).mul(plane))
    idx = _merge_outputs(flat, n, c, outs).add(base.reshape((n, c) + (1,) * nsp))
    return _merge_outputs(y, n, c, outs), idx


def _window_counts(size: int, out: int, kernel: int, stride: int, dilation: int, pad_begin: int,
                   lo: int, hi: int) -> np.ndarray:
    """Per output position, how many of its taps fall in ``[lo, hi)`` of the unpadded axis."""
    o = np.arange(out).reshape(-1, 1)
    pos = o * stride - pad_begin + np.arange(kernel).reshape(1, -1) * dilation
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def _divisor_table(x: Tensor, kernel, strides, dilations, pads, outs, count_include_pad) -> Tensor:
    nsp = len(kernel)
    table = np.ones((), np.float64)
    for i in range(nsp):
        size = x.shape[2 + i]
        lo, hi = (-pads[i], size + pads[nsp + i]) if count_include_pad else (0, size)
        cnt = _window_counts(size, outs[i], kernel[i], strides[i], dilations[i], pads[i], lo, hi)
        table = np.multiply.outer(table, cnt.astype(np.float64))
    with np.errstate(divide="ignore"):
        recip = (1.0 / table).astype(x.dtype.np)
    return Tensor.const(recip.reshape((1, 1) + tuple(outs)))


def avg_pool(x: Tensor, kernel_shape: Sequence[int], *, strides=None, pads=None,
             ceil_mode: bool = False, count_include_pad: bool = False, auto_pad: str = "NOTSET",
             dilations=None) -> Tensor:
    """ONNX ``AveragePool``.

    The window sum is multiplied by a constant reciprocal count: taps inside the input
    (``count_include_pad`` false) or inside the explicitly padded input (true; the extra end that
    ceil mode reads never counts). Error: the sum's rounding plus one rounding of ``1/count`` and
    one of the product (within 1.5 ulp of a true division of the same sum).

    Args:
        x: ``[N, C, *in]``, float.
    Returns:
        ``[N, C, *out]``.
    Raises:
        ShapeError: on a bad rank or a window that does not fit.
    """
    kernel, strides, dilations, pads, outs = _pool_geometry(
        x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, "AveragePool")
    xc = _wide(x)
    win = sliding_windows(xc, 2, kernel, strides, dilations, pads, outs, 0.0)
    s = _merge_outputs(win.sum(_tap_axes(len(kernel)), keepdims=True), *x.shape[:2], outs)
    return s.mul(_divisor_table(xc, kernel, strides, dilations, pads, outs,
                                count_include_pad)).cast(x.dtype)


def _wide(x: Tensor) -> Tensor:
    """``x`` in its accumulation dtype: an f16/bf16 window sum (or sum of squares) in f32, rounded
    once at the end, as a sum that passes 65504 would be inf in f16 where its average or norm is
    not; other dtypes as they are."""
    return x.cast(x.dtype.accumulator) if x.dtype.is_float else x


def _lp_norm(win: Tensor, axes, p: int, keepdims: bool) -> Tensor:
    """``(sum |x|**p) ** (1/p)`` over ``axes``; ``p = 2`` is ``sqrt(sum x*x)`` (exact ops only)."""
    p = int(p)
    if p < 1:
        raise ShapeError(f"LpPool needs p >= 1, got {p}", op="LpPool")
    if p == 2:
        return win.mul(win).sum(axes, keepdims).sqrt()
    s = win.abs().powi(p).sum(axes, keepdims)
    return s if p == 1 else s.pow(1.0 / p)


def lp_pool(x: Tensor, kernel_shape: Sequence[int], p: int = 2, *, strides=None, pads=None,
            dilations=None, ceil_mode: bool = False, auto_pad: str = "NOTSET") -> Tensor:
    """ONNX ``LpPool``: ``(sum over the window of |x|**p) ** (1/p)``, padding reads 0.

    ``p = 1`` and ``p = 2`` use exact primitives (``abs``, ``sqrt``); other ``p`` take the root as
    ``exp2(log2(s) / p)`` (a few ulp, see ``Tensor.pow``).
    """
    kernel, strides, dilations, pads, outs = _pool_geometry(
        x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, "LpPool")
    win = sliding_windows(_wide(x), 2, kernel, strides, dilations, pads, outs, 0.0)
    return _merge_outputs(_lp_norm(win, _tap_axes(len(kernel)), p, True), *x.shape[:2],
                          outs).cast(x.dtype)


def _spatial_axes(x: Tensor, op: str) -> list[int]:
    if x.ndim < 2:
        raise ShapeError(f"needs x [N, C, *spatial], got {x.shape}", op=op)
    return list(range(2, x.ndim))


def global_avg_pool(x: Tensor) -> Tensor:
    """ONNX ``GlobalAveragePool``: mean over every spatial axis, kept as size 1 (``[N, C, 1, ...]``)."""
    axes = _spatial_axes(x, "GlobalAveragePool")
    return x.mean(axes, keepdims=True) if axes else x


def global_max_pool(x: Tensor) -> Tensor:
    """ONNX ``GlobalMaxPool``: max over every spatial axis, kept as size 1; NaN propagates."""
    axes = _spatial_axes(x, "GlobalMaxPool")
    return x.max(axes, keepdims=True) if axes else x


def global_lp_pool(x: Tensor, p: int = 2) -> Tensor:
    """ONNX ``GlobalLpPool``: the Lp norm over every spatial axis, kept as size 1."""
    axes = _spatial_axes(x, "GlobalLpPool")
    return _lp_norm(_wide(x), axes, p, True).cast(x.dtype) if axes else x.abs()


__all__ = ["max_pool", "max_pool_indices", "avg_pool", "lp_pool", "global_avg_pool",
           "global_max_pool", "global_lp_pool"]
