"""Elementwise activations (ONNX ``Erf``, ``Gelu``, ``Relu`` ... ``Mish``) built from primitives.

Every function takes and returns a :class:`~lumc.ir.tensor.Tensor` of the same shape. Float-only
activations raise :class:`~lumc.ir.errors.ShapeError` on integer or bool input. Activations with a
transcendental part compute f16/bf16 inputs in f32 (``DType.accumulator``) and round once at the end,
as onnxruntime and PyTorch do, so their error is that of one f16/bf16 rounding.

Special values follow the ONNX definition of each op as onnxruntime evaluates it: a formula that gives
NaN at an infinity in onnxruntime (``Gelu(-inf)``, ``Softsign(±inf)``, ``Mish(-inf)``) gives NaN here
too, so ``lumc run --check`` agrees with onnxruntime on every input.
"""
from __future__ import annotations

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, broadcast_shapes

SQRT1_2 = 0.7071067811865476          # 1 / sqrt(2)
SQRT_2_OVER_PI = 0.7978845608028654   # sqrt(2 / pi), GELU tanh form
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875

# Rational interpolant of erf on [-c, c], c = erfinv(1 - 2**-24) = 3.8325..., outside of which erf
# rounds to +-1 in fp32. Source: Eigen ``generic_fast_erf_float`` (SpecialFunctionsImpl.h, 2023),
# also XLA's ``EmitErfF32``: erf(x) = x * P(x^2) / Q(x^2) with P of degree 4 and Q of degree 6 in x^2.
_ERF_CLAMP = 3.832506856900711
_ERF_P = (1.128379143519084, 0.18520832239976145, 0.050955695062380861, 0.0034082910107109506,
          0.00022905065861350646)
_ERF_Q = (1.0, 0.49746925110067538, 0.11098505178285362, 0.014070470171167667,
          0.0010179625278914885, 0.000023547966471313185, -1.1791602954361697e-7)


def _float(x: Tensor, op: str) -> Tensor:
    if not x.dtype.is_float:
        raise ShapeError(f"needs a float tensor, got {x.dtype}", op=op)
    return x


def _widen(x: Tensor, op: str) -> Tensor:
    """``x`` in the dtype the op computes in: f32 for f16/bf16, the dtype itself otherwise."""
    return _float(x, op).cast(x.dtype.accumulator)


def _horner(x2: Tensor, coeffs) -> Tensor:
    """``sum(coeffs[k] * x2**k)`` by Horner's rule (highest coefficient first)."""
    p = x2.mul(coeffs[-1]).add(coeffs[-2])
    for c in reversed(coeffs[:-2]):
        p = p.mul(x2).add(c)
    return p


def _is_one(u: Tensor) -> Tensor:
    """``u == 1`` for finite u, as two ``LessThan``s (true for NaN, where callers return NaN anyway)."""
    one = u.scalar_like(1.0)
    return u.lt(one).logical_or(one.lt(u)).logical_not()


def expm1(x: Tensor) -> Tensor:
    """``exp(x) - 1`` with full relative precision near 0 (Kahan's trick).

    For ``|x| < 1``: ``u = exp(x)``; ``x`` where ``u == 1``, else ``(u - 1) * x / log(u)``, which cancels
    the rounding error of ``u`` (Goldberg, "What every computer scientist should know...", thm. 4);
    a few ulp. For ``|x| >= 1``, ``u - 1`` has no cancellation. ``expm1(-0.0) = -0.0``,
    ``expm1(-inf) = -1``, ``expm1(inf) = inf``, NaN stays NaN. Float input only.
    """
    x = _float(x, "Expm1")
    u = x.exp()
    um1 = u.sub(1.0)
    kahan = _is_one(u).where(x, um1.mul(x.div(u.log())))
    return x.abs().lt(x.scalar_like(1.0)).where(kahan, um1)


def log1p(x: Tensor) -> Tensor:
    """``log(1 + x)`` with full relative precision near 0 (Kahan's trick: ``u = 1 + x``;
    ``x`` where ``u == 1``, else ``log(u) * x / (u - 1)``); a few ulp. ``log1p(-1) = -inf``,
    ``log1p(inf) = inf``, ``log1p(x < -1) = NaN``. Float input only."""
    x = _float(x, "Log1p")
    u = x.add(1.0)
    r = u.log().mul(x.div(u.sub(1.0)))
    r = _is_one(u).where(x, r)
    # u - 1 loses nothing once |x| >= 1 (and x / (u - 1) would be inf / inf at x = inf)
    return x.abs().lt(x.scalar_like(1.0)).where(r, u.log())


