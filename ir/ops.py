"""The primitive-op table: every primitive defined once.

Each row gives the op's name, group, arity, dtype rule, shape rule, numpy reference semantics, FLOP
count, egglog constructor, Triton rendering and algebraic properties. Adding an op means adding one
row; ``tests/ir/test_op_table.py`` fails where any column is missing.

Semantics follow IEEE-754 and the ONNX spec. ``Div`` is correctly rounded float division (integer
division, truncating, is a composition in ``Tensor.idiv``). ``Mod`` is the C ``fmod`` (the result
has the sign of the dividend) for floats and integers alike, and refuses an integer divisor of 0
(:func:`int_mod_by_zero`; ``Tensor.fmod``, which gives 0 there for ONNX, divides by 1 there);
Python-style modulo is a composition in ``lumc.ir.library``. Reductions keep the reduced dims (size
1) so ranks never change under them, and accumulate f16/bf16 inputs in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.views import View, prod

Shape = tuple[int, ...]


@dataclass(frozen=True)
class OpDef:
    """One row of the primitive-op table.

    Attributes:
        name: the op's name, also the IR and text-dump spelling.
        group: ``leaf``, ``unary``, ``binary``, ``ternary``, ``reduce``, ``gather`` or ``movement``.
        arity: number of tensor operands.
        dtype_rule: ``(operand dtypes, arg) -> result dtype``; raises ShapeError on a bad operand.
        shape_rule: ``(operand shapes, arg) -> result shape``; raises ShapeError on a mismatch.
        reference: ``(operand arrays, arg) -> array``, the numpy semantics (the numerics oracle).
        flops: ``(operand shapes, result shape, arg) -> FLOP count`` (one per arithmetic result;
            a transcendental counts as one).
        egglog: the egglog constructor name.
        triton: the Triton rendering: a ``str.format`` template over operand expressions, or a
            ``load``/``reduce`` marker for ops the codegen renders structurally.
        props: algebraic properties (``commutative``, ``associative``, ``elementwise``, ...).
    """
    name: str
    group: str
    arity: int
    dtype_rule: Callable[[tuple, Any], dt.DType]
    shape_rule: Callable[[tuple, Any], Shape]
    reference: Callable[[list, Any], np.ndarray]
    flops: Callable[[tuple, Shape, Any], int]
    egglog: str
    triton: str
    props: frozenset = field(default_factory=frozenset)


# ---- dtype rules ----------------------------------------------------------------------------------
def _float_unary(dts, arg):
    if not dts[0].is_float:
        raise ShapeError(f"needs a float operand, got {dts[0]}")
    return dts[0]


def _same_numeric(dts, arg):
    if dts[0] != dts[1]:
        raise ShapeError(f"operand dtypes differ: {dts[0]} vs {dts[1]}")
    if dts[0].is_bool or dts[0].is_storage:
        raise ShapeError(f"needs numeric operands, got {dts[0]}")
    return dts[0]


def _float_binary(dts, arg):
    _same_numeric(dts, arg)
    if not dts[0].is_float:
        raise ShapeError(f"needs float operands, got {dts[0]}")
    return dts[0]


def _compare(dts, arg):
    _same_numeric(dts, arg)
    return dt.bool_


def _where_dtype(dts, arg):
    if not dts[0].is_bool:
        raise ShapeError(f"condition must be bool, got {dts[0]}")
    if dts[1] != dts[2]:
        raise ShapeError(f"branch dtypes differ: {dts[1]} vs {dts[2]}")
    return dts[1]


def _first(dts, arg):
    return dts[0]


def _reduce_dtype(dts, arg):
    return dts[0]


def _sum_dtype(dts, arg):
    if dts[0].is_bool:
        raise ShapeError("SumReduce needs a numeric operand, got bool")
    return dts[0]


def _gather_dtype(dts, arg):
    if dts[1] not in (dt.i32, dt.i64):
        raise ShapeError(f"gather index must be i32 or i64, got {dts[1]}")
    return dts[0]


# ---- shape rules ----------------------------------------------------------------------------------
def _same_shape(shapes, arg):
    for s in shapes[1:]:
        if tuple(s) != tuple(shapes[0]):
            raise ShapeError(f"operand shapes differ: {tuple(shapes[0])} vs {tuple(s)} "
                             "(broadcast explicitly with a view)")
    return tuple(shapes[0])


def _reduce_shape(shapes, axes):
    s = list(shapes[0])
    for a in axes:
        if not 0 <= a < len(s):
            raise ShapeError(f"reduce axis {a} out of range for rank {len(s)}")
        s[a] = 1
    return tuple(s)


def _gather_shape(shapes, axis):
    t, i = shapes
    if not 0 <= axis < len(t):
        raise ShapeError(f"gather axis {axis} out of range for rank {len(t)}")
    return tuple(t[:axis]) + tuple(i) + tuple(t[axis + 1:])


def _view_shape(shapes, view: View):
    if prod(shapes[0]) < 0:
        raise ShapeError("negative size")
    return tuple(view.shape)


# ---- numpy reference semantics --------------------------------------------------------------------
def _np_errstate(fn):
    def wrapped(xs, arg):
        with np.errstate(all="ignore"):
            return fn(xs, arg)
    return wrapped


_STORAGE_NP = frozenset(d.np for d in dt.STORAGE_DTYPES)


def cast_array(x: np.ndarray, to: dt.DType) -> np.ndarray:
    """ONNX ``Cast``: float to int truncates toward zero; to bool is ``x != 0`` (NaN is True).
    To or from a storage type (float8, int4...): ml_dtypes' conversion, as the ONNX reference
    (round to nearest even; the Cast handler saturates first where ``saturate`` asks).

    A float outside an integer type's range, and NaN, have no value in ONNX (undefined; numpy,
    onnxruntime and C give whatever the CPU's conversion gives). lumc saturates, the same in every
    backend: NaN -> 0, values whose truncation is at least ``max + 1`` (``+inf`` included) -> the
    type's max, below its min (``-inf`` included) -> its min, for every signed and unsigned type.
    ``max + 1`` and ``min`` are powers of two, exact in float64, so a 64-bit type's bounds are exact
    too (``float(2**63 - 1)`` rounds up to 2**63: clamping in float, then converting, would not
    give the max)."""
    if to.is_storage or x.dtype in _STORAGE_NP:
        return x.astype(to.np)
    if to.is_bool:
        return x != 0
    src_float = x.dtype.kind == "f" or x.dtype == dt.bf16.np
    if src_float and to.is_int:
        info = np.iinfo(to.np)
        with np.errstate(all="ignore"):
            t = np.trunc(x.astype(np.float64))
            over = t >= float(int(info.max) + 1)
            under = t < float(info.min)
            # every double in [min, max + 1) converts exactly; the rest is replaced below
            inside = np.where(over | under | np.isnan(t), 0.0, t).astype(to.np)
        return np.where(over, to.np.type(info.max), np.where(under, to.np.type(info.min), inside))
    with np.errstate(all="ignore"):   # a float narrowing overflows to ±inf, as IEEE-754 rounds
        return x.astype(to.np)


def _ref_reduce(kind):
    def run(xs, axes):
        x = xs[0]
        acc = dt.from_numpy(x.dtype).accumulator.np
        if kind == "sum":
            with np.errstate(all="ignore"):
                r = np.sum(x.astype(acc, copy=False), axis=tuple(axes), keepdims=True, dtype=acc)
            return r.astype(x.dtype)
        if x.size == 0:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
            return np.full(shape, dt.from_numpy(x.dtype).min_value(), dtype=x.dtype)
        return np.max(x, axis=tuple(axes), keepdims=True)
    return run


def int_mod_by_zero(dtype_name: str) -> str:
    """The reason an integer ``Mod`` of divisor 0 is refused (``dtype_name``: ``int32``...), one
    text for the reference executor and the torch replays (``lumc.compiler.runtime.graph_torch``)."""
    return f"integer modulo by zero ({dtype_name} divisor 0)"


def _ref_mod(xs, arg):
    """C ``fmod``; an integer divisor of 0 raises ZeroDivisionError (numpy would give 0; the
    reference executor turns it into ``DivisionByZeroError``). Kernels leave it undefined, as they
    leave an index outside a ``Gather``'s axis."""
    a, b = xs
    if b.dtype.kind in "iu" and b.size and not b.all():
        raise ZeroDivisionError(int_mod_by_zero(b.dtype.name))
    with np.errstate(all="ignore"):
        return np.fmod(a, b)


