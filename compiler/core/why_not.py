"""Why two kernels stayed separate (``lumc inspect ART --why-not``), after Inductor's ``WhyNoFuse``.

For every value one kernel of the chosen program writes and another reads, one entry names both
kernels, the value, and the reasons they are not one kernel:

* **fusion**: the greedy fusion decision that wrote the value to memory (``lumc.compiler.core.fusion``
  logs one line per refused fusion; here it is matched to the value and said in kernel terms);
* **rule**: which e-graph rule would have had to match for the pair to be one kernel form, and
  whether lumc has one (the pairs of forms that no rule joins are listed in :data:`NO_RULE`);
* **bound**: the e-graph candidates with fewer kernels than the chosen one and the roofline bound
  (or time) they lost by, once per program (they are whole-program alternatives).

The entries are computed at compile time, when the program's nodes and notes are at hand, and
stored in the report (``why_not``, ``why_not_candidates``), so an artifact explains itself.
"""
from __future__ import annotations

import re

from lumc.compiler.core.fusion import CHEAP_OPERAND_OPS
from lumc.compiler.core.fusion_rows import ROWS_REFUSAL, ROWS_UNPLANNED
from lumc.backends.triton.contraction import same_iteration, tensor_core_contractions
from lumc.ir.graph import Node

_QK_NORM = ("a per-head norm (QK-norm) is formed in the attention kernel that reads it only over "
            "the head dim and only through elementwise ops and row-keeping views; the keys' and "
            "values' only in the '+kv-prologue' candidates (it lost on bound or time), and a norm "
            "over all heads (OLMo-2) never")
_NESTED_NORM = ("a norm read inside another norm's kernel (a sandwich norm's residual sum) is formed "
                "on load there in the '+norm-on-load' candidates when both reduce the same rows, "
                "one deep: the inputs of a norm so formed are written (the residual stream once "
                "per layer); here it was one of those, read across rows, or the candidate lost on "
                "bound or time")
NO_RULE = {
    ("rmsnorm", "rmsnorm"): _NESTED_NORM,
    ("layernorm", "layernorm"): _NESTED_NORM,
    ("rmsnorm", "layernorm"): _NESTED_NORM,
    ("layernorm", "rmsnorm"): _NESTED_NORM,
    ("layernorm", "matmul"): "the normalization formed on load in the contractions that read it "
                             "(the '+norm-prologue' and '+norm-on-load' candidates) was not "
                             "chosen: it lost on bound or time (candidates below), or the value "
                             "has another reader",
    ("rmsnorm", "matmul"): "the RMSNorm formed on load in the contractions that read it (the "
                           "'+norm-prologue' and '+norm-on-load' candidates) was not chosen: it "
                           "lost on bound or time, or the value has another reader",
    ("matmul", "layernorm"): "no kernels rule offers residual add + LayerNorm as a whole-row "
                             "epilogue of the contraction before it (post-LN); the norm is formed "
                             "on load in the contractions that read it instead ('+norm-on-load'), "
                             "only where every reader is one and it is not a model output",
    ("matmul", "rmsnorm"): "no kernels rule offers (residual add +) RMSNorm as a whole-row "
                           "epilogue of the contraction before it; the norm is formed on load in "
                           "the contractions that read it instead ('+norm-prologue', "
                           "'+norm-on-load'), only where every reader is one and it is not a "
                           "model output (a decoder's final norm is)",
    ("gather", "layernorm"): "the embedding gather + add is the layer norm's prologue only when "
                             "the norm is its one reader; here the sum is read elsewhere too",
    ("pointwise", "attention"): "an elementwise key or value (RoPE's rotated keys) is computed in "
                                "the attention kernel only by the '+kv-prologue' candidates "
                                "(once per query block): it lost on bound or time (candidates "
                                "below), or the expression is longer than the fusion recomputes",
    ("rmsnorm", "attention"): _QK_NORM,
    ("layernorm", "attention"): _QK_NORM,
    ("matmul", "attention"): "the attention form reads q, k and v from memory (columns of the "
                             "projection's output): no rule makes a contraction its prologue",
    ("attention", "matmul"): "no rule fuses attention with the output projection that reads it "
                             "(heads merged through a view)",
    ("matmul", "matmul"): "the mlp form (the '+mlp' candidates) computes a contraction's "
                          "elementwise epilogue on chip in the next contraction's kernel when "
                          "that contraction is its one reader (an MLP's up-projection, "
                          "activation and down-projection): it lost on bound or time "
                          "(candidates below), or the chain does not fit the form (batch dims, "
                          "another reader, a squeezed batch-of-one spelling)",
    ("layernorm", "reduction"): "no rule fuses a layer norm into the contraction or reduction "
                                "after it",
}

