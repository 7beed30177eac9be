"""Tensor: the tensor-level library's front door. Every method builds primitive nodes only.

``Tensor`` wraps an immutable IR node and adds numpy-style broadcasting and the compositions that
DESIGN.md leaves out of the primitive set: subtraction, division, comparisons, min/max, exp/log,
floor/ceil/round, pow, modulo in both ONNX modes, reductions, and movement. Each composition is exact
where IEEE-754 / ONNX is exact, and its docstring states the error where it approximates.

Conventions: axes may be negative; reductions take ``axes`` (None = all) and ``keepdims``; integer
and float semantics follow the ONNX operator of the same name.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import Node, const_node, iota_node, node, view_node
from lumc.ir.tensor_math import HALF_PI, LN2, LOG2E, TensorMath  # noqa: F401
from lumc.ir.views import View, prod



def normalize_axis(axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)`` for ``axis`` in ``[-rank, rank)``; raises ShapeError otherwise."""
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcasting of shapes; raises ShapeError when incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = {s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def const_values(t: "Tensor") -> np.ndarray | None:
    """The array of the ``Constant`` that ``t`` is, or reads through unmasked views (a superset
    of the values ``t`` holds); None when ``t`` is anything else."""
    n = t.node
    while n.op == "View" and n.arg.mask is None:
        n = n.srcs[0]
    return np.asarray(n.arg.value) if n.op == "Constant" else None


class Tensor(TensorMath):
    """A lazily built tensor: an IR node plus numpy-style methods. Immutable."""
    __slots__ = ("node",)

    def __init__(self, n: Node):
        self.node = n

    # ---- basics ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> dt.DType:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def numel(self) -> int:
        return prod(self.node.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.node!r})"

    @staticmethod
    def const(value, dtype: dt.DType | None = None) -> "Tensor":
        """A constant from a numpy array or Python scalar (``dtype`` casts it)."""
        arr = np.asarray(value)
        if dtype is not None:
            arr = arr.astype(dtype.np)
        elif isinstance(value, float):
            arr = arr.astype(np.float32)   # a bare Python float means f32, as in ONNX models
        return Tensor(const_node(arr))

    @staticmethod
    def full(shape: Sequence[int], value, dtype: dt.DType) -> "Tensor":
        """``value`` broadcast to ``shape`` (one scalar constant plus a view)."""
        c = Tensor.const(np.array(value, dtype=dtype.np), dtype)
        return c.reshape((1,) * len(shape)).expand(tuple(shape)) if len(shape) else c

    @staticmethod
    def iota(shape: Sequence[int], axis: int, dtype: dt.DType = dt.i64) -> "Tensor":
        return Tensor(iota_node(tuple(shape), normalize_axis(axis, len(shape)), dtype))

    def scalar_like(self, value) -> "Tensor":
        """``value`` in this tensor's dtype, broadcast to its shape."""
        return Tensor.full(self.shape, value, self.dtype)

    def _op(self, op: str, *others: "Tensor", arg=None) -> "Tensor":
        return Tensor(node(op, (self.node, *(o.node for o in others)), arg))

    # ---- movement (views) ------------------------------------------------------------------
    def _view(self, fn) -> "Tensor":
        return Tensor(view_node(self.node, fn))

    def reshape(self, shape: Sequence[int]) -> "Tensor":
        """Row-major reshape; one ``-1`` is inferred; ``0`` is a literal zero-size dim."""
        shape = [int(d) for d in shape]
        if shape.count(-1) > 1:
            raise ShapeError(f"reshape to {shape}: more than one -1")
        if -1 in shape:
            rest = prod(d for d in shape if d != -1)
            if rest == 0 or self.numel % rest:
                raise ShapeError(f"cannot reshape {self.shape} to {shape}")
            shape[shape.index(-1)] = self.numel // rest
        if prod(shape) != self.numel:
            raise ShapeError(f"cannot reshape {self.shape} ({self.numel} elements) to {tuple(shape)}")
        shape = tuple(shape)
        if shape == self.shape:
            return self
        return self._view(lambda v: v.reshape(shape))

    def permute(self, perm: Sequence[int]) -> "Tensor":
        perm = tuple(normalize_axis(p, self.ndim) for p in perm)
        if sorted(perm) != list(range(self.ndim)):
            raise ShapeError(f"bad permutation {perm} for rank {self.ndim}")
        if perm == tuple(range(self.ndim)):
            return self
        return self._view(lambda v: v.permute(perm))

    def transpose(self, a: int = -2, b: int = -1) -> "Tensor":
        perm = list(range(self.ndim))
        a, b = normalize_axis(a, self.ndim), normalize_axis(b, self.ndim)
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(perm)

    def expand(self, shape: Sequence[int]) -> "Tensor":
        """Broadcast to ``shape`` (numpy rules, leading dims added)."""
        shape = tuple(int(d) for d in shape)
        if shape == self.shape:
            return self
        if len(shape) < self.ndim:
            raise ShapeError(f"cannot expand {self.shape} to {shape}")
        x = self if self.ndim == len(shape) else self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
        for s, n in zip(x.shape, shape):
            if s != n and s != 1:
                raise ShapeError(f"cannot expand {self.shape} to {shape}")
        return x._view(lambda v: v.expand(shape))

    def broadcast_to(self, shape: Sequence[int]) -> "Tensor":
        return self.expand(broadcast_shapes(self.shape, shape))

    def unsqueeze(self, axes: Iterable[int]) -> "Tensor":
        axes = sorted(normalize_axis(a, self.ndim + len(list(axes))) for a in axes)
        shape = list(self.shape)
        for a in axes:
            shape.insert(a, 1)
        return self.reshape(shape)

    def squeeze(self, axes: Iterable[int] | None = None) -> "Tensor":
        if axes is None:
            return self.reshape([d for d in self.shape if d != 1])
        axes = {normalize_axis(a, self.ndim) for a in axes}
        for a in axes:
            if self.shape[a] != 1:
                raise ShapeError(f"cannot squeeze axis {a} of size {self.shape[a]}")
        return self.reshape([d for i, d in enumerate(self.shape) if i not in axes])

    def flatten(self, axis: int = 1) -> "Tensor":
        axis = axis + self.ndim if axis < 0 else axis   # ONNX: -1 is the last dim, not past it
        return self.reshape((prod(self.shape[:axis]), prod(self.shape[axis:])))

    def slice(self, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
              steps: Sequence[int] | None = None) -> "Tensor":
        """ONNX ``Slice``: clamped starts/ends, negative indices from the end, any nonzero step."""
        axes = list(range(len(starts))) if axes is None else [normalize_axis(a, self.ndim) for a in axes]
        steps = [1] * len(starts) if steps is None else list(steps)
        st = [0] * self.ndim
        sp = [1] * self.ndim
        cnt = list(self.shape)
        for a, s, e, p in zip(axes, starts, ends, steps):
            if p == 0:
                raise ShapeError("slice step must be nonzero")
            r = range(*slice(int(s), int(e), int(p)).indices(self.shape[a]))
            st[a], sp[a], cnt[a] = (r.start if len(r) else 0), p, len(r)
        if st == [0] * self.ndim and sp == [1] * self.ndim and cnt == list(self.shape):
            return self
        return self._view(lambda v: v.slice(st, sp, cnt))

    def flip(self, axis: int) -> "Tensor":
        a = normalize_axis(axis, self.ndim)
        return self.slice([-1], [-(2 ** 63)], [a], [-1])

    def pad(self, pads: Sequence[tuple[int, int]], value=0.0) -> "Tensor":
        """Constant padding; ``pads[k] = (before, after)``, negative values crop."""
        crop_s, crop_e = [], []
        for (b, a), d in zip(pads, self.shape):
            crop_s.append(-b if b < 0 else 0)
            crop_e.append(d + a if a < 0 else d)
        x = self
        if any(b < 0 or a < 0 for b, a in pads):
            x = self.slice(crop_s, crop_e)
        pos = [(max(b, 0), max(a, 0)) for b, a in pads]
        if all(b == 0 and a == 0 for b, a in pos):
            return x
        padded = x._view(lambda v: v.pad(pos))
        if value == 0 and not (x.dtype.is_float and math.copysign(1.0, float(value)) < 0):
            return padded
        inside = Tensor.full(x.shape, True, dt.bool_)._view(lambda v: v.pad(pos))
        return inside.where(padded, Tensor.full(padded.shape, value, x.dtype))

    def window(self, axis: int, size: int, stride: int = 1, dilation: int = 1) -> "Tensor":
        """Sliding windows along ``axis`` as a view: ``axis`` becomes ``(count, size)``."""
        axis = normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        span = (size - 1) * dilation + 1
        count = max(0, (n - span) // stride + 1)
        return self._view(lambda v: v.window(axis, size, stride, dilation, count))

    def contiguous(self) -> "Tensor":
        return self._op("Contiguous")

    # ---- elementwise ---------------------------------------------------------------------------
    def _coerce(self, other) -> "Tensor":
        if isinstance(other, Tensor):
            return other
        return Tensor.const(np.array(other, dtype=self.dtype.np), self.dtype)

    def _bcast(self, other) -> tuple["Tensor", "Tensor"]:
        o = self._coerce(other)
        if o.dtype != self.dtype:
            raise ShapeError(f"dtypes differ: {self.dtype} vs {o.dtype}")
        shape = broadcast_shapes(self.shape, o.shape)
        return self.expand(shape), o.expand(shape)

    def _rbcast(self, other) -> tuple["Tensor", "Tensor"]:
        b, a = self._bcast(other)
        return a, b

    def add(self, o) -> "Tensor":
        a, b = self._bcast(o)
        return a._op("Add", b)

    def mul(self, o) -> "Tensor":
        a, b = self._bcast(o)
        return a._op("Mul", b)

    def neg(self) -> "Tensor":
        """``-x`` as ``x * -1``: exact (sign flip) for floats, wrapping for integers."""
        if self.dtype.is_bool:
            raise ShapeError("cannot negate bool")
        return self.mul(Tensor.const(np.array(-1).astype(self.dtype.np)))  # uint: -1 wraps to max

    def sub(self, o) -> "Tensor":
        """``a - b`` as ``a + (-b)``: identical in IEEE-754 arithmetic."""
        a, b = self._bcast(o)
        return a.add(b.neg())

    def recip(self) -> "Tensor":
        return self._op("Recip")

    def div(self, o) -> "Tensor":
        """ONNX ``Div``. Floats: the ``Div`` primitive, correctly rounded (IEEE-754; the reciprocal
        form ``a * (1/b)``, up to 1.5 ulp off, is only a fast-math rewrite). Integers: truncation
        toward zero, exact (:meth:`idiv`, which also defines division by zero)."""
        a, b = self._bcast(o)
        if a.dtype.is_float:
            return a._op("Div", b)
        return a.idiv(b)

    def fmod(self, o, zero_divisors: bool = True) -> "Tensor":
        """C ``fmod`` (ONNX Mod with fmod=1): the result has the sign of the dividend.

        An integer divisor of 0, undefined in ONNX, gives 0 (numpy's ``fmod``, the ONNX
        reference's value): the ``Mod`` primitive, which refuses it, divides by 1 there. With
        ``zero_divisors=False`` (torch ``fmod`` and ``remainder``, which refuse it) the divisor
        reaches ``Mod`` as given, so a 0 is refused there (``DivisionByZeroError``).
        """
        a, b = self._bcast(o)
        bv = const_values(b)
        if zero_divisors and not a.dtype.is_float and (bv is None or not bv.all()):
            zero = b.scalar_like(0)
            by_zero = b.eq(zero)
            return by_zero.where(zero, a._op("Mod", by_zero.where(b.scalar_like(1), b)))
        return a._op("Mod", b)

    def mod(self, o, zero_divisors: bool = True) -> "Tensor":
        """Python-style modulo (ONNX Mod with fmod=0): the result has the sign of the divisor.
        An integer divisor of 0 as in :meth:`fmod`."""
        a, b = self._bcast(o)
        r = a.fmod(b, zero_divisors)
        zero = r.scalar_like(0)
        fix = r.ne(zero).logical_and(r.lt(zero).logical_xor(b.lt(zero)))
        return fix.where(r.add(b), r)

    def lt(self, o) -> "Tensor":
        a, b = self._bcast(o)
        return a._op("LessThan", b)

    def gt(self, o) -> "Tensor":
        a, b = self._bcast(o)
        return b.lt(a)

    def isnan(self) -> "Tensor":
        """NaN test from ``LessThan``: only NaN is neither below +inf nor above -inf."""
        if not self.dtype.is_float:
            return Tensor.full(self.shape, False, dt.bool_)
        below = self.lt(self.scalar_like(np.inf))
        above = self.scalar_like(-np.inf).lt(self)
        return below.logical_or(above).logical_not()

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> "Tensor":
        if not self.dtype.is_float:
            return Tensor.full(self.shape, False, dt.bool_)
        pos = self.scalar_like(np.finfo(np.float64).max if self.dtype == dt.f64 else
                               float(np.finfo(self.dtype.np).max)).lt(self)
        neg = self.lt(self.scalar_like(-float(np.finfo(self.dtype.np).max)))
        if detect_positive and detect_negative:
            return pos.logical_or(neg)
        if detect_positive:
            return pos
        if detect_negative:
            return neg
        return Tensor.full(self.shape, False, dt.bool_)

    def signbit(self) -> "Tensor":
        """C99 ``signbit`` as bool: true for ``x < 0`` and for -0.0 (whose reciprocal is -inf).
        No primitive reads a NaN's sign bit: NaN gives False."""
        zero = self.scalar_like(0)
        if not self.dtype.is_float:
            return self.lt(zero)
        return self.lt(zero).logical_or(self.recip().lt(zero))

    def le(self, o) -> "Tensor":
        """``a <= b``: not ``b < a``, and false when either side is NaN."""
        a, b = self._bcast(o)
        r = b.lt(a).logical_not()
        if a.dtype.is_float:
            r = r.logical_and(a.isnan().logical_or(b.isnan()).logical_not())
        return r

    def ge(self, o) -> "Tensor":
        a, b = self._bcast(o)
        return b.le(a)

    def eq(self, o) -> "Tensor":
        a, b = self._bcast(o)
        if a.dtype.is_bool:
            return a.logical_xor(b).logical_not()
        return a.le(b).logical_and(b.le(a))

    def ne(self, o) -> "Tensor":
        return self.eq(o).logical_not()

    def where(self, a, b) -> "Tensor":
        """``self ? a : b`` with broadcasting; ``self`` must be bool."""
        a = a if isinstance(a, Tensor) else (b._coerce(a) if isinstance(b, Tensor) else Tensor.const(a))
        b = b if isinstance(b, Tensor) else a._coerce(b)
        shape = broadcast_shapes(self.shape, a.shape, b.shape)
        return self.expand(shape)._op("Where", a.expand(shape), b.expand(shape))

    def _bool(self) -> "Tensor":
        if not self.dtype.is_bool:
            raise ShapeError(f"logical op needs bool, got {self.dtype}")
        return self

    def logical_not(self) -> "Tensor":
        x = self._bool()
        return x.where(x.scalar_like(False), x.scalar_like(True))

    def logical_and(self, o) -> "Tensor":
        a, b = self._bool()._bcast(o)
        return a.where(b, a.scalar_like(False))

    def logical_or(self, o) -> "Tensor":
        a, b = self._bool()._bcast(o)
        return a.where(a.scalar_like(True), b)

    def logical_xor(self, o) -> "Tensor":
        a, b = self._bool()._bcast(o)
        return a.where(b.logical_not(), b)

    def maximum(self, o) -> "Tensor":
        """Elementwise max; NaN in either operand gives NaN (as numpy and ONNX)."""
        a, b = self._bcast(o)
        r = b.lt(a).where(a, b)   # ties (0 vs -0) give b, as numpy does
        if a.dtype.is_float:
            r = a.isnan().where(a, r)
        return r

    def minimum(self, o) -> "Tensor":
        """Elementwise min; NaN in either operand gives NaN; ties give ``o`` (numpy's choice)."""
        a, b = self._bcast(o)
        r = a.lt(b).where(a, b)
        if a.dtype.is_float:
            r = a.isnan().where(a, r)
        return r

    def clip(self, lo=None, hi=None) -> "Tensor":
        """``x < lo ? lo : x``, then ``hi < x ? hi : x`` (ONNX ``Clip``, ``torch.clamp``); ``lo``
        and ``hi`` broadcast to ``x`` (scalars or tensors of its dtype; None: no bound). An ``x``
        equal to a bound is kept, so ``-0.0`` clipped at 0 stays ``-0.0`` as onnxruntime and eager
        give (``maximum`` returns the bound on ties, +0.0). A NaN in ``x`` or in a bound gives NaN;
        ``lo > hi`` gives ``hi``. Shape: the broadcast of all three; dtype: ``x``'s.

        Raises:
            ShapeError: when a bound's dtype differs from ``x``'s or the shapes do not broadcast.
        """
        x = self
        for bound, below in ((lo, True), (hi, False)):
            if bound is None:
                continue
            x, b = x._bcast(bound)
            r = (x.lt(b) if below else b.lt(x)).where(b, x)
            vals = const_values(b)
            if b.dtype.is_float and (vals is None or np.isnan(vals).any()):
                r = b.isnan().where(b, r)   # a NaN bound gives NaN, as maximum/minimum did
            x = r
        return x

    def abs(self) -> "Tensor":
        """``|x|``; ``x + 0`` turns -0.0 into +0.0 so ``abs(-0.0) == +0.0`` exactly."""
        if self.dtype.kind == "uint" or self.dtype.is_bool:
            return self
        zero = self.scalar_like(0)
        pos = self.add(zero) if self.dtype.is_float else self
        return self.lt(zero).where(self.neg(), pos)

    def sign(self, nan_to_zero: bool = False) -> "Tensor":
        """-1, 0 or 1 in ``x``'s dtype (zeros of either sign give +0.0). A NaN stays NaN, as ONNX
        Sign (onnxruntime); ``nan_to_zero`` gives 0 for it, as PyTorch's ``torch.sign``."""
        zero = self.scalar_like(0)
        one = self.scalar_like(1)
        r = self.lt(zero).where(one.neg() if self.dtype.kind != "uint" else zero,
                                zero.lt(self).where(one, zero))
        return self.isnan().where(self, r) if self.dtype.is_float and not nan_to_zero else r

    def cast(self, to: dt.DType) -> "Tensor":
        if to == self.dtype:
            return self
        return self._op("Cast", arg=to)

    # ---- reductions ----------------------------------------------------------------------------
    def _axes(self, axes) -> tuple[int, ...]:
        if axes is None:
            return tuple(range(self.ndim))
        if isinstance(axes, int):
            axes = [axes]
        return tuple(sorted({normalize_axis(a, self.ndim) for a in axes}))

    def _finish_reduce(self, r: "Tensor", axes, keepdims) -> "Tensor":
        return r if keepdims else r.reshape([d for i, d in enumerate(r.shape) if i not in axes])

    def sum(self, axes=None, keepdims: bool = False) -> "Tensor":
        ax = self._axes(axes)
        x = self.cast(dt.i64) if self.dtype.is_bool else self
        r = x._op("SumReduce", arg=ax) if ax else x
        return self._finish_reduce(r, ax, keepdims)

    def max(self, axes=None, keepdims: bool = False) -> "Tensor":
        ax = self._axes(axes)
        r = self._op("MaxReduce", arg=ax) if ax else self
        return self._finish_reduce(r, ax, keepdims)

    def min(self, axes=None, keepdims: bool = False) -> "Tensor":
        """``-max(-x)`` for floats; ``-1 - max(-1 - x)`` for integers (no overflow at the minimum)."""
        if self.dtype.is_float:
            return self.neg().max(axes, keepdims).neg()
        if self.dtype.is_bool:
            return self.logical_not().max(axes, keepdims).logical_not()
        # reflect around the top: c - x never overflows for c = -1 (signed) or the maximum (unsigned)
        c = -1 if self.dtype.kind == "int" else int(self.dtype.max_value())
        r = self.scalar_like(c).sub(self).max(axes, keepdims=True)
        return self._finish_reduce(r.scalar_like(c).sub(r), self._axes(axes), keepdims)

    def mean(self, axes=None, keepdims: bool = False) -> "Tensor":
        """The sum over ``axes`` times ``1/n`` (floats; NaN for an empty set) or divided by ``n``
        (integers, truncating). f16/bf16 sum and scale in f32 and round once: an f16 sum passes
        65504 where the mean does not (a pool over 64x64 values of 30)."""
        if self.dtype.is_float and self.dtype.accumulator != self.dtype:
            return self.cast(self.dtype.accumulator).mean(axes, keepdims).cast(self.dtype)
        ax = self._axes(axes)
        n = prod(self.shape[a] for a in ax)
        s = self.sum(ax, keepdims)
        if self.dtype.is_float:
            return s.mul(1.0 / n) if n else s.mul(np.nan)
        return s.div(n)

    # ---- contraction ---------------------------------------------------------------------------
    def matmul(self, o: "Tensor") -> "Tensor":
        """numpy ``matmul``: 1-D operands promoted, batch dims broadcast; ``Mul`` + ``SumReduce``."""
        a, b = self, o
        if a.dtype != b.dtype:
            raise ShapeError(f"matmul dtypes differ: {a.dtype} vs {b.dtype}")
        a1, b1 = a.ndim == 1, b.ndim == 1
        if a1:
            a = a.reshape((1, a.shape[0]))
        if b1:
            b = b.reshape((b.shape[0], 1))
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(f"matmul inner dims differ: {self.shape} @ {o.shape}")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        full = batch + (m, k, n)
        av = a.reshape(a.shape + (1,)).expand(full)
        bv = b.reshape(b.shape[:-2] + (1,) + b.shape[-2:]).expand(full)
        r = av.mul(bv).sum(-2)
        if a1:
            r = r.squeeze([-2])
        if b1:
            r = r.squeeze([-1])
        return r

    # ---- operators -----------------------------------------------------------------------------
    __add__ = add
    __mul__ = mul
    __sub__ = sub
    __truediv__ = div
    __matmul__ = matmul
    __neg__ = neg

    def __radd__(self, o):
        return self._coerce(o).add(self)

    def __rmul__(self, o):
        return self._coerce(o).mul(self)

    def __rsub__(self, o):
        return self._coerce(o).sub(self)

    def __rtruediv__(self, o):
        return self._coerce(o).div(self)

    def __lt__(self, o):
        return self.lt(o)

    def __gt__(self, o):
        return self.gt(o)


def concat(xs: Sequence[Tensor], axis: int) -> Tensor:
    """Concatenate along ``axis``: pad each part into place and select with ``Where`` (never an add,
    which would turn -0.0 into +0.0)."""
    xs = list(xs)
    axis = normalize_axis(axis, xs[0].ndim)
    total = sum(x.shape[axis] for x in xs)
    nonempty = [x for x in xs if x.shape[axis] > 0]
    if len(nonempty) == 1:
        return nonempty[0]
    if not nonempty:
        shape = list(xs[0].shape)
        shape[axis] = 0
        return Tensor.full(shape, 0, xs[0].dtype)
    for x in xs:
        if x.dtype != xs[0].dtype or x.ndim != xs[0].ndim or any(
                x.shape[i] != xs[0].shape[i] for i in range(x.ndim) if i != axis):
            raise ShapeError(f"concat parts do not fit: {[x.shape for x in xs]} on axis {axis}")
    out, pos = None, 0
    for x in nonempty:
        n = x.shape[axis]
        pads = [(0, 0)] * x.ndim
        pads[axis] = (pos, total - pos - n)
        placed = x.pad(pads)
        if out is None:
            out = placed
        else:
            inside = Tensor.full(x.shape, True, dt.bool_).pad(pads, False)
            out = inside.where(placed, out)
        pos += n
    return out


def split(x: Tensor, sizes: Sequence[int], axis: int) -> list[Tensor]:
    axis = normalize_axis(axis, x.ndim)
    if sum(sizes) != x.shape[axis]:
        raise ShapeError(f"split sizes {list(sizes)} do not add up to {x.shape[axis]}")
    out, pos = [], 0
    for s in sizes:
        out.append(x.slice([pos], [pos + s], [axis]))
        pos += s
    return out


def stack(xs: Sequence[Tensor], axis: int) -> Tensor:
    axis = normalize_axis(axis, xs[0].ndim + 1)
    return concat([x.unsqueeze([axis]) for x in xs], axis)
