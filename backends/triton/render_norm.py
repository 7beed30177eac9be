"""Online forms for looped row kernels: two reductions of different levels in one loop.

A looped row kernel reads its input once per reduction level (``render_reduction``). Two patterns
are recognized in the meaning and merged into one loop, so softmax and layer norm read the row twice
(statistics, then output) instead of three times:

* **online softmax** (Milakov & Gimelshein, "Online normalizer calculation for softmax", 2018):
  ``m = max(x)`` and ``s = sum(exp2((x - m) * c))`` with a positive constant ``c`` (``log2 e`` for
  ``exp``). The loop keeps a running max and a sum relative to it, rescaled by
  ``exp2((m_old - m_new) * c)`` when the max grows. A running max of ``-inf`` is replaced by 0 for
  the rescale, so leading ``-inf`` blocks contribute 0 as in the two-pass form; a row whose max is
  ``-inf`` gets a NaN sum, as ``exp(-inf - -inf)`` does in the reference.
* **Chan/Welford moments** (Chan, Golub & LeVeque, "Updating formulae and a pairwise algorithm for
  computing sample variances", 1979): ``s1 = sum(x)`` and ``s2 = sum((x - s1 * c0)^2)`` with
  ``c0 = 1/K`` (mean and centered second moment). Each block's mean and centered sum of squares
  are merged into running ones; ``s2`` differs from the two-pass value only by rounding.

Both are ``reassociating`` in the rule classes of DESIGN.md: the same math in a different order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lumc.ir.graph import Node
from lumc.backends.row_moments import Moments, find_means, find_moments
from lumc.backends.triton import exprs
from lumc.backends.triton.chan import (ChanLoop, ShiftedSum, first_chunk_shift, kahan_add,
                                       quotient)
from lumc.backends.triton.rowplan import RowPlan


def _scalar(n: Node) -> float | None:
    """The value of a scalar constant, possibly behind a broadcast view, else None."""
    while n.op == "View":
        n = n.srcs[0]
    if n.op == "Constant" and n.numel == 1:
        return float(n.arg.value.reshape(-1)[0])
    return None


def _split_scaled(n: Node) -> tuple[Node, float] | None:
    """``n == a * c`` with a scalar constant ``c``: ``(a, c)``."""
    if n.op != "Mul":
        return None
    a, b = n.srcs
    for x, y in ((a, b), (b, a)):
        c = _scalar(y)
        if c is not None:
            return x, c
    return None


def _split_minus_row(n: Node, plan: RowPlan) -> tuple[Node, Node, Node] | None:
    """``n == x + bcast(r) * -1`` (that is ``x - r``): ``(x, r, bcast)`` with ``r`` a row value."""
    if n.op != "Add":
        return None
    a, b = n.srcs
    for x, y in ((a, b), (b, a)):
        sc = _split_scaled(y)
        if sc is None or sc[1] != -1.0:
            continue
        v = sc[0]
        if v.op == "View" and plan.kind.get(v) == "full" and plan.kind.get(v.srcs[0]) == "row":
            return x, v.srcs[0], v
    return None


@dataclass
class OnlineSoftmax:
    """``m = MaxReduce(x)``, ``s = SumReduce(exp2((x - m) * c))`` in one loop."""
    m: Node
    s: Node
    bcast: Node        # the view broadcasting m over the row
    scale: float

    @property
    def covers(self) -> set[Node]:
        return {self.m, self.s}

    def write(self, rk) -> None:
        w = rk.w
        md = exprs.tl_dtype(self.m.dtype)
        sd = exprs.tl_dtype(_acc(self.s))
        m_run, s_run = w.fresh("m_run"), w.fresh("s_run")
        w.line(f"# online softmax: running max and sum of exp2((x - max) * {self.scale!r})")
        w.line(f"{m_run} = tl.full([BLOCK_M], float('-inf'), {md})")
        w.line(f"{s_run} = tl.zeros([BLOCK_M], {sd})")
        w.open(f"for k_start in range(0, {rk.plan.K}, BLOCK_K):")
        rk.setup_k("k_start")
        x = rk.ev.value(self.m.srcs[0], rk.full_idx, rk.mask2, 1)
        xm = w.bind(f"tl.where(mask2, {x}, float('-inf'))", "a", 1)
        w.line(f"m_new = _max_nan({m_run}, {rk.reduce_tile(self.m, xm, 1)}).to({md})")
        w.line("m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)")
        c = exprs.render_scalar(self.scale, self.m.dtype)
        xd = "tl.float64" if self.m.dtype.itemsize == 8 else "tl.float32"  # exp2: fp32/fp64 only
        w.line(f"alpha = tl.exp2(({m_run} - m_safe).to({xd}) * {c}).to({sd})")
        rk.overrides[self.bcast] = "m_safe"
        p = rk.ev.value(self.s.srcs[0], rk.full_idx, rk.mask2, 1)
        del rk.overrides[self.bcast]
        p = w.bind(f"tl.where(mask2, {p}.to({sd}), 0.0)", "a", 1)
        w.line(f"{s_run} = {s_run} * alpha + tl.sum({p}, axis=1)")
        w.line(f"{m_run} = m_new")
        w.close()
        rk.finish(self.m, m_run)
        rk.finish(self.s, w.bind(f"tl.where({m_run} == float('-inf'), float('nan'), {s_run})",
                                 "a", 0))


@dataclass
class ChanMoments:
    """``s1 = SumReduce(x)``, ``s2 = SumReduce(d * d)`` with ``d = x - bcast(mean)``, ``mean = s1 *
    (1/K)``, in one loop (``lumc.backends.row_moments``); the mean on data shifted by the mean of
    the row's first chunk (``chan.ChanLoop``), ``s1`` Kahan-summed as ``loop_reduce`` sums."""
    mo: Moments

    @property
    def covers(self) -> set[Node]:
        return {self.mo.s1, self.mo.s2}

    def write(self, rk) -> None:
        w = rk.w
        s1 = self.mo.s1
        ad = exprs.tl_dtype(_acc(s1))
        w.line("# Chan/Welford: running mean and centered sum of squares of x - shift, sum of x")
        loop = ChanLoop(w, ShiftedSum(w, *rk.first_chunk(s1.srcs[0]), ad, False))
        sum_run, sum_comp = w.fresh("sum_run"), w.fresh("sum_comp")
        for v in (sum_run, sum_comp):
            w.line(f"{v} = tl.zeros([BLOCK_M], {ad})")
        w.open(f"for k_start in range(0, {rk.plan.K}, BLOCK_K):")
        rk.setup_k("k_start")
        x = rk.ev.value(s1.srcs[0], rk.full_idx, rk.mask2, 1)
        x = w.bind(f"tl.where(mask2, {x}.to({ad}), 0.0)", "a", 1)
        loop.update(x, "mask2")
        kahan_add(w, sum_run, sum_comp, w.bind(f"tl.sum({x}, axis=1)", "a", 1))
        w.close()
        rk.finish(s1, sum_run)
        rk.finish(self.mo.s2, loop.m2)
        rk.finish_value(self.mo.mean, loop.row_mean())