_REASONS = {
    "read through a view (broadcast back)":
        "the consumer reads it through a broadcast view (a row value read back over its rows, or "
        "a contraction operand): a reduction kernel's epilogue is elementwise over its own "
        f"result, and an operand must be in memory or a prologue of at most {CHEAP_OPERAND_OPS} "
        "elementwise ops",
    ROWS_REFUSAL:
        "the '+rows' candidates compute this row value and the values that read it back over "
        "its rows in one row kernel",
    "SumReduce is not an elementwise epilogue":
        "its consumer is a reduction over it, and an epilogue is elementwise only",
    "contraction operand is not a cheap prologue":
        f"a contraction operand longer than {CHEAP_OPERAND_OPS} elementwise ops would be "
        "recomputed per output column, so it is written",
}

_NOTE = re.compile(r"^no fusion %(\d+):(\w+)(?: -> %(\d+):(\w+))?: (.*)$")


def _fusion_reason(value, notes: dict[int, list[str]]) -> str:
    reasons = notes.get(value.id)
    if not reasons:
        return "written as a kernel output (the producer is a kernel form whose output is its root)"
    return "; ".join(_REASONS.get(r, r) for r in dict.fromkeys(reasons))


def _as_operand(call, value) -> bool:
    """``call`` reads ``value`` only inside its contractions' left operands (what pre-LN fusion
    forms on load), not as a residual or another epilogue input."""
    from lumc.backends.triton.contraction import find_contractions
    k = next((i for i, n in enumerate(call.inputs) if n is value), None)
    if k is None:
        return False
    ph = call.kernel.meaning.inputs.get(f"in{k}")
    nodes = call.kernel.meaning.nodes()
    inside = _upstream([c.a for c in find_contractions(nodes)])
    readers = [n for n in nodes if any(s is ph for s in n.srcs)]
    return bool(readers) and all(id(n) in inside for n in readers)


def _upstream(roots) -> set[int]:
    """The ids of ``roots`` and of every node they read, transitively."""
    inside, stack = set(), list(roots)
    while stack:
        x = stack.pop()
        if id(x) not in inside:
            inside.add(id(x))
            stack.extend(x.srcs)
    return inside


def _read_in_epilogue(call, value) -> bool:
    """``call`` (a matmul or mlp kernel) reads ``value`` only after its tensor-core contractions
    (a residual add or another epilogue input), never inside either operand of one."""
    k = next((i for i, n in enumerate(call.inputs) if n is value), None)
    if k is None or call.kernel.form not in ("matmul", "mlp"):
        return False
    ph = call.kernel.meaning.inputs.get(f"in{k}")
    nodes = call.kernel.meaning.nodes()
    inside = _upstream([x for c in tensor_core_contractions(nodes) for x in (c.a, c.b)])
    readers = [n for n in nodes if any(s is ph for s in n.srcs)]
    return bool(readers) and not any(id(n) in inside for n in readers)


def _epilogue_rule(program, i: int, j: int, v) -> str:
    """Why a contraction's output ``v`` (kernel ``i``) that kernel ``j`` reads in its epilogue (a
    residual) is written."""
    others = [k for k, c in enumerate(program.calls)
              if k not in (i, j) and any(n is v for n in c.inputs)]
    also = (f"; #{', #'.join(map(str, others))} also read{'s' * (len(others) == 1)} it, so it is "
            "written once for all its readers" if others else "")
    return (f"#{j} reads it in its epilogue (a residual add), not as a contraction operand: no "
            "kernels rule computes a contraction inside another contraction's epilogue (two "
            f"accumulators over different reductions into one output tile){also}")