def erf(x: Tensor) -> Tensor:
    """ONNX ``Erf``: the Eigen/XLA rational approximation (see ``_ERF_P``), ``sign(x)`` beyond
    ``|x| >= 3.8325``.

    Error against ``math.erf`` (float64), measured by tests/ir/test_library_activations.py over a dense
    grid of 2.4 M points on [-6, 6] plus a geometric grid down to 1e-30, evaluating this graph with the
    reference executor:

    * fp32 (native rounding, no FMA): max absolute error 3.7e-7, max relative error 3.7e-7, at most
      6.1 fp32 ulp (the worst point is near |x| = 3.75);
    * the approximation itself (graph evaluated in float64, as for f64 inputs): max absolute and
      relative error 6.0e-8 (under one fp32 ulp) at the clamp point, 2.1e-8 for |x| < 3.8; so f64
      inputs get only about 7-8 correct digits;
    * f16/bf16 inputs are computed in fp32 and rounded once: within one f16/bf16 ulp.

    ``erf(±0) = ±0``, ``erf(±inf) = ±1``, ``erf(NaN) = NaN``. Shape and dtype of ``x``; float only.
    """
    xc = _widen(x, "Erf")
    x2 = xc.mul(xc)
    p = _horner(x2, _ERF_P).mul(xc)
    q = _horner(x2, _ERF_Q)
    r = p.div(q)
    one = xc.scalar_like(1.0)
    sign = xc.lt(xc.scalar_like(0.0)).where(one.neg(), one)
    big = xc.scalar_like(_ERF_CLAMP).lt(xc.abs())        # false for NaN, which then stays NaN
    return big.where(sign, r).cast(x.dtype)


# Press, Teukolsky, Vetterling, Flannery, Numerical Recipes in C, 2nd ed. (1992), section 6.2,
# ``erfcc``: a Chebyshev fit with fractional error below 1.2e-7 for every x
_ERFC_C = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
           1.48851587, -0.82215223, 0.17087277)


def erfc(x: Tensor) -> Tensor:
    """``1 - erf(x)`` without the cancellation: Numerical Recipes' ``erfcc`` (see ``_ERFC_C``),
    ``t exp(-z^2 + P(t))`` with ``z = |x|``, ``t = 1 / (1 + z / 2)``, and ``2 - erfc(z)`` for
    ``x < 0``. Computed in float64 (the exponent ``-z^2`` rounded in fp32 would cost ~5e-6 relative
    at ``z = 9``), so f16/bf16/f32 results carry the fit's 1.2e-7 relative error (about 2 fp32
    ulp) up to the final rounding, and keep it deep into the tail (``erfc(9) = 4.1e-37``), where
    ``1 - erf`` is 0; f64 inputs get only those ~7 digits. ``erfc(+inf) = 0``, ``erfc(-inf) = 2``,
    ``erfc(NaN) = NaN``. Shape and dtype of ``x``; float only."""
    xd = _float(x, "Erfc").cast(dt.f64)
    z = xd.abs()
    t = z.mul(0.5).add(1.0).recip()
    poly = t.mul(_ERFC_C[-1])
    for c in reversed(_ERFC_C[1:-1]):
        poly = poly.add(c).mul(t)
    poly = poly.add(_ERFC_C[0])
    ans = t.mul(z.mul(z).neg().add(poly).exp())
    neg = xd.lt(xd.scalar_like(0.0))
    return neg.where(xd.scalar_like(2.0).sub(ans), ans).cast(x.dtype)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """ONNX ``Gelu`` (opset 20): ``0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"``
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``. Error: that of :func:`erf` (or of
    ``Tensor.tanh``) times ``0.5 |x|``, plus a few roundings. ``gelu(-inf) = NaN`` as in onnxruntime.

    Raises:
        ShapeError: for ``approximate`` other than ``"none"``/``"tanh"`` or a non-float input.
    """
    xc = _widen(x, "Gelu")
    if approximate == "none":
        inner = erf(xc.mul(SQRT1_2))
    elif approximate == "tanh":
        inner = xc.mul(xc).mul(xc).mul(0.044715).add(xc).mul(SQRT_2_OVER_PI).tanh()
    else:
        raise ShapeError(f"approximate must be 'none' or 'tanh', got {approximate!r}", op="Gelu")
    return xc.mul(0.5).mul(inner.add(1.0)).cast(x.dtype)


def relu(x: Tensor) -> Tensor:
    """ONNX ``Relu``: ``x < 0 ? 0 : x``. Exact; NaN stays NaN and ``-0.0`` stays ``-0.0`` (as
    onnxruntime). Any numeric dtype."""
    zero = x.scalar_like(0)
    return x.lt(zero).where(zero, x)


def leaky_relu(x: Tensor, alpha: float = 0.01) -> Tensor:
    """ONNX ``LeakyRelu``: ``x < 0 ? alpha x : x``; one rounding; NaN stays NaN. Float only."""
    x = _float(x, "LeakyRelu")
    return x.lt(x.scalar_like(0.0)).where(x.mul(alpha), x)


