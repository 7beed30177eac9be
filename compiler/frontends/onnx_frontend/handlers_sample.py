"""Sampling and spectral ops: ``GridSample`` (N-D nearest / linear / cubic with zeros, border and
reflection padding), ``AffineGrid``, 2-D ``DeformConv``, ``DFT`` (forward, inverse, one-sided, as
contractions with constant cos/sin tables), ``STFT`` (window views, then the same contractions),
the Hann / Hamming / Blackman windows and ``MelWeightMatrix`` (constants), ``RoiAlign``.

``GridSample`` is :func:`lumc.ir.library.sample.grid_sample`, shared with the PyTorch frontend.
"""
from __future__ import annotations

import numpy as np

from lumc.compiler.frontends.onnx_frontend.loader import dtype_of
from lumc.compiler.frontends.onnx_frontend.registry import OpContext, constant, handler, lib
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError, UnsupportedOpError
from lumc.ir.tensor import Tensor, concat, normalize_axis, stack
from lumc.ir.views import prod


@handler("GridSample", requires=["sample.grid_sample"])
def _grid_sample(ctx: OpContext):
    mode = ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return lib("sample.grid_sample")(ctx.input(0), ctx.input(1), mode,
                                     ctx.attr("padding_mode", "zeros"),
                                     bool(ctx.attr("align_corners", 0)))


@handler("DFT")
def _dft(ctx: OpContext):
    """``DFT`` along ``axis`` of a real ``[..., 1]`` or complex ``[..., 2]`` signal as products with
    constant cos/sin tables (computed in f64 at build time, rounded once to the signal dtype)."""
    x = ctx.input(0)
    if ctx.opset >= 20:
        axis = int(ctx.const_scalar(2, "axis")) if ctx.has_input(2) else -2
    else:
        axis = ctx.attr("axis", 1)
    axis = normalize_axis(axis, x.ndim)
    if axis == x.ndim - 1 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"DFT needs [..., 1|2] with the axis not last, got {x.shape}, axis {axis}")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    n_in = x.shape[axis]
    length = int(ctx.const_scalar(1, "dft_length")) if ctx.has_input(1) else (
        2 * (n_in - 1) if inverse and onesided else n_in)
    re = x.slice([0], [1], [-1]).squeeze([-1])
    im = x.slice([1], [2], [-1]).squeeze([-1]) if x.shape[-1] == 2 else None
    ax = axis
    # move the transformed axis last: [..., n_in]
    perm = [d for d in range(re.ndim) if d != ax] + [ax]
    back = [int(b) for b in np.argsort(perm)]
    re = re.permute(perm)
    im = im.permute(perm) if im is not None else None
    if inverse and onesided:
        bins = length // 2 + 1
        used = min(n_in, bins)
        kk = np.arange(used, dtype=np.float64)[:, None]
        tt = np.arange(length, dtype=np.float64)[None, :]
        weight = np.full((used, 1), 2.0)
        weight[0] = 1.0
        if length % 2 == 0 and used > length // 2:
            weight[length // 2] = 1.0
        ang = 2 * np.pi * kk * tt / length
        cos_t, sin_t = weight * np.cos(ang) / length, weight * np.sin(ang) / length
        re = re.slice([0], [used], [-1])
        out_re = _contract(re, cos_t, x.dtype)
        if im is not None:
            out_re = out_re.sub(_contract(im.slice([0], [used], [-1]), sin_t, x.dtype))
        return out_re.permute(back).unsqueeze([x.ndim - 1])
    n_out = length // 2 + 1 if onesided and not inverse else length
    out_re, out_im = _dft_last(re, im, length, n_out, inverse, x.dtype)
    return stack([out_re, out_im], -1).permute(back + [len(back)])


def _dft_last(re: Tensor, im: Tensor | None, length: int, n_out: int, inverse: bool,
              dtype: dt.DType) -> tuple[Tensor, Tensor]:
    """The first ``n_out`` bins of the ``length``-point DFT (``1 / length`` scaled when
    ``inverse``) of the signal ``re + i im`` along its last axis, zero-padded or cropped to
    ``length``: ``(real, imaginary)``, each ``[..., n_out]``."""
    used = min(re.shape[-1], length)
    t = np.arange(used, dtype=np.float64)
    ang = 2 * np.pi * t[:, None] * np.arange(n_out, dtype=np.float64)[None, :] / length
    scale = 1.0 / length if inverse else 1.0
    sign = 1.0 if inverse else -1.0
    cos_t, sin_t = np.cos(ang) * scale, sign * np.sin(ang) * scale
    re = re.slice([0], [used], [-1])
    out_re = _contract(re, cos_t, dtype)
    out_im = _contract(re, sin_t, dtype)
    if im is not None:
        im = im.slice([0], [used], [-1])
        # (a + ib)(cos + i s) with s = sign * sin: real a cos - b s, imaginary a s + b cos
        out_re = out_re.sub(_contract(im, sin_t, dtype))
        out_im = out_im.add(_contract(im, cos_t, dtype))
    return out_re, out_im


@handler("STFT", requires=["conv.sliding_windows"])
def _stft(ctx: OpContext):
    """``STFT`` of a real ``[B, L, 1]`` or complex ``[B, L, 2]`` signal: frames of
    ``frame_length`` every ``frame_step`` samples (window views), times the window, then the DFT of
    each frame as :func:`_dft_last` -> ``[B, frames, bins, 2]``, ``bins = frame_length // 2 + 1``
    when ``onesided`` (the default), else ``frame_length``."""
    x, window = ctx.input(0), ctx.opt(2)
    step = int(ctx.const_scalar(1, "frame_step"))
    if x.ndim != 3 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"STFT needs a signal [batch, length, 1|2], got {x.shape}")
    length = x.shape[1]
    flen = int(ctx.const_scalar(3, "frame_length")) if ctx.has_input(3) else None
    if window is not None:
        if window.ndim != 1 or flen not in (None, window.shape[0]):
            raise ShapeError(f"window {window.shape} does not fit frame_length {flen}")
        flen = window.shape[0]
    flen = length if flen is None else flen
    if step < 1 or not 1 <= flen <= length:
        raise ShapeError(f"frame_step {step} must be at least 1 and frame_length {flen} in "
                         f"[1, signal length {length}]")
    frames = (length - flen) // step + 1
    fr = lib("conv.sliding_windows")(x, 1, [flen], [step], [1], [0], [frames])  # [B, F, flen, c]
    re = fr.slice([0], [1], [-1]).squeeze([-1])
    im = fr.slice([1], [2], [-1]).squeeze([-1]) if x.shape[-1] == 2 else None
    if window is not None:
        w = window.reshape((1, 1, flen))
        re, im = re.mul(w), (None if im is None else im.mul(w))
    bins = flen // 2 + 1 if ctx.attr("onesided", 1) else flen
    out_re, out_im = _dft_last(re, im, flen, bins, False, x.dtype)
    return stack([out_re, out_im], -1)