def _norm_rule(program, i: int, v, default: str, on_load_built: bool) -> str:
    """Why a normalization's output ``v`` (kernel ``i``) was written though a contraction reads it:
    a reader that no contraction forms it in (not its operand nor its epilogue), a residual reader
    (post-LN fusion lost, or did not apply: ``on_load_built`` says whether a '+norm-on-load'
    program other than this one was among the candidates), else the search."""
    for j, c in enumerate(program.calls):
        if j != i and any(n is v for n in c.inputs) and not _as_operand(c, v):
            if c.kernel.form in ("layernorm", "rmsnorm"):
                return (f"#{j} ({c.kernel.form}) also reads it: a norm read inside another norm's "
                        "kernel is formed on load there only over the same rows and one deep "
                        "(a norm whose own input is formed on load that way is written: the "
                        "residual stream once per layer), in the '+norm-on-load' candidates")
            if c.kernel.form not in ("matmul", "mlp"):
                return (f"a norm is formed on load only where every reader is a contraction's "
                        f"operand or epilogue; #{j} ({c.kernel.form}) also reads it, so it is "
                        "written")
            if not on_load_built:
                return (f"#{j} (matmul) also reads it, not as its left operand: post-LN fusion "
                        "('+norm-on-load') made no other program, so some reader of it is no "
                        "contraction operand or epilogue it can be formed in (read through a "
                        "view that moves elements, or by a batched contraction)")
            return (f"#{j} (matmul) also reads it in its epilogue (a residual, post-LN): the "
                    "'+norm-on-load' candidates form it there too, and they lost on bound or "
                    "time (candidates below)")
    return default


def _normalizes_on_load(call, value) -> bool:
    """``call`` is a matmul (or mlp) kernel that computes row statistics of ``value`` (a
    normalization of it formed on load, ``norm_prologue`` / ``norm_epilogue``)."""
    if call.kernel.form not in ("matmul", "mlp"):
        return False
    k = next((i for i, n in enumerate(call.inputs) if n is value), None)
    if k is None:
        return False
    ph = call.kernel.meaning.inputs.get(f"in{k}")
    nodes = call.kernel.meaning.nodes()
    reds = [n for n in nodes if n.op in ("SumReduce", "MaxReduce")]
    main = max((n for n in reds if n.srcs[0].op == "Mul"), key=lambda n: n.srcs[0].numel,
               default=None)
    mains = {id(main)} if call.kernel.form == "matmul" else \
        {id(c.node) for c in tensor_core_contractions(nodes)}
    dep = {id(ph)}
    for n in nodes:
        if any(id(s) in dep for s in n.srcs):
            dep.add(id(n))
    return any(id(n) in dep and id(n) not in mains for n in reds)


def _reads_row_values(program, call, value) -> bool:
    """``call`` (a matmul) normalizes ``value`` with row values another matmul kernel wrote (its
    outputs after the first): an elementwise op of its meaning reads both, before any reduction."""
    if call.kernel.form != "matmul":
        return False
    extra = {id(o) for c in program.calls if c.kernel.form == "matmul" for o in c.outputs[1:]}
    ph = {id(n): call.kernel.meaning.inputs.get(f"in{k}") for k, n in enumerate(call.inputs)}
    rows = [ph[id(n)] for n in call.inputs if id(n) in extra]
    if not rows or id(value) not in ph:
        return False
    nodes = call.kernel.meaning.nodes()

    def reach(src) -> set[int]:
        out = {id(src)}
        for n in nodes:
            if n.op not in ("SumReduce", "MaxReduce") and any(id(s_) in out for s_ in n.srcs):
                out.add(id(n))
        return out
    mine = reach(ph[id(value)])
    return any(mine & reach(r) for r in rows)


POST_LN_SUM = ("the sum a normalization reads (post-LN): its row statistics need whole rows, which "
               "one output tile does not hold, so the sum is written and normalized on load in "
               "the next contractions ('+norm-on-load'); no kernels rule makes residual add + "
               "LayerNorm a whole-row epilogue of the contraction before it")


def _paired(call) -> bool:
    """``call`` is a paired matmul: two tensor-core products of one left operand
    (``same_iteration``)."""
    cs = tensor_core_contractions(call.kernel.meaning.nodes())
    return len(cs) == 2 and same_iteration(cs[0], cs[1])


