"""Primitive op -> Triton expression, from the op table's ``triton`` column, plus exact constants.

Every elementwise primitive renders through :func:`render_op`, which formats the op table's template
(``lumc.ir.ops.OPS[op].triton``) over operand expressions. A few ops need more than the template to
keep IEEE results on every dtype; each override says why:

* ``Recip``/``Div``: Triton's ``/`` on fp32 is ``div.full.f32`` (2 ulp); ``tl.math.div_rn`` is IEEE;
  on fp64 ``/`` is ``div.rn.f64`` (div_rn is fp32-only).
* ``Sqrt``/``Exp2``/``Log2``/``Sin``/``Recip``/``Div``/``Mod`` on fp16/bf16: computed in fp32 and rounded once,
  which is what the numpy reference does (Triton's math ops take fp32/fp64 only).
* ``Cast`` to bool is ``x != 0`` (NaN is True, as ONNX); float to int truncates and saturates to
  the type's min/max exactly (64-bit types included), NaN gives 0: the reference's definition of
  what ONNX leaves undefined (``lumc.ir.ops.cast_array``). A float that was
  itself cast from an integer that fits the target (a quantized weight's byte on its way to a
  gather index) converts plainly: no NaN, nothing to truncate or clamp.

Constants are rendered exactly: a float is written with Python's round-trip ``repr`` and typed by
``tl.full``, so inf, -inf, NaN, -0.0, subnormals and the largest finite values keep their bits
(a bare Python float literal would be typed fp32 or fp64 by magnitude, turning subnormals into fp64).
"""
from __future__ import annotations

import math

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.graph import Node
from lumc.ir.ops import OPS

LOW_FLOATS = (dt.f16, dt.bf16)

# Triton's signature spelling of each dtype's pointer element (``*fp32``), for AOT compiles.
SIGNATURE_TYPE = {
    "f64": "fp64", "f32": "fp32", "f16": "fp16", "bf16": "bf16", "i64": "i64", "i32": "i32",
    "i16": "i16", "i8": "i8", "u64": "u64", "u32": "u32", "u16": "u16", "u8": "u8", "bool": "i1",
    "f8e4m3fn": "fp8e4nv", "f8e5m2": "fp8e5",
}


def tl_dtype(d: dt.DType) -> str:
    """The Triton type expression of a lumc dtype (``tl.float32``).

    Raises:
        RenderError: a dtype Triton has no type for (the fnuz float8s, 4- and 2-bit types): the
            kernel is not rendered (an empty type made ``x.to()`` fail inside the kernel)."""
    if not d.triton:
        from lumc.backends.triton.codegen import RenderError
        raise RenderError(f"{d.name} has no Triton type")
    return d.triton


# A float cast to an OCP float8 type without ``saturate`` (ONNX ``Cast(saturate=0)``,
# ``QuantizeLinear(saturate=0)``) overflows as ml_dtypes (the ONNX reference) rounds: e4m3fn has no
# inf, so |x| past the midpoint 464 between its max 448 and 480 is NaN; e5m2's max 57344 ties with
# 65536 at 61440, which rounds to even: inf. Triton's conversion (PTX ``cvt...satfinite``, and the
# interpreter) saturates instead, so the overflow is formed on the float8's bits, signed as
# ml_dtypes signs it: (the comparison in the source type, where the bounds are exact, +bits, -bits).
_F8_OVERFLOW = {
    "f8e4m3fn": ("tl.abs({x}) > 464.0", 0x7F, 0xFF),
    "f8e5m2": ("tl.abs({x}) >= 61440.0", 0x7C, 0xFC),
}


def _float8_cast(expr: str, to: dt.DType) -> str:
    """``expr`` (a float) cast to float8 ``to`` with the reference's overflow (``_F8_OVERFLOW``);
    NaN stays NaN through Triton's conversion. A saturating ``Cast`` clamps before this one
    (``handlers_shape._cast_to``), so its values never reach the overflow."""
    pred, pos, neg = _F8_OVERFLOW[to.name]
    t = tl_dtype(to)
    bits = f"{expr}.to({t}).to(tl.uint8, bitcast=True)"
    special = f"tl.where({expr} > 0, tl.full([], {pos}, tl.uint8), tl.full([], {neg}, tl.uint8))"
    return f"tl.where({pred.format(x=expr)}, {special}, {bits}).to({t}, bitcast=True)"


def render_scalar(value, d: dt.DType) -> str:
    """A Python literal that converts exactly to ``value`` in dtype ``d``.

    Floats use the round-trip ``repr`` of the exact double (every f16/bf16/f32 value is one), with
    ``float('inf')``/``float('nan')`` for the non-finite values; ``-0.0`` keeps its sign.
    """
    if d.is_bool:
        return "1" if bool(value) else "0"
    if d.is_float:
        v = float(np.asarray(value).astype(np.float64))
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    return str(int(value))


def render_constant(value, d: dt.DType) -> str:
    """A 0-d Triton tensor holding ``value`` exactly in dtype ``d``."""
    return f"tl.full([], {render_scalar(value, d)}, {tl_dtype(d)})"


def load_other(d: dt.DType) -> str:
    """The ``other=`` of a masked ``tl.load`` of dtype ``d``: zero, written ``0.0`` for float8
    (Triton casts ``other`` to the pointer's element type and has no integer-to-float8 cast)."""
    return "0.0" if d in (dt.f8e4m3fn, dt.f8e5m2) else "0"