def prelu(x: Tensor, slope: Tensor) -> Tensor:
    """ONNX ``PRelu``: ``x < 0 ? slope x : x`` with ``slope`` unidirectionally broadcast to ``x``.

    Raises:
        ShapeError: when ``slope`` does not broadcast to ``x.shape`` or the dtypes differ.
    """
    if broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise ShapeError(f"slope {slope.shape} does not broadcast to {x.shape}", op="PRelu")
    return x.lt(x.scalar_like(0)).where(x.mul(slope), x)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """ONNX ``Elu``: ``x < 0 ? alpha (exp(x) - 1) : x``, with :func:`expm1` (a few ulp, also near
    0). ``elu(-inf) = -alpha``. Float only."""
    xc = _widen(x, "Elu")
    return xc.lt(xc.scalar_like(0.0)).where(expm1(xc).mul(alpha), xc).cast(x.dtype)


def selu(x: Tensor, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA) -> Tensor:
    """ONNX ``Selu``: ``gamma x`` for ``x > 0``, ``gamma alpha (exp(x) - 1)`` otherwise (via
    :func:`expm1`); a few ulp. ``selu(-0.0) = +0.0`` as the spec's ``exp(x) - 1`` (onnxruntime;
    ``expm1(-0.0)`` is -0.0, torch's). Float only."""
    xc = _widen(x, "Selu")
    neg = expm1(xc).mul(alpha).add(0.0)      # + 0: -0.0 -> +0.0, as alpha exp(x) - alpha
    return xc.scalar_like(0.0).lt(xc).where(xc, neg).mul(gamma).cast(x.dtype)


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """ONNX ``Celu``: ``max(0, x) + min(0, alpha (exp(x / alpha) - 1))``, i.e. ``x`` for ``x > 0`` and
    ``alpha expm1(x / alpha)`` otherwise; a few ulp. ``celu(-0.0) = +0.0`` as the spec's formula
    (onnxruntime; torch's ``celu`` gives -0.0). Float only."""
    xc = _widen(x, "Celu")
    neg = expm1(xc.mul(1.0 / alpha)).mul(alpha).add(0.0)     # + 0: -0.0 -> +0.0, as exp(x) - 1
    return xc.scalar_like(0.0).lt(xc).where(xc, neg).cast(x.dtype)


def softplus(x: Tensor) -> Tensor:
    """ONNX ``Softplus`` ``log(1 + exp(x))``, stable for any ``|x|``: ``max(x, 0) + log1p(exp(-|x|))``
    (never overflows; ``softplus(inf) = inf``, ``softplus(-inf) = 0``); a few ulp. Float only."""
    xc = _widen(x, "Softplus")
    pos = relu(xc)
    return pos.add(log1p(xc.abs().neg().exp())).cast(x.dtype)


def softsign(x: Tensor) -> Tensor:
    """ONNX ``Softsign``: ``x / (1 + |x|)``; about 2 ulp; ``softsign(±inf) = NaN`` as in onnxruntime.
    Float only."""
    xc = _widen(x, "Softsign")
    return xc.div(xc.abs().add(1.0)).cast(x.dtype)


def hard_sigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5) -> Tensor:
    """ONNX ``HardSigmoid``: ``max(0, min(1, alpha x + beta))``; NaN stays NaN. Float only."""
    xc = _widen(x, "HardSigmoid")
    return xc.mul(alpha).add(beta).clip(0.0, 1.0).cast(x.dtype)


def hard_swish(x: Tensor) -> Tensor:
    """ONNX ``HardSwish``: ``x * max(0, min(1, x / 6 + 1/2))``; ``hard_swish(-inf) = NaN`` as in
    onnxruntime. Float only."""
    xc = _widen(x, "HardSwish")
    return xc.mul(hard_sigmoid(xc, 1.0 / 6.0, 0.5)).cast(x.dtype)


def mish(x: Tensor) -> Tensor:
    """ONNX ``Mish``: ``x * tanh(softplus(x))``; a few ulp. ``mish(-inf) = NaN`` as in onnxruntime.
    Float only."""
    xc = _widen(x, "Mish")
    return xc.mul(softplus(xc).tanh()).cast(x.dtype)


def thresholded_relu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """ONNX ``ThresholdedRelu``: ``x > alpha ? x : 0``; exact; NaN gives 0 (as the ONNX reference and
    onnxruntime). Float only."""
    x = _float(x, "ThresholdedRelu")
    return x.scalar_like(alpha).lt(x).where(x, x.scalar_like(0.0))


def silu(x: Tensor) -> Tensor:
    """SiLU / swish ``x * sigmoid(x)`` (ONNX ``Swish`` with alpha 1); a few ulp. Float only."""
    xc = _widen(x, "Silu")
    return xc.mul(xc.sigmoid()).cast(x.dtype)
