"""The compile pipeline: every stage of ``lumc compile`` in order, in one place.

    model ──► frontend (load, check, import) ──► primitive graph
          ──► candidates (e-graph saturation + extraction, or greedy fusion with --no-egraph)
          ──► reference run (captures every kernel boundary value, for numerics checks)
          ──► search (roofline bound ─► prune ─► render ─► check numerics ─► time ─► tuning DB)
          ──► plan (the chosen program and kernel configs) ──► CompiledModel + report

The budget is one hard deadline over all stages. Each stage is a function below, so it can be tested
and timed alone.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from lumc.compiler.core.activation_storage import ACTIVATION_DTYPE, store_activations
from lumc.compiler.core.budget import Deadline, hard_deadline, parse_duration
from lumc.compiler.core.constfold import fold_constants
from lumc.compiler.core.buckets import NarrowRangeError, compile_ranges, range_sizes, ranges_in
from lumc.compiler.runtime.compiled import CompiledModel
from lumc.compiler.core.fusion import ROWS_REFUSAL, greedy_program
from lumc.compiler.core.errors import max_rel_error
from lumc.compiler.core.measure import KernelMeasurer
from lumc.compiler.core.onnx_stage import (Frontend, bind_model, check_example_names,
                                          input_shapes_as_tuples, stage_frontend, with_ranges)
from lumc.compiler.core.precision import (WEIGHT_DTYPE, PrecisionPolicy, integer_error,
                                          precision_report, store_weights)
from lumc.compiler.core.precision_gate import (auto_or_fp32, config_rank, cut_short,
                                               fallback_note, fallback_policy, model_reference,
                                               precision_note, refuse_idle_weights, retimed,
                                               stage_quality, weights_gate, weights_note)
from lumc.compiler.runtime.program import Program, program_time_bound, run_program_reference
from lumc.compiler.core.reference_values import (MAX_KEPT_BYTES, ReferenceValues,  # noqa: F401
                                                 drawn_inputs_error)
from lumc.compiler.core.variants import MAX_VARIANTS, compile_variants, size_lists
from lumc.compiler.core.plan_reuse import _plan_cache_key, _reuse_plan, _store_plan  # noqa: F401
from lumc.compiler.core.progress import Progress
from lumc.compiler.core.report import build_report
from lumc.compiler.core.why_not import why_not
from lumc.compiler.core.search import run_search
from lumc.compiler.core.untimed import check_untimed
from lumc.compiler.core.workers import search_workers, warm_workers, with_workers
from lumc.compiler.runtime.targets import Target, resolve_target, versions, with_measured_ceilings
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir.errors import (BudgetError, DivisionByZeroError, IndexRangeError, InputError,
                             LumcError, RuntimeIfError)
from lumc.ir.graph import Graph
from lumc.rewrites.cost import kernel_time_bound
from lumc.compiler.core import carried
from lumc.compiler.core.options import options

EGRAPH_SHARE = 0.35   # most of the budget a compile gives saturation + extraction
EGRAPH_MIN_S = 0.25   # below this share the e-graph is not started (loading its rules alone costs more)
MAX_CANDIDATES = 16   # distinct programs taken from extraction (the bound prunes the hopeless ones free)
AUTO_FP32_SHARE = 0.4  # of the budget, ``auto``'s fp32 plan (the reduced plan must beat it)
AUTO_RESUME_SHARE = 0.1  # budget left after the reduced plan that resumes a cut-short fp32 search
MAX_REGION_OPS = 400  # primitive ops per e-graph region (EGGLOG-NOTES: per-layer regions)


@dataclass
class Given:
    """What a size bucket's compile takes from the range's one e-graph run (``compile_frontend``):
    ``stored`` is ``(graph with weights stored, weight stats)``, ``programs`` the candidates bound
    to it."""
    stored: tuple
    programs: list
    egraph_stats: dict


def stage_candidates(graph: Graph, target: Target, deadline: Deadline, use_egraph: bool,
                     fast_math: bool = False
                     ) -> tuple[list[Program], dict]:
    """Candidate programs, best-bound first, and the e-graph statistics.

    With ``use_egraph`` the e-graph (``lumc.compiler.core.egraph_pipeline``) saturates under limits that fit
    the deadline and extraction returns up to :data:`MAX_CANDIDATES` distinct programs; the greedy
    program is always a candidate too (it is the ``--no-egraph`` pipeline), with its ``+rows``
    twin where it cut a chain of row reductions (``fusion_rows``).
    """
    stats = {"enodes": 0, "eclasses": 0, "saturation_s": 0.0, "regions": 0, "used": False}
    # constants folded (index arithmetic, empty values) as the e-graph's input is: exact, and a
    # --no-egraph compile of a model whose outputs are all empty launched a kernel per op (under
    # a range's probes an index array holding a probed size stays a computation: held_values)
    folded = fold_constants(graph)
    greedy = greedy_program(folded)
    unfused = unfused_program(graph)
    programs = [greedy, unfused]
    if any(ROWS_REFUSAL in x for x in greedy.notes):    # its row groups in one kernel each
        try:
            programs.append(greedy_program(folded, label="greedy+rows", rows=True))
        except ValueError:      # kernels reading each other in a cycle: the twin is not made
            pass
    own = list(programs)
    if use_egraph:
        try:
            from lumc.compiler.core import egraph_pipeline
            from lumc.rewrites.schedule import EGGLOG_MISSING
            if EGGLOG_MISSING:
                raise ImportError(EGGLOG_MISSING)
        except ImportError as e:   # a tree without the e-graph stage: greedy only, said in the report
            stats["error"] = f"e-graph stage unavailable ({e})"
            use_egraph = False
            carried_from = os.environ.get(carried.READ_ENV)
            if carried_from:       # the GPU image: candidates an e-graph made on a CPU machine
                got, why = carried.load(graph, carried_from)
                stats["carried"] = why
                if got:
                    programs = got + programs
                    stats["used"] = True
    if use_egraph:
        from lumc.rewrites.schedule import Limits
        share = deadline.remaining() * EGRAPH_SHARE
        n_compute = sum(1 for n in graph.nodes() if n.op not in ("Input", "Constant", "View"))
        regions = max(1, -(-n_compute // MAX_REGION_OPS))
        limits = Limits(seconds=max(0.05, min(Limits().seconds, share / regions)),
                        fast_math=fast_math)
        t0 = time.monotonic()
        res = None
        if share < EGRAPH_MIN_S and deadline.clock is time.monotonic:
            stats["error"] = (f"e-graph skipped: {share:.2g} s of the budget left for it (building "
                              "the greedy candidates took the rest)")
        else:
            try:   # the e-graph's share is a deadline too: checked between regions
                res = egraph_pipeline.egraph_candidates(
                    graph, target.spec, k=MAX_CANDIDATES, limits=limits,
                    max_region_ops=MAX_REGION_OPS,
                    deadline=t0 + share if deadline.clock is time.monotonic else None)
            except egraph_pipeline.EGraphDeadline as e:
                stats["error"] = (f"e-graph stopped at its share of the budget ({share:.2g} s) "
                                  f"{e}; greedy candidates only")
            except Exception as e:   # an e-graph defect must not sink a compile the greedy
                # candidates can finish (each is checked like any other); the report says so
                stats["error"] = (f"e-graph failed ({type(e).__name__}: {str(e)[:200]}); greedy "
                                  "candidates only")
                res = None
    if use_egraph and res is not None:
        tot = res.total
        stats.update({"enodes": tot.enodes, "eclasses": tot.eclasses, "iterations": tot.iterations,
                      "saturation_s": res.seconds.get("saturate", tot.seconds),
                      "extraction_s": res.seconds.get("extract", 0.0),
                      "partition_s": res.seconds.get("partition", 0.0), "regions": len(res.regions),
                      "stop_reasons": tot.stop, "used": True, "seconds": time.monotonic() - t0})
        programs = list(res.candidates) + programs
        carry_to = os.environ.get(carried.WRITE_ENV)
        if carry_to:               # for a machine without egglog (make gpu-candidates)
            path = carried.dump(graph, res.candidates, carry_to, "candidates", stats)
            stats["carried"] = f"written to {path}" if path else "no portable candidate"
        # the model's own nodes keyed by e-class too (greedy and unfused bind them), so the
        # reference run's values serve every candidate's nodes of those e-classes
        in_model = {id(n) for n in graph.nodes()}
        keys = {k: v for k, v in res.model_keys.items() if k in in_model}
        for p in own:
            p.value_keys = keys
    seen, out = set(), []
    for p in programs:
        sig = p.signature()
        if sig not in seen:
            seen.add(sig)
            out.append(p)
    ceil = target.spec.as_ceilings()
    out.sort(key=lambda p: sum(kernel_time_bound(c.kernel, ceil) for c in p.calls))
    return out, stats


def unfused_program(graph: Graph) -> Program:
    """One kernel per primitive op (views folded into reads): what an eager executor launches.

    It is always a candidate so that the search shows, by its roofline bound, what fusion buys;
    it is pruned without compiling whenever a fused program has been measured below its bound.
    """
    from lumc.compiler.core.fusion import GreedyFusion
    nodes = graph.nodes()
    users: dict[int, list] = {}
    for n in nodes:
        for s in n.srcs:
            users.setdefault(id(s), []).append(n)
    # every op its own kernel, except the product of a contraction, which stays inside its sum
    compute = {id(n) for n in nodes if n.op not in ("Input", "Constant", "View", "Iota") and not (
        n.op == "Mul" and users.get(id(n)) and all(u.op == "SumReduce" for u in users[id(n)]))}
    try:
        return GreedyFusion(graph, realize=compute).program("unfused")
    except Exception:   # a graph greedy cutting cannot split per op: greedy stands alone
        return greedy_program(graph)


def stage_reference(graph: Graph, programs: list[Program], inputs: dict
                    ) -> tuple[dict, ReferenceValues]:
    """The model's outputs and the (lazy) reference values of every kernel boundary node."""
    vals = ReferenceValues(graph, programs, inputs)
    return vals.outputs, vals


