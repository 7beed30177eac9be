"""The quality gate of a reduced-precision compile, and ``--precision auto``'s per-kernel choice.

After the search has chosen a program and a config per kernel (each contraction config names its
``tl.dot`` operand precision), :func:`stage_quality` runs the program on the CPU executor, with
every reduced-precision contraction emulated as the tensor cores compute it
(``lumc.backends.precision``), on the sample inputs, and compares the outputs with the fp32
reference of the *original* model (``lumc.compiler.core.precision.measure_quality``).

* A plan over the gate is not accepted as it is: each reduced-precision contraction is raised to
  the fastest measured config of a more precise precision the policy allows, and the plan is
  measured again. The pipeline then falls back to the next policy (``precision.FALLBACK``) if it
  still fails, and says so in one line.
* ``auto`` measures each contraction's sensitivity (that kernel alone at its chosen reduced
  precision, every other contraction exact: the figures of the gate), then lowers kernels from the
  least sensitive up, keeping each lowering only while the gate holds: layer sensitivity measured,
  not guessed. The report gives each kernel's precision and its share of the error.

Quantized weights are gated once more, before any of that: :func:`weights_gate` runs the model with
its weights as stored (``--weights int8``...) against the fp32 model. Weight storage is a property
of the graph, not of the kernels, so when the weights alone already miss the gate no plan over
them can pass; the pipeline then stores the model's weights and says so, before it spends the
e-graph and the search on a graph it would have to throw away.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.precision import (FALLBACK, MIN_WEIGHT_ELEMENTS, WEIGHT_DTYPE,
                                          PrecisionPolicy, measure_quality)
from lumc.compiler.core.search import PRECISION_GAIN
from lumc.compiler.runtime.program import run_program_reference
from lumc.ir.errors import InputError
from lumc.ir.graph import Graph
from lumc.ir.provenance import arg_scores
from lumc.compiler.core.options import option

WEIGHT_DTYPE_NAME = {k: (v.name if v is not None else None) for k, v in WEIGHT_DTYPE.items()}
# most to least precise; raising a kernel moves it left
PRECISION_ORDER = ("ieee", "tf32x3", "tf32", "fp16", "bf16", "fp8")


def _rank(p: str | None) -> int:
    return PRECISION_ORDER.index(p) if p in PRECISION_ORDER else 0


def config_rank(cfg: dict | None) -> int:
    """How far below exact a kernel config's arithmetic is: its ``PRECISION``'s place in
    ``PRECISION_ORDER`` (0: ``ieee``, or a config that names none); the search's tie-break."""
    return _rank((cfg or {}).get("PRECISION"))


def best_config_at(measurer, key: str, better_than: str | None) -> int | None:
    """Index of the fastest config of kernel ``key`` whose precision is more precise than
    ``better_than`` (measured now where the search did not; ``sim:*`` makes that cheap), or None."""
    e = measurer.entries[key]
    best, best_t = None, float("inf")
    for i, c in enumerate(e.configs):
        if c is None:
            continue
        p = c.kwargs().get("PRECISION")
        if p is None or _rank(p) >= _rank(better_than):
            continue
        hit = measurer.db.get(measurer._db_key(key, i))
        t = hit.seconds if hit is not None and hit.ok else None
        if t is None and (best is None):
            m = measurer(key, i)
            t = m.seconds if m.status == "ok" else None
        if t is not None and t < best_t:
            best, best_t = i, t
    return best


def retimed(result, keys: list, configs: list, measurer):
    """The search's ``result`` with the times of ``configs``, the gate's choice per kernel call of
    the chosen program (``keys``): a kernel the gate raised or lowered runs at another config
    than the one the search timed, so its time and the plan's (the sum) are that config's. Each
    such config was measured by :func:`best_config_at` or by the search (a tuning database hit)."""
    import dataclasses
    times = dict(result.kernel_times)
    total = 0.0
    for k, cfg in zip(keys, configs):
        if cfg != measurer.config_of(k, result.configs.get(k, 0)):
            j = next(j for j in range(measurer.n_configs(k)) if measurer.config_of(k, j) == cfg)
            times[k] = measurer(k, j).seconds
        total = None if total is None or times.get(k) is None else total + times[k]
    return dataclasses.replace(result, kernel_times=times,
                               time_s=total if result.time_s is not None else None)


