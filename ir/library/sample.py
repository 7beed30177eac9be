"""Sampling at computed positions: ``grid_sample`` (N-D nearest / linear / cubic with zeros, border
and reflection padding), for ONNX ``GridSample`` and PyTorch ``grid_sampler_2d`` / ``_3d``; and
``roi_align`` (ONNX ``RoiAlign``: bilinear samples in boxes, averaged or maxed per bin).

It follows the ONNX reference (``onnx/reference/ops/op_grid_sample.py``, itself PyTorch's
``GridSampler.h``): coordinates are un-normalized per ``align_corners``, moved inside the border
(clamp or reflection) when out of range, and each output reads the ``2^k`` (linear) or ``4^k``
(cubic, Keys a = -0.75) neighbouring input elements with one ``Gather`` each, weighted by the
separable tap weights.
"""
from __future__ import annotations

import itertools

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.library.indexing import gather, gather_elements
from lumc.ir.tensor import Tensor, stack
from lumc.ir.views import prod

_CUBIC_A = -0.75


def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
    """Reflect ``x`` by the nearer border until it lies in ``[lo, hi]``."""
    span = hi - lo
    below, above = x.lt(x.scalar_like(lo)), x.scalar_like(hi).lt(x)
    d = below.where(x.scalar_like(lo).sub(x), x.sub(x.scalar_like(hi)))
    n = d.mul(1.0 / span).floor() if span > 0 else d.scalar_like(0.0)
    r = d.sub(n.mul(span))
    even = n.fmod(2.0).eq(n.scalar_like(0.0))
    from_lo, from_hi = x.scalar_like(lo).add(r), x.scalar_like(hi).sub(r)
    out_below = even.where(from_lo, from_hi)
    out_above = even.where(from_hi, from_lo)
    return below.where(out_below, above.where(out_above, x))


def _cubic_weights(t: Tensor) -> list[Tensor]:
    """Keys cubic weights of the taps at ``-1, 0, 1, 2`` for a fraction ``t`` in ``[0, 1)``."""
    a = _CUBIC_A

    def near(s):   # |s| <= 1
        return s.mul(a + 2).sub(a + 3).mul(s).mul(s).add(1.0)

    def far(s):    # 1 < |s| < 2
        return s.mul(a).sub(5 * a).mul(s).add(8 * a).mul(s).sub(4 * a)

    one = t.scalar_like(1.0)
    return [far(t.add(1.0)), near(t), near(one.sub(t)), far(t.scalar_like(2.0).sub(t))]


