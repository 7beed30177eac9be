"""Compiling one model into several plans: explicit sizes, and ``If`` branches chosen at run time.

:func:`compile_variants` is the entry point :func:`lumc.compiler.core.pipeline.compile_model` hands
over to when one graph cannot serve every call (see ``lumc.compiler.runtime.variants`` for what a
call then does):

1. **Sizes.** Each dynamic dim (or input) given a *list* of sizes (``sequence_length=[16, 64,
   128]``) multiplies the plans: one per combination, at most :data:`MAX_VARIANTS`.
2. **Branches.** Each combination is imported. An ``If`` whose condition is known only at run time
   and whose branches cannot be one graph (:class:`~lumc.ir.errors.RuntimeIfError`) splits it in
   two: the model with that ``If``'s condition fixed to True, and to False (the ``If`` then folds
   to its branch at import). A branch that does not import at these shapes is not compiled; it is
   recorded, and a call that takes it is refused in one line saying why. The condition's own
   sub-graph (``onnx.utils.Extractor``: the nodes between the model inputs and the condition) is
   imported too, to be evaluated at call time.
3. **Budget.** What is left of the budget after the imports is split evenly over the plans still
   to compile, each a full compile (e-graph, search, checks) at its own shapes.

A size *range* (``1..512``) is not compiled here: ``lumc.compiler.core.buckets`` splits it into
size buckets, one re-sizable plan each.
"""
from __future__ import annotations

import itertools
import os
import time

import numpy as np
import onnx

from lumc.compiler.core.budget import BUDGET_KNOBS, parse_duration
from lumc.compiler.runtime.variants import VariantKey, VariantModel
from lumc.compiler.runtime.report_text import PLAN_PRECISION_FIELDS
from lumc.ir.errors import BudgetError, InputError, LumcError, RuntimeIfError

MAX_VARIANTS = 8        # plans in one artifact (sizes x branches)
MAX_FORCED_IFS = 3      # runtime Ifs split per size (2**3 branch combinations at most)
MIN_VARIANT_S = 2.0     # the least budget one plan's compile is given


def size_lists(shapes: dict | None) -> dict[str, list[int]]:
    """The dims (or inputs) given a *list* of sizes (or shapes) in ``shapes``.

    Raises:
        InputError: an empty list, or a size that is not an integer >= 0.
    """
    out = {}
    for k, v in (shapes or {}).items():
        if isinstance(v, list):
            if not v:
                raise InputError(f"--shape {k}: an empty list of sizes")
            if all(isinstance(x, (list, tuple)) for x in v):
                out[k] = [tuple(int(d) for d in x) for x in v]
                continue
            if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0
                       for x in v):
                raise InputError(f"--shape {k}: sizes must be integers >= 0, got {v!r}")
            out[k] = sorted({int(x) for x in v})
    return out


def _force_if(model: onnx.ModelProto, if_output: str, branch: bool) -> onnx.ModelProto:
    """A copy of ``model`` whose top-level ``If`` writing ``if_output`` reads a constant condition
    (it folds to that branch at import)."""
    from onnx import numpy_helper
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        if n.op_type == "If" and n.output and n.output[0] == if_output:
            name = f"__lumc_if_{if_output}_{int(branch)}"
            n.input[0] = name
            out.graph.initializer.append(numpy_helper.from_array(np.array(branch), name))
            return out
    raise KeyError(if_output)


