"""The compiled module against PyTorch eager, on the example inputs, once per compile.

Every kernel lumc chooses is checked against the reference executor's values of the lowered graph;
that cannot see a lowering that means something other than the module does (SDPA's fully masked
rows once came back NaN where PyTorch gives 0, and every check passed). So a compile of a module
also runs the module itself on the example inputs and compares outputs:

* ``max_rel_error``: over tensor outputs, ``max |got - want| / max |want|`` on the positions both
  hold finite values (float64 arithmetic);
* ``nonfinite_mismatch``: positions where one side is NaN or +-inf and the other is not the same
  (NaN matches NaN, inf its own sign);
* ``exact_mismatch``: integer and bool elements that differ, but for an ArgMax/ArgMin index of a
  reduced-precision compile at a near-tie of its fp32 scores (counted in ``near_ties``), which the
  quality gate accepts too (``lumc.compiler.core.precision.near_ties``);
* ``passed``: no mismatch and each float output within the precision policy's tolerance
  (``PrecisionPolicy.rtol``: 1e-4 for fp32, larger for reduced precision, whose quality the gate
  measures separately), or 8 ulp of its own dtype when that is larger (a bf16 module).

Eager is taken as the truth: an output that is pure rounding noise in eager (a catastrophic
cancellation lumc computes exactly) is reported as a difference.

A failure is reported (``report_dict()["eager_check"]``, ``f.report()``) and warned about
(``LumcNumericsWarning``); the compiled module is still returned, since the example may exercise a
case the user accepts (a module that is not deterministic). Outputs that are not tensors are
skipped. The module runs under ``torch.no_grad`` in whatever train/eval mode it was given.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils import _pytree as pytree

from lumc.ir.errors import LumcNumericsWarning  # noqa: F401  (defined torch-free: lumc exports it)


def compare(want, got, rtol: float, ties: list | None = None) -> dict:
    """The check of ``got`` (the compiled outputs) against ``want`` (eager's), same structure.

    Float outputs: relative error on finite positions against ``max(rtol, 8 eps)`` of the output's
    dtype (a bf16 module's outputs are rounded to bf16 in both: 8 ulp is 0.06, as 2 roundings of
    each of a few ops); NaN/inf positions must agree. Integer and bool outputs must be equal.
    Returns ``{"max_rel_error", "nonfinite_mismatch", "exact_mismatch", "outputs", "passed",
    "rtol"}`` (``max_rel_error`` over the float outputs and ``rtol`` the tolerance of the output
    it was met at, ``max(rtol, 8 eps)``: what the report prints beside it; ``passed`` when every
    output is within its own tolerance); an output whose shape differs counts all its positions as
    mismatched.
    ``ties``: per leaf, None or an index output's ``(fp32 scores, axis, largest, keepdims)``."""
    from lumc.compiler.core.precision import near_ties
    wl, gl = pytree.tree_leaves(want), pytree.tree_leaves(got)
    worst, bad, exact, n, ok, n_ties = 0.0, 0, 0, 0, True, 0
    worst_tol = rtol
    for j, (w, g) in enumerate(zip(wl, gl)):
        if not isinstance(w, torch.Tensor) or w.dtype.is_complex:
            continue
        n += 1
        g = torch.as_tensor(g).detach().cpu()
        w = w.detach().cpu()
        if w.shape != g.shape:
            bad += max(w.numel(), 1)
            continue
        if not w.dtype.is_floating_point:
            differ = int((w != g.to(w.dtype)).sum())
            tie = ties[j] if ties is not None and j < len(ties) else None
            if differ and tie is not None:
                t = near_ties(g.numpy(), w.numpy(), tie[0], tie[1], tie[3], rtol)
                differ, n_ties = differ - t, n_ties + t
            exact += differ
            continue
        tol = max(rtol, 8 * torch.finfo(w.dtype).eps)
        w, g = w.to(torch.float64), g.to(torch.float64)
        fw, fg = torch.isfinite(w), torch.isfinite(g)
        same = (torch.isnan(w) & torch.isnan(g)) | (~fw & ~fg & (w == g))
        bad += int(((fw != fg) | (~fw & ~fg & ~same)).sum())
        both = fw & fg
        if both.any():
            scale = float(w[both].abs().max())
            err = float((w[both] - g[both]).abs().max())
            rel = err / scale if scale > 0 else err
            if rel >= worst:
                worst, worst_tol = rel, tol
            ok = ok and rel <= tol
    return {"max_rel_error": worst, "nonfinite_mismatch": bad, "exact_mismatch": exact,
            "outputs": n, "near_ties": n_ties, "rtol": worst_tol,
            "passed": ok and bad == 0 and exact == 0}


def check_against_eager(module: torch.nn.Module, args: tuple, kwargs: dict, got, rtol: float,
                        source: str = "", ties: list | None = None) -> dict:
    """Run ``module`` eagerly, compare (:func:`compare`, ``ties`` per output leaf), warn on a
    failure; never raises for a module that fails to run eagerly a second time
    (``{"skipped": reason}``)."""
    try:
        with torch.no_grad():
            want = module(*args, **kwargs)
    except Exception as e:   # the module ran when captured; a second run may consume state
        return {"skipped": f"the module did not run eagerly again: {type(e).__name__}: {e}"}
    res = compare(want, got, rtol, ties)
    if not res["passed"]:
        warnings.warn(f"lumc: {source or type(module).__name__}: the compiled module differs from "
                      f"PyTorch eager on the example inputs: max rel error "
                      f"{res['max_rel_error']:.3g} (tolerance {res['rtol']:g}), "
                      f"{res['nonfinite_mismatch']} positions NaN/inf on one side only, "
                      f"{res['exact_mismatch']} integer/bool elements unequal",
                      LumcNumericsWarning, stacklevel=_outside_lumc())
    return res


def _outside_lumc() -> int:
    """The ``stacklevel`` of the first caller outside lumc (the user's ``lumc.compile`` line)."""
    root = Path(__file__).resolve().parents[2]
    ours = tuple(str(root / d) + "/" for d in ("compiler", "ir", "rewrites", "backends"))
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(ours):
        frame, level = frame.f_back, level + 1
    return level


def range_sizes_to_check(program, vm, example_leaves: list) -> list[dict]:
    """``[{sym: size}]`` a range compile is checked against eager at: the example's sizes, then
    each size bucket's smallest and largest (its other dims at the example's), each once.
    ``program``: the ``CapturedProgram``; ``vm``: its ``VariantModel``."""
    import sympy
    example = {}
    for slot, leaf in zip(program.inputs, example_leaves):
        if slot.dims is None or not isinstance(leaf, torch.Tensor):
            continue
        for d, n in zip(slot.dims, leaf.shape):
            for sym, info in program.dims.items():   # the dim itself, or a Dim as step * d
                if isinstance(d, sympy.Expr) and d == info.step * sym:
                    example[sym] = int(n) // info.step
    by_name = {info.name: sym for sym, info in program.dims.items()}
    out = [example]
    for key, _ in vm.variants:
        for end in (0, 1):
            env = dict(example)
            env.update({by_name[k]: int(r[end]) // program.dims[by_name[k]].step
                        for k, r in key.ranges.items() if k in by_name})
            if env not in out:
                out.append(env)
    return out


def check_range_against_eager(module: torch.nn.Module, program, vm, args: tuple, kwargs: dict,
                              rtol: float, source: str = "", policy=None) -> dict:
    """A size-range compile (``dynamic_shapes=``) against PyTorch eager: at each of
    :func:`range_sizes_to_check`, the module and ``vm`` run on the same inputs (the example's own
    at its sizes; elsewhere N(0, 1) floats, integers drawn like the example's, as the buckets'
    checks draw them: ``lumc.compiler.frontends.models.random_inputs``), compared by
    :func:`compare`. A size the module does not run at eagerly is listed in ``skipped_sizes``.

    Returns:
        :func:`compare`'s fields over all sizes (the worst error, the summed counts; ``passed``
        when every size passed), with ``sizes``: ``[{dim name: size}]`` in order. Warns
        (``LumcNumericsWarning``) once, naming the sizes that failed.
    """
    from lumc.compiler.core.precision_gate import index_ties
    from lumc.compiler.frontends.models import random_inputs
    from lumc.compiler.frontends.torch_frontend.capture import int_examples
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    ints = int_examples(program.inputs, leaves)
    names = {sym: info.name for sym, info in program.dims.items()}
    total = {"max_rel_error": 0.0, "nonfinite_mismatch": 0, "exact_mismatch": 0, "outputs": 0,
             "near_ties": 0, "rtol": rtol, "passed": True, "sizes": []}
    failed, skipped = [], []
    for i, env in enumerate(range_sizes_to_check(program, vm, leaves)):
        where = {names[s]: v * program.dims[s].step for s, v in env.items() if s in names}
        text = ", ".join(f"{k}={v}" for k, v in where.items())
        new = list(leaves)
        if i:   # other sizes: drawn inputs
            slots = [(j, s) for j, s in enumerate(program.inputs)
                     if s.dims is not None and isinstance(leaves[j], torch.Tensor)]
            shapes = {s.name: tuple(int(d) if isinstance(d, int) else int(d.xreplace(env))
                                    for d in s.dims) for _, s in slots}
            drawn = random_inputs(shapes, {s.name: np.float32 if s.dtype.is_float else s.dtype.np
                                           for _, s in slots}, seed=i, examples=ints)
            for j, s in slots:
                new[j] = torch.from_numpy(drawn[s.name]).to(dtype=leaves[j].dtype,
                                                            device=leaves[j].device)
        a, kw = pytree.tree_unflatten(new, spec)
        try:
            with torch.no_grad():
                want = module(*a, **kw)
        except Exception as e:
            skipped.append(f"{text} (the module does not run there eagerly: "
                           f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            continue
        got = vm(*a, **kw)
        ties = None
        if policy is not None and policy.reduced:
            feed = {s.name: new[j].detach().cpu().numpy() for j, s in enumerate(program.inputs)
                    if s.dims is not None and isinstance(new[j], torch.Tensor)}
            ties = index_ties(vm.select(feed).graph, feed, program.output_names, policy)
        res = compare(want, got, rtol, ties)
        total["sizes"].append(where)
        if res["max_rel_error"] >= total["max_rel_error"]:
            total["max_rel_error"], total["rtol"] = res["max_rel_error"], res["rtol"]
        for k in ("nonfinite_mismatch", "exact_mismatch", "near_ties"):
            total[k] += res[k]
        total["outputs"] = res["outputs"]
        if not res["passed"]:
            total["passed"] = False
            failed.append(f"{text} (max rel error {res['max_rel_error']:.3g}, tolerance "
                          f"{res['rtol']:g}, "
                          f"{res['nonfinite_mismatch']} NaN/inf, {res['exact_mismatch']} "
                          "integer/bool unequal)")
    if skipped:
        total["skipped_sizes"] = skipped
    if not total["sizes"]:
        return {"skipped": "; ".join(skipped)}
    if failed:
        warnings.warn(f"lumc: {source or type(module).__name__}: the compiled module differs from "
                      "PyTorch eager at " + "; ".join(failed),
                      LumcNumericsWarning, stacklevel=_outside_lumc())
    return total
