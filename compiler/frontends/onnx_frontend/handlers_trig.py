"""Inverse trigonometric and hyperbolic ops (``Atan Asin Acos Sinh Cosh Asinh Acosh Atanh``) from
primitives, accurate to a few ulp.

``atan`` is the Cephes ``atan`` (S. L. Moshier, Cephes Math Library 2.8, ``atan.c``): reduction to
``|t| <= 0.66`` through ``atan(x) = pi/2 - atan(1/x)`` and ``pi/4 + atan((x-1)/(x+1))``, then the
rational approximation ``t + t^3 P(t^2)/Q(t^2)`` (relative error < 1e-16 in f64 arithmetic, and
within a few f32 ulp when evaluated in f32). The others reduce to it or to ``expm1``/``log1p``
(``lumc.ir.library.activations``) in forms without cancellation. f16/bf16 are computed in f32 and
rounded once.
"""
from __future__ import annotations

import numpy as np

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor

_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
      -1.228866684490136173410e2, -6.485021904942025371773e1)
_Q = (1.0, 2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
      4.853903996359136964868e2, 1.945506571482613964425e2)
_T3P8 = 2.41421356237309504880      # tan(3 pi / 8)
_MOREBITS = 6.123233995736765886130e-17
_PI_2 = np.pi / 2
_PI_4 = np.pi / 4
_LN2 = 0.6931471805599453


def _poly(z: Tensor, coeffs) -> Tensor:
    r = z.scalar_like(coeffs[0])
    for c in coeffs[1:]:
        r = r.mul(z).add(c)
    return r


def _widened(fn):
    def run(x: Tensor) -> Tensor:
        if not x.dtype.is_float:
            raise ShapeError(f"needs a float tensor, got {x.dtype}")
        if x.dtype in (dt.f16, dt.bf16):
            return fn(x.cast(dt.f32)).cast(x.dtype)
        return fn(x)
    return run


def _odd(x: Tensor, r: Tensor) -> Tensor:
    """An odd function's value from ``r = f(|x|)``: ``-r`` below 0, and ``x`` itself at ``±0``
    (``f(-0.0) = -0.0``, IEEE 754 and eager PyTorch; ``-0.0 < 0`` is false, so the sign test
    alone gave +0.0)."""
    return x.eq(x.scalar_like(0.0)).where(x, x.lt(x.scalar_like(0.0)).where(r.neg(), r))


@_widened
def atan(x: Tensor) -> Tensor:
    ax = x.abs()
    big = ax.scalar_like(_T3P8).lt(ax)
    mid = ax.scalar_like(0.66).lt(ax).logical_and(big.logical_not())
    one = ax.scalar_like(1.0)
    t = big.where(one.neg().div(ax), mid.where(ax.sub(one).div(ax.add(one)), ax))
    z = t.mul(t)
    r = t.mul(z.mul(_poly(z, _P)).div(_poly(z, _Q))).add(t)
    base = big.where(ax.scalar_like(_PI_2 + _MOREBITS), mid.where(ax.scalar_like(_PI_4 + 0.5 * _MOREBITS),
                                                                  ax.scalar_like(0.0)))
    r = base.add(r)
    return _odd(x, r)


@_widened
def asin(x: Tensor) -> Tensor:
    """``atan(x / sqrt((1 - x)(1 + x)))``; ``asin(±1) = ±pi/2`` through ``atan(±inf)``."""
    one = x.scalar_like(1.0)
    return atan(x.div(one.sub(x).mul(one.add(x)).sqrt()))


@_widened
def acos(x: Tensor) -> Tensor:
    """``2 atan(sqrt((1 - x) / (1 + x)))``: no cancellation near either end."""
    one = x.scalar_like(1.0)
    return atan(one.sub(x).div(one.add(x)).sqrt()).mul(2.0)