@handler("MelWeightMatrix")
def _mel_weight_matrix(ctx: OpContext):
    """A constant ``[dft_length // 2 + 1, num_mel_bins]`` of triangular mel filters with peak 1
    (the ONNX reference's and onnxruntime's construction: ``num_mel_bins + 2`` band edges equally
    spaced on ``mel(f) = 2595 log10(1 + f / 700)``, each at spectrogram bin
    ``floor((dft_length + 1) f / sample_rate)``; computed in f64, rounded once)."""
    n_mel, dft_length, rate = (int(ctx.const_scalar(i, w)) for i, w in
                               enumerate(("num_mel_bins", "dft_length", "sample_rate")))
    lo, hi = (float(ctx.const_scalar(i, w)) for i, w in
              ((3, "lower_edge_hertz"), (4, "upper_edge_hertz")))
    n_spec = dft_length // 2 + 1
    if n_mel < 0 or dft_length < 1 or rate < 1 or not 0 <= lo <= hi:
        raise ShapeError(f"num_mel_bins {n_mel}, dft_length {dft_length}, sample_rate {rate}, "
                         f"edges [{lo}, {hi}] Hz: need counts >= 0 and 0 <= lower <= upper")
    lo_mel, hi_mel = (2595 * np.log10(1 + f / 700) for f in (lo, hi))
    mel = np.arange(n_mel + 2) * ((hi_mel - lo_mel) / (n_mel + 2)) + lo_mel
    edge = np.floor((dft_length + 1) * (700 * (10 ** (mel / 2595) - 1)) / rate).astype(np.int64)
    if n_mel and (edge[n_mel] >= n_spec or edge[n_mel + 1] > n_spec):
        raise ShapeError(f"upper_edge_hertz {hi} lies past the {n_spec} spectrogram bins of "
                         f"dft_length {dft_length} at sample_rate {rate}")
    out = np.zeros((n_spec, n_mel))
    for i in range(n_mel):
        left, center, right = edge[i], edge[i + 1], edge[i + 2]
        j = np.arange(left, center + 1)
        out[j, i] = (j - left) / (center - left) if center > left else 1.0
        j = np.arange(center, right)
        out[j, i] = (right - j) / (right - center)
    return constant(out.astype(dtype_of(ctx.attr("output_datatype", 1)).np))