def grid_sample(x: Tensor, grid: Tensor, mode: str = "linear", padding: str = "zeros",
                align: bool = False, style: str = "onnx") -> Tensor:
    """ONNX ``GridSample`` / PyTorch ``grid_sample`` (see the module docstring).

    Args:
        x: ``[N, C, D1, ..., Dk]`` float.
        grid: ``[N, O1, ..., Om, k]`` sampling positions in ``[-1, 1]``, the last dim listing the
            coordinates innermost-first (x, then y, ...).
        mode: ``nearest`` (round half to even), ``linear`` or ``cubic``.
        padding: ``zeros``, ``border`` or ``reflection``: what a position outside reads.
        align: ``align_corners``: -1 and 1 are the centers of the corner elements (else their
            outer edges).
        style: ``onnx`` (the ONNX reference: nearest rounds, then a position outside the border
            moves inside, clamped or reflected) or ``torch`` (``GridSampler.h``: the position is
            clamped, or reflected and clamped, before nearest rounds it, so a reflected half-pixel
            tie rounds the other way; bicubic moves no position, only pads each tap, so one just
            outside still blends the taps on both sides).
    Returns:
        ``[N, C, O1, ..., Om]`` in ``x``'s dtype.
    Raises:
        ShapeError: an unknown mode or padding, or a grid that does not fit ``x``.
    """
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border",
                                                                    "reflection"):
        raise ShapeError(f"unknown mode {mode!r} or padding_mode {padding!r}")
    n, c = x.shape[:2]
    dims = x.shape[2:]
    k = len(dims)
    if grid.ndim != k + 2 or grid.shape[0] != n or grid.shape[-1] != k:
        raise ShapeError(f"grid {grid.shape} does not fit input {x.shape}")
    out_sp = grid.shape[1:-1]
    m = prod(out_sp)
    g = grid.reshape((n, m, k))
    coords = []
    for i, d in enumerate(dims):
        v = g.slice([k - 1 - i], [k - i], [2]).reshape((n, m))     # grid stores x (last dim) first
        v = v.add(1.0).mul(0.5 * (d - 1)) if align else v.add(1.0).mul(0.5 * d).sub(0.5)
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        if style == "torch":
            # GridSampler.h: border clips; reflection reflects then clips; nearest rounds after
            # (a reflected half-pixel tie rounds the other way); bicubic pads only its taps
            if mode != "cubic" and padding == "border":
                v = v.clip(v.scalar_like(0.0), v.scalar_like(d - 1.0))
            elif mode != "cubic" and padding == "reflection":
                v = _reflect(v, lo, hi).clip(v.scalar_like(0.0), v.scalar_like(d - 1.0))
            if mode == "nearest":
                v = v.round()
        else:
            if mode == "nearest":
                v = v.round()
            if padding == "border":
                # only a position outside [lo, hi] moves (ONNX); inside, each tap is clamped
                out = v.lt(v.scalar_like(lo)).logical_or(v.scalar_like(hi).lt(v))
                v = out.where(v.clip(v.scalar_like(0.0), v.scalar_like(d - 1.0)), v)
            elif padding == "reflection":
                v = _reflect(v, lo, hi)
        coords.append((v, lo, hi))
    flat = x.reshape((n, c, prod(dims)))

    def fetch(idx: list[Tensor]) -> Tensor:
        """x at integer positions ``idx`` (one [n, m] i64 tensor per dim), padded per the mode."""
        valid = None
        lin = None
        for i, (ix, d) in enumerate(zip(idx, dims)):
            if padding == "zeros":
                ok = ix.lt(ix.scalar_like(0)).logical_not().logical_and(ix.lt(ix.scalar_like(d)))
                valid = ok if valid is None else valid.logical_and(ok)
            elif padding == "reflection":
                _, lo, hi = coords[i]
                ix = _reflect(ix.cast(dt.f64), lo, hi).cast(dt.i64)
            ix = ix.clip(ix.scalar_like(0), ix.scalar_like(d - 1))
            term = ix.mul(int(prod(dims[i + 1:])))
            lin = term if lin is None else lin.add(term)
        lin = lin.reshape((n, 1, m)).expand((n, c, m))
        val = gather_elements(flat, lin, axis=2)
        if valid is not None:
            val = valid.reshape((n, 1, m)).expand((n, c, m)).where(val, val.scalar_like(0))
        return val

    if mode == "nearest":
        y = fetch([v.cast(dt.i64) for v, _, _ in coords])
    else:
        taps = (0, 1) if mode == "linear" else (-1, 0, 1, 2)
        per_dim = []
        for v, _, _ in coords:
            base = v.floor()
            t = v.sub(base)
            ws = [t.scalar_like(1.0).sub(t), t] if mode == "linear" else _cubic_weights(t)
            per_dim.append((base.cast(dt.i64), [w.cast(x.dtype) for w in ws]))
        y = None
        for combo in itertools.product(range(len(taps)), repeat=k):
            idx = [b.add(b.scalar_like(taps[j])) for (b, _), j in zip(per_dim, combo)]
            w = None
            for (_, ws), j in zip(per_dim, combo):
                w = ws[j] if w is None else w.mul(ws[j])
            term = fetch(idx).mul(w.reshape((n, 1, m)).expand((n, c, m)))
            y = term if y is None else y.add(term)
    return y.reshape((n, c) + tuple(out_sp))


def _roi_axis_taps(start: Tensor, bin_size: Tensor, pooled: int, grid: int, size: int):
    """One axis of RoiAlign's bilinear samples (the ONNX reference, onnxruntime): for rois
    ``[R]``, the ``pooled * grid`` sample coordinates of each and their two taps, as
    ``(index [R, pooled, grid, 2] i64, weight [R, pooled, grid, 2])``. A sample outside
    ``[-1, size]`` weighs 0; one inside is clamped to ``[0, size - 1]``."""
    r = start.shape[0]
    shape = (r, pooled, grid)
    p = Tensor.iota(shape, 1, start.dtype)
    i = Tensor.iota(shape, 2, start.dtype).add(Tensor.full(shape, 0.5, start.dtype))
    b = bin_size.reshape((r, 1, 1)).expand(shape)
    c = start.reshape((r, 1, 1)).expand(shape).add(p.mul(b)).add(i.mul(b.div(b.scalar_like(grid))))
    inside = c.lt(c.scalar_like(-1.0)).logical_or(c.gt(c.scalar_like(float(size)))).logical_not()
    c = c.maximum(c.scalar_like(0.0))
    low = c.floor()
    at_end = low.ge(low.scalar_like(size - 1))
    low = at_end.where(low.scalar_like(size - 1), low)
    c = at_end.where(low, c)
    high = at_end.where(low, low.add(low.scalar_like(1)))
    frac = c.sub(low)
    zero = frac.scalar_like(0.0)
    w = stack([inside.where(frac.scalar_like(1.0).sub(frac), zero), inside.where(frac, zero)], -1)
    return stack([low.cast(dt.i64), high.cast(dt.i64)], -1), w


