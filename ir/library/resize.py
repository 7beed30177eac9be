"""ONNX ``Resize`` (opsets 11-19; also serves ``Upsample``) as gathers with constant tables.

Resize is separable: each resized axis is handled alone. At build time, from the static shapes,
numpy computes per output position along the axis its source taps (indices, clamped to the input as
the spec's edge padding says) and their weights; the graph then reads the taps with one ``Gather``
and, for linear and cubic modes, sums them times a constant weight table. Nearest resizing by an
integer factor that repeats each element is recognized and emitted as a pure view (reshape + expand).

Coordinates are computed in float32, the way onnxruntime computes them, so ties in nearest rounding
(``x.5``) almost always land on the same side as onnxruntime; a coordinate that is ``x.5`` only in
exact arithmetic (``half_pixel_symmetric`` at scale 0.6 on 7 elements) may round to the other
neighbor, as float rounding decides. Weights are rounded once to the tensor
dtype; the result differs from an exact interpolation by the rounding of at most 4 products and
sums per axis. A tap whose weight is exactly 0 adds nothing (an output on an input sample is that
sample, even beside an inf; onnxruntime and the ONNX reference give NaN there, each on one side).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lumc.ir.errors import ShapeError, UnsupportedOpError
from lumc.ir.library.indexing import take
from lumc.ir.tensor import Tensor, normalize_axis

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
MODES = ("nearest", "linear", "cubic")
F32 = np.float32


def output_shape(in_shape: Sequence[int], scales=None, sizes=None, axes=None,
                 keep_aspect_ratio_policy: str = "stretch") -> tuple[list[int], list[float]]:
    """``(out_shape, scales)`` of a Resize over every axis of ``in_shape`` (unlisted axes: scale 1).

    With ``scales``: ``out = floor(in * scale)`` (product in float32, as onnxruntime). With ``sizes``:
    ``scale = out / in``; the ``not_larger``/``not_smaller`` policies use one scale for all ``axes``
    (the min / max of the per-axis ones) and round ``in * scale`` half up.

    Raises:
        ShapeError: when neither or both of ``scales``/``sizes`` are given, lengths differ from
            ``axes``, or a scale is not positive.
    """
    rank = len(in_shape)
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    if (scales is None) == (sizes is None):
        raise ShapeError("Resize needs exactly one of scales and sizes", op="Resize")
    vals = [float(v) for v in (scales if scales is not None else sizes)]
    if len(vals) != len(axes):
        raise ShapeError(f"{len(vals)} scales/sizes for {len(axes)} axes", op="Resize")
    out = list(in_shape)
    sc = [1.0] * rank
    if scales is not None:
        for a, s in zip(axes, vals):
            if not s > 0:
                raise ShapeError(f"scale {s} must be positive", op="Resize")
            sc[a] = float(F32(s))
            out[a] = int(F32(s) * F32(in_shape[a]))
        return out, sc
    for a, n in zip(axes, vals):
        out[a] = int(n)
        sc[a] = float(F32(n) / F32(in_shape[a])) if in_shape[a] else 1.0
    if keep_aspect_ratio_policy != "stretch":
        if keep_aspect_ratio_policy not in ("not_larger", "not_smaller"):
            raise ShapeError(f"unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}",
                             op="Resize")
        pick = min if keep_aspect_ratio_policy == "not_larger" else max
        s = pick(sc[a] for a in axes)
        for a in axes:
            sc[a] = s
            out[a] = int(np.floor(F32(s) * F32(in_shape[a]) + F32(0.5)))
    return out, sc


def source_coordinates(mode: str, n_in: int, n_out: int, scale: float,
                       roi: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """Float32 source coordinate of each output index along one axis (ONNX
    ``coordinate_transformation_mode``), as onnxruntime computes it."""
    x = np.arange(n_out, dtype=F32)
    s, li, lo = F32(scale), F32(n_in), F32(n_out)
    half = F32(0.5)
    if mode == "half_pixel":
        return (x + half) / s - half
    if mode == "half_pixel_symmetric":
        adjustment = lo / (s * li)
        offset = (li / F32(2)) * (F32(1) - adjustment)
        return offset + (x + half) / s - half
    if mode == "pytorch_half_pixel":
        return (x + half) / s - half if n_out > 1 else np.zeros(n_out, F32)
    if mode == "align_corners":
        return x * (li - 1) / (lo - 1) if n_out > 1 else np.zeros(n_out, F32)
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / s
    if mode == "tf_crop_and_resize":
        r0, r1 = F32(roi[0]), F32(roi[1])
        if n_out > 1:
            return r0 * (li - 1) + (x * (r1 - r0) * (li - 1)) / (lo - 1)
        return np.full(n_out, half * (r0 + r1) * (li - 1), F32)
    raise ShapeError(f"unknown coordinate_transformation_mode {mode!r}", op="Resize")


def _nearest_index(xo: np.ndarray, nearest_mode: str) -> np.ndarray:
    fl = np.floor(xo)
    if nearest_mode == "round_prefer_floor":
        return np.where(xo - fl <= 0.5, fl, fl + 1)
    if nearest_mode == "round_prefer_ceil":
        return np.where(xo - fl < 0.5, fl, fl + 1)
    if nearest_mode == "floor":
        return fl
    if nearest_mode == "ceil":
        return np.ceil(xo)
    raise ShapeError(f"unknown nearest_mode {nearest_mode!r}", op="Resize")


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution weights of the taps at offsets -1, 0, 1, 2 for fraction ``t``."""
    t = t.astype(np.float64)

    def near(d):   # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):    # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