def _contract(v: Tensor, table: np.ndarray, dtype: dt.DType) -> Tensor:
    """``v [..., a] @ table [a, b]`` with the table as a constant of ``dtype``."""
    return v.matmul(constant(table.astype(dtype.np)))


@handler("AffineGrid")
def _affine_grid(ctx: OpContext):
    """``theta [N, k, k+1] @ base grid`` with the base grid (normalized ``(x, y[, z], 1)``
    coordinates of every output position) a constant built from the static ``size``."""
    theta = ctx.input(0)
    size = ctx.const_ints(1, "size")
    align = bool(ctx.attr("align_corners", 0))
    spatial = size[2:]
    k = len(spatial)
    if k not in (2, 3) or theta.shape[1:] != (k, k + 1):
        raise ShapeError(f"theta {theta.shape} does not fit size {size}")
    axes = []
    for d in spatial:
        if align:
            a = np.arange(-1, 1 + 0.0001, 2.0 / (d - 1)) if d > 1 else np.array([-1.0])
        else:
            step = 2.0 / d
            a = np.arange(-1 + step / 2, 1, step)
        axes.append(a[:d])
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(prod(spatial))], 0)
    grid = theta.matmul(constant(base.astype(theta.dtype.np)))          # [N, k, P]
    return grid.permute((0, 2, 1)).reshape((theta.shape[0],) + tuple(spatial) + (k,))


_WINDOWS = {
    "HannWindow": lambda a, n: np.sin(a * np.pi / n) ** 2,
    "HammingWindow": lambda a, n: 25 / 46 - np.cos(2 * np.pi * a / n) * (1 - 25 / 46),
    "BlackmanWindow": lambda a, n: 0.42 - 0.5 * np.cos(2 * np.pi * a / n)
    + 0.08 * np.cos(4 * np.pi * a / n),
}


@handler(*_WINDOWS)
def _window(ctx: OpContext):
    """A constant window (f64 formula of the ONNX reference, rounded once to the output dtype)."""
    size = int(ctx.const_scalar(0, "size"))
    periodic = bool(ctx.attr("periodic", 1))
    out = dtype_of(ctx.attr("output_datatype", 1))
    a = np.arange(size, dtype=np.float64)
    w = _WINDOWS[ctx.node.op_type](a, size if periodic else size - 1)
    return constant(w.astype(out.np))


@handler("DeformConv", requires=["indexing.gather_elements"])
def _deform_conv(ctx: OpContext):
    """2-D deformable convolution (as the ONNX reference): every kernel tap reads the input at its
    offset position by bilinear interpolation (zero outside the image), optionally scaled by the
    mask, then a grouped contraction with the weights."""
    x, w, off, bias, mask = ctx.input(0), ctx.input(1), ctx.input(2), ctx.opt(3), ctx.opt(4)
    if x.ndim != 4:
        raise UnsupportedOpError(f"only 2-D DeformConv is supported, got input {x.shape}")
    n, ic, hh, ww = x.shape
    oc, icg, kh, kw = w.shape
    group, og = ctx.attr("group", 1), ctx.attr("offset_group", 1)
    dil = ctx.attr("dilations") or [1, 1]
    pads = ctx.attr("pads") or [0, 0, 0, 0]
    strides = ctx.attr("strides") or [1, 1]
    oh, ow = off.shape[2:]
    k, p = kh * kw, oh * ow
    if ic != icg * group or oc % group or ic % og or off.shape[1] != og * k * 2:
        raise ShapeError(f"shapes do not fit: x {x.shape}, w {w.shape}, offset {off.shape}, "
                         f"group {group}, offset_group {og}")
    off = off.reshape((n, og, kh, kw, 2, oh, ow))
    base_h = (-pads[0] + strides[0] * np.arange(oh)[None, :] + dil[0] * np.arange(kh)[:, None])
    base_w = (-pads[1] + strides[1] * np.arange(ow)[None, :] + dil[1] * np.arange(kw)[:, None])
    f = off.dtype
    hc = off.slice([0], [1], [4]).squeeze([4]).add(
        constant(base_h.reshape(kh, 1, oh, 1).astype(f.np)))          # [n, og, kh, kw, oh, ow]
    wc = off.slice([1], [2], [4]).squeeze([4]).add(
        constant(base_w.reshape(1, kw, 1, ow).astype(f.np)))
    h0, w0 = hc.floor(), wc.floor()
    th, tw = hc.sub(h0), wc.sub(w0)
    h0, w0 = h0.cast(dt.i64), w0.cast(dt.i64)
    per = ic // og
    xg = x.reshape((n, og, per, hh * ww))
    sampled = None
    for dh, dw in ((0, 0), (0, 1), (1, 0), (1, 1)):
        hi, wi = h0.add(h0.scalar_like(dh)), w0.add(w0.scalar_like(dw))
        inside = hi.lt(hi.scalar_like(0)).logical_not().logical_and(hi.lt(hi.scalar_like(hh))) \
            .logical_and(wi.lt(wi.scalar_like(0)).logical_not()).logical_and(wi.lt(wi.scalar_like(ww)))
        lin = hi.clip(hi.scalar_like(0), hi.scalar_like(hh - 1)).mul(ww).add(
            wi.clip(wi.scalar_like(0), wi.scalar_like(ww - 1)))
        lin = lin.reshape((n, og, 1, k * p)).expand((n, og, per, k * p))
        v = lib("indexing.gather_elements")(xg, lin, axis=3)
        wt_h = th if dh else th.scalar_like(1.0).sub(th)
        wt_w = tw if dw else tw.scalar_like(1.0).sub(tw)
        wt = inside.where(wt_h.mul(wt_w), th.scalar_like(0.0)).reshape((n, og, 1, k * p))
        term = v.mul(wt.expand((n, og, per, k * p)).cast(x.dtype))
        sampled = term if sampled is None else sampled.add(term)
    sampled = sampled.reshape((n, og, per, k, p))
    if mask is not None:
        m = mask.reshape((n, og, 1, k, p)).expand((n, og, per, k, p))
        sampled = sampled.mul(m)
    ocg = oc // group
    full = (n, group, ocg, icg, k, p)
    s6 = sampled.reshape((n, group, 1, icg, k, p)).expand(full)
    w6 = w.reshape((1, group, ocg, icg, k, 1)).expand(full)
    y = s6.mul(w6).sum([3, 4]).reshape((n, oc, oh, ow))
    if bias is not None:
        y = y.add(bias.reshape((1, oc, 1, 1)))
    return y


