"""A LayerNorm's mean and centered second moment in one loop over the row, as Triton source: Chan's
pairwise update on shifted data (Chan, Golub & LeVeque, "Algorithms for computing the sample
variance: analysis and recommendations", 1983; formulas and the reason for the shift in
``lumc.backends.row_moments``).

Shared by the row kernels (``render_norm``: one ``[BLOCK_M]`` value per row) and the statistics of
a normalization formed on load or in an epilogue (``norm_prologue.RowStatistics``: ``[BLOCK_M, 1]``
columns). The caller writes the loop and its index setup; it first hands over the row's first
chunk (whose mean is the shift), then each chunk.
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


def first_chunk_shift(w: SourceWriter, x: str, mask: str, dtype: str, column: bool) -> str:
    """The shift ``K0``: the mean of the row's first chunk ``x`` (0 off ``mask``), or 0 where it is
    not finite (a row holding inf or NaN then gives what the unshifted sum gives). Bound at level
    0. On a constant row ``K0`` is within an ulp or two of the value, so every ``x - K0`` is exact
    (Sterbenz) and the shifted sum corrects the mean to the value itself."""
    keep = "[:, None]" if column else ""
    m = w.bind(quotient(f"tl.sum({x}, axis=1){keep}",
                        f"tl.sum({mask}.to({dtype}), axis=1){keep}", dtype), "t", 0)
    return w.bind(f"tl.where(tl.abs({m}) < float('inf'), {m}, 0.0).to({dtype})", "shift", 0)


class ChanLoop:
    """Running count, sum, mean and centered sum of squares of the shifted values ``x - shift``.

    Args:
        w: the kernel's writer (the running values are declared at level 0, here).
        dtype: the accumulator's Triton dtype (``tl.float32`` or ``tl.float64``).
        column: values are ``[BLOCK_M, 1]`` columns (else ``[BLOCK_M]`` vectors).
        shift: :func:`first_chunk_shift`'s name.
    """

    def __init__(self, w: SourceWriter, dtype: str, column: bool, shift: str):
        self.w, self.dtype, self.column, self.shift = w, dtype, column, shift
        self.mean, self.m2, self.n = w.fresh("mom_mean"), w.fresh("mom_m2"), w.fresh("mom_n")
        self.sum, self.sum_comp = w.fresh("mom_sum"), w.fresh("mom_sum_comp")
        shape = "[BLOCK_M, 1]" if column else "[BLOCK_M]"
        for v in (self.mean, self.m2, self.n, self.sum, self.sum_comp):
            w.line(f"{v} = tl.zeros({shape}, {dtype})")

    def update(self, x: str, mask: str) -> None:
        """Merge one chunk (inside the loop, level 1): ``x`` the tile in the accumulator dtype."""
        w, d = self.w, self.dtype
        keep = "[:, None]" if self.column else ""
        tile = "" if self.column else "[:, None]"     # a row value broadcast over the tile
        y = w.bind(f"tl.where({mask}, {x} - {self.shift}{tile}, 0.0)", "t", 1)
        nb = w.bind(f"tl.sum({mask}.to({d}), axis=1){keep}", "t", 1)
        sb = w.bind(f"tl.sum({y}, axis=1){keep}", "t", 1)
        kahan_add(w, self.sum, self.sum_comp, sb)
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
        """The row's mean, ``K0 + sum(x - K0) / n`` (after the loop): the shifted sum divided once,
        correctly rounded (the merges' running mean carries a rounding per chunk)."""
        return self.w.bind(f"{self.shift} + {quotient(self.sum, self.n, self.dtype)}", "t", 0)