class Reference(dict):
    """The fp32 model's outputs, ``{name: array}``; ``ties``: for each integer output that is an
    ArgMax/ArgMin of float scores (``lumc.ir.provenance.arg_scores``), ``(the scores' fp32
    values, axis, largest, keepdims)``, which the gate reads to tell a near-tie from a wrong
    index (``lumc.compiler.core.precision.near_ties``)."""

    def __init__(self, outputs: dict, ties: dict | None = None):
        super().__init__(outputs)
        self.ties = dict(ties or {})


def reference_outputs(graph, inputs: dict) -> Reference:
    """``graph``'s outputs on ``inputs`` (reference executor, fp32) as a :class:`Reference`, the
    scores of its index outputs computed in the same run."""
    found = {k: a for k, n in graph.outputs.items()
             if not n.dtype.is_float and (a := arg_scores(n)) is not None}
    scored = {f"{k}\0scores": a[0] for k, a in found.items()}
    out = ReferenceExecutor(Graph(graph.inputs, {**graph.outputs, **scored}) if found
                            else graph)(inputs)
    return Reference({k: out[k] for k in graph.outputs},
                     {k: (out[f"{k}\0scores"],) + tuple(a[1:]) for k, a in found.items()})


def index_ties(graph, inputs: dict, names: list, policy: PrecisionPolicy) -> list | None:
    """Per output in ``names``, None or its ``Reference.ties`` entry (an ArgMax/ArgMin's fp32
    scores) on ``inputs``, for a reduced-precision compile whose graph has such an output (the
    check against eager accepts near-ties as the gate does); None otherwise."""
    if not policy.reduced or not any(not n.dtype.is_float and arg_scores(n) is not None
                                     for n in graph.outputs.values()):
        return None
    ties = reference_outputs(graph, inputs).ties
    return [ties.get(k) for k in names]


def model_reference(graph, inputs: dict, policy: PrecisionPolicy) -> dict | None:
    """The fp32 model's outputs on ``inputs`` (``{name: array}``), the reference of every gate of a
    reduced-precision compile; None for an exact one. Run once, before the e-graph and the search:
    ``max_kl`` with no distribution to judge is refused here (InputError, see
    :meth:`~lumc.compiler.core.precision.PrecisionPolicy.check_max_kl`)."""
    if not policy.reduced:
        return None
    ref = reference_outputs(graph, inputs)
    policy.check_max_kl(ref, [k for k, n in graph.outputs.items() if n.dtype.is_float])
    return ref


def weights_gate(stored, original, inputs: dict, policy: PrecisionPolicy,
                 ref: dict | None = None) -> dict | None:
    """Quality of the stored weights alone: the graph ``stored`` (weights as the policy stores them,
    every op exact) against ``original`` (the fp32 model; ``ref`` its outputs when already run) on
    ``inputs``, by :func:`~lumc.compiler.core.precision.measure_quality`. None when the policy
    keeps the model's weights (``weights="same"``)."""
    if policy.weights == "same":
        return None
    ref = ref if ref is not None else reference_outputs(original, inputs)
    got = ReferenceExecutor(stored)(inputs)
    floats = [k for k, n in original.outputs.items() if n.dtype.is_float]
    exact = [k for k in original.outputs if k not in floats]
    return measure_quality(got, ref, policy, floats, exact, getattr(ref, "ties", None))


