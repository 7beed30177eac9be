"""The compile's report (``--report``, ``CompiledModel.report_dict()``): per kernel its form,
implementation, time against its roofline bound, FLOPs, bytes and split-K workspace; for the plan
its times, bytes moved against the ideal (inputs + weights + outputs, each once), the search's
counts, the e-graph's statistics and the numerics check. Built once, by :func:`build_report`, when
the pipeline has chosen a program (``lumc.compiler.core.pipeline.compile_frontend``)."""
from __future__ import annotations

from lumc.backends.extern import impl_of
from lumc.backends.simulator import workspace_bytes
from lumc.compiler.core.search import SearchResult
from lumc.compiler.runtime.program import ideal_bytes
from lumc.ir.graph import Graph


def unused_inputs(graph: Graph) -> list[str]:
    """Names of the graph inputs no output depends on (an input whose uses constant folding
    removed, such as one read only by ``Shape``), in model order."""
    reached = {id(n) for n in graph.nodes()}
    return [k for k, n in graph.inputs.items() if id(n) not in reached]


def build_report(fe, graph, programs, chosen, ck, configs, result: SearchResult, measurer, bounds,
                 target, budget_s, deadline, egraph_stats, max_err, use_egraph, db, log) -> dict:
    """The ``--report`` JSON (see the issue for the field list)."""
    per_kernel = []
    for c, k, cfg in zip(chosen.calls, ck, configs):
        t = result.kernel_times.get(k)
        per_kernel.append({
            "form": c.kernel.form, "impl": impl_of(cfg), "kernel": k, "covers": list(c.kernel.covers)[:16],
            "time_s": t, "bound_s": bounds[k], "flops": c.kernel.flops(), "bytes": c.kernel.min_bytes(),
            "workspace_bytes": workspace_bytes(c.kernel, cfg or {}),
            "pct_of_bound": (100.0 * bounds[k] / t) if t else None, "config": cfg,
            "arithmetic_intensity": c.kernel.arithmetic_intensity()})
        if k in measurer.sampled:   # its interpreter check ran a sample of its programs
            per_kernel[-1]["checked_on"] = measurer.sampled[k]
    ideal = ideal_bytes(graph, chosen)
    st = result.stats
    return {
        "model": fe.model_name, "device": target.name, "simulated": target.simulated,
        "budget_s": budget_s, "compile_s": deadline.elapsed(), "stopped_because": st.stopped_because,
        # whether e-graph candidates were searched (not only asked for: without egglog, or past
        # its share of the budget, the candidates are the greedy ones and "egraph.error" says why)
        "egraph_used": bool(use_egraph and egraph_stats.get("used")),
        "kernels": len(chosen.calls), "programs": len(programs),
        "candidate_label": chosen.label,
        # the search's counts (SearchStats): programs (above) and those pruned by bound; the
        # (kernel, config) pairs of their distinct kernels, those pruned by bound, tried
        # (candidates_compiled, configs_from_db of them read from the tuning database), rejected
        # and timed; candidates_total / candidates_pruned mix programs and pairs (older reports)
        "programs_pruned": st.programs_pruned, "distinct_kernels": st.kernels,
        "kernel_configs": st.kernel_configs, "configs_pruned": st.configs_pruned,
        "configs_from_db": st.from_db,
        "candidates_total": st.candidates_total, "candidates_pruned": st.candidates_pruned,
        "candidates_compiled": st.candidates_compiled, "candidates_timed": st.candidates_timed,
        "candidates_rejected": st.candidates_rejected, "measurements": st.measurements,
        "db_hits": measurer.db_hits, "measured": measurer.measured,
        "shared_checks": measurer.shared_checks,
        "best_time_s": result.time_s, "bound_time_s": result.bound_s,
        "bytes_moved": sum(c.kernel.min_bytes() for c in chosen.calls), "ideal_bytes": ideal,
        # what bytes_moved leaves out: partial tiles (split-K, mlp) and the intermediates of vendor
        # calls through memory (simulator.workspace_bytes)
        "workspace_bytes": sum(r["workspace_bytes"] for r in per_kernel),
        "egraph": {k: egraph_stats.get(k) for k in ("enodes", "eclasses", "saturation_s", "regions",
                                                     "used", "iterations", "stop_reasons", "error",
                                                     "extraction_s", "partition_s", "carried")},
        "max_rel_error": max_err, "warnings": list(fe.warnings), "log": log[:200],
        "form_counts": chosen.form_counts(), "per_kernel": per_kernel,
        "inputs": {k: [list(n.shape), n.dtype.name] for k, n in graph.inputs.items()},
        "outputs": {k: [list(n.shape), n.dtype.name] for k, n in graph.outputs.items()},
        # inputs that feed no output once constant folding is done: still accepted at call time
        "unused_inputs": unused_inputs(graph),
    }
