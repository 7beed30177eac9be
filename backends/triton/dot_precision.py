"""The operand precision of a contraction's ``tl.dot``, as a ``PRECISION`` constexpr branch.

A contraction kernel is rendered once with one branch per precision its operands allow; the config's
``PRECISION`` (a string ``tl.constexpr``) selects one at compile time, so each precision is a
separate compiled kernel of one module and the search tunes precision like a tile size:

==========  =====================================================================================
``ieee``    fp32 FFMA on CUDA cores (exact fp32 products, the 66.9 TFLOP/s vector peak on H100)
``tf32x3``  split TF32 on tensor cores: three TF32 MMAs per product (CUTLASS "3xTF32"), about
            fp32 accuracy at a third of the 494.7 TFLOP/s TF32 peak; the fp32 default
``tf32``    one TF32 MMA (operands keep 10 mantissa bits, ~1e-3 relative error per product)
``bf16``    operands rounded to bf16 (RNE) on load, fp32 accumulation, 989 TFLOP/s
``fp16``    operands rounded to fp16 (RNE, overflow to inf), fp32 accumulation, 989 TFLOP/s
``fp8``     e4m3 operands with scales, fp32 accumulation, 1,979 TFLOP/s (see below)
==========  =====================================================================================

fp8 scales are computed in the kernel, per ``BLOCK_K`` slice of K: each row of the ``a`` tile and
each column of the ``b`` tile gets ``scale = amax / 448`` (448 is the largest finite e4m3 value, OCP
FP8 spec v1.0), the scaled tile is clamped to +-448 and converted with round-to-nearest-even, the
fp8 MMA's fp32 partial product is multiplied by ``a_scale[m] * b_scale[n]`` and added to the fp32
accumulator. That is the fine-grained (1 x BLOCK_K) scaling of DeepSeek-V3 (arXiv:2412.19437,
section 3.3.2), finer than per-tensor activation and per-channel weight scales, and needs no
calibration; an all-zero slice gets scale 1, and a scale is at least 2^-126 (``FP8_MIN_SCALE``: a
subnormal amax gave a scale of 0 and a NaN for every zero of the slice). A non-finite operand gives
a NaN output (its slice's scale is inf): fp8 is reduced precision, and its cost is measured by the
quality gate.

:func:`lumc.backends.precision.round_operand` is the numpy emulation of every branch, which the CPU
executor and the numerics checks use.
"""
from __future__ import annotations

from lumc.backends.precision import FP8_MAX, FP8_MIN_SCALE   # 448: largest finite e4m3 (OCP v1.0)
from lumc.ir import dtypes as dt

# the precisions a tl.dot over operands of each dtype can be rendered at
RENDERABLE = {"f32": ("ieee", "tf32x3", "tf32", "bf16", "fp16", "fp8"),
              "bf16": ("bf16", "fp8"), "f16": ("fp16", "fp8")}
ATTENTION_RENDERABLE = {"f32": ("ieee", "tf32x3", "tf32", "bf16", "fp16"), "bf16": ("bf16",),
                        "f16": ("fp16",)}
_CAST = {"bf16": "tl.bfloat16", "fp16": "tl.float16"}


def dot_dtype(d: dt.DType) -> str | None:
    """The ``dot_dtype`` problem key of a contraction over ``d`` operands (None: not a tl.dot)."""
    return d.name if d.name in RENDERABLE else None


def emit_dot(w, a: str, products: list[tuple[str, str]], operand: dt.DType, level: int,
             allowed: tuple[str, ...] | None = None) -> None:
    """Emit ``acc += a @ b`` for each ``(b, acc)`` of ``products`` under ``PRECISION`` branches
    (see module docstring); the ``a`` tile is converted (cast, or scaled and quantized to fp8)
    once for every product (a paired matmul's two).

    Args:
        w: the :class:`~lumc.backends.triton.codegen.SourceWriter`.
        a: name of the ``[BLOCK_M, BLOCK_K]`` operand tile.
        products: ``(b, acc)`` pairs: a ``[BLOCK_K, BLOCK_N]`` operand tile and the name of its
            fp32 ``[BLOCK_M, BLOCK_N]`` accumulator, updated in place.
        operand: the operands' dtype (f32, f16 or bf16).
        level: the writer block the lines go to (the K loop's).
        allowed: the precisions to render (default: every one :data:`RENDERABLE` lists).
    """
    precisions = [p for p in (allowed or RENDERABLE[operand.name]) if p in RENDERABLE[operand.name]]
    native = {"bf16": "bf16", "f16": "fp16"}.get(operand.name)
    # ieee / tf32x3 / tf32 are one branch: PRECISION is tl.dot's own input_precision
    branches = [p for p in ("fp8", "bf16", "fp16") if p in precisions and p != native]
    body = [f"{acc} = tl.dot({a}, {b}, {acc})" if native else
            f"{acc} = tl.dot({a}, {b}, {acc}, input_precision=PRECISION)" for b, acc in products]
    if not branches:
        for ln in body:
            w.line(ln, level)
        return
    for i, p in enumerate(branches):
        w.line(f"{'if' if i == 0 else 'elif'} PRECISION == {p!r}:", level)
        for ln in _branch(p, a, products):
            w.line("    " + ln, level)
    w.line("else:", level)
    for ln in body:
        w.line("    " + ln, level)


def _branch(p: str, a: str, products: list[tuple[str, str]]) -> list[str]:
    if p in _CAST:
        return [f"a_c = {a}.to({_CAST[p]})"] + \
            [f"{acc} = tl.dot(a_c, {b}.to({_CAST[p]}), {acc})" for b, acc in products]
    m, lo = repr(FP8_MAX), repr(FP8_MIN_SCALE)
    out = [
        f"a_f = {a}.to(tl.float32)",
        "a_amax = tl.max(tl.abs(a_f), axis=1)",
        f"a_sc = tl.where(a_amax > 0, tl.maximum(a_amax / {m}, {lo}), 1.0)",
        f"a_q = tl.minimum(tl.maximum(a_f / a_sc[:, None], -{m}), {m}).to(tl.float8e4nv)",
    ]
    for b, acc in products:
        out += [
            f"b_f = {b}.to(tl.float32)",
            "b_amax = tl.max(tl.abs(b_f), axis=0)",
            f"b_sc = tl.where(b_amax > 0, tl.maximum(b_amax / {m}, {lo}), 1.0)",
            f"b_q = tl.minimum(tl.maximum(b_f / b_sc[None, :], -{m}), {m}).to(tl.float8e4nv)",
            f"{acc} += tl.dot(a_q, b_q) * (a_sc[:, None] * b_sc[None, :])",
        ]
    return out


def attention_dot(w, name: str, a: str, b: str, operand: dt.DType, level: int) -> str:
    """Bind ``name = tl.dot(a, b)`` for one of the flash-attention kernel's two products, at the
    ``PRECISION`` constexpr (fp32 operands: bf16 or fp16 casts, else tl.dot's own
    ``input_precision``; 16-bit operands multiply natively). Returns ``name``."""
    if operand != dt.f32:
        w.line(f"{name} = tl.dot({a}, {b})", level)
        return name
    for i, p in enumerate(("bf16", "fp16")):
        w.line(f"{'if' if i == 0 else 'elif'} PRECISION == {p!r}:", level)
        w.line(f"    {name} = tl.dot({a}.to({_CAST[p]}), {b}.to({_CAST[p]}))", level)
    w.line("else:", level)
    w.line(f"    {name} = tl.dot({a}, {b}, input_precision=PRECISION)", level)
    return name