def stage_quality(chosen, graph, graph_ref, inputs: dict, keys: list, configs: list, measurer,
                  policy: PrecisionPolicy, deadline, ref: dict | None = None
                  ) -> tuple[list, dict | None]:
    """Gate the chosen plan (see module docstring) against ``graph_ref``'s outputs (``ref`` when
    already run). Returns ``(configs, quality)``; quality is None for an exact fp32 compile, else
    the ``quality`` report with ``passed``."""
    if not policy.reduced:
        return configs, None
    ref = ref if ref is not None else reference_outputs(graph_ref, inputs)
    floats = [k for k, n in graph.outputs.items() if n.dtype.is_float]
    exact = [k for k in graph.outputs if k not in floats]

    def evaluate(cfgs) -> dict:
        out = run_program_reference(chosen, graph, inputs, configs=cfgs)
        return measure_quality(out, ref, policy, floats, exact, getattr(ref, "ties", None))

    def raised(cfgs, which) -> list:
        out = list(cfgs)
        for i in which:
            cfg = out[i] or {}
            p = cfg.get("PRECISION")
            if p is None or p in ("ieee", "tf32x3") or cfg.get("IMPL", "triton") != "triton":
                continue
            j = best_config_at(measurer, keys[i], p)
            if j is not None:
                out[i] = measurer.config_of(keys[i], j)
        return out

    reduced = [i for i, c in enumerate(configs)
               if c and c.get("PRECISION") not in (None, "ieee", "tf32x3")]
    q = evaluate(configs)
    if policy.precision == "auto" and not q["passed"] and reduced:
        configs, q = _auto(configs, reduced, raised, evaluate, deadline, q)
    elif not q["passed"] and reduced:
        up = raised(configs, reduced)
        q2 = evaluate(up)
        if q2["passed"]:
            q2["raised_kernels"] = sum(1 for a, b in zip(configs, up) if a != b)
            configs, q = up, q2
    q["kernel_precision"] = [(c or {}).get("PRECISION") for c in configs]
    return configs, q


def _auto(configs, reduced, raised, evaluate, deadline, q0) -> tuple[list, dict]:
    """Per-kernel precision under the gate (see module docstring)."""
    exact = raised(configs, reduced)
    sens = {}
    for i in reduced:
        if deadline is not None and deadline.remaining() < 2.0:
            break
        trial = list(exact)
        trial[i] = configs[i]
        qi = evaluate(trial)
        sens[i] = qi["kl_mean"] if qi.get("kl_mean") is not None else qi["max_rel"]
    current = list(exact)
    q = evaluate(current)
    for i in sorted(sens, key=lambda i: sens[i]):
        if deadline is not None and deadline.remaining() < 2.0:
            break
        trial = list(current)
        trial[i] = configs[i]
        qt = evaluate(trial)
        if qt["passed"]:
            current, q = trial, qt
    total = sum(v for v in sens.values() if np.isfinite(v)) or 1.0
    q["sensitivity"] = {str(i): {"error": float(v), "share": float(v / total)}
                        for i, v in sens.items()}
    q["auto_first_try"] = {"max_rel": q0["max_rel"], "kl_mean": q0.get("kl_mean")}
    return current, q


def cut_short(cm) -> bool:
    """Whether CompiledModel ``cm``'s search stopped because its budget ran out."""
    return str(cm._report.get("stopped_because") or "").startswith("budget")