PAIRED_CHAIN = ("the producer is a paired matmul (two products of one left operand, a gated MLP's "
                "gate and up): the mlp form chains one up-projection into the next contraction, "
                "no kernel form chains a paired one, so its product (silu(gate) * up) is written "
                "and read back by the down-projection")


def _row_values_rule(program, i: int, v) -> str | None:
    """The row statistics a kernel that forms a normalization on load writes for the others."""
    call = program.calls[i]
    if call.kernel.form == "matmul" and len(call.outputs) > 1 and v is not call.outputs[0]:
        return ("row values of a normalization formed on load (M values): the first kernel that "
                "forms it computes the row statistics and writes them, the others read them "
                "instead of re-reading whole rows")
    return None


def _rows_rule(reasons: list[str], rows_built: bool) -> str | None:
    """Why a row value read back over its rows was written (``fusion_rows``): the '+rows'
    candidates lost, were not kept, or no row kernel plans the group (its reason)."""
    for r in reasons:
        if r.startswith(ROWS_UNPLANNED):
            return ("no row kernel computes the reductions over these rows with their readers: "
                    + r[len(ROWS_UNPLANNED):])
    if any(ROWS_REFUSAL in r for r in reasons):
        if rows_built:
            return ("the '+rows' candidates compute the reductions over these rows and the "
                    "values that read them back in one row kernel: they lost on bound or time "
                    "(candidates below)")
        return ("a '+rows' twin of this program computes the reductions over these rows and "
                "their readers in one row kernel; it was not among the candidates searched")
    return None


def _in_row_group(program, value, call) -> bool:
    """``call`` writes a member of a row group that holds ``value`` (``fusion_rows``): a '+rows'
    candidate computes both in one row kernel. True where the program does not record its row
    groups (``Program.row_groups`` None)."""
    groups = program.row_groups
    if groups is None:
        return True
    outs = {n.id for n in call.outputs}
    return any(value.id in g and not outs.isdisjoint(g) for g in groups)


def why_not(program, candidates: list | None = None, bounds: list | None = None,
            times: list | None = None, chosen_time: float | None = None,
            simulated: bool = True) -> dict:
    """``{"pairs": [...], "candidates": [...]}`` for a chosen ``program`` (see the module
    docstring); ``candidates``/``bounds``: the e-graph's programs and roofline bounds (seconds);
    ``times``: each candidate's program time as the search measured it (seconds, the sum of its
    kernels' best times; None where it was never timed) and ``chosen_time`` the chosen program's;
    ``simulated``: those times come from the simulator (a ``sim:`` device), as the lines say."""
    notes: dict[int, list[str]] = {}
    for line in program.notes:
        m = _NOTE.match(line)
        if m:
            notes.setdefault(int(m.group(1)), []).append(m.group(5))
    made = {}
    for i, c in enumerate(program.calls):
        for n in c.outputs:
            made[id(n)] = (i, n)
    pairs = []
    on_load_built = any(p is not program and p.label.endswith("+norm-on-load")
                        for p in candidates or [])
    rows_built = any(p is not program and p.label.endswith("+rows") for p in candidates or [])
    for j, c in enumerate(program.calls):
        # one entry per producer and kind of value: its main output, or row values it writes
        read: dict[tuple[int, bool], Node] = {}
        for n in c.inputs:
            if id(n) in made:
                i, v = made[id(n)]
                key = (i, _row_values_rule(program, i, v) is not None)
                if key not in read or (v is program.calls[i].outputs[0]):
                    read[key] = v
        for (i, _), v in sorted(read.items()):
            a, b = program.calls[i].kernel.form, c.kernel.form
            rule = NO_RULE.get((a, b), f"no kernels rule joins a {a} kernel and the {b} kernel "
                                       "that reads it")
            if b == "matmul" and a in ("layernorm", "rmsnorm"):
                rule = _norm_rule(program, i, v, rule, on_load_built)
            vnotes = notes
            if not _in_row_group(program, v, c):   # a '+rows' candidate does not join these two
                vnotes = {v.id: [r for r in notes.get(v.id, []) if ROWS_REFUSAL not in r
                                 and not r.startswith(ROWS_UNPLANNED)]}
            rule = _row_values_rule(program, i, v) or _rows_rule(vnotes.get(v.id, []),
                                                                  rows_built) or rule
            fusion = _fusion_reason(v, vnotes)
            if a == "matmul" and _normalizes_on_load(c, v):
                rule, fusion = POST_LN_SUM, "written: the consumer computes its row statistics"
            elif a == "matmul" and v is program.calls[i].outputs[0] and _reads_row_values(
                    program, c, v):
                rule, fusion = POST_LN_SUM, ("written: the consumer normalizes it on load with "
                                             "the row values another kernel wrote")
            elif a in ("matmul", "mlp") and v is program.calls[i].outputs[0] and \
                    _read_in_epilogue(c, v):
                rule = _epilogue_rule(program, i, j, v)
            elif (a, b) == ("matmul", "matmul") and _paired(program.calls[i]):
                rule = PAIRED_CHAIN
            pairs.append({
                "producer": i, "consumer": j, "producer_form": a, "consumer_form": b,
                "value": f"{v.dtype.name}[{', '.join(map(str, v.shape))}]",
                "fusion": fusion,
                "rule": rule})
    cands = []
    if candidates and bounds:
        mine = len(program.calls)
        chosen_bound = next((bd for p, bd in zip(candidates, bounds) if p is program), None)
        for i, (p, bd) in enumerate(zip(candidates, bounds)):
            if p is not program and len(p.calls) < mine:
                cands.append({"label": p.label, "kernels": len(p.calls), "bound_s": bd,
                              "chosen_bound_s": chosen_bound,
                              "time_s": times[i] if times is not None else None,
                              "chosen_time_s": chosen_time})
    # how many candidates were compared (0: none were given, e.g. without the e-graph)
    return {"pairs": pairs, "candidates": cands, "compared": len(candidates or []) if bounds else 0,
            "times": "simulated" if simulated else "measured"}