def example_inputs_for(graph: Graph, fe: Frontend, seed: int = 0) -> dict:
    """Inputs for the numerics checks: the known model's recipe, else N(0,1) floats and small ints
    (integer and bool inputs drawn like the user's example values, ``fe.examples``, where given)."""
    from lumc.compiler.frontends.models import random_inputs
    shapes = {k: n.shape for k, n in graph.inputs.items()}
    dtypes = {k: n.dtype.np for k, n in graph.inputs.items()}
    highs = {}
    if fe.source_onnx and fe.known_model is None:   # ints indexing a table: drawn in its range
        import onnx
        from lumc.compiler.runtime.index_ranges import index_uses, random_int_highs
        highs = random_int_highs(index_uses(onnx.load_from_string(fe.source_onnx), shapes))
    return random_inputs(shapes, dtypes, seed=seed, info=fe.known_model, int_high=highs,
                         examples=fe.examples)


# what shapes= and bind= look like, for the error when one is not a dict
EXAMPLE = {"shapes": "{'batch_size': 2, 'x': (2, 16)}", "bind": "{'sr': 16000}"}


@with_workers
def compile_model(model, *, budget, device: str | None = None, example_inputs: dict | None = None,
                  shapes: dict | None = None, use_egraph: bool = True, quiet: bool = True,
                  db: TuningDatabase | None = None, clock: Callable[[], float] = time.monotonic,
                  reuse_plan: bool = True, precision: str = "fp32", weights: str = "same",
                  tolerance: float | None = None, max_kl: float | None = None,
                  logits: tuple = (), fast_math: bool = False,
                  bind: dict | None = None) -> CompiledModel:
    """Compile an ONNX model into the fastest correct program lumc finds within ``budget``.

    Args:
        model: a path, ``onnx.ModelProto`` or bytes.
        budget: a DURATION (``"30m"``, ``"90s"``) or seconds; a hard deadline for the whole compile
            (it returns within the budget plus 5%, or plus 10 s under 3 minutes).
        device: ``cuda[:N]``, ``sim:h100`` or ``sim:h200``; None picks the first CUDA GPU, else
            ``sim:h200`` (times then are simulated, and the report says so).
        example_inputs: ``{name: array}`` used for shapes and the numerics checks; inputs not
            given are drawn (the known model's recipe, else random: N(0, 1) floats, integers in
            the range of the table they index, else [0, 8)).
        shapes: ``{input name or dynamic dim name: dims}`` for dynamic dims.
        use_egraph: False gives the greedy-fusion pipeline (``--no-egraph``).
        quiet: no progress display.
        db: the tuning database (default: the user cache dir's).
        reuse_plan: return the stored result of an identical earlier compile (same model bytes,
            shapes, device and versions) when its search finished; no re-timing at all.
        precision, weights, tolerance, max_kl, logits: the precision policy and its quality gate
            (``lumc.compiler.core.precision``: ``fp32`` on tensor cores by default; ``tf32``, ``bf16``,
            ``fp16``, ``fp8``, ``auto``; weight-only ``int8``).
        fast_math: also offer the e-graph the rewrites that change results for speed
            (``lumc.rewrites.rules_algebra.FAST_MATH``: ``a / b`` as ``a * (1/b)``); off by default,
            where division is IEEE.
        bind: ``{input name: value}`` inputs fixed at compile time (``--bind NAME=VALUE``): they
            become constants, so an ``If`` on them folds to its branch; the artifact no longer
            takes them (``lumc.compiler.frontends.onnx_frontend.bind_inputs``).
        workers: where work units run (``lumc.compiler.core.workers``): ``"local:N"``,
            ``"ray"``, ``"ray://HOST:PORT"``; None: a local pool on ``sim:*`` when cores > 1.
    Raises:
        BudgetError, ModelError, UnsupportedOpError, InputError, LumcError: one line each.
    """
    for name, given in (("shapes", shapes), ("bind", bind)):
        if given is not None and not isinstance(given, dict):
            raise InputError(f"{name}= is a dict {{name: value}} (e.g. {EXAMPLE[name]}), "
                             f"got {type(given).__name__} {given!r:.60}")
    policy = PrecisionPolicy.from_user(precision, weights, tolerance, max_kl, logits)
    if bind:
        model = bind_model(model, bind)
        if shapes:      # a bound input is a constant now: a shape given for it has nothing to set
            shapes = {k: v for k, v in shapes.items() if k not in bind}
    budget_s = parse_duration(budget)
    deadline = Deadline(budget_s, clock)
    db = db if db is not None else TuningDatabase()
    shapes = input_shapes_as_tuples(model, shapes)

    def one(src, budget_s: float, shp: dict) -> CompiledModel:   # one plan of several
        return compile_model(src, budget=budget_s, device=device, shapes=shp, use_egraph=use_egraph,
                             quiet=quiet, db=db, clock=clock, reuse_plan=reuse_plan,
                             precision=precision, weights=weights, tolerance=tolerance,
                             max_kl=max_kl, logits=logits, fast_math=fast_math,
                             example_inputs=None if size_lists(shapes) or ranges_in(shapes)
                             else example_inputs)
    lists = size_lists(shapes)
    if example_inputs and (lists or ranges_in(with_ranges(model, shapes))):
        # the per-size compiles take none of them (a range, only its integer values): a name
        # that is no input was ignored there
        from lumc.compiler.frontends.onnx_frontend import load_model
        check_example_names(load_model(model), example_inputs)
    ranges = ranges_in(with_ranges(model, shapes)) if lists else {}
    if ranges:   # each listed size's compile takes one size per dim: a range there is no size
        listed = ", ".join(f"{k}=" + ",".join("x".join(map(str, x)) if isinstance(x, tuple)
                                              else str(x) for x in v) for k, v in lists.items())
        raise InputError(f"a list of sizes and a size range in one compile ({listed} with "
                         + ", ".join(f"{k}={r.describe()}" for k, r in ranges.items())
                         + "): give the listed dim one size per compile, or a range too")
    if lists:                        # several sizes: one plan each, chosen per call
        return compile_variants(model, budget=budget_s, shapes=shapes, compile_one=one,
                                clock=clock)
    target = resolve_target(device)
    ver = versions(gpu=not target.simulated)
    target = with_measured_ceilings(target, db)
    shapes = with_ranges(model, shapes)
    plans = db.plans_dir
    reuse = _plan_cache_key(model, shapes, example_inputs, target, ver,
                            (use_egraph, sorted(policy.as_dict().items()))
                            + (("fast_math",) if fast_math else ()), values=policy.reduced)
    if reuse is not None and reuse_plan:
        cm = _reuse_plan(plans / f"{reuse}.lumc", budget_s, deadline)
        if cm is not None:
            return cm
    if ranges_in(shapes):            # size ranges: one e-graph, one plan per size bucket
        tgt = dataclasses.replace(target, spec=dataclasses.replace(
            target.spec, dot_precisions=policy.dot_precisions()))
        try:
            vm = compile_ranges(
                model, budget=budget_s, shapes=shapes, policy=policy, clock=clock,
                frontend=lambda m, shp: dataclasses.replace(   # drawn inputs follow the user's ints
                    stage_frontend(m, shp, None), examples={
                        k: np.asarray(v) for k, v in (example_inputs or {}).items()
                        if np.asarray(v).dtype.kind in "biu"}),
                candidates=lambda g, dl: stage_candidates(g, tgt, dl, use_egraph, fast_math),
                compile_bucket=lambda fe, stored, progs, stats, dl: compile_frontend(
                    fe, dl, target, ver, db, example_inputs=None, use_egraph=use_egraph,
                    quiet=quiet, policy=policy, fast_math=fast_math,
                    given=Given(stored, progs, stats)))
        except NarrowRangeError:     # a few sizes no probe serves (L=6..6 halved): one plan each
            sizes = range_sizes(ranges_in(shapes), MAX_VARIANTS)
            if sizes is None:
                raise
            return compile_variants(model, budget=max(deadline.remaining(), 0.0),
                                    shapes={**shapes, **sizes}, compile_one=one, clock=clock)
        if reuse is not None and vm.report_dict()["best_time_s"] is not None:
            _store_plan(plans / f"{reuse}.lumc", vm)     # a range's plans are reused too
        return vm
    t0 = deadline.elapsed()
    runtime_if = None
    with hard_deadline(deadline):    # the budget holds for any graph: BudgetError past its grace
        try:
            fe = stage_frontend(model, shapes, example_inputs)
        except RuntimeIfError as e:  # branches that are not one graph: one plan per branch
            runtime_if = e
        if runtime_if is None:
            cm = compile_frontend(fe, deadline, target, ver, db, example_inputs=example_inputs,
                                  use_egraph=use_egraph, quiet=quiet,
                                  frontend_s=deadline.elapsed() - t0, policy=policy,
                                  fast_math=fast_math)
    if runtime_if is not None:
        return compile_variants(model, budget=max(deadline.remaining(), 0.0), shapes=shapes,
                                compile_one=one, clock=clock, first_error=runtime_if)
    if reuse is not None and cm.report_dict()["best_time_s"] is not None:
        _store_plan(plans / f"{reuse}.lumc", cm)
    return cm