def _antialias_weights(t: np.ndarray, scale: float, mode: str, a: float):
    """Tap offsets and weights of the ONNX antialias filters (opset 18) when downsampling: the
    linear (triangle) or cubic kernel stretched by ``1 / scale``, normalized to sum 1."""
    s = min(scale, 1.0)
    if mode == "linear":
        start = int(np.floor(-1 / s) + 1)
        offs = np.arange(start, 2 - start)
        w = np.clip(1 - np.abs((offs[None, :] - t[:, None]) * s), 0, 1)
    else:
        start = int(np.floor(-2 / s) + 1)
        offs = np.arange(start, 2 - start)
        d = np.abs((offs[None, :] - t[:, None]) * s)
        w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                     np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    return offs, w / w.sum(axis=1, keepdims=True)


def axis_taps(n_in: int, n_out: int, scale: float, *, mode: str = "nearest",
              coordinate_transformation_mode: str = "half_pixel",
              nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75,
              exclude_outside: int = 0, roi: tuple[float, float] = (0.0, 1.0),
              antialias: int = 0):
    """Constant tables of one resized axis: ``(index [n_out, taps] i64, weight [n_out, taps] f64
    or None for nearest, outside [n_out] bool or None)``.

    ``outside`` marks outputs whose coordinate lies outside ``[0, n_in - 1]`` under
    ``tf_crop_and_resize`` (they read ``extrapolation_value``). Indices are clamped to the input
    (the spec's edge padding); ``exclude_outside`` zeroes the weights of taps outside the input
    and renormalizes. ``antialias`` widens linear/cubic filters by ``1 / scale`` when downsampling.
    """
    xo = source_coordinates(coordinate_transformation_mode, n_in, n_out, scale, roi)
    outside = None
    if coordinate_transformation_mode == "tf_crop_and_resize":
        outside = (xo < 0) | (xo > F32(n_in - 1))
    x64 = xo.astype(np.float64)
    if mode == "nearest":
        idx = _nearest_index(x64, nearest_mode).astype(np.int64).reshape(-1, 1)
        return np.clip(idx, 0, n_in - 1), None, outside
    base = np.floor(x64)
    t = x64 - base
    if antialias and mode in ("linear", "cubic") and scale < 1:
        offs, w = _antialias_weights(t, scale, mode, float(cubic_coeff_a))
    elif mode == "linear":
        offs = np.array([0, 1])
        w = np.stack([1 - t, t], axis=-1)
    elif mode == "cubic":
        offs = np.array([-1, 0, 1, 2])
        w = _cubic_weights(t, float(cubic_coeff_a))
    else:
        raise ShapeError(f"unknown mode {mode!r} (expected one of {MODES})", op="Resize")
    raw = base.astype(np.int64).reshape(-1, 1) + offs.reshape(1, -1)
    if exclude_outside:
        w = np.where((raw < 0) | (raw >= n_in), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return np.clip(raw, 0, n_in - 1), w, outside


def torch_axis_taps(n_in: int, n_out: int, mode: str, *, align_corners: bool = False,
                    scale: float | None = None, compute=np.float32):
    """Constant tables of one axis of PyTorch's ``upsample_nearest*`` / ``upsample_*linear*``
    (``aten/src/ATen/native/UpSample.h``), ``(index [n_out, taps] i64, weight [n_out, taps] f64 or
    None)`` as :func:`axis_taps` gives them.

    The source coordinate is computed in ``compute``, PyTorch's ``opmath`` type (float32, float64
    for double tensors): the ratio is ``1 / scale`` where the caller gave a scale factor, else
    ``n_in / n_out``; ``(n_in - 1) / (n_out - 1)`` with ``align_corners``. Nearest takes
    ``floor(dst * ratio)`` in float32 (``dst >> 1`` when doubling); linear ``ratio (dst + 0.5) -
    0.5`` clamped at 0 (or ``ratio dst``). An axis of unchanged size copies, whatever the scale.
    """
    if n_in == n_out:                                    # both modes copy
        return np.arange(n_out).reshape(-1, 1), (None if mode == "nearest" else np.ones((n_out, 1)))
    if mode == "nearest":
        if n_out == 2 * n_in:
            return (np.arange(n_out) >> 1).reshape(-1, 1), None
        compute = np.float32                             # nearest_idx: float whatever the dtype
    c = compute
    dst = np.arange(n_out, dtype=c)
    if mode == "linear" and align_corners:
        ratio = c(n_in - 1) / c(n_out - 1) if n_out > 1 else c(0)
    elif scale is not None and scale > 0:
        ratio = c(1.0 / scale)
    else:
        ratio = c(n_in) / c(n_out)
    if mode == "nearest":
        idx = np.minimum(np.floor(dst * ratio).astype(np.int64), n_in - 1)
        return idx.reshape(-1, 1), None
    src = ratio * dst if align_corners else np.maximum(ratio * (dst + c(0.5)) - c(0.5), c(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam1 = np.clip(src - i0.astype(c), c(0), c(1))
    i1 = i0 + (i0 < n_in - 1)
    w = np.stack([c(1) - lam1, lam1], axis=-1).astype(np.float64)
    return np.stack([i0, i1], axis=-1), w


def resize_axis(x: Tensor, axis: int, idx: np.ndarray, w: np.ndarray | None, *,
                skip_zero_taps: bool = False) -> Tensor:
    """``x`` resized along ``axis`` by the tables of :func:`axis_taps` or :func:`torch_axis_taps`
    (the taps read by one gather; weights rounded once to ``x``'s dtype).

    ``skip_zero_taps``: a tap whose weight is exactly 0 adds nothing (-0.0, the identity of
    addition), so an infinite input there does not give ``0 * inf = NaN``; an output on an input
    sample is that sample (ONNX: a weighted average of the neighborhood). Off (PyTorch's
    ``upsample_*`` multiplies every tap, and eager gives NaN there)."""
    return _resize_axis(x, normalize_axis(axis, x.ndim), idx, w, skip_zero_taps)


def _repeat_factor(idx: np.ndarray, n_in: int) -> int | None:
    """``r`` when ``idx[j] == j // r`` over exactly ``n_in * r`` outputs (nearest upsampling by an
    integer factor: a view), else None."""
    n_out = idx.shape[0]
    if idx.shape[1] != 1 or n_in == 0 or n_out % n_in:
        return None
    r = n_out // n_in
    return r if np.array_equal(idx[:, 0], np.arange(n_out) // r) else None


def _resize_axis(x: Tensor, axis: int, idx: np.ndarray, w: np.ndarray | None,
                 skip_zero_taps: bool) -> Tensor:
    n_in, (n_out, taps) = x.shape[axis], idx.shape
    if w is None:
        r = _repeat_factor(idx, n_in)
        if r is not None:
            y = x.reshape(x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
            y = y.expand(x.shape[:axis + 1] + (r,) + x.shape[axis + 1:])
            return y.reshape(x.shape[:axis] + (n_out,) + x.shape[axis + 1:])
        return take(x, Tensor.const(idx[:, 0].astype(np.int64)), axis)
    g = take(x, Tensor.const(idx.reshape(-1).astype(np.int64)), axis)
    g = g.reshape(x.shape[:axis] + (n_out, taps) + x.shape[axis + 1:])
    w = w.astype(x.dtype.np).reshape((n_out, taps) + (1,) * (x.ndim - axis - 1))
    terms = g.mul(Tensor.const(w))
    if skip_zero_taps and (w == 0).any():
        terms = Tensor.const(w != 0).where(terms, Tensor.full((), -0.0, x.dtype))
    return terms.sum([axis + 1])


def resize(x: Tensor, *, scales=None, sizes=None, mode: str = "nearest",
           coordinate_transformation_mode: str = "half_pixel",
           nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75,
           exclude_outside: int = 0, extrapolation_value: float = 0.0, roi=None, axes=None,
           keep_aspect_ratio_policy: str = "stretch", antialias: int = 0) -> Tensor:
    """ONNX ``Resize``.

    Args:
        x: any rank; float for ``linear``/``cubic``, any dtype for ``nearest``.
        scales / sizes: exactly one, one value per axis in ``axes`` (default: all axes).
        mode: ``nearest``, ``linear`` (N-linear) or ``cubic`` (N-cubic, Keys with ``cubic_coeff_a``).
        coordinate_transformation_mode: one of ``COORDINATE_MODES``.
        nearest_mode: one of ``NEAREST_MODES``.
        exclude_outside: zero the weights of taps outside the input and renormalize.
        extrapolation_value: output where a ``tf_crop_and_resize`` coordinate leaves the input.
        roi: ``[starts..., ends...]`` over ``axes`` (or all axes), for ``tf_crop_and_resize``.
        axes: the axes ``scales``/``sizes`` refer to (opset 18).
        keep_aspect_ratio_policy: ``stretch``, ``not_larger`` or ``not_smaller`` (with ``sizes``).
        antialias: 1 widens the linear/cubic filter by ``1 / scale`` on downsampled axes (opset 18);
            not allowed with ``nearest``.
    Returns:
        the resized tensor, same dtype.
    Raises:
        ShapeError: bad mode names or argument lengths, ``antialias`` with ``nearest``;
        UnsupportedOpError: linear/cubic on a non-float tensor.
    """
    if mode not in MODES:
        raise ShapeError(f"unknown mode {mode!r} (expected one of {MODES})", op="Resize")
    if coordinate_transformation_mode not in COORDINATE_MODES:
        raise ShapeError(f"unknown coordinate_transformation_mode {coordinate_transformation_mode!r}",
                         op="Resize")
    if antialias and mode == "nearest":
        raise ShapeError("antialias needs mode linear or cubic", op="Resize")
    if mode != "nearest" and not x.dtype.is_float:
        raise UnsupportedOpError(f"mode {mode!r} needs a float tensor, got {x.dtype}", op="Resize")
    rank = x.ndim
    ax_list = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    out, sc = output_shape(x.shape, scales, sizes, ax_list, keep_aspect_ratio_policy)
    rois = [(0.0, 1.0)] * rank
    if roi is not None and len(roi):
        roi = [float(v) for v in roi]
        if len(roi) != 2 * len(ax_list):
            raise ShapeError(f"roi has {len(roi)} values, expected {2 * len(ax_list)}", op="Resize")
        for i, a in enumerate(ax_list):
            rois[a] = (roi[i], roi[len(ax_list) + i])
    y = x
    outside = None
    for a in ax_list:
        n_in, n_out = x.shape[a], out[a]
        crop = coordinate_transformation_mode == "tf_crop_and_resize"
        if n_out == n_in and sc[a] == 1.0 and not (crop and rois[a] != (0.0, 1.0)):
            continue                                      # identity along this axis
        if n_in == 0 or n_out == 0:
            if n_in == 0 and n_out:
                raise ShapeError(f"cannot resize an empty axis {a} to {n_out}", op="Resize")
            y = y.slice([0], [0], [a])
            continue
        idx, w, out_mask = axis_taps(
            n_in, n_out, sc[a], mode=mode, coordinate_transformation_mode=coordinate_transformation_mode,
            nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a,
            exclude_outside=exclude_outside, roi=rois[a], antialias=antialias)
        y = _resize_axis(y, a, idx, w, skip_zero_taps=True)
        if out_mask is not None and out_mask.any():
            m = Tensor.const(out_mask.reshape((n_out,) + (1,) * (rank - a - 1)))
            outside = m if outside is None else outside.logical_or(m)
    if outside is not None:
        y = outside.where(Tensor.full((), extrapolation_value, y.dtype), y)
    return y


__all__ = ["resize", "output_shape", "source_coordinates", "axis_taps", "torch_axis_taps",
           "resize_axis"]
