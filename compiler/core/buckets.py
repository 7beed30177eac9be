"""Size ranges: one compile whose artifact serves every size of a declared range, tuned per bucket.

``--shape sequence_length=1..256`` (``shapes={"sequence_length": (1, 256)}``) declares a range;
``64..640:32`` one in steps of 32; ``1..512@128`` one whose traffic is around 128 (that bucket gets
twice the search budget and a bucket edge at 128). The compile:

1. **Probes the sizes** (``lumc.compiler.core.range_probing``, ``lumc.ir.symbolic``): the model is
   imported with each ranged dim at a prime inside its range and, to check, at a second prime; the
   first graph re-sized to the second sizes must be the second graph, node for node. Sizes that are
   products of the dims need nothing more. A padded convolution's sizes are not (``H + 2``, its
   strides ``(H + 2) (W + 2)``, mask bounds ``H + 1``): they are *affine values*, learned as a table
   (``learn_table``) from imports at three sets of primes above the range (above 1000 units: there
   no padded size equals a static one) and checked node for node at all three and at two imports
   inside the range. A model whose sizes are neither (``L**2 + 1``, a table folded at the size) is
   refused in one line naming the difference, with the hint to give explicit sizes instead.
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

from lumc.compiler.core.budget import BUDGET_KNOBS, Deadline, hard_deadline, parse_duration
from lumc.compiler.runtime.variants import VariantKey, VariantModel
from lumc.ir.errors import BudgetError, InputError
from lumc.ir.symbolic import NotSymbolic, Resizer, probing
# the primes that probe a range (choose_probes is this module's API too)
from lumc.compiler.core.probes import choose_probes  # noqa: F401
from lumc.compiler.core.range_probing import NarrowRangeError, probe_sizes  # noqa: F401

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


def range_sizes(ranges: dict, most: int) -> dict[str, list[int]] | None:
    """``{dim: [its sizes]}`` of ``ranges``, or None when their combinations are more than
    ``most`` plans."""
    sizes = {k: list(range(r.lo, r.hi + 1, r.step)) for k, r in ranges.items()}
    return sizes if math.prod(len(v) for v in sizes.values()) <= most else None


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


def _compile_ranges(model, budget_s, shapes, policy, candidates, compile_bucket, frontend, clock):
    t0 = clock()
    ranges = ranges_in(shapes)
    fixed = {k: v for k, v in shapes.items() if k not in ranges}
    probe, check, fe_p, table = probe_sizes(model, frontend, fixed, ranges)
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
    from lumc.compiler.core.errors import max_rel_error
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
    if any(cm.report_dict().get("precision") == "auto" for _, cm in done):
        from lumc.compiler.core.options import option
        # pipeline.compile_frontend's fp32 comparison is not made over buckets
        report["warnings"].append(
            "precision auto over size ranges: no fp32 plan is compiled to compare with (the "
            "buckets share one weight storage): the reduced plans are kept whether or "
            f"not they are faster; compile with {option('precision', 'fp32')} to compare")
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