def _exp(x: Tensor, scale: int = 0) -> Tensor:
    """``exp(x) * 2**scale`` within ~2 ulp for large ``|x|`` too (Cody-Waite: ``x = n ln2 + r``
    with ``n ln2`` exact in two parts, Cephes ``expf``/``exp`` constants; ``exp(r) = exp2(r log2
    e)`` with ``|r| <= ln2/2``, then scaled by ``2^(n + scale)`` in two exact halves so no
    intermediate overflows: ``exp(x) / 2`` is finite where ``exp(x)`` alone is not)."""
    hi, lo = (0.693359375, -2.12194440e-4) if x.dtype == dt.f32 else \
        (6.93145751953125e-1, 1.42860682030941723212e-6)
    lim = 200.0 if x.dtype == dt.f32 else 1500.0    # past overflow/underflow either way
    x = x.clip(x.scalar_like(-lim), x.scalar_like(lim))
    n = x.mul(1.4426950408889634).round()
    r = x.sub(n.mul(hi)).sub(n.mul(lo))
    n = n.add(float(scale)) if scale else n
    half = n.mul(0.5).floor()
    return r.exp().mul(half.exp2()).mul(n.sub(half).exp2())


@_widened
def sinh(x: Tensor) -> Tensor:
    """``sign(x) (e + e / (e + 1)) / 2`` with ``e = expm1(|x|)`` below 1 (no cancellation near 0),
    ``H - 1/(4H)`` with the precise ``H = exp(|x|) / 2`` above (finite up to ``|x| = ln(2 max)``,
    89.4 for fp32, where ``exp(|x|)`` itself overflows from 88.7)."""
    ax = x.abs()
    e = lib("activations.expm1")(ax)
    small = e.add(e.div(e.add(1.0))).mul(0.5)
    h = _exp(ax, -1)
    big = h.sub(h.mul(4.0).recip())
    r = ax.lt(ax.scalar_like(1.0)).where(small, big)
    return _odd(x, r)


@_widened
def cosh(x: Tensor) -> Tensor:
    """``H + 1/(4H)`` with the precise ``H = exp(|x|) / 2`` (finite up to ``|x| = ln(2 max)``)."""
    h = _exp(x.abs(), -1)
    return h.add(h.mul(4.0).recip())


@_widened
def asinh(x: Tensor) -> Tensor:
    """``sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))``; ``log|x| + ln 2`` once ``x^2`` would
    overflow."""
    ax = x.abs()
    x2 = ax.mul(ax)
    small = lib("activations.log1p")(ax.add(x2.div(x2.add(1.0).sqrt().add(1.0))))
    huge = ax.scalar_like(np.sqrt(np.finfo(ax.dtype.np).max) / 2).lt(ax)
    r = huge.where(ax.log().add(_LN2), small)
    return _odd(x, r)


@_widened
def acosh(x: Tensor) -> Tensor:
    """``log1p((x - 1) + sqrt((x - 1)(x + 1)))``; ``log x + ln 2`` for huge x; NaN below 1."""
    t = x.sub(1.0)
    small = lib("activations.log1p")(t.add(t.mul(x.add(1.0)).sqrt()))
    huge = x.scalar_like(np.sqrt(np.finfo(x.dtype.np).max) / 2).lt(x)
    r = huge.where(x.log().add(_LN2), small)
    return x.lt(x.scalar_like(1.0)).where(x.scalar_like(np.nan), r)


@_widened
def atanh(x: Tensor) -> Tensor:
    """``sign(x) log1p(2|x| / (1 - |x|)) / 2``: full precision near 0 and near ±1 (the argument of
    log1p stays >= 0); ``±inf`` at ``±1``, NaN beyond."""
    ax = x.abs()
    r = lib("activations.log1p")(ax.mul(2.0).div(ax.scalar_like(1.0).sub(ax))).mul(0.5)
    return _odd(x, r)


_FNS = {"Atan": atan, "Asin": asin, "Acos": acos, "Sinh": sinh, "Cosh": cosh, "Asinh": asinh,
        "Acosh": acosh, "Atanh": atanh}


@handler(*_FNS, requires=["activations.expm1", "activations.log1p"])
def _trig(ctx: OpContext):
    return _FNS[ctx.node.op_type](ctx.input(0))
