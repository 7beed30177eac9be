"""Convolution (ONNX ``Conv`` and ``ConvTranspose``) from views, ``Mul`` and ``SumReduce``.

A convolution is a padding view, one sliding-window view per spatial axis, a broadcast product with
the kernel, and a sum over (input channels per group, kernel taps). Nothing is materialized but the
padded input: the reference executor evaluates ``SumReduce(Mul(view, view))`` as one ``einsum``,
and the e-graph sees the same pattern as a matmul-like contraction (implicit GEMM).

Shapes follow ONNX: ``x`` is ``[N, C, *spatial]``; ``pads`` lists all begins, then all ends;
``strides`` and ``dilations`` default to 1. The helpers :func:`sliding_windows` and
:func:`auto_pad_pads` are shared with pooling (``lumc.ir.library.pool``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _ints(v, n: int, default: int, what: str) -> list[int]:
    """``v`` as a list of ``n`` ints (None gives ``default``); ShapeError when the length is wrong."""
    if v is None:
        return [default] * n
    v = [int(a) for a in v]
    if len(v) != n:
        raise ShapeError(f"{what} has {len(v)} values, expected {n}")
    return v


def auto_pad_pads(in_spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int] | None,
                  dilations: Sequence[int] | None, auto_pad: str) -> list[int]:
    """Pads (ONNX order: all begins, then all ends) that ``auto_pad`` implies for Conv and pooling.

    ``SAME_UPPER``/``SAME_LOWER`` pad so that ``out = ceil(in / stride)``, putting the odd extra
    element at the end (UPPER) or the beginning (LOWER); ``VALID`` and ``NOTSET`` give zeros (for
    ``NOTSET`` the caller uses its explicit ``pads``).

    Raises:
        ShapeError: on an unknown ``auto_pad`` value or mismatched lengths.
    """
    n = len(in_spatial)
    kernel = _ints(kernel, n, 1, "kernel_shape")
    strides = _ints(strides, n, 1, "strides")
    dilations = _ints(dilations, n, 1, "dilations")
    if auto_pad not in AUTO_PADS:
        raise ShapeError(f"unknown auto_pad {auto_pad!r} (expected one of {AUTO_PADS})")
    if auto_pad in ("NOTSET", "VALID"):
        return [0] * (2 * n)
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def conv_output_size(size: int, kernel: int, stride: int, dilation: int, pad_begin: int,
                     pad_end: int, ceil_mode: bool = False) -> int:
    """Output length of one spatial axis for Conv and pooling.

    ``floor`` (or ``ceil``) of ``(size + pads - span) / stride`` plus one, where ``span`` is the
    dilated kernel extent. In ceil mode a last window that would start past the input and the
    begin padding is dropped (the PyTorch / onnxruntime rule).

    Raises:
        ShapeError: when the window does not fit even once (output would be empty or negative).
    """
    span = (kernel - 1) * dilation + 1
    room = size + pad_begin + pad_end - span
    if room < 0 or stride < 1 or dilation < 1:
        raise ShapeError(f"window of span {span} (kernel {kernel}, dilation {dilation}) does not fit "
                         f"an axis of size {size} with pads ({pad_begin}, {pad_end}), stride {stride}")
    out = (-(-room // stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def sliding_windows(x: Tensor, first_axis: int, kernel: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int], pads: Sequence[int], out_sizes: Sequence[int],
                    value=0.0) -> Tensor:
    """Windows over the trailing spatial axes of ``x`` as views.

    Spatial axis ``i`` (at ``first_axis + i``) is padded by ``pads[i]`` before and whatever the end
    needs to hold ``out_sizes[i]`` windows (more than ``pads[n + i]`` in ceil mode, or a crop), reading
    ``value`` in the padding; then it becomes two axes ``(out_sizes[i], kernel[i])``.

    Returns:
        ``x.shape[:first_axis] + (o_0, k_0, o_1, k_1, ...)``.
    """
    n = len(kernel)
    rank = x.ndim
    pairs = [(0, 0)] * rank
    for i in range(n):
        size = x.shape[first_axis + i]
        span = (kernel[i] - 1) * dilations[i] + 1
        need = (out_sizes[i] - 1) * strides[i] + span
        pairs[first_axis + i] = (pads[i], need - size - pads[i])
    x = x.pad(pairs, value)
    for i in range(n):
        # each earlier spatial axis became two, so axis i now sits at first_axis + 2 i
        x = x.window(first_axis + 2 * i, kernel[i], strides[i], dilations[i])
        if x.shape[first_axis + 2 * i] != out_sizes[i]:
            raise ShapeError(f"window count {x.shape[first_axis + 2 * i]} != {out_sizes[i]}")
    return x


def conv(x: Tensor, w: Tensor, b: Tensor | None = None, *, strides=None, pads=None, dilations=None,
         group: int = 1, auto_pad: str = "NOTSET") -> Tensor:
    """ONNX ``Conv`` (1-D, 2-D, 3-D, any spatial rank).

    Args:
        x: ``[N, C, *in]``, float.
        w: ``[M, C / group, *k]``, same dtype.
        b: optional ``[M]`` bias.
        strides, dilations: per spatial axis (default 1).
        pads: ``[begin_0.., end_0..]`` (default 0); ignored unless ``auto_pad`` is ``NOTSET``.
        group: input and output channels split into ``group`` independent convolutions.
        auto_pad: ``NOTSET``, ``SAME_UPPER``, ``SAME_LOWER`` or ``VALID``.
    Returns:
        ``[N, M, *out]`` with ``out = floor((in + pads - ((k - 1) d + 1)) / s) + 1``. Sums
        accumulate in fp32 for f16/bf16 (exact ordering is backend-defined: reassociation only).
    Raises:
        ShapeError: on mismatched ranks, channels not divisible by ``group``, or a kernel that does
            not fit the padded input.
    """
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ShapeError(f"Conv needs x [N, C, *spatial] and w of the same rank, got {x.shape}, "
                         f"{w.shape}", op="Conv")
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    kernel = list(w.shape[2:])
    group = int(group)
    if group < 1 or c % group or m % group or c // group != cg:
        raise ShapeError(f"channels do not fit group={group}: x {x.shape}, w {w.shape}", op="Conv")
    strides = _ints(strides, nsp, 1, "strides")
    dilations = _ints(dilations, nsp, 1, "dilations")
    if auto_pad != "NOTSET":
        pads = auto_pad_pads(x.shape[2:], kernel, strides, dilations, auto_pad)
    pads = _ints(pads, 2 * nsp, 0, "pads")
    outs = [conv_output_size(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                             pads[nsp + i]) for i in range(nsp)]
    mg = m // group
    # layout of the product: [N, (g,) Mg, Cg, o_0, k_0, o_1, k_1, ...]; the g axis only when g > 1
    if group > 1:
        xg = x.reshape((n, group, cg) + x.shape[2:])
        first = 3
    else:
        xg, first = x, 2
    win = sliding_windows(xg, first, kernel, strides, dilations, pads, outs)
    lead = (n, group) if group > 1 else (n,)
    win = win.reshape(lead + (1,) + win.shape[len(lead):])
    wshape: list[int] = [1] + ([group] if group > 1 else []) + [mg, cg]
    for k in kernel:
        wshape += [1, k]
    wv = w.reshape(wshape)
    full = lead + (mg, cg) + tuple(d for o, k in zip(outs, kernel) for d in (o, k))
    ca = len(lead) + 1                        # the Cg axis
    red = [ca] + [ca + 2 + 2 * i for i in range(nsp)]
    y = win.expand(full).mul(wv.expand(full)).sum(red)
    y = y.reshape((n, m) + tuple(outs))
    if b is not None:
        if tuple(b.shape) != (m,):
            raise ShapeError(f"bias shape {b.shape} != ({m},)", op="Conv")
        y = y.add(b.reshape((1, m) + (1,) * nsp))
    return y


def conv_transpose_pads(in_spatial, kernel, strides, dilations, pads, output_padding, output_shape,
                        auto_pad: str) -> tuple[list[int], list[int]]:
    """``(pads, out_spatial)`` of ONNX ``ConvTranspose`` (pads in ONNX order).

    With ``output_shape`` (or ``auto_pad`` SAME_*, which asks for ``in * stride``), the total padding
    ``stride (in - 1) + output_padding + (k - 1) d + 1 - out`` is split as the ONNX spec says:
    SAME_UPPER puts the odd element at the end, NOTSET/SAME_LOWER at the beginning.
    """
    nsp = len(in_spatial)
    if auto_pad not in AUTO_PADS:
        raise ShapeError(f"unknown auto_pad {auto_pad!r}", op="ConvTranspose")
    if output_shape is not None and len(output_shape) > nsp:
        output_shape = list(output_shape)[-nsp:]        # some exporters include N and C
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [size * s for size, s in zip(in_spatial, strides)]
    if output_shape is not None:
        output_shape = _ints(output_shape, nsp, 0, "output_shape")
        begins, ends = [], []
        for i in range(nsp):
            total = (strides[i] * (in_spatial[i] - 1) + output_padding[i]
                     + (kernel[i] - 1) * dilations[i] + 1 - output_shape[i])
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        return begins + ends, output_shape
    pads = [0] * (2 * nsp) if auto_pad == "VALID" else _ints(pads, 2 * nsp, 0, "pads")
    out = [strides[i] * (in_spatial[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1
           - pads[i] - pads[nsp + i] for i in range(nsp)]
    return pads, out


def conv_transpose(x: Tensor, w: Tensor, b: Tensor | None = None, *, strides=None, pads=None,
                   dilations=None, group: int = 1, output_padding=None, output_shape=None,
                   auto_pad: str = "NOTSET") -> Tensor:
    """ONNX ``ConvTranspose`` (the gradient of Conv with respect to its input).

    Undilated, it is built phase by phase (:func:`_conv_transpose_phases`): no product with an
    inserted zero is formed, ``stride**rank`` times fewer multiplies than the zero-insertion form.
    Dilated, it is a stride-1 :func:`conv` of the zero-inserted input (``stride - 1`` zeros between
    elements: a pad + reshape view) with the kernel flipped and its channel axes swapped per group.

    Args:
        x: ``[N, C, *in]``, float.
        w: ``[C, M / group, *k]``.
        b: optional ``[M]`` bias.
        strides, dilations, pads, output_padding: per ONNX (defaults 1, 1, 0, 0).
        output_shape: spatial output shape; when given, pads are derived from it.
        auto_pad: ``NOTSET``, ``SAME_UPPER``, ``SAME_LOWER`` or ``VALID``.
    Returns:
        ``[N, M, *out]``, ``out = s (in - 1) + output_padding + (k - 1) d + 1 - pads``.
    Raises:
        ShapeError: on mismatched ranks or channels, a stride or dilation below 1, an
            ``output_padding`` outside ``[0, max(stride, dilation))`` (onnxruntime's and PyTorch's
            rule), or a negative output size.
    """
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ShapeError(f"ConvTranspose needs x [N, C, *spatial] and w of the same rank, got "
                         f"{x.shape}, {w.shape}", op="ConvTranspose")
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    group = int(group)
    if group < 1 or w.shape[0] != c or c % group:
        raise ShapeError(f"channels do not fit group={group}: x {x.shape}, w {w.shape}",
                         op="ConvTranspose")
    mg = w.shape[1]
    m, cg = mg * group, c // group
    kernel = list(w.shape[2:])
    strides = _ints(strides, nsp, 1, "strides")
    dilations = _ints(dilations, nsp, 1, "dilations")
    output_padding = _ints(output_padding, nsp, 0, "output_padding")
    for i in range(nsp):
        if strides[i] < 1 or dilations[i] < 1:
            raise ShapeError(f"strides {strides} and dilations {dilations} must be at least 1",
                             op="ConvTranspose")
        if not 0 <= output_padding[i] < max(strides[i], dilations[i]):
            raise ShapeError(f"output_padding {output_padding} must lie in [0, max(stride, "
                             f"dilation)) on each axis (strides {strides}, dilations "
                             f"{dilations})", op="ConvTranspose")
    pads, out = conv_transpose_pads(x.shape[2:], kernel, strides, dilations, pads, output_padding,
                                    output_shape, auto_pad)
    if any(o < 0 for o in out):
        raise ShapeError(f"negative output shape {out}", op="ConvTranspose")
    if all(d == 1 for d in dilations) and all(size > 0 for size in x.shape[2:]):
        return _conv_transpose_phases(x, w, b, kernel, strides, pads, out, group)
    # zero insertion: [.., H, ..] -> [.., H, 1, ..] -> pad (0, s-1) -> [.., H*s, ..] -> first (H-1)s+1
    z = x
    for i in range(nsp):
        s = strides[i]
        ax = 2 + i
        size = z.shape[ax]
        if s == 1 or size == 0:
            continue
        z = z.reshape(z.shape[:ax + 1] + (1,) + z.shape[ax + 1:])
        pp = [(0, 0)] * z.ndim
        pp[ax + 1] = (0, s - 1)
        z = z.pad(pp)
        z = z.reshape(z.shape[:ax] + (size * s,) + z.shape[ax + 2:])
        z = z.slice([0], [(size - 1) * s + 1], [ax])
    # full padding (k - 1) d minus the requested crop; output_padding extends the end
    full_pads = [(kernel[i] - 1) * dilations[i] - pads[i] for i in range(nsp)] + \
                [(kernel[i] - 1) * dilations[i] - pads[nsp + i] + output_padding[i] for i in range(nsp)]
    # [C, Mg, *k] -> [g, Cg, Mg, *k] -> [g, Mg, Cg, *k] -> [M, Cg, *k], flipped along every k
    wt = w.reshape((group, cg, mg) + tuple(kernel)).permute((0, 2, 1) + tuple(range(3, 3 + nsp)))
    wt = wt.reshape((m, cg) + tuple(kernel))
    for i in range(nsp):
        wt = wt.flip(2 + i)
    pos = [max(p, 0) for p in full_pads]
    neg = [(min(full_pads[i], 0), min(full_pads[nsp + i], 0)) for i in range(nsp)]
    if any(a or e for a, e in neg):
        # negative total padding crops the zero-inserted input (pads larger than the kernel span)
        z = z.pad([(0, 0), (0, 0)] + list(neg))
    y = conv(z, wt, b, pads=pos, dilations=dilations, group=group)
    if tuple(y.shape[2:]) != tuple(out):
        raise ShapeError(f"internal: output {y.shape[2:]} != {out}", op="ConvTranspose")
    return y


def _conv_transpose_phases(x: Tensor, w: Tensor, b: Tensor | None, kernel, strides, pads, out,
                           group: int) -> Tensor:
    """Undilated ``ConvTranspose`` as one contraction per output phase (sub-pixel form).

    Per spatial axis, with stride ``s``, kernel ``k`` and ``t = ceil(k / s)``: tap ``κ = s q + r``
    (``r < s``) sends input ``i`` to the uncropped position ``f = s (i + q) + r``, so with
    ``v = i + q``::

        Y[v, r] = sum_q x[v - q] * w[s q + r]        v in [0, in + t - 1), r in [0, s)

    (``w`` is zero past ``k`` taps, ``x`` zero outside ``[0, in)``): a stride-1 window of ``t``
    over ``x`` padded by ``t - 1`` on both sides, against the kernel reshaped to ``[t, s]`` and
    flipped along ``t``. ``(v, r)`` flattens to ``f``; output ``o`` is ``f = o + pad_begin``, so the
    flat axis is cropped (or, for ``output_padding``, extended with zeros) to ``out``. No product
    has an inserted zero. Where ``s`` does not divide ``k``, the phases ``r >= k - s (t - 1)`` have
    one tap fewer, the zero weight padded past ``k``; the input window is widened by the phase axis
    and reads -0.0 at those taps (a constant ``Where`` on the operand), so an inf or NaN input never
    meets that zero (``x = [inf, 1]``, ``k = 3``, ``s = 2`` gave ``[inf, inf, inf, nan, 3]``;
    onnxruntime and PyTorch ``[inf, inf, inf, 2, 3]``) and the product adds nothing. It stays one
    contraction (the exact form of one contraction per group of phases doubled the simulated time
    of a decoder's 3x3 stride-2 layer, 64 -> 32 channels at 64x64: 13.9 us in 2 kernels vs 26.8 us
    in 5; the widened window keeps 13.9 us). Known limit: with ``t > 1`` the window's padding
    zeros meet every weight, so an inf *weight* gives NaN at the outputs next to the border where
    the definition is finite. With ``k == s`` and no pads the sizes are products of the input sizes
    (``s * in``), which size ranges need (``lumc.ir.symbolic``).

    Shapes: ``x [N, C, *in]``, ``w [C, M / group, *k]``, result ``[N, M, *out]``.
    """
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    mg = w.shape[1]
    cg = c // group
    ts = [-(-k // s) for k, s in zip(kernel, strides)]
    lead = (n, group) if group > 1 else (n,)
    # input windows: [N, (g,) Cg, *in] -> [N, (g,) 1, Cg, v_0, j_0, 1, v_1, j_1, 1, ...]
    xg = x.reshape((n, group, cg) + x.shape[2:]) if group > 1 else x
    first = len(lead) + 1
    vs = [size + t - 1 for size, t in zip(x.shape[2:], ts)]
    win = sliding_windows(xg, first, ts, [1] * nsp, [1] * nsp,
                          [t - 1 for t in ts] + [t - 1 for t in ts], vs)
    xshape = lead + (1, cg) + tuple(d for v, t in zip(vs, ts) for d in (v, t, 1))
    win = win.reshape(xshape)
    short = [i for i in range(nsp) if kernel[i] % strides[i]]
    if short:
        # a short phase's tap past k (a zero weight) reads -0.0, not the input: an inf input
        # there gave 0 * inf = NaN; -0.0 * 0 adds nothing, whatever the sign of the sum
        valid = np.ones((1,) * (len(lead) + 2), bool)
        for i, (t, st, k) in enumerate(zip(ts, strides, kernel)):
            q = t - 1 - np.arange(t).reshape(t, 1)          # the window is flipped along t
            ok = st * q + np.arange(st).reshape(1, st) < k
            valid = valid[..., None, None, None] & (ok if i in short else
                                                    np.ones((t, st), bool)).reshape(1, t, st)
        xshape = xshape[:len(lead) + 2] + tuple(
            d for v, t, st in zip(vs, ts, strides) for d in (v, t, st))
        win = Tensor.const(valid).where(win.expand(xshape), Tensor.full((), -0.0, x.dtype))
    # kernel: [C, Mg, *k] -> taps padded to t s -> [g, Cg, Mg, t_0, s_0, ...], flipped along t
    wk = w.pad([(0, 0), (0, 0)] + [(0, t * s - k) for t, s, k in zip(ts, strides, kernel)])
    wk = wk.reshape((group, cg, mg) + tuple(d for t, s in zip(ts, strides) for d in (t, s)))
    for i in range(nsp):
        wk = wk.flip(3 + 2 * i)
    wk = wk.permute((0, 2, 1) + tuple(range(3, 3 + 2 * nsp)))
    wshape = (1,) + ((group,) if group > 1 else ()) + (mg, cg) + tuple(
        d for t, s in zip(ts, strides) for d in (1, t, s))
    wk = wk.reshape(wshape)
    full = lead + (mg, cg) + tuple(d for v, t, s in zip(vs, ts, strides) for d in (v, t, s))
    ca = len(lead) + 1                               # the Cg axis
    red = [ca] + [ca + 2 + 3 * i for i in range(nsp)]
    y = win.expand(full).mul(wk.expand(full)).sum(red)
    flat = tuple(v * s for v, s in zip(vs, strides))
    y = y.reshape((n, group * mg) + flat)
    crop = [(0, 0), (0, 0)] + [(-pads[i], out[i] + pads[i] - flat[i]) for i in range(nsp)]
    if any(a or e for a, e in crop):
        y = y.pad(crop)
    if b is not None:
        m = group * mg
        if tuple(b.shape) != (m,):
            raise ShapeError(f"bias shape {b.shape} != ({m},)", op="ConvTranspose")
        y = y.add(b.reshape((1, m) + (1,) * nsp))
    return y
