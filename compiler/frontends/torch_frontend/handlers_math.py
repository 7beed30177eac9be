"""Handlers for elementwise ATen ops: arithmetic, comparisons, logic, unary math, activations,
casts, and tensor factories (``full``, ``arange``, ``scalar_tensor``...).

Operands are promoted with PyTorch's rules (:func:`~.registry.result_dtype`: dimensioned tensors over
0-d tensors over Python scalars) before the :class:`~lumc.ir.tensor.Tensor` method runs, so
``x_f32 + 1`` and ``mask_bool & mask_bool`` keep their PyTorch dtypes.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from lumc.compiler.frontends.torch_frontend.registry import (aten, arg, float_of, lib, lumc_dtype, promote,
                                                   int_scalar, result_dtype, to_tensor)
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor


def _scaled(b: Tensor, alpha) -> Tensor:
    return b if alpha == 1 else b.mul(to_tensor(alpha, b.dtype))


def _in_opmath(d: dt.DType, operands) -> bool:
    """Whether eager's 16-bit float ``mul``/``div`` (with a rounding mode too) differs from the
    op in ``d``: it takes a scalar operand (a Python number, a 0-d tensor) at f32, its opmath,
    and rounds the result once, so a scalar ``d`` does not hold (``70000.0``, ``1/3``, ``1e-8``,
    a 0-d f32 tensor, whose value the trace does not know) is not rounded to ``d`` first
    (``h * 70000.0``: inf; ``h / 70000.0``: 0). Its ``add``/``sub`` round the scalar to ``d``
    first, as lumc does."""
    if d not in (dt.f16, dt.bf16):
        return False
    for x in operands:
        if isinstance(x, Tensor):
            if x.ndim == 0 and x.dtype != d:     # a tensor of more dims is cast to ``d`` first
                return True
        else:
            with np.errstate(over="ignore"):
                if float(np.array(x, dtype=d.np)) != float(x):
                    return True
    return False


def _at_opmath(x, d: dt.DType) -> Tensor:
    """Operand ``x`` of a 16-bit op computed at f32 (:func:`_in_opmath`): a scalar (a Python
    number, a 0-d tensor) as it is, a tensor of more dims rounded to ``d`` first, as eager casts
    it to the result dtype (``h * int_tensor``: 2049 is 2048 in f16)."""
    if isinstance(x, Tensor) and x.ndim > 0:
        return x.cast(d).cast(dt.f32)
    return to_tensor(x, dt.f32)


def _in_result_dtype(a, b, fn) -> Tensor:
    """``fn(a, b)`` in PyTorch's result dtype of ``a`` and ``b``, at f32 and rounded once where
    eager computes it so (:func:`_in_opmath`)."""
    d = result_dtype(a, b)
    if _in_opmath(d, (a, b)):
        return fn(_at_opmath(a, d), _at_opmath(b, d)).cast(d)
    a, b = promote(a, b)
    return fn(float_of(a), float_of(b)) if fn is Tensor.div else fn(a, b)


# ---- arithmetic ------------------------------------------------------------------------------------
@aten("add.Tensor", "add.Scalar")
def _add(ctx, a, b, *, alpha=1):
    a, b = promote(a, b)
    if a.dtype.is_bool:
        return a.logical_or(b)
    return a.add(_scaled(b, alpha))


@aten("sub.Tensor", "sub.Scalar")
def _sub(ctx, a, b, *, alpha=1):
    a, b = promote(a, b)
    return a.sub(_scaled(b, alpha))


@aten("rsub.Tensor", "rsub.Scalar")
def _rsub(ctx, a, b, alpha=1):
    a, b = promote(a, b)
    return b.sub(_scaled(a, alpha))


@aten("mul.Tensor", "mul.Scalar")
def _mul(ctx, a, b):
    if result_dtype(a, b).is_bool:
        a, b = promote(a, b)
        return a.logical_and(b)
    return _in_result_dtype(a, b, Tensor.mul)


@aten("div.Tensor", "div.Scalar")
def _div(ctx, a, b):
    return _in_result_dtype(a, b, Tensor.div)


def _floor_div_float(a: Tensor, b: Tensor) -> Tensor:
    """PyTorch's ``div_floor_floating``: ``(a - fmod(a, b)) / b`` moved down by one where the
    remainder's sign differs from ``b``'s, then rounded to the nearest integer; ``a / b`` when
    ``b == 0``. Exact where PyTorch's is."""
    a, b = a.broadcast_to(b.shape), b.broadcast_to(a.shape)
    zero = a.scalar_like(0.0)
    mod = a.fmod(b)
    div = a.sub(mod).div(b)
    fix = mod.ne(zero).logical_and(b.lt(zero).logical_xor(mod.lt(zero)))
    div = fix.where(div.sub(1.0), div)
    fl = div.floor()
    fl = div.sub(fl).gt(div.scalar_like(0.5)).where(fl.add(1.0), fl)
    # a zero quotient takes the sign of the true quotient, as PyTorch's copysign(0, a / b)
    fl = div.ne(zero).where(fl, a.div(b).mul(0.0))
    return b.eq(zero).where(a.div(b), fl)