def _ref_gather(xs, axis):
    table, index = xs
    if index.size and (index.min() < 0 or index.max() >= table.shape[axis]):
        bad = index[(index < 0) | (index >= table.shape[axis])].flat[0]
        raise IndexError(f"gather index {bad} out of range [0, {table.shape[axis]})")
    return np.take(table, index.astype(np.int64), axis=axis)


def _check_extent(v: View, start: int, shape, size: int) -> None:
    """A view reads inside its source: ``as_strided`` would read whatever memory lies past it (a
    plan re-sized to a size its views do not fit read garbage, lumc.ir.symbolic)."""
    lo = start + sum(min(0, (d - 1) * st) for d, st in zip(shape, v.strides))
    hi = start + sum(max(0, (d - 1) * st) for d, st in zip(shape, v.strides))
    if lo < 0 or hi >= size:
        raise ShapeError(f"view {v} reads elements {lo}..{hi} of a source of {size}")


def apply_view(x: np.ndarray, v: View) -> np.ndarray:
    """Evaluate a view on a numpy array; zero-copy (``as_strided``) unless it is masked."""
    if x.dtype in _STORAGE_NP:   # as_strided cannot read ml_dtypes' 1-byte types: move the bytes
        return apply_view(np.asarray(x).view(np.uint8), v).view(x.dtype)
    flat = np.asarray(x, order="C").reshape(-1)
    if v.numel == 0:
        return np.zeros(v.shape, dtype=x.dtype)
    isz = flat.itemsize
    if v.mask is None:
        _check_extent(v, v.offset, v.shape, flat.size)
        return np.lib.stride_tricks.as_strided(flat[v.offset:], v.shape,
                                               tuple(s * isz for s in v.strides), writeable=False)
    if any(lo >= hi for lo, hi in v.mask):
        return np.zeros(v.shape, dtype=x.dtype)
    # a dim the view broadcasts (stride 0) and the mask keeps whole: read once, broadcast back
    # (a padded concat's mask over a convolution's product space is not copied per channel)
    bdims = {d for d, (st, size, (lo, hi)) in enumerate(zip(v.strides, v.shape, v.mask))
             if st == 0 and size > 1 and (lo, hi) == (0, size)}
    if bdims:
        one = View(tuple(1 if d in bdims else size for d, size in enumerate(v.shape)), v.strides,
                   v.offset, tuple((0, 1) if d in bdims else m for d, m in enumerate(v.mask)))
        return np.broadcast_to(apply_view(x, one), v.shape)
    out = np.zeros(v.shape, dtype=x.dtype)
    box = tuple(slice(lo, hi) for lo, hi in v.mask)
    start = v.offset + sum(lo * st for (lo, _), st in zip(v.mask, v.strides))
    sub_shape = tuple(hi - lo for lo, hi in v.mask)
    _check_extent(v, start, sub_shape, flat.size)
    out[box] = np.lib.stride_tricks.as_strided(flat[start:], sub_shape,
                                               tuple(s * isz for s in v.strides), writeable=False)
    return out