def neutral(kind: str, d: dt.DType) -> str:
    """The identity of a reduction (``sum`` or ``max``) as a Python literal in dtype ``d``."""
    if kind == "sum":
        return "0.0" if d.is_float else "0"
    return render_scalar(d.min_value(), d)


def _upcast(expr: str, d: dt.DType, body: str) -> str:
    """Evaluate ``body`` (a template over ``{x}``) in fp32 for fp16/bf16 operands, round once."""
    if d in LOW_FLOATS:
        return f"{body.format(x=f'{expr}.to(tl.float32)')}.to({tl_dtype(d)})"
    return body.format(x=expr)


def render_cast(expr: str, src: dt.DType, to: dt.DType) -> str:
    """``Cast`` with ONNX/reference semantics (see module docstring)."""
    if src == to:
        return expr
    if to.is_bool:
        return f"({expr} != 0)"
    if src.is_float and to.is_int:
        info = np.iinfo(to.np)
        # clamp in fp64, where every bound of a <=32-bit integer type is exact
        x = f"{expr}.to(tl.float64)"
        lo, hi = float(info.min), float(info.max)
        if to.itemsize == 8:
            # the largest double below 2**63 (2**64 unsigned): the type's max rounds up to 2**63
            hi = float(2 ** 64 - 2048) if to.kind == "uint" else float(2 ** 63 - 1024)
        out = (f"tl.where({x} != {x}, 0.0, tl.minimum(tl.maximum({x}, {lo!r}), {hi!r}))"
               f".to({tl_dtype(to)})")
        if to.itemsize == 8:
            # no double holds the max: one at or past max + 1 (2**63 or 2**64, +inf) takes it
            top = float(int(info.max) + 1)
            out = f"tl.where({x} >= {top!r}, {render_constant(info.max, to)}, {out})"
        return out
    if src.is_bool:
        return f"{expr}.to(tl.int8).to({tl_dtype(to)})"
    if src in (dt.f32, dt.f16, dt.bf16) and to.name in _F8_OVERFLOW:
        return _float8_cast(expr, to)
    return OPS["Cast"].triton.format(expr, dtype=tl_dtype(to))


def _exact_integer_float(x: Node, to: dt.DType) -> bool:
    """True when float ``x`` is ``Cast(i, float)`` of an integer ``i`` whose every value the float
    holds exactly and ``to`` (an integer type) holds: converting ``x`` to ``to`` is then exact."""
    if not (to.is_int and x.op == "Cast" and x.dtype.is_float and x.srcs[0].dtype.is_int):
        return False
    i = x.srcs[0].dtype
    digits = {dt.f64: 53, dt.f32: 24, dt.f16: 11, dt.bf16: 8}.get(x.dtype, 0)
    info, tinfo = np.iinfo(i.np), np.iinfo(to.np)
    return (max(abs(int(info.min)), int(info.max)) < 2 ** digits
            and tinfo.min <= info.min and info.max <= tinfo.max)


def render_op(n: Node, operands: list[str]) -> str:
    """The Triton expression of an elementwise node over already-rendered operand expressions."""
    op, d = n.op, n.dtype
    row = OPS[op]
    if op == "Cast":
        if _exact_integer_float(n.srcs[0], n.arg):
            return OPS["Cast"].triton.format(operands[0], dtype=tl_dtype(n.arg))
        return render_cast(operands[0], n.srcs[0].dtype, n.arg)
    if op == "Recip":
        if d == dt.f64:
            return row.triton.format(operands[0])
        return _upcast(operands[0], d, "tl.math.div_rn(tl.full([], 1.0, tl.float32), {x})")
    if op == "Sqrt" and d == dt.f64:  # sqrt_rn is fp32-only; fp64 sqrt lowers to sqrt.rn.f64
        return f"tl.sqrt({operands[0]})"
    if op in ("Sqrt", "Exp2", "Log2", "Sin"):
        return _upcast(operands[0], d, row.triton.replace("{0}", "{x}"))
    if op == "Div":
        a, b = operands
        if d == dt.f64:
            return f"({a} / {b})"
        if d in LOW_FLOATS:  # IEEE fp32 quotient rounded once: correctly rounded (24 >= 2p + 2)
            return f"tl.math.div_rn({a}.to(tl.float32), {b}.to(tl.float32)).to({tl_dtype(d)})"
        return row.triton.format(a, b)
    if op == "Mod":
        a, b = operands
        if d in LOW_FLOATS:  # fmod is exact, so fp32 then round changes nothing
            return f"_fmod({a}.to(tl.float32), {b}.to(tl.float32)).to({tl_dtype(d)})"
        return row.triton.format(a, b)
    if op in ("Add", "Mul", "LessThan", "Where"):
        return row.triton.format(*operands)
    raise NotImplementedError(f"no elementwise rendering for {op}")


# Helpers every generated module defines (the op table's templates refer to ``_fmod``).
HELPERS = '''
@triton.jit
def _fmod(a, b):
    # C fmod (sign of the dividend): Triton's % lowers to frem/srem, which are fmod
    return a % b


@triton.jit
def _max_nan(a, b):
    # max that propagates NaN from either side (IEEE maximum, ONNX Max/ReduceMax)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''