def _trunc(x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        return x
    return x.lt(x.scalar_like(0.0)).where(x.ceil(), x.floor())


@aten("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(ctx, a, b, *, rounding_mode=None):
    d = result_dtype(a, b)
    if rounding_mode is not None and _in_opmath(d, (a, b)):     # a 16-bit float by a scalar
        return _div_mode(ctx, _at_opmath(a, d), _at_opmath(b, d),
                         rounding_mode=rounding_mode).cast(d)
    a, b = promote(a, b)
    if rounding_mode is None:
        return float_of(a).div(float_of(b))
    if rounding_mode == "trunc":
        return _trunc(a.div(b)) if a.dtype.is_float else a.idiv(b)
    if rounding_mode == "floor":
        return _floor_div_float(a, b) if a.dtype.is_float else a.floordiv(b)
    raise ctx.unsupported(f"rounding_mode {rounding_mode!r}")


@aten("floor_divide.default", "floor_divide.Scalar")
def _floor_divide(ctx, a, b):
    return _div_mode(ctx, a, b, rounding_mode="floor")




@aten("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar")
def _pow(ctx, a, b):
    """IEEE ``pow`` (``Tensor.pow``), except where eager PyTorch's kernels (CPU and CUDA
    ``pow_tensor_scalar``) swap a Python exponent 0.5 / -0.5 for ``sqrt`` / ``rsqrt``: there
    ``(-0) ** 0.5 = -0`` and ``(-inf) ** 0.5 = NaN`` as in eager, not ``+0`` and ``+inf``."""
    d = result_dtype(a, b)
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        x = to_tensor(a, d)
        if x.dtype.is_float and b in (0.5, -0.5):
            return x.sqrt() if b > 0 else x.rsqrt()
        return x.pow(b)
    x, y = promote(a, b)
    return x.pow(y)


# ---- comparisons and logic ---------------------------------------------------------------------
def _compare(method):
    def fn(ctx, a, b):
        a, b = promote(a, b)
        if a.dtype.is_bool:   # LessThan needs numbers: compare bools as 0/1
            a, b = a.cast(dt.u8), b.cast(dt.u8)
        return method(a, b)
    return fn


for _name, _m in (("eq", Tensor.eq), ("ne", Tensor.ne), ("lt", Tensor.lt), ("le", Tensor.le),
                  ("gt", Tensor.gt), ("ge", Tensor.ge)):
    aten(f"{_name}.Tensor", f"{_name}.Scalar")(_compare(_m))


def _truth(x) -> Tensor:
    """``x != 0`` as bool (PyTorch's logical ops accept any dtype)."""
    x = to_tensor(x, dt.bool_) if not isinstance(x, Tensor) else x
    return x if x.dtype.is_bool else x.ne(x.scalar_like(0))


@aten("logical_not.default")
def _logical_not(ctx, x):
    return _truth(x).logical_not()


for _name, _m in (("and", Tensor.logical_and), ("or", Tensor.logical_or),
                  ("xor", Tensor.logical_xor)):
    aten(f"logical_{_name}.default")(lambda ctx, a, b, _m=_m: _m(_truth(a), _truth(b)))


def _bool_only(node) -> str | None:
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and v.dtype != torch.bool:
        return f"bitwise ops on {str(v.dtype).replace('torch.', '')} (only bool)"
    return None


for _name, _m in (("and", Tensor.logical_and), ("or", Tensor.logical_or),
                  ("xor", Tensor.logical_xor)):
    aten(f"bitwise_{_name}.Tensor", f"bitwise_{_name}.Scalar", check=_bool_only)(
        lambda ctx, a, b, _m=_m: _m(*promote(a, b)))
aten("bitwise_not.default", check=_bool_only)(lambda ctx, x: x.logical_not())


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(ctx, cond, a, b):
    a, b = promote(a, b, wrap=False)      # eager refuses a scalar outside the result dtype
    return _truth(cond).where(a, b)


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(ctx, x, mask, value):
    return _truth(mask).where(to_tensor(value, x.dtype), x)


@aten("isnan.default")
def _isnan(ctx, x):
    return x.isnan()


@aten("isinf.default")
def _isinf(ctx, x):
    return x.isinf()


@aten("isfinite.default")
def _isfinite(ctx, x):
    return x.isnan().logical_or(x.isinf()).logical_not()




@aten("clamp.default", "clamp.Tensor")
def _clamp(ctx, x, min=None, max=None):
    """Eager's clamp: a value equal to a bound is kept (``clamp(-0.0, min=0)`` is -0.0), a NaN
    in ``x`` or a bound gives NaN (:meth:`Tensor.clip`)."""
    d = result_dtype(x, min, max)
    return x.cast(d).clip(None if min is None else to_tensor(min, d),
                          None if max is None else to_tensor(max, d))


@aten("clamp_min.default", "clamp_min.Tensor")
def _clamp_min(ctx, x, min):
    return _clamp(ctx, x, min=min)


@aten("clamp_max.default", "clamp_max.Tensor")
def _clamp_max(ctx, x, max):
    return _clamp(ctx, x, max=max)


# ---- unary math ------------------------------------------------------------------------------------
_FLOAT_UNARY = {
    "exp": Tensor.exp, "exp2": Tensor.exp2, "log": Tensor.log, "log2": Tensor.log2,
    "sqrt": Tensor.sqrt, "rsqrt": Tensor.rsqrt, "sin": Tensor.sin, "cos": Tensor.cos,
    "tanh": Tensor.tanh, "sigmoid": Tensor.sigmoid, "reciprocal": Tensor.recip,
    "tan": lambda x: x.sin().div(x.cos()),
    "log10": lambda x: x.log2().mul(math.log10(2.0)),
}
for _name, _m in _FLOAT_UNARY.items():
    aten(f"{_name}.default")(lambda ctx, x, _m=_m: _m(float_of(x)))

_LIB_UNARY = {"erf": "activations.erf", "erfc": "activations.erfc", "expm1": "activations.expm1",
              "log1p": "activations.log1p", "relu": "activations.relu", "silu": "activations.silu", "mish": "activations.mish",
              "hardswish": "activations.hard_swish"}
for _name, _q in _LIB_UNARY.items():
    aten(f"{_name}.default", requires=[_q])(lambda ctx, x, _q=_q: lib(_q)(float_of(x)))

_SAME_UNARY = {"neg": Tensor.neg, "abs": Tensor.abs, "floor": Tensor.floor,
               "ceil": Tensor.ceil, "round": Tensor.round, "trunc": _trunc}
for _name, _m in _SAME_UNARY.items():
    aten(f"{_name}.default")(lambda ctx, x, _m=_m: _m(x))


@aten("sign.default")
def _sign(ctx, x):
    """-1, 0 or 1 as eager: ``torch.sign(NaN)`` is 0 (ONNX Sign keeps the NaN), zeros give +0.0."""
    return x.sign(nan_to_zero=True)


@aten("sgn.default")
def _sgn(ctx, x):
    """``torch.sgn`` of a real tensor is ``torch.sign`` (-1, 0 or 1; NaN gives 0, zeros +0.0, as
    eager). A complex input (``x / |x|``) is refused by the dtype check (lumc has no complex
    dtype): ``unsupported ATen op: on complex64``."""
    return _sign(ctx, x)


@aten("round.decimals")
def _round_decimals(ctx, x, *, decimals=0):
    if decimals == 0:
        return x.round()
    s = 10.0 ** decimals
    return x.mul(s).round().div(x.scalar_like(s))


@aten("gelu.default", requires=["activations.gelu"])
def _gelu(ctx, x, *, approximate="none"):
    return lib("activations.gelu")(x, approximate=approximate)


@aten("leaky_relu.default")
def _leaky_relu(ctx, x, negative_slope=0.01):
    """Eager's ``x > 0 ? x : slope x``: with a negative slope -0.0 gives +0.0 and +0.0 gives
    -0.0 (ONNX ``LeakyRelu`` tests ``x < 0`` and keeps both zeros, as onnxruntime); NaN stays
    NaN. Same float dtype out as in; a 16-bit float's ``slope x`` at f32, as eager."""
    x = float_of(x)
    if x.dtype in (dt.f16, dt.bf16):
        return _leaky_relu(ctx, x.cast(dt.f32), negative_slope).cast(x.dtype)
    return x.gt(x.scalar_like(0.0)).where(x, x.mul(float(negative_slope)))


def _rrelu_training(node) -> str | None:
    """``rrelu`` samples its slopes only in training mode; in eval it is a leaky ReLU."""
    from lumc.compiler.frontends.torch_frontend.lowering import RANDOM_OP
    training = node.kwargs.get("training", node.args[4] if len(node.args) > 4 else False)
    return RANDOM_OP if training else None


@aten("rrelu_with_noise_functional.default", check=_rrelu_training)
def _rrelu(ctx, x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """``F.rrelu(training=False)`` (``nn.RReLU`` in eval): eager's leaky ReLU with slope
    ``(lower + upper) / 2``, the noise buffer passed through. It was refused as random sampling
    ('call module.eval()') though the module was in eval."""
    return _leaky_relu(ctx, x, (float(lower) + float(upper)) / 2), noise


@aten("elu.default", requires=["activations.expm1"])
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    # PyTorch: x > 0 ? scale x : scale alpha (exp(input_scale x) - 1)
    neg = lib("activations.expm1")(x.mul(float(input_scale))).mul(float(alpha) * float(scale))
    pos = x if scale == 1 else x.mul(float(scale))
    return x.gt(x.scalar_like(0.0)).where(pos, neg)


@aten("hardtanh.default")
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return x.clip(to_tensor(min_val, x.dtype), to_tensor(max_val, x.dtype))


@aten("hardsigmoid.default", requires=["activations.hard_sigmoid"])
def _hardsigmoid(ctx, x):
    return lib("activations.hard_sigmoid")(x, alpha=1.0 / 6.0, beta=0.5)


@aten("softplus.default", requires=["activations.softplus"])
def _softplus(ctx, x, beta=1.0, threshold=20.0):
    # PyTorch: x beta > threshold ? x : log1p(exp(x beta)) / beta
    xb = x if beta == 1 else x.mul(float(beta))
    y = lib("activations.softplus")(xb)
    y = y if beta == 1 else y.div(x.scalar_like(float(beta)))
    return xb.gt(x.scalar_like(float(threshold))).where(x, y)


# ---- casts and copies ------------------------------------------------------------------------------
@aten("_to_copy.default")
def _to_copy(ctx, x, *, dtype=None, **_layout):
    return x if dtype is None else x.cast(lumc_dtype(dtype))


def _identity(ctx, x, *args, **kwargs):
    return x


aten("clone.default", "alias.default", "alias_copy.default", "detach.default",
     "detach_copy.default", "lift_fresh_copy.default", "contiguous.default")(_identity)


@aten("copy.default")
def _copy(ctx, x, src, non_blocking=False):
    return src.cast(x.dtype).expand(x.shape)


# ---- factories -------------------------------------------------------------------------------------
def _factory_dtype(dtype, value) -> dt.DType:
    if dtype is not None:
        return lumc_dtype(dtype)
    if isinstance(value, bool):
        return dt.bool_
    return dt.i64 if isinstance(value, int) else dt.f32


def _full(shape, value, d: dt.DType) -> Tensor:
    if isinstance(value, Tensor):
        return value.cast(d).expand(tuple(shape))
    if d.is_int and isinstance(value, float):
        # PyTorch converts a float fill to an integer dtype toward zero (full(2, 2.7, long) is 2)
        # and refuses one the type cannot hold
        lo, hi = d.min_value(), d.max_value()
        if not math.isfinite(value) or not lo <= math.trunc(value) <= hi:
            raise ShapeError(f"fill value {value} does not fit {d}")
        value = math.trunc(value)
    elif d.is_int and isinstance(value, int) and not isinstance(value, bool):
        value = int_scalar(value, d)      # eager's conversion: 300 is refused for int8
    return Tensor.full(tuple(int(s) for s in shape), value, d)


@aten("full.default")
def _full_h(ctx, size, fill_value, *, dtype=None, **_layout):
    return _full(size, fill_value, _factory_dtype(dtype, fill_value))


@aten("full_like.default")
def _full_like(ctx, x, fill_value, *, dtype=None, **_layout):
    return _full(x.shape, fill_value, lumc_dtype(dtype) if dtype is not None else x.dtype)


@aten("scalar_tensor.default")
def _scalar_tensor(ctx, s, *, dtype=None, **_layout):
    return _full((), s, lumc_dtype(dtype) if dtype is not None else dt.f32)


for _name, _v in (("zeros", 0), ("ones", 1), ("empty", 0)):
    # empty memory is undefined; zeros are as good as any value and fold away
    aten(f"{_name}.memory_format" if _name == "empty" else f"{_name}.default")(
        lambda ctx, size, *a, dtype=None, _v=_v, **k: _full(size, _v, lumc_dtype(dtype) if dtype
                                                             else dt.f32))
    aten(f"{_name}_like.default")(
        lambda ctx, x, *a, dtype=None, _v=_v, **k: _full(x.shape, _v, lumc_dtype(dtype) if dtype
                                                         else x.dtype))
    aten(f"new_{_name}.default")(
        lambda ctx, x, size, *a, dtype=None, _v=_v, **k: _full(size, _v, lumc_dtype(dtype) if dtype
                                                               else x.dtype))


@aten("empty_strided.default")
def _empty_strided(ctx, size, stride, *, dtype=None, **_layout):
    return _full(size, 0, lumc_dtype(dtype) if dtype is not None else dt.f32)


@aten("empty_permuted.default")
def _empty_permuted(ctx, size, physical_layout, *, dtype=None, **_layout):
    return _full(size, 0, lumc_dtype(dtype) if dtype is not None else dt.f32)


@aten("new_full.default")
def _new_full(ctx, x, size, fill_value, *, dtype=None, **_layout):
    return _full(size, fill_value, lumc_dtype(dtype) if dtype is not None else x.dtype)


@aten("fill.Scalar", "fill.Tensor")
def _fill(ctx, x, value):
    return _full(x.shape, value, x.dtype)


def _arange(start, end, step, dtype) -> Tensor:
    ints = all(isinstance(v, int) for v in (start, end, step))
    d = lumc_dtype(dtype) if dtype is not None else (dt.i64 if ints else dt.f32)
    if step == 0:
        raise ShapeError("arange step must be nonzero")
    n = max(0, math.ceil((end - start) / step))
    if d.is_int and ints:
        return Tensor.iota((n,), 0, dt.i64).mul(step).add(start).cast(d)
    # PyTorch computes start + i * step in double, then rounds once to the result dtype
    r = Tensor.iota((n,), 0, dt.f64).mul(float(step)).add(float(start))
    return r.cast(d)


@aten("arange.default")
def _arange_end(ctx, end, *, dtype=None, **_layout):
    return _arange(0, end, 1, dtype)


@aten("arange.start")
def _arange_start(ctx, start, end, *, dtype=None, **_layout):
    return _arange(start, end, 1, dtype)


@aten("arange.start_step")
def _arange_step(ctx, start, end, step=1, *, dtype=None, **_layout):
    return _arange(start, end, step, dtype)


def _dropout_check(node) -> str | None:
    p, train = arg(node, 1, "p", 0.0), arg(node, 2, "train", False)
    if train and p:
        return "random dropout in training mode (call module.eval() before compiling)"
    return None


@aten("native_dropout.default", check=_dropout_check)
def _native_dropout(ctx, x, p, train):
    return x, Tensor.full(x.shape, True, dt.bool_)


@aten("dropout.default", check=_dropout_check)
def _dropout(ctx, x, p, train):
    return x



# ---- inverse trigonometric and hyperbolic (the ONNX frontend's Cephes-based compositions) ---------
def _trig_fn(name: str):
    from lumc.compiler.frontends.onnx_frontend import handlers_trig
    return getattr(handlers_trig, name)


for _name in ("atan", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh"):
    aten(f"{_name}.default", requires=["activations.expm1", "activations.log1p"])(
        lambda ctx, x, _n=_name: _trig_fn(_n)(float_of(x)))


@aten("atan2.default", requires=["activations.expm1", "activations.log1p"])
def _atan2(ctx, y, x):
    """C ``atan2`` from ``atan(y / x)`` moved by ``±pi`` for ``x < 0`` (including ``x = -0.0``);
    signed zeros and the four infinite corners (``±pi/4``, ``±3pi/4``) as IEEE."""
    y, x = (float_of(t) for t in promote(y, x))
    y, x = y.broadcast_to(x.shape), x.broadcast_to(y.shape)
    zero = x.scalar_like(0.0)
    q = _trig_fn("atan")(y.div(x))

    def negative(t):   # t < 0, or t == -0.0 (1 / -0.0 == -inf)
        return t.lt(zero).logical_or(t.eq(zero).logical_and(t.recip().lt(zero)))
    negx, negy = negative(x), negative(y)
    pi = negy.where(x.scalar_like(-math.pi), x.scalar_like(math.pi))
    r = negx.where(q.add(pi), q)
    both_zero = y.eq(zero).logical_and(x.eq(zero))
    r = both_zero.where(negx.where(pi, y), r)
    corner = negx.where(x.scalar_like(0.75 * math.pi), x.scalar_like(0.25 * math.pi))
    both_inf = y.isinf().logical_and(x.isinf())
    return both_inf.where(negy.where(corner.neg(), corner), r)


def _promoted(method: str):
    """A handler applying the Tensor method ``method`` to both operands after type promotion."""
    def handler(ctx, a, b):
        a, b = promote(a, b)
        return getattr(a, method)(b)
    return handler


def _modulo(method: str):
    """``fmod`` / ``mod`` after type promotion; an integer divisor of 0 is refused, as eager
    refuses it (``ZeroDivisionError``): it reaches the ``Mod`` primitive as given."""
    def handler(ctx, a, b):
        a, b = promote(a, b)
        return getattr(a, method)(b, zero_divisors=False)
    return handler


# remainder is Python modulo (Tensor.mod: fmod moved by b where signs differ), fmod is C's;
# maximum/minimum propagate NaN
aten("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor")(_modulo("mod"))
aten("fmod.Tensor", "fmod.Scalar")(_modulo("fmod"))
for _overloads, _method in [
        (("maximum.default", "max.other"), "maximum"),
        (("minimum.default", "min.other"), "minimum")]:
    aten(*_overloads)(_promoted(_method))


@aten("signbit.default")
def _signbit(ctx, x):
    """True for negative numbers and -0.0 (:meth:`Tensor.signbit`); a NaN's sign bit cannot be
    read by any primitive, so NaN gives False (PyTorch reads it: True for -NaN); bools have none."""
    return Tensor.full(x.shape, False, dt.bool_) if x.dtype.is_bool else x.signbit()


@aten("copysign.Tensor", "copysign.Scalar")
def _copysign(ctx, a, b):
    """``|a|`` with the sign of ``b`` (-0.0 counts as negative; a NaN ``b`` as positive, see
    :func:`_signbit`). Float result (integers promote to f32, as PyTorch)."""
    a, b = (float_of(t) for t in promote(a, b))
    mag = a.abs()
    return b.signbit().where(mag.neg(), mag)


@aten("hypot.default")
def _hypot(ctx, a, b):
    """``sqrt(a^2 + b^2)`` without overflow or underflow: ``m sqrt(1 + (n / m)^2)`` with
    ``m = max(|a|, |b|)``, ``n = min``; ``+inf`` when either is infinite (even with a NaN, as C's
    ``hypot``), NaN for another NaN, 0 for two zeros."""
    a, b = (float_of(t) for t in promote(a, b))
    a, b = a.abs().broadcast_to(b.shape), b.abs().broadcast_to(a.shape)
    m, n = a.maximum(b), a.minimum(b)
    zero = m.scalar_like(0.0)
    r = m.eq(zero).where(zero, n.div(m.eq(zero).where(m.scalar_like(1.0), m)))
    out = m.mul(r.mul(r).add(1.0).sqrt())
    return a.isinf().logical_or(b.isinf()).where(m.scalar_like(float("inf")), out)
