"""Size ranges: one compile whose artifact serves every size of a declared range, tuned per bucket.

``--shape sequence_length=1..256`` (``shapes={"sequence_length": (1, 256)}``) declares a range;
``64..640:32`` one in steps of 32; ``1..512@128`` one whose traffic is around 128 (that bucket gets
twice the search budget and a bucket edge at 128). The compile:

1. **Probes the sizes** (``lumc.ir.symbolic``): the model is imported with each ranged dim at a
   prime inside its range and, to check, at a second prime; the first graph re-sized to the
   second sizes must be the second graph, node for node. Sizes that are products of the dims
   need nothing more. A padded convolution's sizes are not (``H + 2``, its strides
   ``(H + 2) (W + 2)``, mask bounds ``H + 1``): they are *affine values*, learned as a table
   (``learn_table``) from imports at three sets of primes above the range (above 1000 units:
   there no padded size equals a static one) and checked node for node at all three and at two
   imports inside the range. A model whose sizes are neither (``L**2 + 1``, a table folded at
   the size) is refused in one line naming the difference, with the hint to give explicit
   sizes instead.
2. **Runs the e-graph once**, on the probed graph: saturation and extraction do not depend on
   which size of the range a call has, so every bucket shares the candidates (re-sized).
3. **Searches per bucket**: the range is cut into :data:`DEFAULT_BUCKETS` buckets (geometric
   edges, at the step's multiples), each searched at its representative size (its largest: a tile
   that fits the largest size fits all) with the remaining budget split in proportion to the
   buckets' weights (the square root of the representative size, twice for the ``@`` bucket), and its chosen plan's numerics checked at the bucket's smallest and largest
   size against the reference executor on the model imported there.
4. **Stores one plan per bucket**, at the probe sizes, with its configs. A call of size ``n``
   re-sizes its bucket's plan to ``n`` (``lumc.compiler.runtime.variants``): no search, no
   padding, exact results.

Kernels are rendered per exact size (a GPU compiles each size's modules once, cached); Triton
kernels that take the sizes as runtime arguments are not generated yet.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from lumc.backends.reference import TooLargeError
from lumc.compiler.core.budget import BUDGET_KNOBS, Deadline, hard_deadline, parse_duration
from lumc.compiler.runtime.variants import VariantKey, VariantModel
from lumc.ir.errors import BudgetError, InputError, ShapeError
from lumc.ir.symbolic import NotSymbolic, Resizer, probing
# the primes that probe a range (choose_probes is this module's API too)
from lumc.compiler.core.probes import choose_probes, probe_assignments  # noqa: F401
from lumc.compiler.core.resize_checks import (grows_with_size, resizes_to as _resizes_to,
                                               values_differ as _values_differ)

DEFAULT_BUCKETS = 4     # buckets per ranged dim (two ranged dims: 2 each)
MIN_BUCKET_S = 2.0      # the least search budget one bucket is given


@dataclass(frozen=True)
class DimRange:
    """A dynamic dim's declared sizes: ``lo..hi`` in steps of ``step``, traffic around ``at``."""
    lo: int
    hi: int
    step: int = 1
    at: int | None = None

    def __post_init__(self):
        if not (0 < self.lo <= self.hi) or self.step < 1:
            raise InputError(f"bad size range {self.describe()} (need 0 < lo <= hi, "
                             "step >= 1)")
        if self.lo % self.step or self.hi % self.step:
            raise InputError(f"size range {self.lo}..{self.hi}: both ends must be multiples of "
                             f"its step {self.step} (sizes off the step, such as odd ones, are "
                             "a list: NAME=A,B,C)")
        if self.at is not None and not (self.lo <= self.at <= self.hi and self.at % self.step == 0):
            raise InputError(f"size range {self.describe()}: the traffic point must be a size of "
                             "the range" + (f" (a multiple of its step {self.step})"
                                            if self.step > 1 and self.lo <= self.at <= self.hi
                                            else ""))

    def describe(self) -> str:
        return (f"{self.lo}..{self.hi}" + (f":{self.step}" if self.step > 1 else "")
                + (f"@{self.at}" if self.at is not None else ""))