def iota_array(shape: Shape, axis: int, dtype: dt.DType) -> np.ndarray:
    """Index along ``axis``, broadcast to ``shape``."""
    r = np.arange(shape[axis], dtype=dtype.np)
    bshape = [1] * len(shape)
    bshape[axis] = shape[axis]
    return np.asarray(np.broadcast_to(r.reshape(bshape), shape), order="C")


def _ewise_flops(shapes, out, arg):
    return prod(out)


def _reduce_flops(shapes, out, arg):
    return prod(shapes[0])


def _zero_flops(shapes, out, arg):
    return 0


def _leaf_shape(shapes, arg):
    return tuple(arg.shape)


def _leaf_dtype(dts, arg):
    return arg.dtype


def _unary(name, fn, triton, props=()):
    return OpDef(name, "unary", 1, _float_unary, _same_shape, _np_errstate(lambda xs, a: fn(xs[0])),
                 _ewise_flops, name, triton, frozenset({"elementwise", *props}))


_ROWS = [
    # leaves: the arg carries shape and dtype
    OpDef("Input", "leaf", 0, _leaf_dtype, _leaf_shape, lambda xs, a: None, _zero_flops,
          "Input", "load", frozenset({"leaf"})),
    OpDef("Constant", "leaf", 0, _leaf_dtype, _leaf_shape, lambda xs, a: a.value, _zero_flops,
          "Const", "load", frozenset({"leaf"})),
    OpDef("Iota", "leaf", 0, _leaf_dtype, _leaf_shape,
          lambda xs, a: iota_array(a.shape, a.axis, a.dtype), _zero_flops, "Iota", "iota",
          frozenset({"leaf"})),
    # unary
    _unary("Exp2", np.exp2, "tl.exp2({0})"),
    _unary("Log2", np.log2, "tl.log2({0})"),
    _unary("Sin", np.sin, "tl.sin({0})"),
    _unary("Sqrt", np.sqrt, "tl.sqrt_rn({0})"),
    _unary("Recip", lambda x: np.reciprocal(x), "(1.0 / {0})"),
    OpDef("Cast", "unary", 1, lambda dts, a: a, _same_shape, lambda xs, a: cast_array(xs[0], a),
          _zero_flops, "Cast", "{0}.to({dtype})", frozenset({"elementwise"})),
    # binary: same shape and dtype (broadcast is an explicit view)
    OpDef("Add", "binary", 2, _same_numeric, _same_shape,
          _np_errstate(lambda xs, a: np.add(xs[0], xs[1], dtype=xs[0].dtype)), _ewise_flops,
          "Add", "({0} + {1})", frozenset({"elementwise", "commutative", "associative"})),
    OpDef("Mul", "binary", 2, _same_numeric, _same_shape,
          _np_errstate(lambda xs, a: np.multiply(xs[0], xs[1], dtype=xs[0].dtype)), _ewise_flops,
          "Mul", "({0} * {1})", frozenset({"elementwise", "commutative", "associative"})),
    # IEEE division, correctly rounded (numpy's float divide is IEEE; f16/bf16 via f32 and one
    # rounding, innocuous since 24 >= 2p + 2, Figueroa 1995); integer division is a composition
    OpDef("Div", "binary", 2, _float_binary, _same_shape,
          _np_errstate(lambda xs, a: np.divide(xs[0], xs[1], dtype=xs[0].dtype)), _ewise_flops,
          "Div", "tl.math.div_rn({0}, {1})", frozenset({"elementwise"})),
    OpDef("Mod", "binary", 2, _same_numeric, _same_shape, _ref_mod, _ewise_flops,
          "Mod", "_fmod({0}, {1})", frozenset({"elementwise"})),
    OpDef("LessThan", "binary", 2, _compare, _same_shape,
          _np_errstate(lambda xs, a: np.less(xs[0], xs[1])), _ewise_flops,
          "LessThan", "({0} < {1})", frozenset({"elementwise"})),
    # select: never cond*a + (1-cond)*b, which turns 0*inf into NaN
    OpDef("Where", "ternary", 3, _where_dtype, _same_shape,
          lambda xs, a: np.where(xs[0], xs[1], xs[2]), _zero_flops,
          "Where", "tl.where({0}, {1}, {2})", frozenset({"elementwise"})),
    # reductions over a tuple of axes, keeping them as size-1 dims
    OpDef("SumReduce", "reduce", 1, _sum_dtype, _reduce_shape, _ref_reduce("sum"), _reduce_flops,
          "SumReduce", "tl.sum({0}, axis={axis})", frozenset({"reduce"})),
    OpDef("MaxReduce", "reduce", 1, _reduce_dtype, _reduce_shape, _ref_reduce("max"),
          _reduce_flops, "MaxReduce", "tl.max({0}, axis={axis}, propagate_nan=tl.PropagateNan.ALL)",
          frozenset({"reduce", "idempotent"})),
    # data-dependent read: out = table[..., index[...], ...] along axis (index in [0, n))
    OpDef("Gather", "gather", 2, _gather_dtype, _gather_shape, _ref_gather, _zero_flops,
          "Gather", "load", frozenset()),
    # movement
    OpDef("View", "movement", 1, _first, _view_shape, lambda xs, v: apply_view(xs[0], v),
          _zero_flops, "View", "load", frozenset({"view"})),
    OpDef("Contiguous", "movement", 1, _first, _same_shape,
          lambda xs, a: np.asarray(xs[0], order="C"), _zero_flops, "Contiguous", "store",
          frozenset()),
]

OPS: dict[str, OpDef] = {row.name: row for row in _ROWS}
ELEMENTWISE = frozenset(n for n, r in OPS.items() if "elementwise" in r.props)
UNARY = frozenset(n for n, r in OPS.items() if r.group == "unary")
BINARY = frozenset(n for n, r in OPS.items() if r.group == "binary")
REDUCE = frozenset(n for n, r in OPS.items() if r.group == "reduce")
LEAVES = frozenset(n for n, r in OPS.items() if r.group == "leaf")
