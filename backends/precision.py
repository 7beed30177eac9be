"""numpy emulation of a contraction's operand precision (the ``PRECISION`` knob of
``backends/triton/dot_precision.py``), for the CPU executor and the numerics checks.

A reduced-precision ``tl.dot`` rounds its operand tiles and then multiplies exactly with fp32
accumulation (the products of two bf16, fp16, tf32 or e4m3 values are exact in fp32). Rounding the
operands here and contracting them in fp32 therefore reproduces the kernel up to the summation order:

* ``bf16``, ``fp16``: round to nearest even (``ml_dtypes``/numpy casts; fp16 overflows to inf), as
  Triton's ``.to(tl.bfloat16)`` / ``.to(tl.float16)``;
* ``tf32``: the tensor core reads the top 19 bits of each fp32 operand (1 sign, 8 exponent, 10
  mantissa) and ignores the low 13 (PTX ISA, "Matrix multiply-accumulate ... .tf32": "the lower 13
  bits are ignored"), so the emulation truncates them;
* ``tf32x3`` and ``ieee``: no rounding (3xTF32 keeps all but the ``lo * lo`` term, below 2^-22 of
  each product);
* ``fp8``: per slice of ``block_k`` consecutive elements along the (flattened) reduced axes, each
  row of the operand is scaled by ``amax / 448`` (:func:`fp8_scale`: 1 where the slice is all zero,
  at least 2^-126 where its amax is subnormal), clamped to +-448, rounded to float8 e4m3
  (``ml_dtypes.float8_e4m3fn``, round to nearest even) and scaled back. Scaling back before the
  product equals the kernel's scaling of the partial product (both scales are exact factors of an
  exact fp32 product, up to one rounding).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FP8_MAX = 448.0   # largest finite float8 e4m3 (OCP 8-bit floating point specification, v1.0)
# the smallest fp8 scale: the smallest normal fp32 (2^-126). ``amax / 448`` of a slice whose amax is
# under 448 * 2^-149 is 0, and ``x / 0`` made the slice's zeros NaN (0 / 0) and the rest +-inf; a
# normal floor also keeps the scale from being flushed where a GPU flushes subnormals
FP8_MIN_SCALE = float(np.finfo(np.float32).tiny)
EXACT = ("ieee", "tf32x3")
PRECISIONS = ("ieee", "tf32x3", "tf32", "bf16", "fp16", "fp8")


def round_operand(x: np.ndarray, precision: str, reduced: tuple[int, ...] = (),
                  block_k: int = 32) -> np.ndarray:
    """``x`` as the tensor cores see it at ``precision``, in fp32.

    Args:
        x: an fp32 (or fp16/bf16) operand of a contraction; any shape.
        precision: one of :data:`PRECISIONS`.
        reduced: the axes of ``x`` the contraction sums over (only ``fp8`` uses them).
        block_k: the kernel's ``BLOCK_K`` (only ``fp8``: the scaling slice along K).
    Returns:
        an fp32 array of ``x``'s shape.
    Raises:
        ValueError: for an unknown precision.
    """
    a = np.asarray(x, dtype=np.float32)
    if precision in EXACT:
        return a
    if precision == "bf16":
        return a.astype(ml_dtypes.bfloat16).astype(np.float32)
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16).astype(np.float32)
    if precision == "tf32":
        bits = np.ascontiguousarray(a).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits.view(np.float32).reshape(a.shape)
    if precision == "fp8":
        return _fp8_blocks(a, tuple(sorted(r % max(a.ndim, 1) for r in reduced)), block_k)
    raise ValueError(f"unknown operand precision {precision!r}; known: {PRECISIONS}")


def fp8_scale(amax: np.ndarray) -> np.ndarray:
    """fp32 scale of each fp8 slice from its ``amax``: ``amax / 448``, at least
    :data:`FP8_MIN_SCALE`, 1 for an all-zero slice (and a NaN one, whose values stay NaN)."""
    with np.errstate(under="ignore", invalid="ignore"):
        s = (np.asarray(amax, np.float32) / np.float32(FP8_MAX)).astype(np.float32)
        return np.where(amax > 0, np.maximum(s, np.float32(FP8_MIN_SCALE)),
                        np.float32(1.0)).astype(np.float32)


def _fp8_blocks(a: np.ndarray, reduced: tuple[int, ...], block_k: int) -> np.ndarray:
    keep = [d for d in range(a.ndim) if d not in reduced]
    moved = np.transpose(a, keep + list(reduced))
    rows_shape = moved.shape[:len(keep)]
    k = int(np.prod(moved.shape[len(keep):], dtype=np.int64))
    flat = moved.reshape(-1, k)
    bk = max(1, int(block_k))
    pad = (-k) % bk
    if pad:
        flat = np.concatenate([flat, np.zeros((flat.shape[0], pad), np.float32)], axis=1)
    blocks = flat.reshape(flat.shape[0], -1, bk)
    with np.errstate(all="ignore"):
        amax = np.max(np.abs(blocks), axis=2, keepdims=True)
        scale = fp8_scale(amax)
        q = np.clip(blocks / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
        back = q.astype(np.float32) * scale
    back = back.reshape(flat.shape[0], -1)[:, :k].reshape(rows_shape + moved.shape[len(keep):])
    inv = np.argsort(keep + list(reduced))
    return np.ascontiguousarray(np.transpose(back, inv))


def dot_rounding(config: dict | None):
    """The ``ReferenceExecutor(dot_operands=...)`` hook of a kernel config: None where the config
    multiplies exactly (no ``PRECISION``, ``ieee`` or ``tf32x3``), else the operand rounding of its
    ``PRECISION`` at its ``BLOCK_K``."""
    p = (config or {}).get("PRECISION")
    if p is None or p in EXACT:
        return None
    bk = int((config or {}).get("BLOCK_K", 32))
    return lambda x, reduced: round_operand(x, p, reduced, bk)


def emulation(kernel, config: dict | None) -> dict:
    """``ReferenceExecutor`` keyword arguments that emulate ``kernel`` at ``config``'s operand
    precision: ``dot_operands`` (:func:`dot_rounding`), ``factored`` (:func:`deferred_factors`) and
    ``rounded``: for SDPA at ``bf16``/``fp16`` on fp32 operands, the value product's result, which
    SDPA returns in the half type (``compiler/runtime/extern_sdpa.py``)."""
    cfg = config or {}
    out = {"dot_operands": dot_rounding(cfg), "factored": deferred_factors(kernel, cfg)}
    if out["dot_operands"] is not None and cfg.get("IMPL") == "sdpa" and \
            cfg.get("PRECISION") in ("bf16", "fp16") and out["factored"]:
        from lumc.backends.extern import attention_plan
        c2 = attention_plan(kernel).c2
        if c2.node.dtype.itemsize == 4:
            out["rounded"] = {id(c2.node)}
    return out


def deferred_factors(kernel, config: dict | None) -> dict | None:
    """The ``ReferenceExecutor(factored=...)`` map of ``kernel`` at ``config``: for an attention
    kernel at an elementwise operand rounding (``bf16``, ``fp16``, ``tf32``), the value product's
    probabilities ``exp2(s - max) * (1 / sum)`` as ``{id(operand): (numerator, row factor,
    BLOCK_N)}``; the flash loop rounds the numerator relative to the running max of each key block
    and divides after the product (FlashAttention-2, arXiv:2307.08691, Algorithm 1), as do SDPA's
    kernels (their key blocks unknown here: one block). None otherwise (the operand is
    rounded as a whole, as a GEMM prologue forms its tile and then rounds it), and for the other
    extern implementations (``cublas``, ``cudnn``): they evaluate the softmax as eager torch ops and
    hand the normalized probabilities, rounded, to the GEMM."""
    p = (config or {}).get("PRECISION")
    if p not in ("bf16", "fp16", "tf32") or getattr(kernel, "form", None) != "attention":
        return None
    if (config or {}).get("IMPL", "triton") not in ("triton", "sdpa"):
        return None
    from lumc.backends.triton.codegen import RenderError
    from lumc.backends.triton.render_attention import AttentionPlan
    try:
        ap = AttentionPlan(kernel)
    except RenderError:
        return None
    block = None if (config or {}).get("IMPL") == "sdpa" else (config or {}).get("BLOCK_N")
    num, fac = (ap.e2, ap.g2) if ap.pushed else (ap.e, ap.g)
    return {id(ap.c2.a): (num, fac, None if block is None else int(block))}