@handler("RoiAlign", requires=["sample.roi_align"])
def _roi_align(ctx: OpContext):
    """``RoiAlign`` as :func:`lumc.ir.library.sample.roi_align`. ``sampling_ratio`` 0 (adaptive:
    ``ceil(box size / bins)`` samples per bin on each axis, per roi) needs the rois at compile
    time; rois of one grid are computed together and put back in order (a grid of 0 samples
    gives 0, as the ONNX reference)."""
    x, rois, bidx = ctx.input(0), ctx.input(1), ctx.input(2)
    ctm = ctx.attr("coordinate_transformation_mode", "half_pixel") if ctx.opset >= 16 else \
        "output_half_pixel"
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ShapeError(f"unknown coordinate_transformation_mode {ctm!r}")
    oh, ow = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio, scale = int(ctx.attr("sampling_ratio", 0)), float(ctx.attr("spatial_scale", 1.0))
    kw = dict(output_height=oh, output_width=ow, spatial_scale=scale,
              mode=ctx.attr("mode", "avg"), half_pixel=ctm == "half_pixel")
    roi_align = lib("sample.roi_align")
    if ratio > 0:
        return roi_align(x, rois, bidx, grid=(ratio, ratio), **kw)
    boxes = np.asarray(ctx.const(1, "rois: sampling_ratio 0 sizes each roi's grid by its box"))
    f = boxes.dtype.type
    b = boxes.reshape(-1, 4) * f(scale) - f(0.5 if ctm == "half_pixel" else 0.0)
    size_h, size_w = b[:, 3] - b[:, 1], b[:, 2] - b[:, 0]
    if ctm != "half_pixel":
        size_h, size_w = np.maximum(size_h, f(1)), np.maximum(size_w, f(1))
    grids = [(int(np.ceil(hh / f(oh))), int(np.ceil(ww / f(ow)))) for hh, ww in zip(size_h, size_w)]
    parts, order = [], []
    for grid in dict.fromkeys(grids):
        idx = [i for i, g in enumerate(grids) if g == grid]
        order += idx
        sel = constant(np.array(idx, np.int64))
        if min(grid) < 1:
            parts.append(Tensor.full((len(idx), x.shape[1], oh, ow), 0, x.dtype))
            continue
        parts.append(roi_align(x, lib("indexing.take")(rois, sel, 0),
                               lib("indexing.take")(bidx, sel, 0), grid=grid, **kw))
    if not parts:
        return Tensor.full((0, x.shape[1], oh, ow), 0, x.dtype)
    out = concat(parts, 0)
    return lib("indexing.take")(out, constant(np.argsort(order).astype(np.int64)), 0)
