"""Softmax and normalization ops (ONNX ``Softmax``, ``LayerNormalization``, ``BatchNormalization``...)
built from primitives.

Shapes follow the ONNX operator of the same name; axes may be negative. f16/bf16 inputs are computed
in f32 (the ONNX ``stash_type`` default and what onnxruntime does) and the result rounded once, so
their error is one f16/bf16 rounding. Statistics use the two-pass form ``mean((x - mean)^2)``, never
``E[x^2] - E[x]^2``, which cancels catastrophically when ``|mean| >> std``.

Errors: :class:`~lumc.ir.errors.ShapeError` for non-float inputs, bad axes and parameter shapes that
do not fit; :class:`~lumc.ir.errors.ModelError` for attribute values the ONNX spec forbids.
"""
from __future__ import annotations

from typing import Sequence

from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError, ShapeError
from lumc.ir.tensor import Tensor, broadcast_shapes, normalize_axis
from lumc.ir.views import prod


def _widen(x: Tensor, op: str, to: dt.DType | None = None) -> Tensor:
    if not x.dtype.is_float:
        raise ShapeError(f"needs a float tensor, got {x.dtype}", op=op)
    return x.cast(to or x.dtype.accumulator)


def _param(p: Tensor, shape: Sequence[int], like: Tensor, op: str, name: str) -> Tensor:
    """Parameter ``p`` in ``like``'s dtype, unidirectionally broadcast to ``shape``."""
    if broadcast_shapes(p.shape, shape) != tuple(shape):
        raise ShapeError(f"{name} of shape {p.shape} does not broadcast to {tuple(shape)}", op=op)
    return _widen(p, op, like.dtype).expand(tuple(shape))


