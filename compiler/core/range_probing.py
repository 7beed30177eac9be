"""Probing a size range (step 1 of ``lumc.compiler.core.buckets``): the model imported at prime
sizes that re-size to every size of the range, checked at other primes, at sizes inside the range
and at its edges (``lumc.ir.symbolic``), or a one-line refusal naming why no probe serves."""
from __future__ import annotations

from lumc.backends.reference import TooLargeError
from lumc.compiler.core.probes import probe_assignments
from lumc.compiler.core.resize_checks import (grows_with_size, resizes_to as _resizes_to,
                                               values_differ as _values_differ)
from lumc.ir.errors import InputError, ShapeError
from lumc.ir.symbolic import probing


def probe_sizes(model, frontend, fixed, ranges):
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
    affine_inside = []     # inside assignments whose sizes need affine values (see below)
    for (probe, check, third), kind in kinds:
        above = kind == "above"
        # the primes whose multiples the imports hold unfolded (lumc.ir.symbolic.probing); the
        # third is imported only above the range
        primes = tuple(probe.values()) + tuple(check.values()) + (
            tuple(p for p in third.values() if p is not None) if above else ())
        try:
            with probing(primes):
                at = probe
                fe_p = frontend(model, dims_shapes(fixed, ranges, probe))
                at = check
                fe_c = frontend(model, dims_shapes(fixed, ranges, check))
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
                # affine values are learned at probes above the range (probe_assignments), and
                # inside it only where no size above it imports (_affine_inside)
                first, inside = first or diff, inside or [(probe, fe_p), (check, fe_c)]
                if None not in third.values():
                    affine_inside.append((probe, check, third))
                continue
            if kind == "narrow":
                if None not in third.values():
                    affine_inside.append((probe, check, third))
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
    if affine_inside and not grown:
        got = _affine_inside(model, frontend, fixed, ranges, affine_inside)
        if got is not None:
            return got
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
    # a strided conv or pool floor-divides its size: a range in steps of the stride re-sizes
    steps = ("; or, where a stride divides the size (a strided convolution or pooling), a range "
             "in steps of it (A..B:STEP; torch.export: a derived dim, STEP * Dim(...))"
             if all(r.step == 1 for r in ranges.values()) else "")
    raise InputError(f"size range {spec}: the model's sizes are not products of "
                     f"{' and '.join(ranges)} or of such sizes padded ({why}), which one plan per "
                     f"range needs; give explicit sizes (a list) instead{steps}")


class NarrowRangeError(InputError):
    """A range too narrow to probe inside (fewer than two odd primes per dim) whose probes above
    it do not import, though the model takes its edge sizes: ``compile_model`` compiles its few
    sizes as a list instead (:func:`range_sizes`)."""


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
            frontend(model, dims_shapes(fixed, ranges, at))
        except (InputError, ShapeError) as e:
            if e.node is not None:
                raise not_taken(ranges, at, e) from None


def dims_shapes(fixed: dict, ranges: dict, units: dict) -> dict:
    return {**fixed, **{k: r.step * units[k] for k, r in ranges.items()}}


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
                    inside.append((pt, frontend(model, dims_shapes(fixed, ranges, pt))))
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
                fe = frontend(model, dims_shapes(fixed, ranges, at))
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


def _affine_inside(model, frontend, fixed, ranges, assignments):
    """``(probe, check, fe_p, table)`` of the first inside (or narrow) assignment whose affine
    values (learned at its three primes, inside the range but for a narrow dim's) re-size the probed graph to the other two
    imports node for node and, by value, to the range's edge sizes; else None. Only where the
    probes above the range found nothing (a model that imports at no size above it: BERT's
    position and token-type buffers sliced to the sequence, read with ``h[:, -1]``, whose offset
    is ``(L - 1) D``). A static value equal to an affine one at a probe is told apart by the
    other two imports (learn_table), and the edges are checked by value."""
    for probe, check, third in assignments:
        primes = tuple(probe.values()) + tuple(check.values()) + tuple(third.values())
        try:
            with probing(primes):
                fe_p = frontend(model, dims_shapes(fixed, ranges, probe))
                fe_c = frontend(model, dims_shapes(fixed, ranges, check))
            table, diff = _affine_table(model, frontend, fixed, ranges, probe, check, third,
                                        primes, fe_p, fe_c)
        except (InputError, ShapeError):
            continue
        if not table or diff is not None:
            continue
        if _consecutive(model, frontend, fixed, ranges, probe, primes, fe_p, table) is None:
            return probe, check, fe_p, table
    return None


def _affine_table(model, frontend, fixed, ranges, probe, check, third, primes, fe_p, fe_c):
    """``(table, diff)``: the affine values (``lumc.ir.symbolic.learn_table``) learned from the
    checked import and one at the third primes (above the range: there are always three), and
    None when the probed graph re-sized with them is both, node for node, else the first
    difference (an empty table: nothing affine to learn)."""
    from lumc.ir.symbolic import learn_table
    with probing(primes):
        fe_t = frontend(model, dims_shapes(fixed, ranges, third))
    subs = [{probe[k]: check[k] for k in ranges}, {probe[k]: third[k] for k in ranges}]
    table = learn_table(fe_p.graph, [fe_c.graph, fe_t.graph], subs)
    for sub, fe in zip(subs, (fe_c, fe_t)):
        diff = _resizes_to(fe_p, sub, table, fe)
        if diff is not None:
            return table, diff
    return table, None
