"""Weight-only quantization formats and their dequantization as primitive graphs.

Each format stores a contraction weight ``W`` (fp32, any rank) narrow, and
:func:`store_quantized` returns the primitive expression that recomputes ``W'`` (fp32, ``W``'s
shape) from what it stores. The expression is made of ``Cast``, ``Mul``, ``Gather`` and views
over constants only, so greedy fusion puts it in the contraction's operand prologue
(``compiler/core/fusion.py``, a *weight prologue*): only the stored bytes cross HBM, never ``W'``.

* **int8** (``quantize_int8``): symmetric per-output-channel int8, ``scale = amax / 127`` over each
  channel's reduced axes, ``Q = clip(rint(W / scale), +-127)`` (TensorRT's and torchao's
  weight-only int8), dequantized as ``Cast(Q, f32) * scale``.

* **fp8** (``quantize_fp8``): float8 e4m3 (OCP 8-bit floating point specification v1.0, the
  ``fn`` variant: no infinities, largest finite 448) with one fp32 scale per output channel:
  ``scale = amax / 448`` over the channel's reduced axes (1 for an all-zero channel),
  ``Q = e4m3(clip(W / scale, +-448))`` (round to nearest even, ``ml_dtypes``), dequantized as
  ``Cast(Q, f32) * scale``. 1 byte per weight plus 4 per channel.

* **nvfp4** (``quantize_nvfp4``): NVIDIA's NVFP4 (NVIDIA Blackwell / TensorRT Model Optimizer
  docs, "NVFP4": a 4-bit e2m1 value per element, an fp8 e4m3 scale per block of 16 consecutive
  elements, an fp32 per-tensor scale), blocked along the contraction's reduced axis (K):

  - ``tensor_scale = amax(|W|) / (6 * 448)`` (1 for an all-zero tensor);
  - per block of 16: ``s = e4m3(clip(amax_block / 6 / tensor_scale, 448))``;
  - ``q = e2m1(W / (f32(s) * tensor_scale))``: round to nearest even onto
    {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign, saturating at 6 (``ml_dtypes.float4_e2m1fn``; as
    Blackwell's ``cvt.rn.satfinite.e2m1x2.f32``); 0 where the block's scale is 0;
  - dequantized ``W' = (e2m1(q) * f32(s)) * tensor_scale``: the first product is exact in fp32
    (2 by 4 significant bits, exponents within range), so ``W'`` is rounded once.

  Stored: the 4-bit codes (e2m1 bit patterns: sign, 2 exponent, 1 mantissa bit) packed two per
  byte along the reduced axis, element ``2i`` in the low nibble and ``2i + 1`` in the high one
  (the layout of NVIDIA's packed ``e2m1x2``), the block scales as e4m3 and the tensor scale:
  ``numel / 2 + numel / 16 + 4`` bytes. Reduced axes that are one run in memory (a convolution's
  ``C x KH x KW``) are blocked along their flattened length, the GEMM's K; a weight whose reduced
  axes are not one run, or whose K is not a multiple of 16, is not quantized (:func:`nvfp4_span`).

  The decode is a ``Gather`` of a 256 x 2 fp32 table, ``NVFP4_PAIRS[byte, j]`` the value of
  nibble ``j`` of ``byte``, by the packed byte, read through views that put the pair axis after
  the packed axis and merge them (``W'[.., k, ..] = pairs[P[.., k // 2, ..], k % 2]``): two ops
  per element (a cast and a table read from L1) instead of a nibble split and a 16-way select.
  The index is computed through fp32 (``Cast(Cast(P, f32), i32)``): constant folding evaluates an
  integer index chain of constants and would store it as i32 (``compiler/core/constfold.py``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from lumc.backends.precision import FP8_MAX
from lumc.ir import dtypes as dt
from lumc.ir.graph import Node, const_node, node
from lumc.ir.tensor import Tensor
from lumc.ir.views import prod

E2M1_MAX = 6.0      # largest e2m1 magnitude
NVFP4_BLOCK = 16    # elements per e4m3 block scale
# the value of each 4-bit e2m1 code (bit 3 sign, bits 2-1 exponent, bit 0 mantissa)
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                       dtype=np.float32)
# NVFP4_PAIRS[b, 0] / [b, 1]: the value of the low / high nibble of byte b
NVFP4_PAIRS = np.stack([E2M1_VALUES[np.arange(256) & 15], E2M1_VALUES[np.arange(256) >> 4]],
                       axis=1).astype(np.float32)
FORMATS = ("int8", "fp8", "nvfp4")


def store_quantized(w: Node, reduced: tuple[int, ...], fmt: str) -> tuple[Node, int] | None:
    """``(W', stored bytes)`` of fp32 constant ``w`` stored in format ``fmt`` (one of
    :data:`FORMATS`) along its contraction's ``reduced`` axes; None when the format cannot store
    it (NVFP4 where :func:`nvfp4_span` finds no blocking axis; a weight holding inf or NaN)."""
    value = np.asarray(w.arg.value, dtype=np.float32)
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; known: {FORMATS}")
    # no format stores inf or NaN: an int8 channel holding inf had scale inf and dequantized to
    # NaN everywhere, a NaN weight became 0
    if not np.all(np.isfinite(value)):
        return None
    if fmt == "int8":
        q, scale = quantize_int8(value, reduced)
        return dequant_scaled(q, scale), q.nbytes + scale.nbytes
    if fmt == "fp8":
        q, scale = quantize_fp8(value, reduced)
        return dequant_scaled(q, scale), q.nbytes + scale.nbytes
    span = nvfp4_span(w.shape, reduced)     # nvfp4
    if span is None:
        return None
    a, b = span
    flat = w.shape[:a] + (prod(w.shape[a:b + 1]),) + w.shape[b + 1:]
    packed, scales, ts = quantize_nvfp4(value.reshape(flat), a)
    deq = Tensor(dequant_nvfp4(packed, scales, ts, a)).reshape(w.shape)
    return deq.node, nvfp4_nbytes(packed, scales)


def dequant_scaled(q: np.ndarray, scale: np.ndarray) -> Node:
    """``Cast(Q, f32) * scale`` (scale broadcast over the reduced axes), fp32 of ``q``'s shape: the
    int8 and fp8 dequantization."""
    sc = Tensor(const_node(scale)).expand(q.shape)
    return (Tensor(const_node(q)).cast(dt.f32) * sc).node


def channel_scale(amax: np.ndarray, qmax: float) -> np.ndarray:
    """fp32 ``amax / qmax`` per channel, 1 for an all-zero channel, and never below the smallest
    fp32 subnormal: a channel of subnormal weights (amax under ``qmax * 2**-149``) had its quotient
    flush to a scale of 0, and ``W / 0`` made its zeros NaN (fp8) and its values 0 (int8)."""
    with np.errstate(under="ignore"):
        s = (amax / np.float32(qmax)).astype(np.float32)
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    return np.where(amax > 0, np.maximum(s, tiny), np.float32(1)).astype(np.float32)


# ---- int8 ----------------------------------------------------------------------------------------
def quantize_int8(value: np.ndarray, reduced: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, scale)``: ``Q`` int8 of ``value``'s shape, ``scale`` fp32 with size-1 ``reduced``
    axes (per output channel)."""
    w = np.asarray(value, dtype=np.float32)
    amax = np.max(np.abs(w), axis=reduced, keepdims=True) if w.size else w
    scale = channel_scale(amax, 127.0)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale


# ---- fp8 -----------------------------------------------------------------------------------------
def quantize_fp8(value: np.ndarray, reduced: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, scale)``: ``Q`` e4m3 of ``value``'s shape, ``scale`` fp32 with size-1 ``reduced`` axes
    (per output channel); see the module docstring."""
    w = np.asarray(value, dtype=np.float32)
    amax = np.max(np.abs(w), axis=reduced, keepdims=True)
    scale = channel_scale(amax, FP8_MAX)
    q = np.clip(w / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    return q, scale


# ---- nvfp4 ---------------------------------------------------------------------------------------
def nvfp4_span(shape: tuple[int, ...], reduced: tuple[int, ...] | None) -> tuple[int, int] | None:
    """The axes ``(first, last)`` NVFP4 blocks a weight along: its reduced axes when they are one
    run in memory (every axis between the first and the last reduced or of size 1: a matmul's K,
    a convolution's ``C x KH x KW`` as its im2col view flattens them) whose total length is a
    multiple of 16; None otherwise (the weight is then not stored as NVFP4)."""
    if not reduced:
        return None
    a, b = min(reduced), max(reduced)
    if any(d not in reduced and shape[d] != 1 for d in range(a, b + 1)):
        return None
    k = prod(shape[a:b + 1])
    return (a, b) if k > 0 and k % NVFP4_BLOCK == 0 else None


def _blocked(a: np.ndarray, axis: int, block: int) -> np.ndarray:
    """``a`` with ``axis`` split into ``(len / block, block)``."""
    s = a.shape
    return a.reshape(s[:axis] + (s[axis] // block, block) + s[axis + 1:])


def quantize_nvfp4(value: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """``(packed, scales, tensor_scale)`` of an fp32 weight blocked along ``axis``.

    Returns:
        packed: uint8, ``value``'s shape with ``axis`` halved (two e2m1 codes per byte, see the
            module docstring); scales: e4m3, ``axis`` divided by 16; tensor_scale: fp32 scalar.
    """
    w = np.asarray(value, dtype=np.float32)
    amax = np.float32(np.max(np.abs(w))) if w.size else np.float32(0)
    ts = np.float32(amax / np.float32(E2M1_MAX * FP8_MAX)) if amax > 0 else np.float32(1)
    blocks = _blocked(w, axis, NVFP4_BLOCK)
    bmax = np.max(np.abs(blocks), axis=axis + 1, keepdims=True)
    with np.errstate(over="ignore"):
        s = np.clip(bmax / np.float32(E2M1_MAX) / ts, 0, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    denom = s.astype(np.float32) * ts
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(denom > 0, blocks / np.where(denom > 0, denom, np.float32(1)), np.float32(0))
    codes = x.astype(np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & np.uint8(15)
    pairs = _blocked(codes.reshape(w.shape), axis, 2)
    lo = np.take(pairs, 0, axis=axis + 1)
    hi = np.take(pairs, 1, axis=axis + 1)
    packed = (lo | (hi << np.uint8(4))).astype(np.uint8)
    return packed, np.squeeze(s, axis=axis + 1), ts


def dequant_nvfp4(packed: np.ndarray, scales: np.ndarray, tensor_scale, axis: int) -> Node:
    """The fp32 weight ``(e2m1(q) * f32(s)) * tensor_scale`` as a primitive graph over the stored
    constants (see the module docstring for the decode)."""
    shape = list(packed.shape)
    shape[axis] *= 2
    rank = len(shape)
    p = Tensor(const_node(packed)).cast(dt.f32).cast(dt.i32)
    # pairs[P] is P's shape + (2,); the pair axis moves after the packed axis, the two merge
    g = Tensor(node("Gather", (const_node(NVFP4_PAIRS), p.node), 0))
    perm = list(range(axis + 1)) + [rank] + list(range(axis + 1, rank))
    vals = g.permute(perm).reshape(shape)
    s = Tensor(const_node(scales)).cast(dt.f32)
    sshape = list(scales.shape)
    s = s.reshape(sshape[:axis + 1] + [1] + sshape[axis + 1:])
    s = s.expand(sshape[:axis + 1] + [NVFP4_BLOCK] + sshape[axis + 1:]).reshape(shape)
    ts = Tensor.full(tuple(shape), np.float32(tensor_scale), dt.f32)
    return ((vals * s) * ts).node


def nvfp4_nbytes(packed: np.ndarray, scales: np.ndarray) -> int:
    """Stored bytes of one NVFP4 weight: codes, block scales and the fp32 tensor scale."""
    return packed.nbytes + scales.nbytes + 4