def _moments(xc: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Mean and biased variance over ``axes`` (kept as size-1 dims); NaN for an empty set."""
    mean = xc.mean(axes, keepdims=True)
    d = xc.sub(mean)
    return mean, d.mul(d).mean(axes, keepdims=True)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """ONNX ``Softmax`` (opset 13): ``exp(x - max) / sum(exp(x - max))`` along ``axis``.

    A row that is all ``-inf``, or holds ``+inf`` or NaN, gives NaN throughout (as onnxruntime).
    Error: a few ulp (the exp, one reciprocal and one product). Shape and dtype of ``x``.
    """
    xc = _widen(x, "Softmax")
    axis = normalize_axis(axis, x.ndim)
    e = xc.sub(xc.max(axis, keepdims=True)).exp()
    # one reciprocal per row, then products: the spelling the softmax kernel form matches
    return e.mul(e.sum(axis, keepdims=True).expand(e.shape).recip()).cast(x.dtype)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """ONNX ``LogSoftmax`` (opset 13): ``(x - max) - log(sum(exp(x - max)))`` along ``axis``; never
    overflows; special values as :func:`softmax`. Shape and dtype of ``x``."""
    xc = _widen(x, "LogSoftmax")
    axis = normalize_axis(axis, x.ndim)
    d = xc.sub(xc.max(axis, keepdims=True))
    return d.sub(d.exp().sum(axis, keepdims=True).log()).cast(x.dtype)


def _legacy(fn, x: Tensor, axis: int) -> Tensor:
    """Opset < 13 form: coerce ``x`` to 2-D ``[prod(shape[:axis]), prod(shape[axis:])]``, apply
    ``fn`` along the second dim, reshape back."""
    if x.ndim == 0:
        return fn(x.reshape((1, 1)), 1).reshape(())
    axis = normalize_axis(axis, x.ndim)
    return fn(x.flatten(axis), 1).reshape(x.shape)


def softmax_legacy(x: Tensor, axis: int = 1) -> Tensor:
    """ONNX ``Softmax`` for opset < 13: the softmax of each ``x.flatten(axis)`` row."""
    return _legacy(softmax, x, axis)


def log_softmax_legacy(x: Tensor, axis: int = 1) -> Tensor:
    """ONNX ``LogSoftmax`` for opset < 13: the log-softmax of each ``x.flatten(axis)`` row."""
    return _legacy(log_softmax, x, axis)


def layer_norm(x: Tensor, scale: Tensor, bias: Tensor | None = None, *, axis: int = -1,
               epsilon: float = 1e-5, stash_dtype: dt.DType | None = None
               ) -> tuple[Tensor, Tensor, Tensor]:
    """ONNX ``LayerNormalization`` (opset 17) over dims ``axis..rank-1``.

    Args:
        x: float tensor of any rank >= 1.
        scale, bias: broadcastable to ``x.shape[axis:]`` (``bias`` optional), dtype of ``x``.
        stash_dtype: dtype of the statistics and of the computation (ONNX ``stash_type``); default
            f32 for f16/bf16/f32 and f64 for f64 inputs.
    Returns:
        ``(Y, Mean, InvStdDev)``: ``Y = (x - Mean) * InvStdDev * scale + bias`` with ``x``'s shape and
        dtype; ``Mean`` and ``InvStdDev = 1 / sqrt(var + epsilon)`` of shape
        ``x.shape[:axis] + (1,) * (rank - axis)`` in ``stash_dtype``.
    Raises:
        ShapeError: non-float ``x``, bad ``axis``, or parameters that do not broadcast.
    """
    xc = _widen(x, "LayerNormalization", stash_dtype)
    axis = normalize_axis(axis, x.ndim)
    axes = tuple(range(axis, x.ndim))
    mean, var = _moments(xc, axes)
    inv = var.add(epsilon).sqrt().recip()
    y = xc.sub(mean).mul(inv).mul(_param(scale, x.shape[axis:], xc, "LayerNormalization", "scale"))
    if bias is not None:
        y = y.add(_param(bias, x.shape[axis:], xc, "LayerNormalization", "bias"))
    return y.cast(x.dtype), mean, inv


def _channel_param(p: Tensor, x: Tensor, like: Tensor, op: str, name: str) -> Tensor:
    """A per-channel ``[C]`` parameter reshaped to ``[C, 1, ..., 1]`` and broadcast to ``x``."""
    c = x.shape[1]
    if p.shape != (c,):
        raise ShapeError(f"{name} must have shape ({c},), got {p.shape}", op=op)
    return _widen(p, op, like.dtype).reshape((c,) + (1,) * (x.ndim - 2)).expand(x.shape)


def _needs_channels(x: Tensor, op: str) -> None:
    if x.ndim < 2:
        raise ShapeError(f"input must have rank >= 2 ([N, C, ...]), got shape {x.shape}", op=op)


def batch_norm(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, *,
               epsilon: float = 1e-5) -> Tensor:
    """ONNX ``BatchNormalization`` in inference mode:
    ``(x - mean) * (scale / sqrt(var + epsilon)) + bias`` per channel.

    Args:
        x: ``[N, C, D1, ...]`` float.
        scale, bias, mean, var: ``[C]``.
    Returns:
        ``Y`` of ``x``'s shape and dtype; error a few ulp.
    Raises:
        ShapeError: rank < 2, non-float, or parameters not of shape ``[C]``.
    """
    op = "BatchNormalization"
    _needs_channels(x, op)
    xc = _widen(x, op)
    mul = _channel_param(scale, x, xc, op, "scale").mul(
        _channel_param(var, x, xc, op, "var").add(epsilon).sqrt().recip())
    y = xc.sub(_channel_param(mean, x, xc, op, "mean")).mul(mul)
    return y.add(_channel_param(bias, x, xc, op, "bias")).cast(x.dtype)


def instance_norm(x: Tensor, scale: Tensor, bias: Tensor, *, epsilon: float = 1e-5) -> Tensor:
    """ONNX ``InstanceNormalization``: normalize each ``(n, c)`` over the spatial dims, then
    ``* scale[c] + bias[c]``.

    Args:
        x: ``[N, C, D1, ...]`` float; scale, bias: ``[C]``.
    Returns:
        ``Y`` of ``x``'s shape and dtype.
    Raises:
        ShapeError: rank < 2, non-float, or parameters not of shape ``[C]``.
    """
    op = "InstanceNormalization"
    _needs_channels(x, op)
    xc = _widen(x, op)
    mean, var = _moments(xc, tuple(range(2, x.ndim)))
    y = xc.sub(mean).mul(var.add(epsilon).sqrt().recip())
    y = y.mul(_channel_param(scale, x, xc, op, "scale"))
    return y.add(_channel_param(bias, x, xc, op, "bias")).cast(x.dtype)


def group_norm(x: Tensor, scale: Tensor, bias: Tensor, num_groups: int,
               epsilon: float = 1e-5) -> Tensor:
    """ONNX ``GroupNormalization``: split the ``C`` channels into ``num_groups`` groups, normalize each
    ``(n, group)`` over its channels and spatial dims, then apply ``scale``/``bias``.

    Args:
        x: ``[N, C, D1, ...]`` float, ``C`` divisible by ``num_groups``.
        scale, bias: ``[C]`` (opset 21: per channel) or ``[num_groups]`` (opset 18: per group, each
            value applied to all the group's channels). The two readings agree when
            ``num_groups == C``.
    Returns:
        ``Y`` of ``x``'s shape and dtype.
    Raises:
        ShapeError: rank < 2, non-float, ``C % num_groups != 0``, or parameters of another shape.
    """
    op = "GroupNormalization"
    _needs_channels(x, op)
    n, c = x.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise ShapeError(f"{c} channels do not split into {num_groups} groups", op=op)
    xc = _widen(x, op)
    g = xc.reshape((n, num_groups, (c // num_groups) * prod(x.shape[2:])))
    mean, var = _moments(g, (2,))
    y = g.sub(mean).mul(var.add(epsilon).sqrt().recip()).reshape(x.shape)

    def per_channel(p: Tensor, name: str) -> Tensor:
        if p.shape == (num_groups,) and num_groups != c:
            p = p.reshape((num_groups, 1)).expand((num_groups, c // num_groups)).reshape((c,))
        return _channel_param(p, x, xc, op, name)
    return y.mul(per_channel(scale, "scale")).add(per_channel(bias, "bias")).cast(x.dtype)


def rms_norm(x: Tensor, scale: Tensor, *, axis: int = -1, epsilon: float = 1e-5) -> Tensor:
    """ONNX ``RMSNormalization`` (opset 23): ``x / sqrt(mean(x^2) + epsilon) * scale`` over dims
    ``axis..rank-1``.

    Args:
        x: float tensor; scale: broadcastable to ``x.shape[axis:]``.
    Returns:
        ``Y`` of ``x``'s shape and dtype.
    Raises:
        ShapeError: non-float, bad ``axis``, or a ``scale`` that does not broadcast.
    """
    op = "RMSNormalization"
    xc = _widen(x, op)
    axis = normalize_axis(axis, x.ndim)
    ms = xc.mul(xc).mean(tuple(range(axis, x.ndim)), keepdims=True)
    y = xc.mul(ms.add(epsilon).sqrt().recip())
    return y.mul(_param(scale, x.shape[axis:], xc, op, "scale")).cast(x.dtype)


def lp_normalization(x: Tensor, axis: int = -1, p: int = 2) -> Tensor:
    """ONNX ``LpNormalization``: ``x / ||x||_p`` along ``axis`` for ``p`` in {1, 2}; a row whose
    norm is 0 gives 0 (as onnxruntime). The norm is not rescaled, so (as in onnxruntime) ``p = 2``
    overflows to 0 for ``|x| > 1.8e19`` in fp32. Shape and dtype of ``x``.

    Raises:
        ModelError: ``p`` not 1 or 2.  ShapeError: non-float or bad ``axis``.
    """
    op = "LpNormalization"
    if p not in (1, 2):
        raise ModelError(f"p must be 1 or 2, got {p}", op=op)
    xc = _widen(x, op)
    axis = normalize_axis(axis, x.ndim)
    norm = (xc.abs() if p == 1 else xc.mul(xc)).sum(axis, keepdims=True)
    if p == 2:
        norm = norm.sqrt()
    zero = norm.scalar_like(0.0)
    # exactly zero (a NaN norm is not: its row stays NaN, as onnxruntime's)
    is_zero = norm.eq(zero)
    return is_zero.where(xc.scalar_like(0.0), xc.div(norm)).cast(x.dtype)


def mean_variance_normalization(x: Tensor, axes: Sequence[int] = (0, 2, 3)) -> Tensor:
    """ONNX ``MeanVarianceNormalization``: ``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes``.

    The ONNX function body computes ``var = E[x^2] - E[x]^2``; this uses the two-pass
    ``E[(x - mean)^2]``, equal in exact arithmetic and never negative (the one-pass form can give
    NaN from ``sqrt`` of a tiny negative). Shape and dtype of ``x``.

    Raises:
        ShapeError: non-float or bad ``axes``.
    """
    xc = _widen(x, "MeanVarianceNormalization")
    axes = tuple(sorted({normalize_axis(a, x.ndim) for a in axes}))
    mean, var = _moments(xc, axes)
    return xc.sub(mean).div(var.sqrt().add(1e-9)).cast(x.dtype)