def roi_align(x: Tensor, rois: Tensor, batch_indices: Tensor, *, output_height: int = 1,
              output_width: int = 1, grid: tuple[int, int] = (2, 2), spatial_scale: float = 1.0,
              mode: str = "avg", half_pixel: bool = True) -> Tensor:
    """ONNX ``RoiAlign``: ``[R, C, output_height, output_width]`` features of the boxes ``rois``
    ``[R, 4]`` (``x1, y1, x2, y2`` in input coordinates times ``spatial_scale``) of the images
    ``batch_indices`` ``[R]`` of ``x`` ``[N, C, H, W]``.

    Each output bin averages (``avg``) or takes the largest of (``max``: the largest of the four
    weighted taps, as onnxruntime) ``grid[0] x grid[1]`` bilinear samples (ONNX
    ``sampling_ratio`` on both axes; the adaptive 0 is the caller's), as the ONNX reference:
    ``half_pixel`` shifts box corners by -0.5 (else boxes are at least 1 wide), a sample outside
    ``[-1, size]`` reads 0 and one inside is clamped to the image. ``avg`` is separable: one
    ``Gather`` along H, a weighted sum, one along W; ``max`` gathers all four taps.

    Raises:
        ShapeError: bad shapes, a grid below 1 or an unknown mode.
    """
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != (
            rois.shape[0],):
        raise ShapeError(f"RoiAlign needs X [N, C, H, W], rois [R, 4], batch_indices [R], got "
                         f"{list(x.shape)}, {list(rois.shape)}, {list(batch_indices.shape)}",
                         op="RoiAlign")
    gh, gw = (int(k) for k in grid)
    if min(gh, gw) < 1 or mode not in ("avg", "max"):
        raise ShapeError(f"sampling grid {list(grid)} must be >= 1 and mode {mode!r} avg or max",
                         op="RoiAlign")
    _, ch, h, w = x.shape
    r, oh, ow = rois.shape[0], int(output_height), int(output_width)
    box = rois.cast(x.dtype).mul(rois.cast(x.dtype).scalar_like(spatial_scale))
    if half_pixel:
        box = box.sub(box.scalar_like(0.5))
    corner = [box.slice([k], [k + 1], [1]).reshape((r,)) for k in range(4)]   # x1, y1, x2, y2
    size_w, size_h = corner[2].sub(corner[0]), corner[3].sub(corner[1])
    if not half_pixel:
        size_w, size_h = size_w.maximum(size_w.scalar_like(1.0)), size_h.maximum(
            size_h.scalar_like(1.0))
    yi, yw = _roi_axis_taps(corner[1], size_h.div(size_h.scalar_like(oh)), oh, gh, h)
    xi, xw = _roi_axis_taps(corner[0], size_w.div(size_w.scalar_like(ow)), ow, gw, w)
    img = gather(x, batch_indices, 0)                                           # [R, C, H, W]
    ky, kx = oh * gh * 2, ow * gw * 2
    rows = gather_elements(img, yi.reshape((r, 1, ky, 1)).expand((r, ch, ky, w)), axis=2)
    if mode == "avg":
        rows = rows.mul(yw.reshape((r, 1, ky, 1)).expand((r, ch, ky, w)))
        rows = rows.reshape((r, ch, oh, gh * 2, w)).sum([3])                    # [R, C, oh, W]
        vals = gather_elements(rows, xi.reshape((r, 1, 1, kx)).expand((r, ch, oh, kx)), axis=3)
        vals = vals.mul(xw.reshape((r, 1, 1, kx)).expand((r, ch, oh, kx)))
        out = vals.reshape((r, ch, oh, ow, gw * 2)).sum([4])
        return out.div(out.scalar_like(gh * gw))
    # max: every (y tap, x tap) product of a bin, [R, C, oh, gh * 2, ow, gw * 2]
    full = (r, ch, ky, kx)
    vals = gather_elements(rows.reshape((r, ch, ky, 1, w)).expand((r, ch, ky, kx, w)),
                           xi.reshape((r, 1, 1, kx, 1)).expand((r, ch, ky, kx, 1)), axis=4)
    wt = yw.reshape((r, 1, ky, 1)).expand(full).mul(xw.reshape((r, 1, 1, kx)).expand(full))
    vals = vals.reshape(full).mul(wt).reshape((r, ch, oh, gh * 2, ow, gw * 2))
    return vals.max(5).max(3)
