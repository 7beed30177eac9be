"""A compile report's search counts, precision, measured quality and notes as text lines: one
wording for the
CLI's compile summary (``lumc compile``, ``lumc bench``) and for ``CompiledModel.report()`` (and so
a PyTorch module's ``f.report()`` and each size bucket's in a range's report).

Every function takes the report dict (``CompiledModel.report_dict()``): ``precision``, ``weights``,
``quality`` (None for an exact fp32 compile, else ``lumc.compiler.core.precision.measure_quality``'s
figures) and ``warnings``.
"""
from __future__ import annotations


# each plan's precision fields, carried per plan into a report of several (a range's size
# buckets, a size list's plans: ``variants``): a plan may have fallen back on its own
PLAN_PRECISION_FIELDS = ("precision", "weights", "tolerance", "quality", "weight_storage",
                         "warnings")


def workspace_text(r: dict, digits: int = 2) -> str:
    """``"; intermediates (partial tiles, vendor-call temporaries) 1.23 MB more"``: what the plan
    moves besides the bytes moved the report counts (its ``workspace_bytes``, MB at ``digits``
    decimals), or ``""`` where it moves nothing more."""
    ws = r.get("workspace_bytes")
    return (f"; intermediates (partial tiles, vendor-call temporaries) {ws / 1e6:.{digits}f} MB more"
            if ws else "")


def lower_bound_text(x: float, digits: int = 6) -> str:
    """``x`` at ``digits`` decimals rounded down, for a figure printed as a lower bound: a cosine
    of 0.9999995 (a tf32 plan 1.4e-3 off) read 'cosine >= 1.000000', which it is not."""
    s = f"{x:.{digits}f}"
    return f"{float(s) - 10.0 ** -digits:.{digits}f}" if float(s) > x else s


def quality_line(r: dict) -> str | None:
    """``precision bf16 (weights same) vs fp32: max rel error 3.1e-03 (tolerance 0.02), cosine >=
    0.999990[, mean KL 1e-05, top-1 100.0%][, integer outputs equal | integer outputs: 1 of 64 values
    differ, all at near-ties (...)][; GATE FAILED: reason]``, or None when no quality was
    measured (an exact compile)."""
    q = r.get("quality")
    if q is None:
        return None
    # a model whose outputs are all integers has no float error to state (its 0 and 1 are defaults)
    parts = [f"max rel error {q['max_rel']:.2e} (tolerance {q['tolerance']:g})",
             f"cosine >= {lower_bound_text(q['min_cosine'])}"] if q.get("outputs", True) else []
    if q.get("kl_mean") is not None:
        top1 = min(v["top1"] for v in q["outputs"].values() if "top1" in v)
        parts.append(f"mean KL {q['kl_mean']:.3g}, top-1 {100 * top1:.1f}%")
    exact = q.get("exact_outputs") or {}
    if exact:
        differ = sum(v["differ"] for v in exact.values())
        count = sum(v["count"] for v in exact.values())
        ties = sum(v.get("near_ties", 0) for v in exact.values())
        parts.append("integer outputs equal" if not differ else
                     f"integer outputs: {differ} of {count} values differ"
                     + (f", {'all' if ties == differ else ties} at near-ties (fp32 scores within "
                        "the tolerance)" if ties else ""))
    return (f"precision {r['precision']} (weights {r['weights']}) vs fp32: " + ", ".join(parts)
            + ("" if q["passed"] else f"; GATE FAILED: {q['reason']}"))


def user_notes(r: dict) -> list[str]:
    """The report's warnings a user must see in the summary and in ``lumc inspect``: what the
    reduced-precision policy did (``precision ...``: a fallback to a higher precision, a mix of
    kernel precisions), a weight storage that was refused for its quality and replaced by the
    model's own weights (``weights ...``), a graph output listed more than once, which lumc
    returns once (``graph output ...``), an output whose declared shape is not the one it
    computes, which lumc returns as computed (``output 'y' is declared ...``), a plan the plan
    cache could not store (``plan cache: ...``), and a size bucket left less than its minimum
    search time (``size bucket ...``)."""
    return [w for w in r.get("warnings", [])
            if w.startswith(("precision ", "weights ", "graph output ", "plan cache: ",
                             "size bucket "))
            or (w.startswith("output ") and " is declared " in w)]


