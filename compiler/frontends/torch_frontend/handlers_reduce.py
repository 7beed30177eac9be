"""Handlers for reductions (``sum``, ``mean``, ``amax``, ``max.dim``, ``var``, ``cumsum``, ``cumprod``,
``logcumsumexp``...), softmax
and the normalizations (``native_layer_norm``, batch norm in inference mode, ``native_group_norm``).

Integer and bool sums accumulate in i64 as PyTorch does; an empty ``dim`` list means every dim.
The normalizations return PyTorch's tuples: the statistics outputs are built only if a later node
reads them (unused IR is never part of the graph).
"""
from __future__ import annotations

from lumc.compiler.frontends.torch_frontend.registry import (aten, arg, float_of, lib, lumc_dtype,
                                                             rank0_as_1d)
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, normalize_axis
from lumc.ir.views import prod


def _axes(x: Tensor, dim) -> list[int] | None:
    """``dim`` as a list of axes; None (every dim) for None or an empty list."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [normalize_axis(d, max(x.ndim, 1)) for d in dims] or None


def _sum_dtype(x: Tensor, dtype) -> Tensor:
    if dtype is not None:
        return x.cast(lumc_dtype(dtype))
    return x.cast(dt.i64) if (x.dtype.is_int or x.dtype.is_bool) else x


def _reduce(x: Tensor, kind: str, dim, keepdim: bool) -> Tensor:
    if x.ndim == 0:
        return x
    return lib("reduce.reduce")(x, kind, _axes(x, dim), keepdims=bool(keepdim))


@aten("sum.dim_IntList", requires=["reduce.reduce"])
def _sum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    return _reduce(_sum_dtype(x, dtype), "sum", dim, keepdim)


@aten("sum.default", requires=["reduce.reduce"])
def _sum_all(ctx, x, *, dtype=None):
    return _reduce(_sum_dtype(x, dtype), "sum", None, False)


@aten("mean.dim", requires=["reduce.reduce"])
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.cast(lumc_dtype(dtype))
    if x.ndim and x.dtype.is_float and 0 in [x.shape[a] for a in (_axes(x, dim) or range(x.ndim))]:
        return x.mean(_axes(x, dim), keepdims=bool(keepdim))   # over nothing: NaN, as eager
    return _reduce(x, "mean", dim, keepdim)


@aten("mean.default", requires=["reduce.reduce"])
def _mean_all(ctx, x, *, dtype=None):
    return _mean(ctx, x, None, False, dtype=dtype)


@aten("prod.dim_int", requires=["reduce.reduce"])
def _prod(ctx, x, dim, keepdim=False, *, dtype=None):
    return _reduce(_sum_dtype(x, dtype), "prod", dim, keepdim)


@aten("prod.default", requires=["reduce.reduce"])
def _prod_all(ctx, x, *, dtype=None):
    return _reduce(_sum_dtype(x, dtype), "prod", None, False)


_EXTREMES = ("aten.amax.default", "aten.amin.default", "aten.max.default", "aten.min.default")


def _refuse_empty(ctx, x: Tensor, dim, what: str) -> None:
    """Eager raises where a max or a min (no identity) reduces an empty dim, where ONNX's -inf /
    +inf would be served silently (a Dim from 0).

    Raises:
        ShapeError: a dim of ``x`` that ``dim`` reduces (every dim for None) is empty; ``what``
            names the reduction (``take the max``)."""
    empty = [a for a in (_axes(x, dim) or range(x.ndim)) if x.shape[a] == 0]
    if empty:
        raise ShapeError(f"cannot {what} over empty dim {empty[0]} of a tensor of shape "
                         f"{list(x.shape)} (eager raises there too)", op=ctx.op)


def _extreme(ctx, x: Tensor, kind: str, dim, keepdim: bool) -> Tensor:
    """``amax``/``amin`` (``max``/``min`` of every element), refused over an empty dim
    (:func:`_refuse_empty`) unless the node comes from a decomposition that handles it
    (``logsumexp``'s, whose eager gives -inf; the trace's ``original_aten``)."""
    orig = ctx.node.meta.get("original_aten")
    if orig is not None and str(orig) in _EXTREMES:
        _refuse_empty(ctx, x, dim, f"take the {kind}")
    return _reduce(x, kind, dim, keepdim)


@aten("amax.default", "max.default", requires=["reduce.reduce"])
def _amax(ctx, x, dim=(), keepdim=False):
    return _extreme(ctx, x, "max", dim, keepdim)


@aten("amin.default", "min.default", requires=["reduce.reduce"])
def _amin(ctx, x, dim=(), keepdim=False):
    return _extreme(ctx, x, "min", dim, keepdim)


@aten("logsumexp.default", requires=["reduce.reduce"])
def _logsumexp(ctx, x, dim, keepdim=False):
    return _reduce(float_of(x), "log_sum_exp", dim, keepdim)


def _truth(x: Tensor) -> Tensor:
    return x if x.dtype.is_bool else x.ne(x.scalar_like(0))


@aten("any.default", "any.dim", "any.dims", requires=["reduce.reduce"])
def _any(ctx, x, dim=None, keepdim=False):
    return _reduce(_truth(x), "max", dim, keepdim)


@aten("all.default", "all.dim", "all.dims", requires=["reduce.reduce"])
def _all(ctx, x, dim=None, keepdim=False):
    return _reduce(_truth(x), "min", dim, keepdim)


def _arg(x: Tensor, dim, keepdim: bool, largest: bool) -> Tensor:
    fn = lib("reduce.argmax" if largest else "reduce.argmin")
    if dim is None:     # over the flattened x: [1, .., 1, numel] keeps keepdim's rank, so the
        # index still reads its scores along one axis (the quality gate's near-ties)
        if keepdim and x.ndim >= 1:
            return fn(x.reshape((1,) * (x.ndim - 1) + (x.numel,)), axis=x.ndim - 1, keepdims=True)
        r = fn(x.reshape((x.numel,)), axis=0, keepdims=False)
        return r.reshape((1,) * x.ndim) if keepdim else r
    if x.ndim == 0:
        return Tensor.full((), 0, dt.i64)
    return fn(x, axis=dim, keepdims=bool(keepdim))


@aten("argmax.default", requires=["reduce.argmax"])
def _argmax(ctx, x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, True)


@aten("argmin.default", requires=["reduce.argmin"])
def _argmin(ctx, x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, False)


@aten("max.dim", requires=["reduce.reduce", "reduce.argmax"])
def _max_dim(ctx, x, dim, keepdim=False):
    return _reduce(x, "max", dim, keepdim), _arg(x, dim, keepdim, True)


@aten("min.dim", requires=["reduce.reduce", "reduce.argmin"])
def _min_dim(ctx, x, dim, keepdim=False):
    return _reduce(x, "min", dim, keepdim), _arg(x, dim, keepdim, False)


def _var_mean(x: Tensor, dim, correction, keepdim) -> tuple[Tensor, Tensor]:
    """Two-pass variance ``sum((x - mean)^2) / (N - correction)`` (PyTorch's default correction 1);
    f16/bf16 in f32, rounded once, as eager (an f16 sum of squares passes 65504 where the
    variance does not)."""
    x0 = float_of(x)
    x = x0.cast(x0.dtype.accumulator)
    axes = _axes(x, dim) or list(range(x.ndim))
    n = prod(x.shape[a] for a in axes)
    c = 1 if correction is None else correction
    mean = x.mean(axes, keepdims=True)
    d = x.sub(mean)
    ss = d.mul(d).sum(axes, keepdims=bool(keepdim))
    # N <= correction divides by zero: inf, or NaN where the sum is 0, as PyTorch
    var = ss.mul(float("inf")) if n - c <= 0 else ss.mul(1.0 / (n - c))
    return var.cast(x0.dtype), (mean if keepdim else mean.reshape(ss.shape)).cast(x0.dtype)


@aten("var.correction")
@rank0_as_1d
def _var(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@aten("var_mean.correction")
@rank0_as_1d
def _var_mean_h(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@aten("cumsum.default", requires=["reduce.cumsum"])
def _cumsum(ctx, x, dim, *, dtype=None):
    x = _sum_dtype(x, dtype)
    if x.ndim == 0:
        return x
    return lib("reduce.cumsum")(x, normalize_axis(dim, x.ndim))


@aten("cumprod.default", requires=["reduce.reduce", "reduce.scan_grid"])
def _cumprod(ctx, x, dim, *, dtype=None):
    """Running product along ``dim``: each prefix reduced by ``reduce.reduce``'s product (floats:
    within an ulp of the sequential product; integers exact, wrapping as PyTorch's)."""
    x = x.cast(lumc_dtype(dtype)) if dtype is not None else \
        (x.cast(dt.i64) if not x.dtype.is_float else x)
    if x.ndim == 0 or x.numel == 0:
        return x
    grid, _, back = lib("reduce.scan_grid")(x, dim, 1)
    return lib("reduce.reduce")(grid, "prod", [-1], keepdims=False).permute(back)


@aten("logcumsumexp.default", requires=["reduce.scan_grid"])
def _logcumsumexp(ctx, x, dim):
    """``log(cumsum(exp(x)))`` along ``dim``, shifted by each prefix's max (no overflow); a prefix
    of ``-inf`` gives ``-inf``, one holding ``+inf`` gives ``+inf``, NaN propagates. Computed in
    the accumulator type of half inputs (f32)."""
    if not x.dtype.is_float:
        raise ShapeError(f"needs a floating-point tensor, got {x.dtype}")
    if x.ndim == 0 or x.numel == 0:
        return x
    xa = x.cast(x.dtype.accumulator)
    grid, _, back = lib("reduce.scan_grid")(xa, dim, float("-inf"))
    m = grid.max([-1], keepdims=True)
    shift = m.isinf().logical_or(m.isnan()).where(m.scalar_like(0.0), m)
    r = grid.sub(shift).exp().sum([-1], keepdims=True).log().add(shift)
    return r.reshape(r.shape[:-1]).permute(back).cast(x.dtype)


# ---- softmax ---------------------------------------------------------------------------------------
@aten("_softmax.default", requires=["norm.softmax"])
@rank0_as_1d
def _softmax(ctx, x, dim, half_to_float=False):
    y = lib("norm.softmax")(x.cast(dt.f32) if half_to_float else x, axis=dim)
    return y


@aten("_log_softmax.default", requires=["norm.log_softmax"])
@rank0_as_1d
def _log_softmax(ctx, x, dim, half_to_float=False):
    return lib("norm.log_softmax")(x.cast(dt.f32) if half_to_float else x, axis=dim)


@aten("_safe_softmax.default", requires=["norm.softmax"])
@rank0_as_1d
def _safe_softmax(ctx, x, dim, dtype=None):
    # a row that is all -inf gives 0 instead of NaN (fully masked attention rows)
    if dtype is not None:
        x = x.cast(lumc_dtype(dtype))
    y = lib("norm.softmax")(x, axis=dim)
    masked = x.eq(x.scalar_like(float("-inf"))).logical_not().max([dim], keepdims=True)
    return masked.where(y, y.scalar_like(0.0))


# ---- normalizations --------------------------------------------------------------------------------
def _ones(n: int, like: Tensor) -> Tensor:
    return Tensor.full((n,), 1.0, like.dtype)


def _zeros(n: int, like: Tensor) -> Tensor:
    return Tensor.full((n,), 0.0, like.dtype)


@aten("native_layer_norm.default", requires=["norm.layer_norm"])
def _layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    tail = x.shape[x.ndim - k:]
    scale = weight if weight is not None else Tensor.full(tail, 1.0, x.dtype)
    y, mean, inv = lib("norm.layer_norm")(x, scale, bias, axis=x.ndim - k, epsilon=float(eps))
    return y, mean, inv


def _bn_training(node) -> str | None:
    # training mode updates the running statistics: a side effect lumc graphs cannot express
    if arg(node, 5, "training", False):
        return "batch norm in training mode (call module.eval() before compiling)"
    return None


def _batch_norm(x, weight, bias, mean, var, eps):
    c = x.shape[1]
    w = weight if weight is not None else _ones(c, x)
    b = bias if bias is not None else _zeros(c, x)
    y = lib("norm.batch_norm")(x, w, b, mean, var, epsilon=float(eps))
    empty = Tensor.full((0,), 0.0, x.dtype)
    return y, empty, empty


@aten("_native_batch_norm_legit_no_training.default", requires=["norm.batch_norm"])
def _bn_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, eps)