def auto_or_fp32(reduced, exact, deadline):
    """``auto``'s plan (``reduced``: a CompiledModel at ``auto``, or at what it fell back to), or
    the fp32 plan of the same model (``exact``) when the reduced one is not faster than it by
    ``search.PRECISION_GAIN``: weights stored in bf16 and contractions at bf16 or fp8 cost quality,
    and on a launch-bound model they buy no time. The plan kept has ``report["auto"]``: both
    times (seconds, simulated on ``sim:*``) and which was kept; the fp32 one also a note saying
    why. An untimed plan (budget) loses to a timed one. ``reduced`` is ``exact`` when the
    reduced plans missed the quality gate (the fallback's note says so; no reduced time). The
    plan kept reports the whole compile's budget and seconds (``deadline``: the outer one)."""
    for cm in (reduced, exact):
        cm._report.update(budget_s=deadline.budget_s, compile_s=deadline.elapsed())
    why = exact._report.get("stopped_because")
    if cut_short(exact) and "fp32 plan's share" not in why and not deadline.expired():
        # its own share ran out, not the budget the report shows ("in 5 s of 12 s: budget")
        exact._report["stopped_because"] = f"{why} (auto's fp32 plan's share of the budget)"
    if reduced is exact:     # the reduced plans missed the gate: auto fell back to this one
        exact._report["auto"] = {"fp32_time_s": exact._report.get("best_time_s"),
                                 "reduced_time_s": None, "reduced_precision": None,
                                 "kept": "fp32",
                                 "fp32_stopped_because": exact._report.get("stopped_because")}
        return exact
    r, e = reduced.report_dict(), exact.report_dict()
    t_r, t_e = r.get("best_time_s"), e.get("best_time_s")
    keep_reduced = t_r is not None and (t_e is None or t_r < t_e * (1 - PRECISION_GAIN))
    kept = reduced if keep_reduced else exact
    kept._report["auto"] = {"fp32_time_s": t_e, "reduced_time_s": t_r,
                            "reduced_precision": r["precision"],
                            "kept": "reduced" if keep_reduced else "fp32",
                            # plan reuse: a comparison the fp32 plan's share cut short is redone
                            # at a larger budget (plan_reuse._reuse_plan)
                            "fp32_stopped_because": exact._report.get("stopped_because")}
    if not keep_reduced:
        unit = " simulated" if exact.simulated else ""
        fig = (f"{t_r * 1e6:.1f} us{unit}" if t_r is not None else "untimed")
        at = "" if r["precision"] == "auto" else f", fallen back to {r['precision']}"
        kept._report["warnings"].append(
            f"precision auto: the reduced plan ({fig}{at}) is not {PRECISION_GAIN:.0%} faster "
            f"than the fp32 plan ({t_e * 1e6:.1f} us{unit}): compiled at fp32"
            + (f" (weights {e['weights']})" if e["weights"] != "same" else
               " accuracy, with the model's weights")
            if t_e is not None else
            "precision auto: neither plan was timed within the budget: compiled at fp32")
    elif t_e is None:     # kept by default: no time said it was faster
        kept._report["warnings"].append(
            "precision auto: the fp32 plan was not timed within its share of the budget: the "
            "reduced plan is kept without a comparison; a larger budget compares them")
    elif cut_short(exact):
        unit = " simulated" if exact.simulated else ""
        kept._report["warnings"].append(
            f"precision auto: the fp32 plan's search ran out of its share of the budget (at "
            f"{t_e * 1e6:.1f} us{unit}, against {t_r * 1e6:.1f} us): the reduced plan is kept "
            "against a plan searched less; a larger budget compares them")
    return kept


def precision_note(policy: PrecisionPolicy, quality: dict | None) -> str | None:
    """One line for the report's notes when the plan's contractions do not all run at the policy's
    own precision (``fp8`` allows ``bf16``; the gate raises kernels to pass; ``auto`` mixes by
    design): how many run at each precision, and how many the gate raised. None when they all do,
    or for an exact compile."""
    if quality is None:
        return None
    dots = [p for p in quality.get("kernel_precision", []) if p is not None]
    counts: dict[str, int] = {}
    for p in dots:
        counts[p] = counts.get(p, 0) + 1
    if not dots or (policy.precision != "auto" and set(counts) == {policy.precision}):
        return None
    mix = ", ".join(f"{n} at {p}" for p, n in sorted(counts.items(),
                                                     key=lambda kv: -_rank(kv[0])))
    n = f"{len(dots)} contraction{'s' * (len(dots) != 1)}"
    if policy.precision == "fp32":     # --weights alone: tf32x3 and ieee are fp32's own
        return (f"weights {policy.weights} at precision fp32: only the weights' storage is "
                f"reduced (dequantized in each contraction's prologue); the {n} "
                f"compute{'s' * (len(dots) == 1)} at fp32 accuracy ({mix})")
    raised = quality.get("raised_kernels", 0)
    # the contractions above the policy's precision that the gate did not raise (none: no clause;
    # it said 'the others were faster there' of a plan whose one contraction the gate raised)
    others = len(dots) - counts.get(policy.precision, 0) - raised
    why = (f"; {raised} raised to pass the quality gate" if raised else "") + \
        ("" if policy.precision == "auto" or others <= 0 else
         "; the others were faster there, or no config of the lower precision applies")
    return f"precision {policy.precision}: of {n}, {mix}{why}"