def precision_lines(r: dict, exact: bool = False) -> list[str]:
    """:func:`quality_line` (with ``exact``, where none was measured: the precision the plan runs
    at, ``precision fp32 (weights same): no reduced precision, no quality gate``; for a model
    whose inputs or outputs are f16/bf16, ``no reduced precision below the model's own bf16``),
    then each of :func:`user_notes` as ``note: ...``."""
    line = quality_line(r)
    if line is None and exact and r.get("precision") is not None:
        # a model whose own values are 16-bit computes in them at any policy: the line said
        # "no reduced precision" of a bf16 module's bf16 plan
        own = sorted({v[1] for part in ("inputs", "outputs") for v in (r.get(part) or {}).values()
                      if isinstance(v, (list, tuple)) and len(v) == 2 and v[1] in ("f16", "bf16")})
        line = (f"precision {r['precision']} (weights {r.get('weights', 'same')}): no reduced "
                "precision" + (f" below the model's own {' and '.join(own)}" if own else "")
                + ", no quality gate")
    return ([line] if line else []) + [f"note: {w}" for w in user_notes(r)]


def search_text(r: dict) -> str:
    """What the search counted, each number saying what it counts (``lumc compile``'s summary,
    ``lumc inspect``): ``16 programs (14 pruned by bound); their 38 kernels' 40770 (kernel,
    config) pairs: 4 pruned by bound, 235 tried (235 from the tuning database, none compiled), 0
    rejected, 235 timed``. A report from before these counts gives its older mixed ones."""
    if r.get("kernel_configs") is None:
        return (f"{r.get('candidates_total')} candidates (programs and kernel configs), "
                f"{r.get('candidates_pruned')} pruned by bound, {r.get('candidates_compiled')} "
                f"compiled, {r.get('candidates_rejected')} rejected, {r.get('candidates_timed')} timed")
    tried, db = r.get("candidates_compiled") or 0, r.get("configs_from_db") or 0
    nprog, nk = r.get("programs"), r.get("distinct_kernels")
    whose = "kernel's" if nk == 1 else "kernels'"
    how = (f"{tried} compiled" if not db else
           f"{tried} tried ({db} from the tuning database, "
           f"{tried - db if tried > db else 'none'} compiled)")
    return (f"{nprog} program{'s' * (nprog != 1)} ({r.get('programs_pruned')} pruned by bound); "
            f"their {nk} {whose} {r['kernel_configs']} (kernel, config) pairs: "
            f"{r.get('configs_pruned')} pruned by bound, {how}, {r.get('candidates_rejected')} "
            f"rejected, {r.get('candidates_timed')} timed")


def eager_text(ec: dict | None) -> str | None:
    """The report's line for a compile's check against PyTorch eager
    (``lumc.compiler.core.eager_check``): ``against PyTorch eager on the example inputs: max rel
    error 3e-07 (tolerance 0.0001), 0 NaN/inf mismatches, 0 integer/bool unequal: passed``; a range
    compile's names the sizes it ran at. None where no check was recorded."""
    if not ec:
        return None
    if "passed" not in ec:
        return f"against PyTorch eager: skipped ({ec.get('skipped')})"
    where = "on the example inputs"
    sizes = ec.get("sizes")
    if sizes:
        if all(list(s) == list(sizes[0]) for s in sizes) and len(sizes[0]) == 1:
            k = next(iter(sizes[0]))
            at = f"{k} = " + ", ".join(str(s[k]) for s in sizes)
        else:
            at = "; ".join(" ".join(f"{k}={v}" for k, v in s.items()) for s in sizes)
        where = f"at {at} (the example's sizes first, then each size bucket's ends)"
    line = (f"against PyTorch eager {where}: max rel error {ec['max_rel_error']:.3g} "
            f"(tolerance {ec['rtol']:g}), {ec['nonfinite_mismatch']} NaN/inf mismatches, "
            f"{ec.get('exact_mismatch', 0)} integer/bool unequal"
            + (f" ({ec['near_ties']} more at near-ties)" if ec.get("near_ties") else "")
            + f": {'passed' if ec['passed'] else 'FAILED'}")
    if ec.get("skipped_sizes"):
        line += "; not run at " + "; ".join(ec["skipped_sizes"])
    return line


def sampled_text(r: dict) -> str:
    """``"; K of N kernels checked on a sample of their programs ..."``, or "" (each chosen kernel
    whose interpreter check ran a sample of its grid: ``lumc.backends.triton.sampled``)."""
    rows = r.get("per_kernel") or []
    k = sum(1 for row in rows if row.get("checked_on"))
    if not k:
        return ""
    return (f"; {k} of {len(rows)} kernels checked on a sample of their programs (the CPU "
            f"interpreter's large grids: corners and a seeded draw, 'checked_on' in the report)")