def one_pass_mean(rk, mo: Moments) -> None:
    """The mean of a moments pair in a one-pass row kernel (the whole row in one tile), bound
    before the sum of squared deviations that reads it: the row's mean ``K0`` corrected by the mean
    of ``x - K0`` (``lumc.backends.row_moments``; exact on a constant row)."""
    w = rk.w
    ad = exprs.tl_dtype(_acc(mo.s1))
    x = rk.operand_tile(mo.s1, 0)
    shift = first_chunk_shift(w, x, "mask2", ad, False)
    y = w.bind(f"tl.where(mask2, {x} - {shift}[:, None], 0.0)", "a", 0)
    # the count from the mask, not a literal: a size-generic kernel serves other row lengths
    q = quotient(f"tl.sum({y}, axis=1)", f"tl.sum(mask2.to({ad}), axis=1)", ad)
    rk.finish_value(mo.mean, w.bind(f"{shift} + {q}", "a", 0))


def _acc(r: Node):
    from lumc.backends.triton.render_reduction import acc_dtype
    return acc_dtype(r)


def _match_softmax(s: Node, plan: RowPlan):
    if s.op != "SumReduce" or not s.dtype.is_float:
        return None
    e = s.srcs[0]
    if e.op == "Cast" and e.srcs[0].dtype.is_float and e.dtype.itemsize >= e.srcs[0].dtype.itemsize:
        e = e.srcs[0]
    if e.op != "Exp2":
        return None
    sc = _split_scaled(e.srcs[0])
    if sc is None or not (sc[1] > 0 and math.isfinite(sc[1])):
        return None
    d, c = sc
    xm = _split_minus_row(d, plan)
    if xm is None:
        return None
    x, m, bcast = xm
    if m.op != "MaxReduce" or m.srcs[0] is not x or plan.level.get(m) != plan.level[s] - 1:
        return None
    return OnlineSoftmax(m, s, bcast, c)


def pair_moments(plan: RowPlan) -> dict[Node, Moments]:
    """``{s1: pair}`` for the moments pairs among the plan's reductions whose mean the row kernel
    reads as a row value (``lumc.backends.row_moments.find_moments``)."""
    out = {}
    for mo in find_moments(plan.reduces):
        if (mo.s2 in plan.reduces and plan.kind.get(mo.mean) == "row" and mo.s1.dtype.is_float
                and mo.s1.dtype == mo.s2.dtype):
            out[mo.s1] = mo
    return out


def lone_means(nodes: list[Node], plan: RowPlan, paired: dict) -> dict[Node, Moments]:
    """``{s1: Moments(s1, None, mean, K)}`` for the row means ``s1 * (1/K)`` among ``nodes`` whose
    sum of squared deviations is not in the kernel (``paired``, :func:`pair_moments`'s): computed on
    shifted data too, so a LayerNorm whose statistics land in two kernels keeps a constant row's
    mean exact."""
    out = {}
    for s1, mean, length in find_means(nodes):
        if (s1 in plan.reduces and s1 not in paired and s1 not in out
                and plan.kind.get(mean) == "row" and s1.op == "SumReduce"):
            out[s1] = Moments(s1, None, mean, length)
    return out


def find_online_merges(plan: RowPlan) -> dict[Node, object]:
    """``{reduction: merge}`` for every pair of reductions an online form can compute together
    (each merge listed under both of its reductions)."""
    out: dict[Node, object] = {}
    moments = pair_moments(plan)
    for r in plan.reduces:
        if r in out:
            continue
        merge = _match_softmax(r, plan) or (ChanMoments(moments[r]) if r in moments else None)
        if merge is None:
            continue
        if any(c in out for c in merge.covers):
            continue
        for c in merge.covers:
            out[c] = merge
    return out