@with_workers
def compile_graph(graph: Graph, *, budget, device: str | None = None, example_inputs: dict | None = None,
                  use_egraph: bool = True, quiet: bool = True, db: TuningDatabase | None = None,
                  clock: Callable[[], float] = time.monotonic, name: str = "graph",
                  policy: PrecisionPolicy | None = None,
                  deadline: Deadline | None = None) -> CompiledModel:
    """Compile an already imported primitive graph (the PyTorch frontend's entry point).

    Same search as :func:`compile_model` (``workers=`` too); ``example_inputs`` (``{input name:
    array}``) feed the numerics checks (default: N(0,1) floats and small non-negative integers).
    ``deadline``: a budget already being spent (``budget`` is then not read): ``torch.compile``'s
    first call, after a range compile that failed.
    """
    deadline = deadline or Deadline(parse_duration(budget), clock)
    target = resolve_target(device)
    ver = versions(gpu=not target.simulated)
    db = db if db is not None else TuningDatabase()
    target = with_measured_ceilings(target, db)
    with hard_deadline(deadline):
        return compile_frontend(Frontend(graph, None, name), deadline, target, ver, db,
                                example_inputs=example_inputs, use_egraph=use_egraph, quiet=quiet,
                                policy=policy)


def compile_frontend(fe: Frontend, deadline: Deadline, target: Target, ver: dict,
                     db: TuningDatabase, *, example_inputs: dict | None, use_egraph: bool,
                     quiet: bool, frontend_s: float = 0.0,
                     policy: PrecisionPolicy | None = None, fast_math: bool = False,
                     given: "Given | None" = None) -> CompiledModel:
    """Every stage after the frontend: precision (weights stored as the policy says), candidates,
    reference capture, search, the quality gate, plan, report.

    ``given`` supplies the stored graph and the candidates instead (a size bucket of a range,
    ``lumc.compiler.core.buckets``: the e-graph ran once for every bucket).

    ``auto`` stores weights reduced, which no kernel choice undoes: it is compiled twice, at fp32
    first with ``AUTO_FP32_SHARE`` of the budget, then at ``auto``, and the reduced plan is kept
    only when it is faster (:func:`~lumc.compiler.core.precision_gate.auto_or_fp32`); an fp32
    search its share cut short goes on with what the reduced compile left. Not over a range's
    buckets, whose weights are stored once for all."""
    policy = policy or PrecisionPolicy()
    args = dict(example_inputs=example_inputs, use_egraph=use_egraph, quiet=quiet,
                frontend_s=frontend_s, fast_math=fast_math, given=given)
    if policy.precision != "auto" or given is not None:
        return _compile_policy(fe, deadline, target, ver, db, policy=policy, **args)
    policy.check_logits(fe.graph.outputs)      # the options the fp32 plan does not judge: refused
    if policy.max_kl is not None and not policy.logits:      # before its search, not after
        model_reference(fe.graph, {**example_inputs_for(fe.graph, fe), **{
            k: np.asarray(v) for k, v in (example_inputs or {}).items()}}, policy)
    fp32 = dataclasses.replace(policy, precision="fp32")
    exact = _compile_policy(dataclasses.replace(fe, warnings=list(fe.warnings)),
                            deadline.sub(AUTO_FP32_SHARE), target, ver, db, policy=fp32, **args)
    try:
        reduced = _compile_policy(fe, deadline, target, ver, db, policy=policy, fp32_plan=exact,
                                  **args)
    except (InputError, BudgetError):
        raise
    except LumcError as e:     # the fp32 plan is compiled and checked: it stands
        exact._report["warnings"].append(
            f"precision auto: the reduced plan failed ({' '.join(str(e).split())}): compiled at "
            "fp32")
        reduced = exact
    if reduced is not exact and cut_short(exact) and \
            deadline.remaining() > AUTO_RESUME_SHARE * deadline.budget_s:
        # its share ran out while the reduced compile left budget: its search goes on (the
        # tuning database holds what it measured), so the reduced plan is not kept against a
        # plan searched less (argmax at 10 s: fp32 14.5 us after 2 configs, 10.5 us alone)
        again = _compile_policy(dataclasses.replace(fe, warnings=list(fe.warnings)),
                                deadline.sub(1.0), target, ver, db, policy=fp32, **args)
        t0, t1 = exact._report.get("best_time_s"), again._report.get("best_time_s")
        if t1 is not None and (t0 is None or t1 <= t0):
            exact = again
    return auto_or_fp32(reduced, exact, deadline)