def fallback_policy(policy: PrecisionPolicy, quality: dict) -> PrecisionPolicy:
    """The policy a plan at ``policy`` that missed the quality gate (``quality``) is compiled at
    next: a more precise precision first (``precision.FALLBACK``), then weights as the model
    stores them. A precision whose plan was the one just measured is passed over: an ``fp8`` or
    ``auto`` plan none of whose contractions ran below bf16 (a tie goes to the precise config)
    stored its weights as bf16 does, so bf16's plan would miss the gate with the same figure."""
    if policy.precision not in FALLBACK:
        return dataclasses.replace(policy, weights="same")
    down = dataclasses.replace(policy, precision=FALLBACK[policy.precision])
    dots = [p for p in quality.get("kernel_precision", []) if p is not None]
    while (down.precision in FALLBACK and dots and WEIGHT_DTYPE[down.precision] ==
           WEIGHT_DTYPE[policy.precision] and max(map(_rank, dots)) <= _rank(down.precision)):
        down = dataclasses.replace(down, precision=FALLBACK[down.precision])
    return down


def fallback_note(policy: PrecisionPolicy, down: PrecisionPolicy, quality: dict) -> str:
    """The line of a plan at ``policy`` that missed the quality gate (``quality``) and is compiled
    at ``down`` instead. A plan none of whose contractions runs at the policy's own precision
    (``fp8`` whose contractions were all faster at bf16; ``auto`` that chose nothing below bf16)
    measured the lower precision's plan, not its own, and the line says so: when that precision
    misses the gate too, its own line repeats the figure for that reason."""
    own = f"precision {policy.precision} (weights {policy.weights})"
    dots = sorted({p for p in quality.get("kernel_precision", []) if p is not None},
                  key=_rank, reverse=True)
    if policy.precision == "fp8" and dots and "fp8" not in dots:
        own += f": no contraction runs at fp8 (its plan is {'/'.join(dots)}'s), and that plan"
    elif policy.precision == "auto" and dots == ["bf16"]:   # bf16's plan, next
        own += ": its plan is bf16's, and that plan"
    elif policy.precision == "auto" and dots and "fp8" not in dots:
        # not fp32's plan though its contractions are: its weights and activations are bf16
        own += (f": no contraction runs below bf16 (at {'/'.join(dots)}, over weights and "
                "activations stored in bf16), and that plan")
    return (f"{own} misses the quality gate ({quality['reason']}); compiled at {down.precision} "
            f"(weights {down.weights}) instead")


def refuse_idle_weights(policy: PrecisionPolicy, stats: dict, where: str = "") -> None:
    """Raises InputError when ``--weights`` names a format and the model has no weight it could
    store (``stats``: :func:`~lumc.compiler.core.precision.store_weights`'s; no fp32 weight of at
    least ``MIN_WEIGHT_ELEMENTS`` read only by matrix products, as in a model without a MatMul or
    whose products read only inputs): the option would do nothing, as ``--tolerance`` at fp32.
    A weight the format cannot store (NVFP4 with K = 24) is a note instead
    (:func:`weights_note`)."""
    fmt = policy.weights
    if fmt != "same" and not stats.get(fmt, 0) and not stats.get("skipped", 0):
        raise InputError(f"{option('weights', fmt)}: {where or 'the model'} has no weight read "
                         f"only by matrix products (an fp32 constant of at least "
                         f"{MIN_WEIGHT_ELEMENTS} elements), so nothing would be stored as {fmt}; "
                         f"leave {option('weights')} out")


def weights_note(policy: PrecisionPolicy, stats: dict) -> str | None:
    """One line for the report's notes when ``--weights`` stored fewer weights than the user may
    think (``stats``: :func:`~lumc.compiler.core.precision.store_weights`'s): none (the format
    could store none: NVFP4 with a K not a multiple of 16), or some skipped. None when every
    contraction weight is stored in the format, or for ``weights="same"``; a model with no
    contraction weight at all is refused (:func:`refuse_idle_weights`)."""
    fmt = policy.weights
    if fmt == "same":
        return None
    done, skipped = stats.get(fmt, 0), stats.get("skipped", 0)
    if done and not skipped:
        return None
    low = WEIGHT_DTYPE_NAME[policy.precision]
    keep = ("as the model stores it" if low is None else
            f"in {low} (precision {policy.precision})")
    if not done:
        why = f"the format cannot store the {skipped} contraction weight{'s' * (skipped != 1)}"
        return f"weights {fmt}: no weight is stored as {fmt} ({why}); every weight stays {keep}"
    return (f"weights {fmt}: {done} of {done + skipped} contraction weights stored as {fmt}; "
            f"{skipped} the format cannot store stay{'s' * (skipped == 1)} {keep}")
