"""bfloat16 values and float8 casts in the Triton interpreter, as the GPU computes them.

The interpreter (``TRITON_INTERPRET=1``, how kernels run without a GPU) stores bfloat16 tensors as
their ``uint16`` bit patterns, because numpy has no bfloat16, and then applies numpy's arithmetic,
comparisons, ``np.matmul`` and reductions to those bit patterns: ``2.5 + 2.0`` is a denormal, a
bf16 ``tl.dot`` returns values near 1e10. Triton documents it as a limitation ("It does not support
operations on bfloat16 numeric types", programming guide, debugging chapter); the upstream fixes
(triton-lang/triton PRs #10945 and #11585) were declined. Every bf16 kernel lumc generates therefore
failed its numerics check on CPU, and a bf16 model compiled for ``sim:*`` came back untimed.

:func:`install` wraps the interpreter builder's ops so that a bfloat16 operand is widened to fp32
(exact: a bf16 value is the top half of an fp32 one), the op runs in fp32, and a bfloat16 result is
rounded back to bfloat16 to nearest even. That is what the GPU does for bf16 arithmetic (Hopper's
bf16 FMA rounds its fp32 result once; an fp32 op on two bf16 values rounded once more to bf16 is
correctly rounded, since 24 >= 2 * 8 + 2 bits, Figueroa 1995), so the interpreter's results are the
GPU's up to summation order. A ``tl.dot`` of bf16 operands multiplies them in fp32 and accumulates in
fp32, as the tensor cores do. The generated source is unchanged: nothing here reaches a GPU compile.

A cast of fp32 (or fp16) values to ``float8e4nv`` or ``float8e5`` is done here too: the interpreter's
own conversion drops the carry when rounding up crosses a binade (1.987 becomes 1.0, not 2.0; 72 of
4,096 normal samples at 3 sigma), so an fp8 ``tl.dot`` missed the numpy emulation of lumc's fp8
precision by 8%, and the measurer checked fp8 configs at fp32 instead: the generated fp8 branch
(scales, quantization, the fp8 dot) was never run on CPU. It is rounded to nearest even by
``ml_dtypes``, saturating at the largest finite value (``cvt.rn.satfinite``, what Triton emits on
Hopper), NaN kept; and a float8 value widened is its exact value (the interpreter decoded the e4m3
NaN as 480).

It only patches the interpreter module, and only once; a Triton without the expected builder
methods is left alone (:data:`INSTALLED` says which).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

INSTALLED: bool | str = False


def _widen(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> the fp32 values they are (exact)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _round(x: np.ndarray) -> np.ndarray:
    """fp32 values -> bf16 bit patterns, round to nearest even; NaN stays a quiet NaN of its sign,
    +-inf and overflow to inf as IEEE (the carry of the rounding add reaches the exponent)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    if nan.any():
        r = np.where(nan, ((u >> 16) | 0x0040).astype(np.uint16), r)
    return r


def _to_fp8(x: np.ndarray, fmt) -> np.ndarray:
    """fp32/fp16 values -> float8 bit patterns (uint8), round to nearest even, saturating at the
    format's largest finite value (infinities included), NaN kept."""
    x = np.asarray(x, dtype=np.float32)
    big = float(ml_dtypes.finfo(fmt).max)
    return np.where(np.isnan(x), x, np.clip(x, -big, big)).astype(fmt).view(np.uint8)