def _compile_policy(fe: Frontend, deadline: Deadline, target: Target, ver: dict,
                    db: TuningDatabase, *, example_inputs: dict | None, use_egraph: bool,
                    quiet: bool, frontend_s: float, policy: PrecisionPolicy, fast_math: bool,
                    given: "Given | None", fp32_plan: CompiledModel | None = None
                    ) -> CompiledModel:
    """:func:`compile_frontend` at one policy (and the policies it falls back to; ``fp32_plan``:
    the plan to fall back to at fp32, compiled already)."""
    policy.check_logits(fe.graph.outputs)
    budget_s = deadline.budget_s
    drawn = True
    progress = Progress(budget_s, target, quiet)
    try:
        stage_s: dict[str, float] = {"frontend": frontend_s}
        graph, weight_stats = given.stored if given is not None else store_weights(fe.graph, policy)
        refuse_idle_weights(policy, weight_stats, fe.model_name)
        inputs = {k: np.asarray(v) for k, v in (example_inputs or {}).items()}
        drawn = not set(graph.inputs) <= set(inputs)     # inputs not given are drawn
        if drawn:
            inputs = {**example_inputs_for(graph, fe), **inputs}
        model_ref = model_reference(fe.graph, inputs, policy)   # max_kl with nothing to judge: refused
        wq = weights_gate(graph, fe.graph, inputs, policy, model_ref) \
            if not deadline.expired() and given is None else None
        if wq is not None and not wq["passed"]:
            down = dataclasses.replace(policy, weights="same")
            fe.warnings.append(f"weights {policy.weights} miss the quality gate on their own "
                               f"({wq['reason']}, every op exact); compiled with the model's "
                               f"weights (precision {policy.precision}) instead")
            policy = down
            graph, weight_stats = store_weights(fe.graph, policy)
        if weights_note(policy, weight_stats):
            fe.warnings.append(weights_note(policy, weight_stats))
        if policy.weights != "same" and not weight_stats.get(policy.weights):
            # no weight stored in the format (the note says so): the plan is the model's weights
            # at the precision, gated at its tolerance, not the format's looser one (a bf16 plan
            # 0.3 off passed --weights nvfp4's 0.4 with not one weight in nvfp4)
            policy = dataclasses.replace(policy, weights="same")
        target = dataclasses.replace(target, spec=dataclasses.replace(
            target.spec, dot_precisions=policy.dot_precisions()))
        progress.stage("candidates", deadline)
        warm_workers(target)          # Ray actors start while the candidates are built
        programs, egraph_stats = (list(given.programs), dict(given.egraph_stats)) \
            if given is not None else stage_candidates(graph, target, deadline, use_egraph,
                                                       fast_math)
        act = ACTIVATION_DTYPE[policy.precision]
        if act is not None:    # kernel-to-kernel values stored narrow, then best-bound first again
            ceil = target.spec.as_ceilings()
            programs = sorted((store_activations(p, act) for p in programs),
                              key=lambda p: sum(kernel_time_bound(c.kernel, ceil) for c in p.calls))
        stage_s["candidates"] = deadline.elapsed() - sum(stage_s.values())
        progress.stage("reference", deadline)
        # past the deadline already: no search, the best-bound candidate; but the reference runs
        # anyway (within the hard deadline's grace): no program is returned unchecked
        t_ref = deadline.elapsed()
        ref_out, values = stage_reference(graph, programs, inputs)
        # a reduced-precision compile keeps time for its quality gate: about three whole-model
        # runs (the fp32 model, the emulated program), like the one the reference stage just made
        search_deadline = deadline
        if policy.reduced and ref_out is not None:
            reserve = min(0.3 * deadline.remaining(), 3.0 * (deadline.elapsed() - t_ref) + 1.0)
            search_deadline = Deadline(max(0.0, deadline.remaining() - reserve), deadline.clock)
        log: list[str] = []
        measurer = KernelMeasurer(target, db, ver, values, log)
        measurer.deadline = search_deadline
        keys = [[measurer.add(c) for c in p.calls] for p in programs]
        ceil = target.spec.as_ceilings()
        bounds = {k: kernel_time_bound(measurer.entries[k].kernel, ceil) for ks in keys for k in ks}
        nconf = {k: measurer.n_configs(k) for ks in keys for k in ks}
        stage_s["reference"] = deadline.elapsed() - sum(stage_s.values())
        with search_workers(target, deadline) as workers:   # local processes or Ray actors
            measurer.pool, progress.workers = workers.pool, workers.status
            result = run_search(keys, bounds, nconf, measurer, search_deadline,
                                on_progress=lambda st, b, bd: progress.search(deadline, st, b, bd),
                                config_bounds=measurer.bound,
                                before_candidate=lambda i: measurer.prefetch(keys[i]),
                                remeasure=measurer.remeasure, runnable=measurer.runnable,
                                lookahead=None if target.simulated else measurer.lookahead,
                                precision_rank=lambda k, ci: config_rank(measurer.config_of(k, ci)))
            measurer.pool = progress.workers = None
        worker_report = workers.report()
        stage_s["search"] = deadline.elapsed() - sum(stage_s.values())
        progress.stage("plan", deadline)
        chosen = programs[result.candidate]
        ck = keys[result.candidate]
        checked_late = check_untimed(result, ck, measurer, fe.model_name, fe.warnings, deadline)
        configs = [measurer.config_of(k, result.configs.get(k, 0)) for k in ck]
        quality = None
        if ref_out is not None:    # reduced precision is never returned unmeasured, even late
            gated, quality = stage_quality(chosen, graph, fe.graph, inputs, ck, configs, measurer,
                                           policy, deadline, model_ref)
            if gated != configs:   # kernels the gate raised: their own times, not the search's
                result = retimed(result, ck, gated, measurer)
            configs = gated
        # the chosen program (as the gate left it) end to end on the CPU against the reference,
        # even past the deadline (the hard deadline's grace bounds it; a budget too small for it
        # is a BudgetError)
        err = None
        if ref_out is not None and (quality is None or quality["passed"]):
            out = run_program_reference(chosen, graph, inputs, configs=configs)
            ties = getattr(model_ref, "ties", {})   # an index at a near-tie is not an error
            err = max((max_rel_error(out[k], ref_out[k]) if graph.outputs[k].dtype.is_float else
                       integer_error(out[k], ref_out[k], ties.get(k), policy.rtol))
                      for k in graph.outputs) if graph.outputs else 0.0
        if quality is not None and not quality["passed"]:
            # the next policy up: a lower precision first, then weights as the model stores them
            down = fallback_policy(policy, quality)
            if given is not None and (down.weights != policy.weights or
                                      WEIGHT_DTYPE[down.precision] != WEIGHT_DTYPE[policy.precision]):
                raise InputError(f"precision {policy.precision} (weights {policy.weights}) misses "
                                 f"the quality gate ({quality['reason']}) at {fe.model_name}; a "
                                 "size range cannot fall back to weights stored differently: "
                                 "compile it with " + options(("precision", down.precision),
                                                              ("weights", down.weights)))
            fe.warnings.append(fallback_note(policy, down, quality))
            progress.close()
            if fp32_plan is not None and down == dataclasses.replace(policy, precision="fp32"):
                have = fp32_plan._report["warnings"]    # the fallbacks' lines, auto's on
                have += [w for w in fe.warnings if w not in have]
                return fp32_plan       # auto's own fp32 plan, compiled already
            return _compile_policy(fe, deadline, target, ver, db, example_inputs=example_inputs,
                                   use_egraph=use_egraph, quiet=quiet, frontend_s=frontend_s,
                                   policy=down, given=given, fast_math=fast_math,
                                   fp32_plan=fp32_plan)
        note = precision_note(policy, quality)
        if note:
            fe.warnings.append(note)
        kernel_err = max((measurer.check_error(k, c) for k, c in zip(ck, configs)), default=0.0)
        if err is not None or kernel_err:
            err = max(err or 0.0, kernel_err)
        stage_s["plan"] = deadline.elapsed() - sum(stage_s.values())
        report = build_report(fe, graph, programs, chosen, ck, configs, result, measurer, bounds,
                              target, budget_s, deadline, egraph_stats, err, use_egraph, db, log)
        report["stage_seconds"] = stage_s
        report["checked_after_budget"] = checked_late
        report["workers"] = worker_report
        report["fast_math"] = bool(fast_math)   # rewrites that change results were offered
        report["reference_s"] = round(getattr(values, "seconds", 0.0), 3)   # incl. in the stages
        report["why_not"] = why_not(chosen, programs, [program_time_bound(p, target.spec)
                                                       for p in programs],
                                    [result.program_times.get(i) for i in range(len(programs))],
                                    result.time_s, target.simulated)
        report.update(precision_report(policy, quality, weight_stats, report["per_kernel"]))
        return CompiledModel(graph, chosen, configs, target.name, target.simulated, report,
                             fe.source_onnx, target.torch_device)
    except (IndexRangeError, DivisionByZeroError) as e:   # refused at inputs lumc made up
        raise drawn_inputs_error(e) if drawn else e from None
    finally:
        progress.close()
