"""A LayerNorm's mean and centered second moment in one loop over the row, as Triton source: Chan's
pairwise update on shifted data (Chan, Golub & LeVeque, "Algorithms for computing the sample
variance: analysis and recommendations", 1983; formulas and the reason for the shift in
``lumc.backends.row_moments``).

Shared by the row kernels (``render_norm`` and ``render_reduction``: one ``[BLOCK_M]`` value per
row; ``render_split``: a row mean split over programs) and the statistics of a normalization formed
on load or in an epilogue (``norm_prologue.RowStatistics``: ``[BLOCK_M, 1]`` columns). The caller
writes the loop and its index setup; it first hands over the row's first chunk (whose mean is the
shift), then each chunk.
"""
from __future__ import annotations

from lumc.backends.triton.codegen import SourceWriter


def quotient(a: str, b: str, dtype: str) -> str:
    """``a / b`` correctly rounded: ``div_rn`` in fp32 (Triton's ``/`` is ``div.full.f32``, 2 ulp),
    ``/`` in fp64 (``div.rn.f64``)."""
    if dtype == "tl.float64":
        return f"({a} / {b})"
    return f"tl.math.div_rn({a}, ({b}).to(tl.float32))"


def kahan_add(w: SourceWriter, acc: str, comp: str, value: str) -> None:
    """``acc += value`` inside a loop, Kahan-compensated across chunks (``comp`` carries the lost
    low bits; a chunk's ``tl.sum`` is a tree, the running sum is not). The compensation is kept
    only while the sum is finite: ``inf - inf`` would turn it NaN."""
    y, t = w.fresh("ky"), w.fresh("kt")
    w.line(f"{y} = {value} - {comp}")
    w.line(f"{t} = {acc} + {y}")
    w.line(f"{comp} = tl.where(tl.abs({t}) < float('inf'), ({t} - {acc}) - {y}, 0.0)")
    w.line(f"{acc} = {t}")


def first_chunk_shift(w: SourceWriter, first: str, mask: str, dtype: str, column: bool) -> str:
    """The shift ``K0`` (bound at level 0): the mean of the row's first chunk ``first`` (any float
    dtype; ``mask`` its mask), taken as ``sum(x * (1/count))`` so it cannot overflow where the
    chunk's plain sum would (|x| near 3e38 / BLOCK_K), or 0 where it is not finite (a row holding
    inf or NaN then gives what the unshifted sum gives). On a constant row ``K0`` is within a few
    ulps of the value, so every ``x - K0`` is exact (Sterbenz) and the shifted sum corrects the
    mean to the value itself. ``column``: ``[BLOCK_M, 1]`` (else ``[BLOCK_M]``)."""
    keep, tile = ("[:, None]", "") if column else ("", "[:, None]")
    x = w.bind(f"tl.where({mask}, {first}.to({dtype}), 0.0)", "a", 0)
    count = w.bind(f"tl.sum({mask}.to({dtype}), axis=1){keep}", "t", 0)
    inv = w.bind(quotient(f"tl.full([], 1.0, {dtype})", count, dtype), "t", 0)
    m = w.bind(f"tl.sum({x} * {inv}{tile}, axis=1){keep}", "t", 0)
    return w.bind(f"tl.where(tl.abs({m}) < float('inf'), {m}, 0.0).to({dtype})", "shift", 0)