@aten("native_batch_norm.default", requires=["norm.batch_norm"], check=_bn_training)
def _native_bn(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is None or running_var is None:
        raise ShapeError("batch norm without running statistics")
    return _batch_norm(x, weight, bias, running_mean, running_var, eps)


@aten("native_group_norm.default", requires=["norm.group_norm"])
def _group_norm(ctx, x, weight, bias, n, c, hw, group, eps):
    y = lib("norm.group_norm")(x, weight if weight is not None else _ones(c, x),
                               bias if bias is not None else _zeros(c, x), int(group),
                               epsilon=float(eps))
    # PyTorch also returns the per-(n, group) mean and 1/std
    g = float_of(x).reshape((n, group, (int(c) // int(group)) * int(hw)))   # no -1: N may be 0
    mean = g.mean([2], keepdims=True)
    d = g.sub(mean)
    rstd = d.mul(d).mean([2]).add(float(eps)).rsqrt()
    return y, mean.reshape((n, group)), rstd


@aten("linalg_vector_norm.default", requires=["reduce.reduce"])
@rank0_as_1d
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``||x||_ord`` over ``dim``: 2 and 1 as ``l2``/``l1`` reductions, ``±inf`` as max/min of
    ``|x|``, 0 as the count of nonzeros, other orders as ``(sum |x|^p)^(1/p)``."""
    x = float_of(x.cast(lumc_dtype(dtype)) if dtype is not None else x)
    ord = float(ord)
    if ord == 2:
        return _reduce(x, "l2", dim, keepdim)
    if ord == 1:
        return _reduce(x, "l1", dim, keepdim)
    if abs(ord) == float("inf"):        # a max or min of |x|: refused over an empty dim
        _refuse_empty(ctx, x, dim, f"compute the {ord:g} norm")
        return _reduce(x.abs(), "max" if ord > 0 else "min", dim, keepdim)
    if ord == 0:
        return _reduce(x.ne(x.scalar_like(0.0)).cast(x.dtype), "sum", dim, keepdim)
    return _reduce(x.abs().pow(ord), "sum", dim, keepdim).pow(1.0 / ord)


def _batch_stats(x: Tensor, eps) -> tuple[Tensor, Tensor]:
    """Per-channel mean and ``1/sqrt(var + eps)`` over every dim but 1 (biased variance), in the
    accumulation dtype of ``x``'s float dtype: f16/bf16 in f32 (their squares overflow f16 from
    256)."""
    axes = [0] + list(range(2, x.ndim))
    xf = float_of(x)
    xc = xf.cast(xf.dtype.accumulator)
    mean = xc.mean(axes, keepdims=True)
    d = xc.sub(mean)
    rstd = d.mul(d).mean(axes, keepdims=True).add(float(eps)).rsqrt()
    return mean, rstd


def _bn_batch_stats(x, weight, bias, eps):
    """Batch norm with the batch's own statistics (no running statistics are read or written)."""
    mean, rstd = _batch_stats(x, eps)
    c = x.shape[1]
    shape = (1, c) + (1,) * (x.ndim - 2)
    xf = float_of(x)
    y = xf.cast(mean.dtype).sub(mean).mul(rstd)        # in f32 for f16/bf16, rounded once
    if weight is not None:
        y = y.mul(weight.cast(y.dtype).reshape(shape))
    if bias is not None:
        y = y.add(bias.cast(y.dtype).reshape(shape))
    return (y.cast(x.dtype), mean.reshape((c,)).cast(xf.dtype),
            rstd.reshape((c,)).cast(xf.dtype))


@aten("_native_batch_norm_legit.no_stats")
def _bn_no_stats(ctx, x, weight, bias, training, momentum, eps):
    # InstanceNorm without running stats lands here (input reshaped to [1, N*C, ...])
    return _bn_batch_stats(x, weight, bias, eps)


@aten("_native_batch_norm_legit_functional.default", requires=["norm.batch_norm"],
      check=lambda node: "batch norm in training mode (call module.eval() before compiling)")
def _bn_functional(ctx, *args):     # torch.export's training-mode form: always refused above
    raise AssertionError("refused by its check")


@aten("_native_batch_norm_legit.default", requires=["norm.batch_norm"], check=_bn_training)
def _bn_legit(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, eps)
