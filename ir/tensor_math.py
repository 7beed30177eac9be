"""Transcendental, rounding, power and integer-division compositions of
:class:`lumc.ir.tensor.Tensor`.

A mixin of ``Tensor`` (split out of ``tensor.py`` by concept): every method builds primitives only
(``Exp2``, ``Log2``, ``Sin``, ``Sqrt``, ``Mod``, ``Where``...), exact where IEEE-754 / ONNX is exact,
with the error stated where it approximates.
"""
from __future__ import annotations

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError

LOG2E = 1.4426950408889634   # log2(e)
LN2 = 0.6931471805599453     # ln(2)
HALF_PI = 1.5707963267948966


class TensorMath:
    """Math methods of ``Tensor``; see the module docstring."""
    __slots__ = ()

    def _float(self) -> "Tensor":
        if not self.dtype.is_float:
            raise ShapeError(f"needs a float tensor, got {self.dtype}")
        return self

    def widened(self, fn) -> "Tensor":
        """``fn(self)`` for a float tensor, f16/bf16 computed in f32 and rounded once: a formula
        evaluated in f16 rounds at every step (``tanh`` was 3 ulp off, ``log`` 2; ``sigmoid``
        below -11 gave 0 for 1.5e-5, its ``1 + exp(-x)`` overflowing to inf; ``cos(54304)`` gave
        0 for 1.9e-4, the cancellation of ``1 - 2 sin(x/2)**2``)."""
        x = self._float()
        if x.dtype in (dt.f16, dt.bf16):
            return fn(x.cast(dt.f32)).cast(x.dtype)
        return fn(x)

    def exp2(self) -> "Tensor":
        return self._float()._op("Exp2")

    def log2(self) -> "Tensor":
        return self._float()._op("Log2")

    def exp(self) -> "Tensor":
        """``exp(x) = exp2(x * log2 e)``; relative error about ``|x| * eps`` from rounding x*log2e.
        f16/bf16 are computed in f32 and rounded once: ``x * log2 e`` rounded to f16 would put
        ``|x| * 2**-11`` of relative error into the result (4e-3 at x = 7.6)."""
        return self.widened(lambda x: x.mul(LOG2E).exp2())

    def log(self) -> "Tensor":
        """``ln(x) = log2(x) * ln 2``: 1 ulp extra (f16/bf16: none, :meth:`widened`); log(0) = -inf,
        log(x<0) = NaN."""
        return self.widened(lambda x: x.log2().mul(LN2))

    def sqrt(self) -> "Tensor":
        return self._float()._op("Sqrt")

    def rsqrt(self) -> "Tensor":
        return self.sqrt().recip()

    def sin(self) -> "Tensor":
        return self._float()._op("Sin")

    def cos(self) -> "Tensor":
        """``cos(x)``, absolute error a few ulp of 1 at any ``x``:

        * ``|x| < T``: ``sin(x + pi/2)`` with the sum kept exact: ``s = x + hi`` rounded, ``e``
          its error (Knuth's two-sum) plus ``lo`` (``hi + lo`` is pi/2 to twice the precision),
          and ``sin(s + e) = sin(s) - e sin(x)`` to first order; ``|e| <= ulp(T)/2`` makes the
          rest under ``eps`` (``T = 2**floor(log2(2 / sqrt(eps)))``: 4096 for fp32), and near
          the zeros of cos it keeps full relative precision;
        * beyond: ``1 - 2 sin(x/2)**2`` (``x/2`` is exact).

        A plain ``sin(x + pi/2)`` was off by ``ulp(x)/2``: 1.5e-4 at x = 1e4 (fp32), and
        ``cos(-x) != cos(x)``. inf and NaN give NaN. f16/bf16: in f32 (:meth:`widened`)."""
        return self.widened(TensorMath._cos)

    def _cos(self) -> "Tensor":
        x = self
        np_dt = x.dtype.np
        hi_v = np.asarray(HALF_PI, dtype=np_dt)
        lo_v = np.asarray(HALF_PI - float(hi_v), dtype=np_dt)
        hi = x.scalar_like(float(hi_v))
        s = x.add(hi)
        bb = s.sub(x)
        err = x.sub(s.sub(bb)).add(hi.sub(bb)).add(x.scalar_like(float(lo_v)))
        near = s.sin().sub(err.mul(x.sin()))
        h = x.mul(0.5).sin()
        far = x.scalar_like(1.0).sub(h.mul(h).mul(2.0))
        t = 2.0 ** np.floor(np.log2(2.0 / np.sqrt(float(np.finfo(np_dt).eps))))
        return x.abs().lt(x.scalar_like(t)).where(near, far)

    def tanh(self) -> "Tensor":
        """``tanh(x) = sign(x) (1 - e) / (1 + e)`` with ``e = exp(-2|x|)``; below |x| = 2**-4 an odd
        Taylor polynomial to x**9 (truncation error < 1e-13 relative), so small |x| keep full
        relative precision. Saturates to ±1 without overflow. f16/bf16: in f32
        (:meth:`widened`)."""
        return self.widened(TensorMath._tanh)

    def _tanh(self) -> "Tensor":
        x = self
        ax = x.abs()
        e = ax.mul(-2.0).exp()
        big = x.scalar_like(1.0).sub(e).div(x.scalar_like(1.0).add(e))
        big = x.lt(x.scalar_like(0.0)).where(big.neg(), big)
        x2 = x.mul(x)
        c = [1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835]
        p = x2.mul(c[4]).add(c[3])
        for k in (2, 1, 0):
            p = p.mul(x2).add(c[k])
        small = p.mul(x)
        return ax.lt(ax.scalar_like(0.0625)).where(small, big)

    def sigmoid(self) -> "Tensor":
        """``1 / (1 + exp(-x))``: exact limits 0 and 1, no overflow NaN; f16/bf16 in f32
        (:meth:`widened`)."""
        return self.widened(lambda x: x.neg().exp().add(1.0).recip())

    def floor(self) -> "Tensor":
        """Exact floor from ``fmod``: ``t = x - fmod(x, 1)`` is trunc(x); step down where the
        remainder is negative. Integers, ±0, ±inf and NaN pass through unchanged."""
        if not self.dtype.is_float:
            return self
        r = self.fmod(1.0)
        t = self.sub(r)
        zero = self.scalar_like(0.0)
        return r.lt(zero).where(t.sub(1.0), zero.lt(r).where(t, self))

    def ceil(self) -> "Tensor":
        if not self.dtype.is_float:
            return self
        return self.neg().floor().neg()

    def round(self) -> "Tensor":
        """Round half to even (ONNX ``Round``), exact."""
        if not self.dtype.is_float:
            return self
        fl = self.floor()
        d = self.sub(fl)
        half = self.scalar_like(0.5)
        up = fl.add(1.0)
        even = fl.fmod(2.0).eq(fl.scalar_like(0.0)).where(fl, up)
        r = half.lt(d).where(up, d.lt(half).where(fl, even))
        # a zero result keeps the sign of x (round(-0.4) == -0.0); x * 0 carries that sign
        return r.eq(r.scalar_like(0.0)).where(self.mul(0.0), r)

    def idiv(self, o) -> "Tensor":
        """Integer division truncating toward zero (C, ONNX ``Div``, torch ``rounding_mode="trunc"``),
        exact for every value of every integer dtype (i8..i64, u8..u64); same dtype out,
        broadcast shapes. See :meth:`_int_quotient` for overflow and division by zero.

        Raises:
            ShapeError: a float or bool operand, or shapes that do not broadcast.
        """
        return self._int_quotient(o, floor=False)

    def floordiv(self, o) -> "Tensor":
        """Integer division rounding toward -inf (Python ``//``, torch ``floor_divide`` and
        ``rounding_mode="floor"``), exact for every value; as :meth:`idiv` otherwise."""
        return self._int_quotient(o, floor=True)

    def _int_quotient(self, o, floor: bool) -> "Tensor":
        """``trunc(a / b)`` (``floor(a / b)`` when ``floor``) of integers, from ``Mod`` (C fmod,
        exact) and f64 arithmetic, then one exact correction.

        ``m = a - fmod(a, b)`` is the exact multiple ``trunc(a / b) * b``, and ``q0``, ``m / b``
        in f64 rounded to an integer, is ``q = trunc(a / b)`` exactly when ``|a| < 2**52`` (every
        8..32-bit value). A 64-bit ``q0`` is off by at most ``|q| * 2**-51`` (three f64 roundings;
        a nonzero error needs ``|q| > 2**50``, so ``|b| < 2**14``): the residual ``m - q0 * b``,
        computed in wrapping 64-bit arithmetic, is exactly ``(q - q0) * b``, below ``2**14`` in
        magnitude, and its f64 quotient by ``b`` is the exact correction. The floor form steps
        down by one where the remainder is nonzero and its sign differs from ``b``'s.

        Overflow wraps as in torch and numpy: ``MIN / -1`` is ``MIN``. Division by zero (an error
        in torch, undefined in ONNX) gives ``0`` for ``0 / 0``, else the dtype's max for
        ``a > 0`` and its min for ``a < 0``: the f64 quotient's +-inf / NaN saturated as ``Cast``
        saturates (the integer form of ``a / 0.0``).
        """
        from lumc.ir.tensor import const_values   # tensor.py imports this module
        a, b = self._bcast(o)
        d = a.dtype
        if not d.is_int:
            raise ShapeError(f"integer division needs integer tensors, got {d}")
        r = a.fmod(b)
        m = a.sub(r)
        bf = b.cast(dt.f64)
        # 8..32 bits: round in i64 so that MIN / -1 = -MIN wraps back to MIN in d below
        q = _round_to(m.cast(dt.f64).div(bf), d if d.itemsize == 8 else dt.i64)
        if d.itemsize == 8:
            s = dt.i64      # u64 too: wrapping arithmetic mod 2**64 is the same bits either way
            q = q.cast(s)
            e = m.cast(s).sub(q.mul(b.cast(s)))
            q = q.add(_round_to(e.cast(dt.f64).div(bf), s))
        q = q.cast(d)
        zero = a.scalar_like(0)
        if floor and d.kind == "int":
            fix = r.ne(zero).logical_and(r.lt(zero).logical_xor(b.lt(zero)))
            q = fix.where(q.sub(q.scalar_like(1)), q)
        bv = const_values(b)
        if bv is None or not bv.all():
            sat = a.lt(zero).where(a.scalar_like(d.min_value()),
                                   a.eq(zero).where(zero, a.scalar_like(d.max_value())))
            q = b.eq(zero).where(sat, q)
        return q

    def pow(self, o) -> "Tensor":
        """ONNX ``Pow`` / ``torch.pow``: ``x ** y`` broadcast, in ``x``'s dtype.

        Floats follow IEEE-754 ``pow`` (C99 Annex F.9.4.4, as numpy and torch): ``x ** ±0 = 1``
        and ``1 ** y = 1`` even for NaN; ``(-1) ** ±inf = 1``; ``(±0) ** y`` is ``±inf`` (y < 0
        odd integer), ``+inf`` (other y < 0), ``±0`` (y > 0 odd integer), ``+0`` (other y > 0);
        a finite ``x < 0`` to a finite non-integer power is NaN; ``x ** ±inf`` and ``(±inf) ** y``
        by magnitude, with the sign of an odd integer power. The magnitude is
        ``exp2(y * log2|x|)`` computed one precision up (f16/bf16 in f32, f32 in f64) and rounded
        once: within 1 ulp of the correctly rounded result. f64 has no wider type: its relative
        error is about ``|y log2 x| * 2**-52`` (up to ~2**-42 near the double range's ends).
        A constant integer exponent in [0, 4] or -1 is repeated multiplication (one rounding per
        product, the same special values; 2 and -1 are correctly rounded); a constant 0.5 is
        ``sqrt`` (correctly rounded) with ``pow``'s ``(-0) ** 0.5 = +0`` and
        ``(-inf) ** 0.5 = +inf``.

        Integers (``y`` an integer tensor of any int dtype): exact by binary exponentiation,
        wrapping modulo ``2**bits`` on overflow like ``Mul`` (numpy, torch); for ``y < 0`` the
        truncated real value: 0 for ``|x| >= 2``, ``±1`` for ``x = ±1``, and ``0 ** y`` is ``+inf``
        saturated to the type's max (see ``Cast``). An integer ``x`` with a float ``y`` is ``pow``
        in f64 truncated toward zero (the ONNX reference, ``np.power(x, y).astype(x.dtype)``),
        rounded to the nearest integer first where ``y`` is integral (the exact value is then an
        integer, or in [-1, 1]).
        """
        from lumc.ir.tensor import Tensor, broadcast_shapes   # tensor.py imports this module
        if not isinstance(o, Tensor):
            y = np.asarray(o)
            fractional = y.dtype.kind == "f" and not (np.isfinite(y).all()
                                                      and (y == np.trunc(y)).all())
            # an integer tensor to a fractional Python power: the f64 path, not the power truncated
            o = (Tensor.const(y, dt.f64) if fractional and not self.dtype.is_float
                 else self._coerce(y))
        if o.node.op == "Constant" and o.node.arg.value.size == 1:
            c = o.node.arg.value.reshape(())
            shape = broadcast_shapes(self.shape, o.shape)
            if np.isfinite(c) and float(c) == int(c):
                n = int(c)
                if (0 <= n <= 4 or n == -1 and self.dtype.is_float) or (
                        0 <= n <= 64 and not self.dtype.is_float):
                    return self.powi(n).expand(shape)
            if float(c) == 0.5 and self.dtype.is_float:
                x = self.add(self.scalar_like(0.0))   # -0 + 0 = +0: pow(-0, 0.5) is +0, sqrt(-0) -0
                # pow(-inf, 0.5) is +inf where sqrt(-inf) is NaN
                r = x.isinf(detect_positive=False).where(x.scalar_like(np.inf), x.sqrt())
                return r.expand(shape)
        if self.dtype.is_float:
            return self._pow_float(o)
        if o.dtype.is_float:
            y = o.cast(dt.f64)
            r = self.cast(dt.f64)._pow_float(y)
            # an integral y: the real value is an integer (y >= 0), or in [-1, 1] (y < 0), which
            # exp2(y log2 x) misses by an ulp or so (9 ** 3.0 = 728.99999...): rounded to the
            # nearest, it truncates as the exact value does (np.power rounds correctly)
            r = y.floor().eq(y).where(r.round(), r)
            return r.cast(self.dtype)
        return self._pow_int(o)

    def _pow_float(self, o) -> "Tensor":
        """IEEE ``pow`` of a float ``self`` (see :meth:`pow`), ``o`` of any numeric dtype."""
        wide = dt.f32 if self.dtype in (dt.f16, dt.bf16) else dt.f64
        x, y = self.cast(wide)._bcast(o.cast(wide))
        one, zero = x.scalar_like(1.0), x.scalar_like(0.0)
        ax = x.abs()
        mag = y.mul(ax.log2()).exp2()
        # |x| = 1, y = ±inf: log2 1 = 0 and 0 * inf is NaN; the limit is 1
        mag = ax.eq(one).logical_and(y.isinf()).where(one, mag)
        y_int = y.floor().eq(y)   # ±inf counts as an (even) integer, NaN does not
        y_odd = y_int.logical_and(y.fmod(2.0).abs().eq(one))
        # the sign bit, not x < 0: (-0) ** 3 is -0 and (-0) ** -1 is -inf
        r = x.signbit().logical_and(y_odd).where(mag.neg(), mag)
        # a finite x < 0 to a finite non-integer power has no real value (-0 and -inf have one)
        finite_neg = x.lt(zero).logical_and(x.scalar_like(-np.inf).lt(x))
        no_real = finite_neg.logical_and(y_int.logical_not())
        r = no_real.where(x.scalar_like(np.nan), r)
        r = y.eq(zero).logical_or(x.eq(one)).where(one, r)   # x ** ±0 = 1, 1 ** y = 1, NaN too
        return r.cast(self.dtype)

    def _pow_int(self, o) -> "Tensor":
        """Exact integer ``pow`` (see :meth:`pow`): ``o`` an integer tensor, any int dtype."""
        from lumc.ir.tensor import broadcast_shapes
        shape = broadcast_shapes(self.shape, o.shape)
        x, y = self.expand(shape), o.expand(shape)
        bits = 8 * y.dtype.itemsize - (0 if y.dtype.kind == "uint" else 1)   # value bits of y
        # right-to-left binary exponentiation over every value bit of y: bit k multiplies x**(2**k)
        result, base = x.scalar_like(1), x
        for k in range(bits):
            low = y if k + 1 == bits else y.fmod(y.scalar_like(2 ** (k + 1)))   # y mod 2**(k+1)
            bit = y.scalar_like(2 ** k - 1).lt(low)
            result = bit.where(result.mul(base), result)
            if k + 1 < bits:
                base = base.mul(base)
        if y.dtype.kind == "uint":
            return result
        # y < 0: the real value 1 / x**-y truncated toward zero
        zero, one = x.scalar_like(0), x.scalar_like(1)
        # 1 / 0 = +inf, saturated to the type's max
        r = x.eq(zero).where(x.scalar_like(np.iinfo(x.dtype.np).max), zero)
        r = x.eq(one).where(one, r)
        if x.dtype.kind != "uint":
            odd = y.fmod(y.scalar_like(2)).ne(y.scalar_like(0))
            r = x.eq(one.neg()).where(odd.where(one.neg(), one), r)
        return y.lt(y.scalar_like(0)).where(r, result)

    def powi(self, n: int) -> "Tensor":
        """``x ** n`` for a Python int ``n`` by repeated squaring (``n < 0``: reciprocal)."""
        if n == 0:
            return self.scalar_like(1)
        if n < 0:
            if not self.dtype.is_float:
                raise ShapeError("negative integer power of an integer tensor")
            return self.powi(-n).recip()
        result, base = None, self
        while n:
            if n & 1:
                result = base if result is None else result.mul(base)
            n >>= 1
            if n:
                base = base.mul(base)
        return result


def _round_to(x, to: dt.DType):
    """f64 ``x`` (an integer plus rounding error below 1/2) rounded half away from zero, as
    integer dtype ``to`` (``Cast`` truncates and saturates)."""
    half = x.scalar_like(0.5)
    return x.lt(x.scalar_like(0.0)).where(x.sub(half), x.add(half)).cast(to)