class ShiftedSum:
    """The Kahan-compensated running sum of ``x - K0`` over a row's chunks, ``K0`` the
    :func:`first_chunk_shift` of ``first``, and the row's mean from it, ``K0 + sum / n``
    (``lumc.backends.row_moments``). Declared at level 0, here.

    Args:
        w: the kernel's writer.
        first, mask: the row's first chunk (any float dtype) and its mask.
        dtype: the accumulator's Triton dtype (``tl.float32`` or ``tl.float64``).
        column: row values are ``[BLOCK_M, 1]`` columns (else ``[BLOCK_M]`` vectors).
    """

    def __init__(self, w: SourceWriter, first: str, mask: str, dtype: str, column: bool):
        self.w, self.dtype, self.column = w, dtype, column
        self.keep = "[:, None]" if column else ""      # a reduced row value kept as a column
        self.tile = "" if column else "[:, None]"      # a row value broadcast over a tile
        self.shift = first_chunk_shift(w, first, mask, dtype, column)
        self.sum, self.comp = w.fresh("shifted_sum"), w.fresh("shifted_comp")
        shape = "[BLOCK_M, 1]" if column else "[BLOCK_M]"
        for v in (self.sum, self.comp):
            w.line(f"{v} = tl.zeros({shape}, {dtype})", 0)

    def add(self, x: str, mask: str) -> tuple[str, str]:
        """Inside the loop (level 1): add a chunk ``x`` (the accumulator dtype); returns its
        shifted tile (0 off ``mask``) and that tile's sum."""
        w = self.w
        y = w.bind(f"tl.where({mask}, {x} - {self.shift}{self.tile}, 0.0)", "t", 1)
        sb = w.bind(f"tl.sum({y}, axis=1){self.keep}", "t", 1)
        kahan_add(w, self.sum, self.comp, sb)
        return y, sb

    def mean(self, n: str) -> str:
        """The row's mean over ``n`` elements, ``K0 + sum / n``, divided once, correctly rounded
        (after the loop, level 0)."""
        return self.w.bind(f"{self.shift} + {quotient(self.sum, n, self.dtype)}", "t", 0)


class ChanLoop:
    """Running count, mean and centered sum of squares of the shifted values ``x - K0``
    (:class:`ShiftedSum`, whose sum gives the row's mean).

    Args:
        w: the kernel's writer (the running values are declared at level 0, here).
        shifted: the row's :class:`ShiftedSum` (its dtype and layout are the loop's).
    """

    def __init__(self, w: SourceWriter, shifted: ShiftedSum):
        self.w, self.s, self.dtype = w, shifted, shifted.dtype
        self.mean, self.m2, self.n = w.fresh("mom_mean"), w.fresh("mom_m2"), w.fresh("mom_n")
        shape = "[BLOCK_M, 1]" if shifted.column else "[BLOCK_M]"
        for v in (self.mean, self.m2, self.n):
            w.line(f"{v} = tl.zeros({shape}, {self.dtype})", 0)

    def update(self, x: str, mask: str) -> None:
        """Merge one chunk (inside the loop, level 1): ``x`` the tile in the accumulator dtype."""
        w, d, keep, tile = self.w, self.dtype, self.s.keep, self.s.tile
        y, sb = self.s.add(x, mask)
        nb = w.bind(f"tl.sum({mask}.to({d}), axis=1){keep}", "t", 1)
        mb = w.bind(f"{sb} / {nb}", "t", 1)
        dev = w.bind(f"tl.where({mask}, {y} - {mb}{tile}, 0.0)", "t", 1)
        mb2 = w.bind(f"tl.sum({dev} * {dev}, axis=1){keep}", "t", 1)
        n = w.bind(f"{self.n} + {nb}", "t", 1)
        delta = w.bind(f"{mb} - {self.mean}", "t", 1)
        w.line(f"{self.mean} = {self.mean} + {delta} * ({nb} / {n})")
        # the first chunk (no running count) adds no cross term: 0 * delta^2 would be NaN for a
        # row whose squares overflow (|x| > 1.8e19), where the two-pass variance is +inf
        w.line(f"{self.m2} = {self.m2} + {mb2} + tl.where({self.n} > 0, "
               f"{delta} * {delta} * ({self.n} * {nb} / {n}), 0.0)")
        w.line(f"{self.n} = {n}")

    def row_mean(self) -> str:
        """The row's mean from the shifted sum (after the loop; the merges' running mean carries
        a rounding per chunk)."""
        return self.s.mean(self.n)