def install() -> bool | str:
    """Patch the interpreter's builder and reductions (see the module docstring). Returns
    :data:`INSTALLED`: True, or the reason nothing was patched."""
    global INSTALLED
    if INSTALLED:
        return INSTALLED
    try:
        import triton.language as tl
        from triton.runtime import interpreter as itp
        builder, reduce_ops = itp.InterpreterBuilder, itp.ReduceOps
        handle = itp.TensorHandle
        names = ("binary_op", "unary_op", "create_fma", "create_dot", "cast_impl")
        if not all(hasattr(builder, n) for n in names) or not hasattr(reduce_ops, "sum"):
            INSTALLED = "this Triton's interpreter has another builder layout: not patched"
            return INSTALLED
    except ImportError as e:
        INSTALLED = f"no Triton interpreter: {e}"
        return INSTALLED
    bf16, f32 = tl.bfloat16, tl.float32
    fp8 = {tl.float8e4nv: ml_dtypes.float8_e4m3fn, tl.float8e5: ml_dtypes.float8_e5m2}

    def is_bf16(x) -> bool:
        """A tensor handle, or a ``tl.tensor`` (its dtype a block type), of bfloat16 elements."""
        return getattr(x.dtype, "scalar", x.dtype) == bf16

    def wide(h):
        return handle(_widen(h.data), f32) if is_bf16(h) else h

    def narrow(out, like_bf16: bool):
        if like_bf16 and getattr(out.dtype, "scalar", out.dtype) == f32:
            return handle(_round(out.data), bf16)
        return out

    binary_op, unary_op, fma, dot, cast = (getattr(builder, n) for n in names)

    def binary_op_(self, lhs, rhs, op):
        if not (is_bf16(lhs) or is_bf16(rhs)):
            return binary_op(self, lhs, rhs, op)
        return narrow(binary_op(self, wide(lhs), wide(rhs), op), True)

    def unary_op_(self, arg, op):
        if not is_bf16(arg):
            return unary_op(self, arg, op)
        return narrow(unary_op(self, wide(arg), op), True)

    def fma_(self, x, y, z):
        if not any(is_bf16(h) for h in (x, y, z)):
            return fma(self, x, y, z)
        return narrow(fma(self, wide(x), wide(y), wide(z)), is_bf16(z))

    def dot_(self, a, b, d, input_precision, max_num_imprecise_acc):
        if is_bf16(a) or is_bf16(b):
            a, b = wide(a), wide(b)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_(self, src, dst_type):
        # to bf16: through fp32, rounded to nearest even as the GPU's cvt.rn.bf16.f32 (the
        # interpreter truncates, and casts integers to the bit pattern); from bf16: through its
        # exact fp32 value
        if getattr(dst_type, "scalar", dst_type) == bf16 and not is_bf16(src) and \
                np.asarray(src.data).dtype.kind in "fiub":
            return handle(_round(np.asarray(src.data).astype(np.float32)), bf16)
        if is_bf16(src) and getattr(dst_type, "scalar", dst_type) != bf16:
            return cast(self, handle(_widen(src.data), f32), dst_type)
        return cast(self, src, dst_type)

    for n, f in zip(names, (binary_op_, unary_op_, fma_, dot_, cast_)):
        setattr(builder, n, f)

    if hasattr(builder, "create_fp_to_fp"):
        fp_to_fp = builder.create_fp_to_fp

        def fp_to_fp_(self, src, dst_type, rounding_mode):
            frm, to = getattr(src.dtype, "scalar", src.dtype), getattr(dst_type, "scalar", dst_type)
            if to in fp8 and frm in (f32, tl.float16, bf16):
                vals = _widen(src.data) if frm == bf16 else src.data
                return handle(_to_fp8(vals, fp8[to]), to)
            if frm in fp8 and to in (f32, tl.float16, bf16):    # exact (NaN was decoded as 480)
                vals = np.asarray(src.data).view(fp8[frm]).astype(np.float32)
                return handle(_round(vals), bf16) if to == bf16 else \
                    handle(vals.astype(np.float16) if to == tl.float16 else vals, to)
            return fp_to_fp(self, src, dst_type, rounding_mode)
        builder.create_fp_to_fp = fp_to_fp_

    reduce_sum, reduce_min_max = reduce_ops.sum, reduce_ops.min_max

    def sum_(self, input):
        if not is_bf16(input):
            return reduce_sum(self, input)
        total = np.sum(_widen(input.handle.data), axis=self.axis, keepdims=self.keep_dims,
                       dtype=np.float32)
        return self.to_tensor(_round(total), input.dtype)

    def min_max_(self, input, val_reduce_op, idx_reduce_op=None):
        x = input[0] if isinstance(input, tuple) else input
        if not is_bf16(x):
            return reduce_min_max(self, input, val_reduce_op, idx_reduce_op)
        vals = _widen(x.handle.data)
        out = []
        if val_reduce_op:
            v = val_reduce_op(vals, axis=self.axis, keepdims=self.keep_dims)
            out.append(self.to_tensor(_round(np.asarray(v, dtype=np.float32)), x.dtype))
        if idx_reduce_op:
            out.append(self.to_tensor(idx_reduce_op(vals, axis=self.axis, keepdims=self.keep_dims),
                                      tl.int32))
        if not out:
            raise ValueError("val_reduce_op and idx_reduce_op are both None")
        return tuple(out) if len(out) == 2 else out[0]

    reduce_ops.sum, reduce_ops.min_max = sum_, min_max_
    INSTALLED = True
    return INSTALLED