def why_not_lines(doc: dict, first: int = 0, last: int | None = None) -> list[str]:
    """Text lines of a stored ``why_not`` document, for kernels ``first..last``."""
    out = []
    for e in doc.get("pairs", []):
        if e["producer"] < first or (last is not None and e["consumer"] > last):
            continue
        out.append(f"#{e['producer']} {e['producer_form']} -> #{e['consumer']} "
                   f"{e['consumer_form']} ({e['value']}): not one kernel")
        out.append(f"    fusion: {e['fusion']}")
        out.append(f"    rule:   {e['rule']}")
    if doc.get("compared") and not doc.get("candidates") and first == 0 and last is None:
        out.append(f"candidates: none of the {doc['compared']} e-graph candidates had fewer "
                   "kernels than the chosen program")
    for c in doc.get("candidates", []):
        out.append(f"candidate {c['label']} ({c['kernels']} kernel{'s' * (c['kernels'] != 1)}) "
                   f"{_lost_by(c, doc.get('times', 'measured'))}")
    return out


def _lost_by(c: dict, times: str) -> str:
    """How a fewer-kernel candidate lost: its measured time against the chosen program's where
    both were timed, else its bound (a document stored before times were kept has bounds only)."""
    cb, t, ct = c.get("chosen_bound_s"), c.get("time_s"), c.get("chosen_time_s")
    bound = f"bound {c['bound_s'] * 1e6:.1f} us" + (
        f" against the chosen {cb * 1e6:.1f} us" if cb is not None else "")
    if t is not None and ct is not None and t < ct:   # the top programs' re-timing (a GPU's)
        return (f"not chosen: {t * 1e6:.1f} us {times} at its last timing, against the chosen "
                f"{ct * 1e6:.1f} us when the top 3 were re-timed, which it was not among ({bound})")
    if t is not None and ct is not None:
        return (f"lost on time: {t * 1e6:.1f} us {times} against the chosen {ct * 1e6:.1f} us "
                f"({bound})")
    if cb is not None and c["bound_s"] > cb:
        return f"lost on bound: {bound}"
    if "time_s" in c:      # stored with times: this one was never timed
        return f"not timed before the search stopped: {bound}"
    return f"lost on time: {bound}"
