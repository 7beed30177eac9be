"""Reductions (ONNX ``Reduce*``, ``ArgMax``/``ArgMin``, ``CumSum``) built from primitives.

Only two reductions are primitive (``SumReduce``, ``MaxReduce``); everything else composes them:
``min = -max(-x)``, ``log_sum_exp`` shifts by the max, ``prod`` sums logarithms (floats) or
multiplies pairwise (integers), ``argmax`` reduces an index mask, ``cumsum`` contracts with a
triangular mask. Axes may be negative; zero-size reductions give the ONNX identities.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError, UnsupportedOpError
from lumc.ir.provenance import mark_arg_scores
from lumc.ir.tensor import Tensor, normalize_axis
from lumc.ir.views import prod

# Elements of a scan's grid of prefixes (``scan_grid``) lumc builds: the numpy reference executor
# materializes the grid (and float64 copies of it), about 17 bytes an element measured on a
# cumprod of 2 x 20000 (13.8 GB resident); 2**27 elements keeps that near 2 GB.
SCAN_GRID_MAX = 1 << 27

KINDS = ("sum", "mean", "max", "min", "prod", "l1", "l2", "log_sum", "log_sum_exp", "sum_square")


def reduce(x: Tensor, kind: str, axes: Sequence[int] | None = None, keepdims: bool = True,
           noop_with_empty_axes: bool = False) -> Tensor:
    """ONNX ``Reduce<Kind>`` (opset 18 form: ``axes`` given as a list, may be negative).

    Args:
        x: input of any rank (0 included).
        kind: one of :data:`KINDS`: ``sum``, ``mean``, ``max``, ``min``, ``prod``, ``l1`` (sum of
            ``|x|``), ``l2`` (sqrt of sum of squares), ``log_sum``, ``log_sum_exp``, ``sum_square``.
        axes: dims to reduce; ``None`` or empty means all dims, unless ``noop_with_empty_axes``, in
            which case nothing is reduced and only the elementwise part applies (``sum_square``
            gives ``x**2``, ``l1`` gives ``|x|``), as in the ONNX reference implementation.
        keepdims: keep reduced dims as size 1.
    Returns:
        The reduction, in ``x``'s dtype (integer ``mean`` truncates toward zero; integer ``l2``,
        ``log_sum`` and ``log_sum_exp`` are computed in f64 and truncated, as onnxruntime).
    Numerics:
        f16/bf16 inputs are reduced in f32 and rounded once. ``log_sum_exp`` is max-shifted (no
        overflow; a row of ``-inf`` gives ``-inf``, a row holding ``+inf`` gives ``+inf``).
        ``l2`` is not rescaled (it overflows, as onnxruntime, for ``sum(x^2) > 3.4e38`` in fp32).
        ``prod``: see :func:`reduce_prod`. Zero-size reductions give sum/l1/l2/sum_square 0,
        prod 1, max ``-inf`` (integer minimum), min ``+inf`` (integer maximum), log_sum and
        log_sum_exp ``-inf``, and mean 0 (ONNX leaves it undefined; onnxruntime gives 0).
    Raises:
        ShapeError: unknown ``kind``, bad axes, or bool input (other than max/min).
    """
    op = "Reduce" + "".join(w.capitalize() for w in kind.split("_"))
    if kind not in KINDS:
        raise ShapeError(f"unknown reduction {kind!r}; expected one of {KINDS}")
    if x.dtype.is_bool and kind not in ("max", "min"):
        raise ShapeError("needs a numeric tensor, got bool", op=op)
    if axes is None or len(axes) == 0:
        ax = () if noop_with_empty_axes else tuple(range(x.ndim))
    else:
        ax = tuple(sorted({normalize_axis(a, x.ndim) for a in axes}))
    if kind == "max":
        r = x.max(ax, keepdims=True)
    elif kind == "min":
        r = _min(x, ax)
    elif kind == "prod":
        r = reduce_prod(x, ax)
    else:
        r = _reduce_arith(x, kind, ax)
    return r if keepdims else r.reshape([d for i, d in enumerate(r.shape) if i not in ax])


def _min(x: Tensor, ax: tuple[int, ...]) -> Tensor:
    """Min over ``ax`` keeping dims; unsigned as ``top - max(top - x)`` (no negative constants)."""
    if x.dtype.kind != "uint":
        return x.min(ax, keepdims=True)
    top = x.scalar_like(x.dtype.max_value())
    r = top.sub(x).max(ax, keepdims=True)
    return r.scalar_like(x.dtype.max_value()).sub(r)


def _reduce_arith(x: Tensor, kind: str, ax: tuple[int, ...]) -> Tensor:
    """The sum-based kinds over ``ax``, keeping dims."""
    if x.dtype.is_int and kind in ("l2", "log_sum", "log_sum_exp"):
        return _reduce_arith(x.cast(dt.f64), kind, ax).cast(x.dtype)
    xc = x.cast(x.dtype.accumulator)
    n = prod(x.shape[a] for a in ax)
    if kind == "sum":
        r = xc.sum(ax, keepdims=True)
    elif kind == "mean":
        r = xc.sum(ax, keepdims=True)
        if n:
            r = r.mul(1.0 / n) if xc.dtype.is_float else r.div(n)
    elif kind == "l1":
        r = xc.abs().sum(ax, keepdims=True)
    elif kind in ("l2", "sum_square"):
        r = xc.mul(xc).sum(ax, keepdims=True)
        if kind == "l2":
            r = r.sqrt()
    elif kind == "log_sum":
        r = xc.sum(ax, keepdims=True).log()
    else:  # log_sum_exp
        m = xc.max(ax, keepdims=True)
        # an infinite (or empty-set) max would give inf - inf = NaN: shift by 0 there instead
        m = m.isinf().where(m.scalar_like(0.0), m)
        r = xc.sub(m).exp().sum(ax, keepdims=True).log().add(m)
    return r.cast(x.dtype)


def reduce_prod(x: Tensor, axes: Sequence[int]) -> Tensor:
    """ONNX ``ReduceProd`` over ``axes`` (kept as size-1 dims); the empty product is 1.

    Floats: ``sign * exp2(sum(log2|x|))`` computed in f64, with the sign from the parity of the count
    of negative sign bits (so ``-0.0`` counts, and the sign of a zero product is IEEE's). Zeros give
    ``log2 0 = -inf`` hence 0; a zero times an infinity gives ``-inf + inf = NaN``; NaN propagates;
    overflow and underflow happen on the final rounding, as in a sequential product.
    Error: relative ``<= ln2 * 2**-52 * (n + sum|log2|x_i||)`` before the final rounding, so
    f16/bf16/f32 results are within one ulp of the exact product (correctly rounded up to a double
    rounding) for any realistic ``n``; f64 results carry that bound itself (e.g. ``3e-14`` relative
    for 100 factors of magnitude about ``2**±10``).

    Integers: a pairwise tree of ``Mul`` over slices of the flattened reduced dims (``log2 n``
    levels): exact, and wrapping on overflow exactly like the sequential ONNX product.
    """
    ax = tuple(sorted({normalize_axis(a, x.ndim) for a in axes}))
    if not ax:
        return x
    if x.dtype.is_float:
        return _prod_log(x, ax)
    return _prod_tree(x, ax)


def _prod_log(x: Tensor, ax: tuple[int, ...]) -> Tensor:
    xd = x.cast(dt.f64)
    zero = xd.scalar_like(0.0)
    mag = xd.abs().log2().sum(ax, keepdims=True).exp2()
    negatives = xd.signbit().where(xd.scalar_like(1.0), zero).sum(ax, keepdims=True)
    odd = negatives.fmod(2.0).gt(mag.scalar_like(0.5))
    return odd.where(mag.neg(), mag).cast(x.dtype)


def _prod_tree(x: Tensor, ax: tuple[int, ...]) -> Tensor:
    keep = [i for i in range(x.ndim) if i not in ax]
    n = prod(x.shape[a] for a in ax)
    out_shape = tuple(1 if i in ax else d for i, d in enumerate(x.shape))
    if n == 0:
        return Tensor.full(out_shape, 1, x.dtype)
    lead = [x.shape[i] for i in keep]
    y = x.permute(keep + list(ax)).reshape(lead + [n])
    while n > 1:
        if n % 2:
            y = y.pad([(0, 0)] * len(lead) + [(0, 1)], value=1)
            n += 1
        h = n // 2
        y = y.slice([0], [h], [-1]).mul(y.slice([h], [n], [-1]))
        n = h
    return y.reshape(out_shape)


def _arg_extreme(x: Tensor, axis: int, keepdims: bool, select_last_index: bool,
                 largest: bool) -> Tensor:
    op = "ArgMax" if largest else "ArgMin"
    axis = normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    if n == 0:
        raise ShapeError(f"cannot take the index of an extreme over empty axis {axis}", op=op)
    xv = x.cast(dt.i32) if x.dtype.is_bool else x
    if largest:
        m = xv.max(axis, keepdims=True).expand(x.shape)
        hit = xv.lt(m).logical_not()          # x == max, since nothing exceeds the max
    else:
        m = _min(xv, (axis,)).expand(x.shape)
        hit = m.lt(xv).logical_not()
    if xv.dtype.is_float:
        # a NaN extreme (numpy: the first NaN wins) is hit only by the NaNs
        hit = m.isnan().where(xv.isnan(), hit)
    idx = Tensor.iota(x.shape, axis, dt.i64)
    if select_last_index:
        r = hit.where(idx, idx.scalar_like(-1)).max(axis, keepdims=True)
    else:
        # n - i is largest for the first index
        first = hit.where(idx.scalar_like(n).sub(idx), idx.scalar_like(0)).max(axis, keepdims=True)
        r = first.scalar_like(n).sub(first)
    out = r if keepdims else r.squeeze([axis])
    if x.dtype.is_float:    # the scores it reads, for the quality gate's near-ties
        mark_arg_scores(out.node, x.node, axis, largest, keepdims)
    return out


def argmax(x: Tensor, axis: int = 0, keepdims: bool = True,
           select_last_index: bool = False) -> Tensor:
    """ONNX ``ArgMax``: i64 index of the largest element along ``axis`` (first occurrence, or last
    with ``select_last_index``). NaN counts as the largest value, as in numpy: a slice holding NaN
    gives the index of its first NaN (its last NaN with ``select_last_index``); onnxruntime skips
    NaN instead. Bool inputs order ``False < True``.

    Raises:
        ShapeError: bad ``axis`` or an empty reduced axis.
    """
    return _arg_extreme(x, axis, keepdims, select_last_index, largest=True)


def argmin(x: Tensor, axis: int = 0, keepdims: bool = True,
           select_last_index: bool = False) -> Tensor:
    """ONNX ``ArgMin``: as :func:`argmax` for the smallest element (NaN wins here too, as in numpy)."""
    return _arg_extreme(x, axis, keepdims, select_last_index, largest=False)


def scan_grid(x: Tensor, axis: int, fill) -> tuple[Tensor, Tensor, list[int]]:
    """A scan along ``axis`` as a reduction over one more axis: ``(grid, keep, back)`` with ``x``'s
    ``axis`` moved last and widened to ``[..., i, j]``, ``grid`` holding ``x[..., j]`` where
    ``keep`` (``j <= i``, ``[n, n]``) and ``fill`` elsewhere, and ``back`` the permutation that
    moves the scanned axis back after the reduction over ``j``. ``O(n^2)`` work along ``axis``
    (PyTorch's ``cumprod``, ``logcumsumexp``, ``cummax``, ``cummin``).

    Raises:
        UnsupportedOpError: when the grid would hold over :data:`SCAN_GRID_MAX` elements.
    """
    axis = normalize_axis(axis, x.ndim)
    perm = [a for a in range(x.ndim) if a != axis] + [axis]
    back = [perm.index(a) for a in range(x.ndim)]
    xl = x.permute(perm)
    n = xl.shape[-1]
    if x.numel * n > SCAN_GRID_MAX:
        raise UnsupportedOpError(
            f"a running product, max, min or log-sum-exp along a dim of {n} is computed as a grid "
            f"of prefixes, {x.numel // max(n, 1)} x {n} x {n} = {x.numel * n:.3g} elements, over "
            f"lumc's limit of {SCAN_GRID_MAX:.3g}; shorten the dim or compute it outside lumc")
    grid = xl.unsqueeze([-2]).expand(xl.shape[:-1] + (n, n))          # [..., i, j] = x[j]
    keep = Tensor.iota((n, n), 1).le(Tensor.iota((n, n), 0))           # j <= i
    return keep.where(grid, grid.scalar_like(fill)), keep, back


def prefix_contraction(v: Tensor, axis: int, exclusive: bool = False,
                       reverse: bool = False) -> Tensor:
    """``out[..., i, ...] = sum_j M[i, j] * v[..., j, ...]`` along ``axis`` with the 0/1 mask
    ``M[i, j] = j <= i`` (``j < i`` when ``exclusive``, ``j >= i`` / ``j > i`` when ``reverse``),
    of ``v``'s dtype: the primitive meaning of a prefix sum. ``O(n^2)`` as written; the e-graph
    offers a ``scan`` kernel for it (``lumc.rewrites.spellings``, ``lumc.backends.scan_structure``),
    equal where ``v`` is finite (a masked ``0 * inf`` is NaN here). ``axis`` may be negative.
    Shape and dtype of ``v``."""
    axis = normalize_axis(axis, v.ndim)
    n = v.shape[axis]
    i = Tensor.iota((n, n), 0)
    j = Tensor.iota((n, n), 1)
    if reverse:
        i, j = j, i
    mask = j.lt(i) if exclusive else i.lt(j).logical_not()
    m = mask.where(Tensor.full((n, n), 1, v.dtype), Tensor.full((n, n), 0, v.dtype))
    big = v.shape[:axis] + (n, n) + v.shape[axis + 1:]
    mv = m.reshape((1,) * axis + (n, n) + (1,) * (v.ndim - axis - 1)).expand(big)
    vv = v.unsqueeze([axis]).expand(big)
    return mv.mul(vv).sum(axis + 1)


def cumsum(x: Tensor, axis: int, exclusive: bool = False, reverse: bool = False) -> Tensor:
    """ONNX ``CumSum`` along ``axis`` as a contraction with a triangular 0/1 mask:
    ``out[..., i, ...] = sum_j M[i, j] * x[..., j, ...]`` with ``M[i, j] = j <= i`` (``j < i`` when
    ``exclusive``, mirrored when ``reverse``; :func:`prefix_contraction`). ``Mul`` + ``SumReduce``
    so the reference executor sees a contraction (O(n^2) as written); the e-graph offers each
    one as a ``scan`` kernel (a prefix sum, O(n): ``lumc.backends.triton.render_scan``), every
    operand contracted here being finite.

    Floats: the mask products ``0 * x`` would turn an infinity into NaN everywhere, so the finite
    part is contracted with non-finite values zeroed, and two more contractions count the ``+inf``
    (or NaN) and ``-inf`` (or NaN) seen so far; the result is NaN once both were seen, else ±inf once
    one was, else the finite sum (as a sequential scan). The summation order differs from a
    sequential scan (rounding may differ by reassociation); the sign of a zero is the sequential
    scan's: -0.0 where every term so far is -0.0 (found by one ``O(n)`` reduction), never -0.0
    when ``exclusive`` (the scan starts from +0.0, as onnxruntime's). f16/bf16 are summed in f32.
    Integers: exact, wrapping as the sequential sum.
    Shape and dtype of ``x``.

    Raises:
        ShapeError: bool input or bad ``axis``.
    """
    if x.dtype.is_bool:
        raise ShapeError("needs a numeric tensor, got bool", op="CumSum")
    axis = normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    xc = x.cast(x.dtype.accumulator)

    def contract(v: Tensor) -> Tensor:
        return prefix_contraction(v, axis, exclusive, reverse)

    if not xc.dtype.is_float:
        return contract(xc).cast(x.dtype)
    below_inf = xc.lt(xc.scalar_like(np.inf))          # false for +inf and NaN
    above_ninf = xc.scalar_like(-np.inf).lt(xc)        # false for -inf and NaN
    zero, one = xc.scalar_like(0.0), xc.scalar_like(1.0)
    finite = contract(below_inf.where(above_ninf.where(xc, zero), zero))
    pos = contract(below_inf.where(zero, one)).gt(finite.scalar_like(0.5))
    neg = contract(above_ninf.where(zero, one)).gt(finite.scalar_like(0.5))
    r = neg.where(finite.scalar_like(-np.inf), finite)
    r = pos.where(neg.where(finite.scalar_like(np.nan), finite.scalar_like(np.inf)), r)
    if exclusive:
        return r.add(0.0).cast(x.dtype)     # a sequential scan from +0.0 never gives -0.0
    # a sequential scan's zero is -0.0 exactly when every term so far is -0.0, where the masked
    # products 0 * x may have added a +0.0: one O(n) reduction finds the first (last) other term
    at = Tensor.iota(x.shape, axis)
    negzero = xc.eq(zero).logical_and(xc.signbit())
    if reverse:
        last = negzero.where(at.scalar_like(-1), at).max(axis, keepdims=True).expand(x.shape)
        all_negzero = last.lt(at)
    else:
        first = negzero.where(at.scalar_like(n), at).min(axis, keepdims=True).expand(x.shape)
        all_negzero = at.lt(first)
    return all_negzero.where(r.abs().neg(), r).cast(x.dtype)