def parse_range(text: str) -> DimRange | None:
    """``A..B[:STEP][@AT]`` as a :class:`DimRange`, or None when ``text`` is not a range."""
    body, _, at = text.partition("@")
    body, _, step = body.partition(":")
    lo, dots, hi = body.partition("..")
    if not dots:
        return None
    try:
        return DimRange(int(lo), int(hi), int(step) if step else 1, int(at) if at else None)
    except ValueError:
        raise InputError(f"bad size range {text!r}: expected A..B, A..B:STEP or A..B@AT") from None


def ranges_in(shapes: dict | None) -> dict[str, DimRange]:
    """The ranged dims of ``shapes``: its :class:`DimRange` values (the API's ``(lo, hi)`` tuples
    become DimRanges in ``onnx_stage.with_ranges``)."""
    return {k: v for k, v in (shapes or {}).items() if isinstance(v, DimRange)}


def bucket_edges(r: DimRange, n: int) -> list[tuple[int, int]]:
    """``n`` (or fewer) buckets ``[(lo, hi)]`` covering the range, edges at multiples of the step,
    geometric (equal ratios: sequence lengths and image sizes spread over orders of magnitude), with
    an edge at ``r.at`` when given."""
    units = list(range(r.lo // r.step, r.hi // r.step + 1))
    if len(units) <= n:
        return [(u * r.step, u * r.step) for u in units]
    lo, hi = units[0], units[-1]
    tops = sorted({min(hi, max(lo, round(lo * (hi / lo) ** ((i + 1) / n)))) for i in range(n)})
    if r.at is not None and r.at // r.step not in tops:
        tops = sorted(set(tops) | {r.at // r.step})
        while len(tops) > n:      # merge the bucket nearest the traffic point's neighbours
            j = min(range(len(tops) - 1), key=lambda i: tops[i + 1] - tops[i]
                    if r.at // r.step not in (tops[i],) else 1 << 60)
            tops.pop(j)
    out, start = [], lo
    for t in tops:
        if t >= start:
            out.append((start * r.step, t * r.step))
            start = t + 1
    return out


def _probe_sizes(model, frontend, fixed, ranges):
    """``(probe, check, probe frontend, table)``: the model imported at probe sizes that re-size
    to every size of the range (checked at the check primes, and at the third ones where affine
    values were needed), trying :func:`probe_assignments` in turn.

    Raises:
        InputError: sizes that no assignment re-sizes (one line, the first difference).
    """
    kinds = []
    # probes inside the range, else (a dim too narrow for two odd primes) the narrow dims above
    # and the others inside (a sequence beside it may slice a 512-row table), then all above
    for kind in ("inside", "narrow"):
        try:
            got = probe_assignments(ranges, 1, above=kind == "narrow" and "narrow")
        except InputError:
            continue
        # a probe of 5 also the other way round: 5 divides every decimal constant's denominator
        # (1e-6 = 1 / (2^6 5^6), a slope of 0.2 = 1 / 5), which the probe import re-sizes as a
        # count of the dim (b = 1..5 probed at 5 refused any model with an epsilon of 1e-k); the
        # check prime reads it as the constant it is. 5 first still reads a static 3 as static
        kinds += [(a, kind) for a in got] + [((c, p, t), kind) for p, c, t in got
                                             if 5 in p.values()]
        break
    kinds += [(a, "above") for a in probe_assignments(ranges, above=True)]
    first = inside = grown = None
    err = ""
    for (probe, check, third), kind in kinds:
        above = kind == "above"
        # the primes whose multiples the imports hold unfolded (lumc.ir.symbolic.probing); the
        # third is imported only above the range
        primes = tuple(probe.values()) + tuple(check.values()) + (
            tuple(p for p in third.values() if p is not None) if above else ())
        try:
            with probing(primes):
                at = probe
                fe_p = frontend(model, _dims_shapes(fixed, ranges, probe))
                at = check
                fe_c = frontend(model, _dims_shapes(fixed, ranges, check))
        except (InputError, ShapeError) as e:
            if kind == "inside":    # a size of the range: the model does not take it
                raise (not_taken(ranges, at, e) if e.node is not None else e) from None
            err = e.reason if hasattr(e, "reason") else str(e)
            if above:
                break      # the frontend imports no size outside the range (a position table)
            continue
        diff = _resizes_to(fe_p, {probe[k]: check[k] for k in ranges}, {}, fe_c)
        table: dict = {}
        if diff is not None:
            grows = grows_with_size(fe_p, probe, fe_c, check, ranges)
            grown = grown or grows
            if grows and above:
                break      # a graph that grows with the size: no table of sizes re-sizes it
            if kind == "inside":
                # affine values are learned at probes above the range only (probe_assignments)
                first, inside = first or diff, inside or [(probe, fe_p), (check, fe_c)]
                continue
            if kind == "narrow":
                continue   # affine sizes: learned at probes all above the range, next
            first = first or diff
            table, diff = _affine_table(model, frontend, fixed, ranges, probe, check, third,
                                        primes, fe_p, fe_c)
            if not table:
                break      # nothing affine to learn: moving the probes cannot help
        if diff is None and kind != "inside":
            diff = _inside(model, frontend, fixed, ranges, probe, primes, fe_p, table, inside)
            first = first or (diff if above else None)
        if diff is None:
            diff = _consecutive(model, frontend, fixed, ranges, probe, primes, fe_p, table)
            if diff is None:
                return probe, check, fe_p, table
            first = first or (diff if kind != "narrow" else None)
            if kind == "inside":       # the next assignments are checked at these imports too
                inside = inside or [(probe, fe_p), (check, fe_c)]
    spec = ", ".join(f"{k}={r.describe()}" for k, r in ranges.items())
    if first is None:       # too narrow inside, and no import above it
        _edges_taken(model, frontend, fixed, ranges)     # a size inside it the model refuses?
        raise NarrowRangeError(f"size range {spec}: " + (
            f"the model is not one graph at every size ({grown})" if grown else
            f"too narrow to probe inside (two odd primes per dim) and the model imports at no "
            f"size above it ({err})") + "; give explicit sizes (a list) instead")
    if grown:
        raise InputError(f"size range {spec}: the model is not one graph at every size ({grown}), "
                         "which one plan per range needs; give explicit sizes (a list) instead")
    why = first if len(first) <= 200 else first[:197] + "..."
    raise InputError(f"size range {spec}: the model's sizes are not products of "
                     f"{' and '.join(ranges)} or of such sizes padded ({why}), which one plan per "
                     "range needs; give explicit sizes (a list) instead")


class NarrowRangeError(InputError):
    """A range too narrow to probe inside (fewer than two odd primes per dim) whose probes above
    it do not import, though the model takes its edge sizes: ``compile_model`` compiles its few
    sizes as a list instead (:func:`range_sizes`)."""


def range_sizes(ranges: dict, most: int) -> dict[str, list[int]] | None:
    """``{dim: [its sizes]}`` of ``ranges``, or None when their combinations are more than
    ``most`` plans."""
    sizes = {k: list(range(r.lo, r.hi + 1, r.step)) for k, r in ranges.items()}
    return sizes if math.prod(len(v) for v in sizes.values()) <= most else None


def not_taken(ranges: dict, units: dict, e: Exception) -> InputError:
    """The one-line refusal of a range holding a size the model does not import at (a Split in
    two halves at an odd size, a position table shorter than the range): it names that size, in
    the user's units, and the model's own reason. Only for an error a model node raised
    (``e.node``): a bad ``shapes=`` name is the user's, said as it is."""
    spec = ", ".join(f"{k}={r.describe()}" for k, r in ranges.items())
    where = ", ".join(f"{k}={ranges[k].step * units[k]}" for k in ranges)
    why = str(e)
    why = why if len(why) <= 300 else why[:297] + "..."
    return InputError(f"size range {spec}: the model does not take {where}, a size of the range "
                      f"({why}); declare only sizes it takes (a narrower range, or one in steps: "
                      "A..B:STEP) or give explicit sizes (a list)")


def _edge_units(ranges: dict) -> list[dict]:
    """The range's two smallest and two largest sizes (in units of each dim's step), each
    once."""
    lo = {k: -(-r.lo // r.step) for k, r in ranges.items()}
    top = {k: r.hi // r.step for k, r in ranges.items()}
    pts = [lo, {k: min(lo[k] + 1, top[k]) for k in ranges},
           {k: max(top[k] - 1, lo[k]) for k in ranges}, top]
    return [p for i, p in enumerate(pts) if p not in pts[:i]]


def _edges_taken(model, frontend, fixed, ranges) -> None:
    """Import the model at the range's edge sizes; raise :func:`not_taken` for the first that a
    model node refuses (a range too narrow to probe inside whose probes above it do not import:
    the reason may be a size of the range itself, an odd L that a reshape halves)."""
    for at in _edge_units(ranges):
        try:
            frontend(model, _dims_shapes(fixed, ranges, at))
        except (InputError, ShapeError) as e:
            if e.node is not None:
                raise not_taken(ranges, at, e) from None


def _dims_shapes(fixed: dict, ranges: dict, units: dict) -> dict:
    return {**fixed, **{k: r.step * units[k] for k, r in ranges.items()}}


def compile_ranges(model, *, budget, shapes: dict, policy, candidates, compile_bucket, frontend,
                   clock=time.monotonic, deadline: Deadline | None = None):
    """Compile ``model`` for the size ranges in ``shapes`` (see the module docstring).

    Args:
        model: a path, bytes or ``onnx.ModelProto``.
        budget: the whole compile's budget.
        shapes: ``{dim: DimRange | int | 1-tuple, input: shape}``.
        policy: the :class:`~lumc.compiler.core.precision.PrecisionPolicy`.
        candidates: ``(stored graph, deadline) -> (programs, e-graph stats)``, the e-graph stage.
        compile_bucket: ``(fe, (stored graph, weight stats), programs, e-graph stats, deadline)
            -> CompiledModel`` for one bucket at its representative size (``fe`` has the re-sized
            graph).
        frontend: ``(model, shapes) -> Frontend`` (imports; under :func:`probing`).
        deadline: a budget already being spent (``torch.compile``'s first call, whose fallback
            compile shares it); ``budget`` is then what it has left, and its grace the limit.
    Returns:
        A :class:`~lumc.compiler.runtime.variants.VariantModel` with one plan per bucket.
    Raises:
        InputError: a model whose sizes cannot be probed (one line), a bucket whose numerics check
            fails at its ends; BudgetError: too little budget for the buckets.
    """
    budget_s = parse_duration(budget)
    if deadline is not None:
        budget_s = min(budget_s, deadline.remaining())
    with hard_deadline(deadline or Deadline(budget_s, clock), "the range compile"):   # it holds
        return _compile_ranges(model, budget_s, shapes, policy, candidates, compile_bucket,
                               frontend, clock)


# a bucket's search gets this share of its budget; the rest is for its numerics checks at both
# ends (two reference runs and two plan runs, at the bucket's smallest and largest size)
BUCKET_SEARCH_SHARE = 0.8


def _inside(model, frontend, fixed, ranges, probe, primes, fe_p, table, inside):
    """None when the graph probed above the range re-sizes to the model imported inside it (at
    the first assignment's probe and check imports, ``inside``, or at sizes near the range's top
    for a range too narrow to hold two primes), else the first difference: a frontend may lower
    a size outside the declared range differently (``torch.export``'s range guards). A size
    inside that does not import is refused (:func:`not_taken`)."""
    if inside is None:
        top = {k: r.hi // r.step for k, r in ranges.items()}
        mid = {k: (r.lo + r.hi) // (2 * r.step) for k, r in ranges.items()}
        # (top, mid) and (mid, top): two sizes inside, each dim at two values
        pts = [{k: (top if i % 2 == j else mid)[k] for i, k in enumerate(ranges)} for j in (0, 1)]
        inside = []
        for pt in pts:
            try:
                with probing(primes):
                    inside.append((pt, frontend(model, _dims_shapes(fixed, ranges, pt))))
            except (InputError, ShapeError) as e:
                if e.node is not None:
                    raise not_taken(ranges, pt, e) from None
                return str(e)
    for at, fe in inside:
        # node for node, else by value: an import away from the probes folds what the probed one
        # holds (a position table gathered at indices computed from the size: T5's buckets)
        if _resizes_to(fe_p, {probe[k]: at[k] for k in ranges}, table, fe) is not None:
            diff = _values_differ(fe_p, probe, at, table, fe, ranges)
            if diff is not None:
                return diff
    return None


def _consecutive(model, frontend, fixed, ranges, probe, primes, fe_p, table) -> str | None:
    """None when the probed graph re-sized to the range's two smallest and two largest sizes
    computes what the model imported there computes (the same outputs on the same inputs), else
    the first difference. A size the model floor-divides (a strided conv's or pool's output,
    ``floor((H - k) / s) + 1``) agrees with products of the probe at the probes' residue mod ``s``
    only, and two primes can share it (H = 3..20 probed at 17 and 19: 6 windows at both for
    ``s = 3, k = 2``, and the plan then read 6 windows at every size): such a count is monotone in
    the size, so it is right over the whole range only if it is at both ends, and a size that
    cycles with the residue (SAME padding) differs at one of two consecutive sizes. Compared by
    value, not node for node: an import away from the probes folds what the probed one holds (a
    position table)."""
    for at in _edge_units(ranges):
        where = ", ".join(f"{k}={ranges[k].step * at[k]}" for k in ranges)
        try:
            with probing(primes):
                fe = frontend(model, _dims_shapes(fixed, ranges, at))
        except TooLargeError:
            raise
        except (InputError, ShapeError) as e:
            if e.node is not None:
                raise not_taken(ranges, at, e) from None
            return f"at {where}: {e}"
        diff = _values_differ(fe_p, probe, at, table, fe, ranges)
        if diff is not None:
            return diff
    return None


def _affine_table(model, frontend, fixed, ranges, probe, check, third, primes, fe_p, fe_c):
    """``(table, diff)``: the affine values (``lumc.ir.symbolic.learn_table``) learned from the
    checked import and one at the third primes (above the range: there are always three), and
    None when the probed graph re-sized with them is both, node for node, else the first
    difference (an empty table: nothing affine to learn)."""
    from lumc.ir.symbolic import learn_table
    with probing(primes):
        fe_t = frontend(model, _dims_shapes(fixed, ranges, third))
    subs = [{probe[k]: check[k] for k in ranges}, {probe[k]: third[k] for k in ranges}]
    table = learn_table(fe_p.graph, [fe_c.graph, fe_t.graph], subs)
    for sub, fe in zip(subs, (fe_c, fe_t)):
        diff = _resizes_to(fe_p, sub, table, fe)
        if diff is not None:
            return table, diff
    return table, None


def _compile_ranges(model, budget_s, shapes, policy, candidates, compile_bucket, frontend, clock):
    t0 = clock()
    ranges = ranges_in(shapes)
    fixed = {k: v for k, v in shapes.items() if k not in ranges}
    probe, check, fe_p, table = _probe_sizes(model, frontend, fixed, ranges)
    # the input axes that are the dim itself (a derived axis, 2 * L, is checked by the plan's
    # own input shapes at call time instead)
    axes = {k: [[name, ax] for name, n in fe_p.graph.inputs.items()
                for ax, d in enumerate(n.shape) if d == ranges[k].step * probe[k]]
            for k in ranges}
    for k, uses in axes.items():
        if not uses:
            raise InputError(f"--shape {k}={ranges[k].describe()}: no model input has an axis of "
                             f"that size (it is a dim derived from the inputs?); give explicit "
                             "sizes instead")
    from lumc.compiler.core.precision import store_weights
    from lumc.compiler.core.precision_gate import refuse_idle_weights
    if policy.max_kl is not None and not policy.logits:   # nothing to judge: refused before the e-graph
        from lumc.compiler.core.pipeline import example_inputs_for
        from lumc.compiler.core.precision_gate import model_reference
        model_reference(fe_p.graph, example_inputs_for(fe_p.graph, fe_p), policy)
    policy.check_logits(fe_p.graph.outputs)
    stored, wstats = store_weights(fe_p.graph, policy)
    refuse_idle_weights(policy, wstats, fe_p.model_name)
    with probing(tuple(probe.values()) + tuple(check.values())):
        programs, egraph_stats = candidates(stored, Deadline(
            max(1.0, 0.35 * (budget_s - (clock() - t0))), clock))
    for i, p in enumerate(programs):
        p.origin = i
    # buckets: one ranged dim cut in DEFAULT_BUCKETS, two in 2 each (their product)
    per_dim = DEFAULT_BUCKETS if len(ranges) == 1 else 2
    cuts = {k: bucket_edges(r, per_dim) for k, r in ranges.items()}
    import itertools
    boxes = [dict(zip(cuts, c)) for c in itertools.product(*cuts.values())]
    # a bucket's reference runs, numerics checks and timings grow with its size: its share of
    # the budget grows with the square root of its representative size's work (elements), so
    # the largest bucket is not left with nothing timed; a bucket holding ``@at`` counts twice
    small = math.prod(hi for lo, hi in boxes[0].values())
    weights = [(1.0 + sum(1.0 for k, (lo, hi) in b.items()
                          if ranges[k].at is not None and lo <= ranges[k].at <= hi))
               * math.sqrt(math.prod(hi for lo, hi in b.values()) / small) for b in boxes]
    done = []
    from lumc.compiler.core.measure import sharing_checks
    # largest sizes first: their reference values and checks cost the most, and the smaller
    # buckets then re-check only the kernels that take another code path there (split-K)
    boxes, weights = boxes[::-1], weights[::-1]
    left = budget_s - (clock() - t0)
    if left < MIN_BUCKET_S * len(boxes):    # refused before any bucket's work, not after it
        raise too_small(budget_s, left, len(boxes))
    with sharing_checks():    # one interpreter verdict per kernel structure for all buckets
        for bi, box in enumerate(boxes):
            done.append(_compile_bucket(bi, box, boxes, weights, budget_s, t0, clock, ranges, probe,
                                        programs, fe_p, stored, wstats, egraph_stats, fixed, axes,
                                        compile_bucket, table))
    return _variant_model(done[::-1], fe_p, budget_s, t0, clock, ranges, probe, check,
                          egraph_stats, fixed)


def too_small(budget_s: float, left: float, n: int) -> BudgetError:
    """The one-line refusal of a budget leaving ``left`` seconds for ``n`` size buckets."""
    return BudgetError(f"budget {budget_s:g} s leaves {max(left, 0):.1f} s for {n} size "
                       f"bucket{'s' * (n != 1)} ({MIN_BUCKET_S:g} s each at least); give a larger "
                       f"budget ({BUDGET_KNOBS})")


def bucket_share(left: float, weights: list[float]) -> tuple[float, bool]:
    """``(seconds, short)`` for the first of the buckets left (``weights``, its own first) when
    ``left`` seconds remain: each gets :data:`MIN_BUCKET_S` and what is over that is shared by
    weight. The budget held every bucket's minimum when they began (``_compile_ranges``), so a
    bucket left less (``short``) was short-changed by the ones before it overrunning their shares
    (their end checks): it takes its weight's part of what is left, at nothing its best-bound
    plan untimed, still checked at both ends (the range compile's hard deadline, budget + grace,
    bounds it), and its report says so."""
    spare = left - MIN_BUCKET_S * len(weights)
    if spare < 0:
        return max(0.0, left) * weights[0] / sum(weights), True
    return MIN_BUCKET_S + spare * weights[0] / sum(weights), False


def _compile_bucket(bi, box, boxes, weights, budget_s, t0, clock, ranges, probe, programs, fe_p,
                    stored, wstats, egraph_stats, fixed, axes, compile_bucket, table):
    """One size bucket: its search at the representative size, its plan checked at both ends."""
    from lumc.compiler.core.pipeline import example_inputs_for
    from lumc.compiler.runtime.program import resize_program, run_program_reference
    from lumc.compiler.core.measure import max_rel_error
    from lumc.compiler.core.precision import integer_error
    from lumc.compiler.core.precision_gate import reference_outputs
    share, short = bucket_share(budget_s - (clock() - t0), weights[bi:])
    rep = {k: hi for k, (lo, hi) in box.items()}
    r = Resizer({probe[k]: rep[k] // ranges[k].step for k in ranges}, table)
    progs = []
    for p in programs:
        try:
            progs.append(resize_program(p, r))
        except NotSymbolic:
            continue
    fe_rep = dataclasses.replace(fe_p, graph=r.graph(fe_p.graph), warnings=list(fe_p.warnings))
    cm = compile_bucket(fe_rep, (r.graph(stored), wstats), progs, egraph_stats,
                        Deadline(share * BUCKET_SEARCH_SHARE, clock))
    origin = cm.program.origin
    if origin is None:
        raise InputError(f"bucket {box}: the chosen plan is not one of the range's candidates")
    # the bucket's plan at the probe sizes (what the artifact stores and every call re-sizes)
    from lumc.compiler.core.activation_storage import ACTIVATION_DTYPE, store_activations
    report = cm.report_dict()
    chosen_p = store_activations(programs[origin], ACTIVATION_DTYPE[report["precision"]])
    report["bucket"] = {k: list(v) for k, v in box.items()}
    report["representative"] = rep
    checks = {}
    tol = max(report.get("tolerance") or 1e-4, 1e-4)
    # a 16-bit float output is held to 8 ulp of its type too, as against eager (eager_check)
    tols = {k: max(tol, 8 * float(ml_dtypes.finfo(v.dtype.np).eps))
            for k, v in fe_p.graph.outputs.items() if v.dtype.is_float}
    q = report.get("quality")
    known = q.get("max_rel") if q else report.get("max_rel_error")
    for end in ("lo", "hi"):
        at = {k: (lo if end == "lo" else hi) for k, (lo, hi) in box.items()}
        if at == rep and known is not None:
            # the bucket's compile already ran this plan end to end at this size against
            # the reference (the fp32 model's, for a reduced-precision gate)
            err, end_tol = float(known), max(tols.values(), default=tol)
            checks[end] = {"sizes": at, "max_rel_error": err, "from": "the bucket's compile"}
        else:
            re = Resizer({probe[k]: at[k] // ranges[k].step for k in ranges}, table)
            g_end = re.graph(fe_p.graph)
            ins = example_inputs_for(g_end, fe_p)
            ref = reference_outputs(g_end, ins)
            got = run_program_reference(resize_program(chosen_p, re), re.graph(stored), ins,
                                        configs=cm.configs)
            errs = {k: max_rel_error(got[k], ref[k]) for k in ref if k in tols}
            worst = max(errs, key=lambda k: errs[k] / tols[k], default=None)
            err, end_tol = (errs[worst], tols[worst]) if worst is not None else (0.0, tol)
            checks[end] = {"sizes": at, "max_rel_error": err}
            # integer and bool outputs (an argmax, a comparison) must be equal, as everywhere
            # (an ArgMax's near-ties excepted, as the quality gate judges them)
            wrong = next((k for k in ref if not g_end.outputs[k].dtype.is_float and
                          integer_error(got[k], ref[k], ref.ties.get(k), tol)), None)
            if wrong is not None:
                spans = ", ".join(f"{k}={lo}..{hi}" for k, (lo, hi) in box.items())
                differ = int(np.count_nonzero(np.asarray(got[wrong]) != ref[wrong])) \
                    if np.shape(got[wrong]) == np.shape(ref[wrong]) else ref[wrong].size
                raise InputError(f"bucket {spans}: the plan at {at} gives output {wrong!r} with "
                                 f"{differ} of {ref[wrong].size} integer values other than the "
                                 "reference's")
        if not err <= end_tol:
            spans = ", ".join(f"{k}={lo}..{hi}" for k, (lo, hi) in box.items())
            raise InputError(f"bucket {spans}: the plan at {at} has max rel error {err:.3g} > "
                             f"{end_tol:g} against the reference")
    report["end_checks"] = checks
    if short:
        spans = ", ".join(f"{k}={lo}..{hi}" for k, (lo, hi) in box.items())
        how = ("the best-bound candidate, untimed" if cm.report_dict().get("best_time_s") is None
               else "from a short search")
        report.setdefault("warnings", []).append(
            f"size bucket {spans} had {share:.1f} s of the budget left (the larger buckets before "
            f"it overran their shares), less than {MIN_BUCKET_S:g} s: its plan is {how}; a larger "
            "budget times more")
    template = type(cm)(stored, chosen_p, cm.configs, cm.device, cm.simulated, report,
                        fe_p.source_onnx, cm.torch_device)
    key = VariantKey({k: v for k, v in fixed.items() if isinstance(v, int)},
                     {}, {}, ranges={k: [lo, hi, ranges[k].step] for k, (lo, hi) in box.items()},
                     probes={k: probe[k] for k in ranges}, axes=axes, table=table)
    return key, template


def _variant_model(done, fe_p, budget_s, t0, clock, ranges, probe, check, egraph_stats, fixed):
    """The range compile's model: every bucket's plan, and the report over all of them (each
    bucket's precision, measured quality, weight storage and warnings in its ``variants`` entry)."""
    from lumc.compiler.runtime.report_text import PLAN_PRECISION_FIELDS
    name = fe_p.model_name
    total = clock() - t0
    first = done[0][1].report_dict()
    report = {
        "model": name, "device": first.get("device"), "simulated": first.get("simulated"),
        "budget_s": budget_s, "compile_s": total, "kernels": first.get("kernels"),
        "best_time_s": first.get("best_time_s"), "bound_time_s": first.get("bound_time_s"),
        "per_kernel": first.get("per_kernel", []), "ranges": {k: r.describe() for k, r in ranges.items()},
        "egraph": egraph_stats, "probes": probe, "checked_at": check,
        # sizes that are not products of the dims (a padded H + 2), re-sized by their factors
        "affine_values": len(done[0][0].table),
        # the compile's workers, counted over every plan (the last plan's report has them all)
        "workers": done[-1][1].report_dict().get("workers"),
        "warnings": list(dict.fromkeys(        # each plan's notes, once (buckets repeat them)
            w for _, cm in done for w in cm.report_dict().get("warnings", []))),
        "variants": [{"key": k.as_json(), "describe": k.describe(),
                      **{f: cm.report_dict().get(f) for f in (
                          "best_time_s", "kernels", "bound_time_s", "bytes_moved", "compile_s",
                          "stopped_because", "max_rel_error", "representative", "end_checks",
                          "shared_checks") + PLAN_PRECISION_FIELDS}}
                     for k, cm in done],
    }
    return VariantModel(done, {}, [], report, fe_p.source_onnx)


def compile_range(model, ranges: dict, frontend, budget_s: float, device: str | None = None,
                  policy=None, deadline: Deadline | None = None):
    """``compile_ranges`` with the kernel search on ``device`` (the e-graph on, the tuning
    database): the one range compile of a torch graph or module.

    Args:
        model: ``frontend``'s first argument (the Dynamo graph module; None from
            ``torch_compile.compile_module_range``, whose frontend holds the capture).
        ranges: ``{dim name: DimRange or int}``, compile_ranges' ``shapes``.
        frontend: ``(model, {dim: size}) -> Frontend`` lowering the model at those sizes.
        deadline: as :func:`compile_ranges`'.
    Returns:
        the :class:`~lumc.compiler.runtime.variants.VariantModel`.
    """
    from lumc.compiler.core.pipeline import Given, compile_frontend, stage_candidates
    from lumc.compiler.core.precision import PrecisionPolicy
    from lumc.compiler.runtime.targets import resolve_target, versions, with_measured_ceilings
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    policy = policy or PrecisionPolicy()
    target = resolve_target(device)
    ver = versions(gpu=not target.simulated)
    db = TuningDatabase()
    target = with_measured_ceilings(target, db)
    tgt = dataclasses.replace(target, spec=dataclasses.replace(
        target.spec, dot_precisions=policy.dot_precisions()))
    return compile_ranges(
        model, budget=budget_s, shapes=dict(ranges), policy=policy, frontend=frontend,
        deadline=deadline,
        candidates=lambda g, dl: stage_candidates(g, tgt, dl, True, False),
        compile_bucket=lambda fe, stored, progs, stats, dl: compile_frontend(
            fe, dl, target, ver, db, example_inputs=None, use_egraph=True, quiet=True,
            policy=policy, given=Given(stored, progs, stats)))
