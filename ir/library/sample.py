"""Sampling at computed positions: ``grid_sample`` (N-D nearest / linear / cubic with zeros, border
and reflection padding), for ONNX ``GridSample`` and PyTorch ``grid_sampler_2d`` / ``_3d``.

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
from lumc.ir.library.indexing import gather_elements
from lumc.ir.tensor import Tensor
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