def condition_graph(model: onnx.ModelProto, cond: str, shapes: dict):
    """The primitive graph of ``cond`` (a tensor of ``model``'s main graph) over the model inputs
    it needs: the nodes between those inputs and ``cond``, imported at ``shapes``
    (``{input: shape}``).

    Raises:
        UnsupportedOpError: ``cond`` is not computed by the main graph (an If nested in a branch).
    """
    from onnx import helper
    from lumc.compiler.frontends.onnx_frontend import import_onnx, model_input_specs
    from lumc.ir.errors import UnsupportedOpError
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    inputs = {vi.name: vi for vi in g.input if vi.name not in inits}
    keep, used_in, used_init, todo, seen = [], [], [], [cond], set()
    while todo:
        name = todo.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in inputs:
            used_in.append(inputs[name])
        elif name in inits:
            used_init.append(inits[name])
        elif name in producer:
            n = producer[name]
            if id(n) not in {id(k) for k in keep}:
                keep.append(n)
                todo.extend(n.input)
        else:
            raise UnsupportedOpError(f"the condition {cond!r} of a runtime If is not computed by "
                                     "the main graph", op="If")
    order = [n for n in g.node if any(n is k for k in keep)]
    sub = helper.make_graph(order, "condition", used_in,
                            [helper.make_tensor_value_info(cond, onnx.TensorProto.BOOL, None)],
                            used_init)
    m = helper.make_model(sub, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    names = {s.name for s in model_input_specs(m)}
    return import_onnx(m, {k: v for k, v in shapes.items() if k in names}).graph


def compile_variants(model, *, budget, shapes: dict | None, compile_one, clock=time.monotonic,
                     first_error: RuntimeIfError | None = None):
    """Compile every plan ``model`` needs (see the module docstring).

    Args:
        model: a path, bytes or ``onnx.ModelProto``.
        budget: the whole compile's budget (a DURATION or seconds).
        shapes: as for ``compile_model``; list values are the sizes to compile.
        compile_one: ``(model_bytes, budget_s, shapes) -> CompiledModel``, one ordinary compile.
        first_error: the RuntimeIfError the single-shape import already raised, if any.
    Returns:
        A :class:`~lumc.compiler.runtime.variants.VariantModel`.
    Raises:
        InputError: too many variants, or a range; BudgetError: a budget too small for them;
        the first variant's own error when no variant compiles.
    """
    from lumc.compiler.frontends.onnx_frontend import load_model
    from lumc.compiler.core.onnx_stage import resolve_dim_names, stage_frontend
    t0 = clock()
    budget_s = parse_duration(budget)
    m = load_model(model)
    src = model if isinstance(model, (bytes, bytearray)) else None
    if src is None:
        try:
            with open(model, "rb") as f:
                src = f.read()
        except (TypeError, OSError):
            src = m.SerializeToString()
    lists = size_lists(shapes)
    fixed = {k: v for k, v in (shapes or {}).items() if k not in lists}
    combos = [dict(zip(lists, vals)) for vals in itertools.product(*lists.values())] or [{}]
    if len(combos) > MAX_VARIANTS:
        raise InputError(f"--shape lists give {len(combos)} size combinations; at most "
                         f"{MAX_VARIANTS} plans fit one artifact")
    leaves, skipped = [], []
    for combo in combos:
        shp = {**fixed, **combo}
        whole = _input_shapes(m, resolve_dim_names(m, shp))

        def split(proto, forced: dict):
            try:
                stage_frontend(proto, shp, None)
            except RuntimeIfError as e:
                if e.if_output in forced or len(forced) >= MAX_FORCED_IFS:
                    raise
                for branch in (True, False):
                    try:
                        sub = _force_if(proto, e.if_output, branch)
                    except KeyError:
                        raise e from None      # an If inside a subgraph: not split here
                    f2 = {**forced, e.if_output: (branch, e.cond)}
                    try:
                        split(sub, f2)
                    except RuntimeIfError:
                        raise
                    except LumcError as err:
                        skipped.append((_key(combo, whole, f2), err.reason))
                return
            leaves.append((combo, shp, whole, forced, proto))
        try:
            split(m, {})
        except RuntimeIfError:
            raise
        except LumcError as e:
            if not combo or e.node is None:     # not a model node's: a bad name is said as is
                raise
            # a listed size the model does not take (a Split in halves at an odd size): said
            # with the size, which the model's own reason does not name
            at = ", ".join(f"{k}=" + ("x".join(map(str, v)) if isinstance(v, tuple) else str(v))
                           for k, v in combo.items())
            raise InputError(f"--shape {at}: the model does not take this listed size ({e}); "
                             "drop it from the list") from None
    if len(leaves) > MAX_VARIANTS:
        raise InputError(f"the model needs {len(leaves)} plans (sizes x runtime If branches); at "
                         f"most {MAX_VARIANTS} fit one artifact")
    if not leaves:
        if first_error is not None:
            raise first_error
        raise InputError("no variant of the model imports: " +
                         "; ".join(f"{k.describe()}: {r}" for k, r in skipped))
    conditions, done = {}, []
    for combo, shp, whole, forced, proto in leaves:
        for if_out, (_, cond) in forced.items():
            if if_out not in conditions:
                conditions[if_out] = condition_graph(m, cond, whole)
    for i, (combo, shp, whole, forced, proto) in enumerate(leaves):
        left = budget_s - (clock() - t0)
        share = left / (len(leaves) - i)
        if share < MIN_VARIANT_S:
            raise BudgetError(f"budget {budget_s:g} s leaves {max(left, 0):.1f} s for "
                              f"{len(leaves) - i} more plans ({MIN_VARIANT_S:g} s each at least); "
                              f"give a larger budget ({BUDGET_KNOBS})")
        cm = compile_one(proto.SerializeToString() if forced else src, share, shp)
        cm.source_onnx = src
        done.append((_key(combo, whole, forced), cm))
    name = os.path.basename(str(model)) if isinstance(model, (str, os.PathLike)) else "model"
    for _, cm in done:
        cm._report["model"] = name
    report = _combined_report(done, skipped, budget_s, clock() - t0)
    return VariantModel(done, conditions, skipped, report, src)


def _input_shapes(m: onnx.ModelProto, resolved: dict) -> dict:
    """``{input: shape}`` of every model input: ``resolved`` for those with dynamic dims, the
    declared shape for the static ones."""
    from lumc.compiler.frontends.onnx_frontend import model_input_specs
    out = {}
    for spec in model_input_specs(m):
        if spec.name in resolved:
            out[spec.name] = tuple(resolved[spec.name])
        elif all(isinstance(d, int) for d in spec.shape):
            out[spec.name] = tuple(spec.shape)
    return out


def _key(combo: dict, whole: dict, forced: dict) -> VariantKey:
    return VariantKey({k: v for k, v in combo.items() if isinstance(v, int)},
                      {k: tuple(v) for k, v in whole.items()},
                      {k: b for k, (b, _) in forced.items()})


def _combined_report(done: list, skipped: list, budget_s: float, compile_s: float) -> dict:
    first = done[0][1].report_dict()
    times = [cm.report_dict().get("best_time_s") for _, cm in done]
    return {
        "model": first.get("model"), "device": first.get("device"),
        "simulated": first.get("simulated"), "budget_s": budget_s, "compile_s": compile_s,
        "kernels": first.get("kernels"), "best_time_s": first.get("best_time_s"),
        "bound_time_s": first.get("bound_time_s"), "per_kernel": first.get("per_kernel", []),
        # the compile's workers, counted over every plan (the last plan's report has them all)
        "workers": done[-1][1].report_dict().get("workers"),
        "warnings": list(dict.fromkeys(        # each plan's notes, once (buckets repeat them)
            w for _, cm in done for w in cm.report_dict().get("warnings", []))),
        "variants": [{"key": k.as_json(), "describe": k.describe(),
                      "best_time_s": t, **{f: cm.report_dict().get(f) for f in (
                          "kernels", "bound_time_s", "bytes_moved", "compile_s",
                          "stopped_because", "max_rel_error") + PLAN_PRECISION_FIELDS}}
                     for (k, cm), t in zip(done, times)],
        "not_compiled": [{"key": k.as_json(), "describe": k.describe(), "reason": r}
                         for k, r in skipped],
    }
