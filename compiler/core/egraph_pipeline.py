"""The e-graph stage of the pipeline: regions -> saturation -> candidate programs.

    graph ──► partition (regions) ──► encode ──► saturate (rule schedule, limits)
          ──► choose (roofline tree cost) + structural alternatives ──► decode to IR
          ──► greedy fusion around the chosen forms ──► Program ──► rank by roofline bound

:func:`egraph_candidates` returns the top K distinct programs by estimated time (the sum of the
roofline bounds of their kernels on a named device) and the statistics of every region.
:func:`compile_program` is the switch the CLI's ``--no-egraph`` turns off: without the e-graph the
same pipeline runs greedy fusion only.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import re
import threading
import time
from dataclasses import dataclass, field

from lumc.backends.devices import DeviceSpec, get_device
from lumc.ir.graph import Graph, Node
from lumc.ir.ops import ELEMENTWISE
from lumc.rewrites.language import FORMS, OP_OF_CTOR, Encoder, Tables, constructors
from lumc.rewrites.schedule import Limits, RunStats, Saturator, total_stats

from lumc.compiler.core.extract import (CostModel, EGraphView, FormRecord, alternatives, choose,
                                   decode)
from lumc.compiler.core import egraph_engines
from lumc.compiler.core.constfold import fold_constants
from lumc.compiler.core.fusion import KV_PROLOGUE_REFUSAL, ROWS_REFUSAL, greedy_program
from lumc.compiler.core.fusion_attention import ATTENTION_REFUSAL
from lumc.compiler.core.fusion_chain import MLP_REFUSAL
from lumc.compiler.core.partition import Region, partition
from lumc.compiler.runtime.program import Program, program_time_bound

log = logging.getLogger("lumc.egraph")


@dataclass
class RegionResult:
    region: Region
    view: EGraphView
    roots: list[str]             # e-class of each region root, in region.roots order
    pick: dict[str, int]
    best: dict[str, float]
    alts: list
    original: dict[str, int]     # the e-node each inserted term had (the identity extraction)
    stats: RunStats
    model_classes: dict = field(default_factory=dict)   # {id(model node): e-class}


@dataclass
class EGraphResult:
    """Candidates (best first) and statistics."""
    candidates: list[Program]
    bounds: list[float]
    regions: list[RunStats]
    total: RunStats
    seconds: dict = field(default_factory=dict)     # {stage: seconds}
    # {id(node of the graph saturated): (region, e-class)}: the keys of ``Program.value_keys``
    model_keys: dict = field(default_factory=dict)

    @property
    def best(self) -> Program:
        return self.candidates[0]


def _dominant_itemsize(graph: Graph) -> tuple[int, str]:
    best = {}
    for n in graph.nodes():
        if n.dtype.is_float:
            best[n.dtype] = best.get(n.dtype, 0) + n.numel
    if not best:
        return 4, "f32"
    d = max(best, key=best.get)
    return d.itemsize, d.name


_SATURATORS: dict[tuple, Saturator] = {}     # the main thread's engines (others: egraph_engines)


def saturator(limits: Limits) -> Saturator:
    """A loaded engine for these limits (parsing the rules once per thread: an egglog ``EGraph``
    is bound to its thread, :mod:`lumc.compiler.core.egraph_engines`; regions run between
    ``push`` and ``pop``)."""
    key = (limits.domain, limits.fast_math)   # the loaded rules depend on these; the rest is per run
    engines = _SATURATORS if threading.current_thread() is threading.main_thread() \
        else egraph_engines.thread_engines()
    if key not in engines:
        with egraph_engines.building():
            engines[key] = Saturator(limits)
    sat = engines[key]
    sat.limits = limits
    return sat


class EGraphDeadline(Exception):
    """The e-graph stage's deadline passed (raised between regions or candidate decodes, so the
    overrun is at most one region's work); the caller falls back to greedy candidates."""


def _check_deadline(deadline: float | None, what: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise EGraphDeadline(what)


def saturate_regions(graph: Graph, limits: Limits, max_region_ops: int, cost: CostModel,
                     deadline: float | None = None,
                     timing: dict | None = None) -> tuple[list[RegionResult], Tables]:
    """Saturate and extract each region of ``graph``; ``deadline`` (``time.monotonic`` seconds)
    is checked before each region (raises :class:`EGraphDeadline`). ``timing`` receives
    ``partition``, the seconds spent cutting the graph into regions (a greedy fusion of the whole
    graph: linear in its size, before any saturation)."""
    tables = Tables()
    sat = saturator(limits)
    ctors = set(constructors())
    out = []
    seen: dict[str, tuple[RegionResult, list[str], list[str]]] = {}
    tp = time.perf_counter()
    regions = partition(graph, max_region_ops)
    if timing is not None:
        timing["partition"] = time.perf_counter() - tp
    for i, reg in enumerate(regions):
        _check_deadline(deadline, f"after {i} of {len(regions)} regions")
        enc = Encoder(tables, {id(x): f"ext{x.id}" for x in reg.externals})
        root_vars = [enc.encode(r) for r in reg.roots]
        sig, names = _signature(enc.lines, tables.strided)
        if sig in seen:   # a repeated layer: the first copy's e-graph and choices, renamed
            first, first_vars, first_names = seen[sig]
            if root_vars == first_vars:
                out.append(_renamed(first, reg, dict(zip(first_names, names))))
                out[-1].model_classes = _model_classes(enc, first.view)
                log.info("%s: saturated as %s (same structure)", reg.name, first.region.name)
                continue
        data, stats = sat.saturate(enc.lines, reg.name)
        view = EGraphView.from_json(data, ctors)
        roots = [view.lets[v] for v in root_vars]
        pick, best = choose(view, cost)
        orig = _identity_pick(view, cost, enc)
        out.append(RegionResult(reg, view, roots, pick, best,
                                alternatives(view, pick, best, roots), orig, stats,
                                _model_classes(enc, view)))
        seen.setdefault(sig, (out[-1], root_vars, names))
        log.info(stats.line())
    return out, tables


def _model_classes(enc: Encoder, view: EGraphView) -> dict:
    """``{id(model node): e-class}`` of the region's own nodes (not its external inputs)."""
    return {k: view.lets[v] for k, v in enc.var.items()
            if k not in enc.externals and v in view.lets}


_LEAF_NAME = re.compile(r'\((Blob|Input) "([^"]*)"\)|\(Strided (\d+)\)')


def _signature(lines: list[str], strided: list) -> tuple[str, list[str]]:
    """A region's encoding with its weight keys and input names replaced by their order of first
    appearance, and those names: two regions with the same signature are the same program over
    other weights (the layers of a transformer), so they saturate and extract alike."""
    names: dict[str, int] = {}

    def sub(m):
        if m.group(3) is not None:   # a side-table view: compared by value (views are equal)
            return f"(Strided {strided[int(m.group(3))]!r})"
        k = names.setdefault(m.group(2), len(names))
        return f"({m.group(1)} #{k})"
    return "\n".join(_LEAF_NAME.sub(sub, ln) for ln in lines), list(names)


def _renamed(first: RegionResult, reg: Region, rename: dict[str, str]) -> RegionResult:
    """``first``'s saturated e-graph and choices for region ``reg`` of the same signature: the
    same classes, with the weight keys and input names of ``reg``."""
    def new(v):
        if isinstance(v, str):
            return rename.get(v, v)
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "Blob":
            return ("Blob", [rename.get(v[1][0], v[1][0])])
        return v
    view = EGraphView(first.view.classes, {c: new(v) for c, v in first.view.values.items()},
                      first.view.shapes, first.view.lets)
    # the first copy's figures, no time: the region was not saturated again
    stats = dataclasses.replace(first.stats, region=reg.name, seconds=0.0,
                                stages=[("reused", 0, f"same as {first.region.name}")])
    return RegionResult(reg, view, first.roots, first.pick, first.best, first.alts,
                        first.original, stats)


def _identity_pick(view: EGraphView, cost: CostModel, enc: Encoder) -> dict[str, int]:
    """Least-cost choice with every form ruled out: the program greedy fusion alone would see
    (up to the exact identities, which only drop work)."""
    forced = {}
    for c, ns in view.classes.items():
        ok = [i for i, n in enumerate(ns) if n.ctor not in FORMS]
        if ok and len(ok) < len(ns):
            forced[c] = ok
    pick, _ = choose(view, _NoForms(cost, forced))
    return pick


class _NoForms(CostModel):
    def __init__(self, base: CostModel, allowed: dict):
        super().__init__(base.ceilings, base.itemsize, base.dtype)
        self.allowed = allowed

    def enode_cost(self, g, c, n):
        if c in self.allowed and g.classes[c].index(n) not in self.allowed[c]:
            return float("inf")
        return super().enode_cost(g, c, n)


def _joined_parts(view: EGraphView, forced: dict[str, int]) -> set[str]:
    """The part classes of ``forced`` (each read through its chosen ``Part`` e-node) that share
    their wide contraction and their width with exactly one other part, the two joined by
    elementwise e-nodes of their own size (through views that keep the element count) and joined
    to no third part."""
    elementwise = {c for c, op in OP_OF_CTOR.items() if op in ELEMENTWISE} | {"View"}
    parents: dict[str, set[str]] = {}
    for c, ns in view.classes.items():
        for n in ns:
            if n.ctor in elementwise:
                for a in n.args:
                    if a in view.classes:
                        parents.setdefault(a, set()).add(c)

    def size(c: str) -> int:
        out = 1
        for d in view.shapes.get(c) or ():
            out *= d
        return out

    def above(c: str) -> set[str]:
        seen, stack, n = {c}, [c], size(c)
        while stack and len(seen) < 256:
            for p in parents.get(stack.pop(), ()):
                if p not in seen and size(p) == n:
                    seen.add(p)
                    stack.append(p)
        return seen - {c}

    def top(c: str, depth: int = 0) -> str:
        """The widest contraction a part belongs to (a part of a part: Q of the Q/K pair)."""
        i = forced.get(c)
        if i is None or depth > 8:
            return c
        return top(view.classes[c][i].args[0], depth + 1)

    by_wide: dict[tuple, list[str]] = {}
    for c, i in forced.items():
        part = view.classes[c][i]
        lo, hi = (view.values.get(a) for a in part.args[1:3])
        if isinstance(lo, int) and isinstance(hi, int):
            by_wide.setdefault((top(c), hi - lo), []).append(c)
    out: set[str] = set()
    for cs in by_wide.values():
        if len(cs) < 2:
            continue
        ups = {c: above(c) for c in cs}
        joined = {c: {c2 for c2 in cs if c2 != c and ups[c] & ups[c2]} for c in cs}
        # only a pair joined to nothing else: the fusion pairs two products, and three or more
        # joined ones (q * k + v) gain nothing from staying apart
        for c, js in joined.items():
            if len(js) == 1 and joined[next(iter(js))] == {c}:
                out.add(c)
    return out


def _wide_forced(view: EGraphView) -> dict[str, int] | None:
    """The choices that read every class that is a column slice of a wider contraction
    (``Part``, ``lumc.rewrites.horizontal``) from the widest one, or None without any."""
    reach: dict[str, int] = {}

    def widest(c: str) -> int:
        """The width of the widest contraction class ``c`` is a column part of, transitively
        (a part of a part: Q of the Q/K pair, which is a part of Q/K/V)."""
        if c not in reach:
            parts = [n.args[0] for n in view.classes.get(c, ()) if n.ctor == "Part"]
            own = (view.shapes.get(c) or (0,))[-1]
            reach[c] = max([own] + [widest(p) for p in parts])
        return reach[c]

    forced = {}
    for c, ns in view.classes.items():
        parts = [(widest(n.args[0]), i) for i, n in enumerate(ns) if n.ctor == "Part"]
        if parts:
            forced[c] = max(parts)[1]
    # two parts whose elementwise epilogues meet (a gated MLP's silu(gate) * up) stay apart: the
    # fusion pairs them in one kernel that never writes either (``GreedyFusion._pairs``), where
    # the merged product would write both for a separate pointwise kernel
    for c in _joined_parts(view, forced):
        del forced[c]
    if not forced:
        return None
    # a view over a part (a batch of one's reshape of the 2-D product) is read through it too:
    # its class also holds the raw reduction it was recognized from, which bypasses the part; and
    # so is a view over such a view (RoPE's halves of q's heads), to a fixpoint
    grew = True
    while grew:
        grew = False
        for c, ns in view.classes.items():
            if c not in forced:
                via = [i for i, n in enumerate(ns) if n.ctor == "View" and n.args[0] in forced]
                if via:
                    forced[c] = via[0]
                    grew = True
    return forced


def fusion_flags(label: str) -> tuple[bool, bool, bool, bool, bool, bool]:
    """``(norm_prologue, norm_epilogue, kv_prologue, attention, mlp, rows)`` of a candidate's
    label: its suffixes ``+norm-prologue`` or ``+norm-on-load``, then ``+kv-prologue``,
    ``+attention``, ``+mlp`` and ``+rows`` (the twins, in the order they were made)."""
    tail = label.split("+")[1:]
    return ("norm-prologue" in tail, "norm-on-load" in tail, "kv-prologue" in tail,
            "attention" in tail, "mlp" in tail, "rows" in tail)


def mlp_twin(label: str, notes: list[str]) -> bool:
    """Whether the candidate ``label`` (its fusion's ``notes``) gets a ``+mlp`` twin
    (``fusion_chain``): its fusion noted chained contractions it could compute in one kernel, and
    it is not a twin already (of ``+mlp``, or ``+rows``: the last twin made) nor a single
    region's flip (one more decode of the whole program each)."""
    flags = fusion_flags(label)
    return (not flags[4] and not flags[5] and not label.startswith("flip:")
            and any(MLP_REFUSAL in x for x in notes))


def rows_twin(label: str, notes: list[str]) -> bool:
    """Whether the candidate ``label`` (its fusion's ``notes``) gets a ``+rows`` twin
    (``fusion_rows``): its fusion noted a row value read back over its rows that one row kernel
    could keep on chip, and it is not a ``+rows`` twin already nor a single region's flip (one
    more decode of the whole program each). Every other twin is made before it (a ``+rows``
    label gets none), so each combination is decoded once."""
    return (not fusion_flags(label)[5] and not label.startswith("flip:")
            and any(ROWS_REFUSAL in x for x in notes))


def attention_twin(label: str, notes: list[str]) -> bool:
    """Whether the candidate ``label`` (its fusion's ``notes``) gets a ``+attention`` twin
    (``fusion_attention``): its fusion noted a softmax it could assemble, it is not a twin
    already, and its plan did not choose against the e-graph's attention forms (``all:Attention
    Masked->MatMul``: the twin would put one back)."""
    flags = fusion_flags(label)
    return (not flags[3] and not flags[5] and "Attention" not in label.split("+")[0]
            and any(ATTENTION_REFUSAL in x for x in notes))


def decode_candidate(graph: Graph, results: list[RegionResult], picks: list[dict],
                     tables: Tables, label: str, norm_prologue: bool = False,
                     memo: dict | None = None, norm_epilogue: bool = False,
                     kv_prologue: bool = False, attention: bool = False,
                     mlp: bool = False, rows: bool = False) -> Program:
    """The program of one choice per region: decode regions in order, then fuse greedily around
    the chosen forms (``norm_prologue``: normalizations read only by contractions are formed on
    load inside them; ``norm_epilogue``: also where a contraction's epilogue reads them,
    ``lumc.compiler.core.fusion``; ``kv_prologue``: attention computes its elementwise keys and
    values itself; ``attention``: attention assembled around score functions no rule spells,
    ``fusion_attention``; ``mlp``: chained contractions in one kernel, ``fusion_chain``; ``rows``:
    reductions over the same rows and their readers in one row kernel, ``fusion_rows``). ``memo``
    (shared by the candidates of one
    e-graph run) keeps each region's decode by its choice and the nodes it reads, so a region
    that the candidates choose alike over the same inputs is decoded once (the same nodes)."""
    env: dict[int, Node] = {}
    forms: dict[int, FormRecord] = {}
    keys: dict[int, tuple] = {}
    for i, (res, pick) in enumerate(zip(results, picks)):
        mkey = (i, id(pick), tuple(id(env[id(x)]) for x in res.region.externals))
        hit = memo.get(mkey) if memo is not None else None
        if hit is None:
            for x in res.region.externals:
                tables.leaves[f"ext{x.id}"] = env[id(x)]
            classes: dict[int, str] = {}
            part: dict[int, FormRecord] = {}
            built = decode(res.view, pick, res.roots, tables, part, classes)
            hit = ([built[c] for c in res.roots], part, classes)
            if memo is not None:
                memo[mkey] = hit
        roots, part, classes = hit
        forms.update(part)
        for r, x in zip(res.region.roots, roots):
            env[id(r)] = x
        keys.update((k, (i, c)) for k, c in classes.items() if k not in keys)
    outs = {k: env.get(id(o), o) for k, o in graph.outputs.items()}
    new = Graph(graph.inputs, outs)
    prog = greedy_program(new, label=label, forms=forms, norm_prologue=norm_prologue,
                          norm_epilogue=norm_epilogue, kv_prologue=kv_prologue,
                          attention=attention, mlp=mlp, rows=rows)
    prog.value_keys = keys
    # what the fusion was given: enough to build the program again elsewhere (carried.py)
    prog.decoded = (new, forms, (norm_prologue, norm_epilogue, kv_prologue, attention, mlp, rows))
    return prog


def egraph_candidates(graph: Graph, device: DeviceSpec | str = "h100", k: int = 4,
                      limits: Limits | None = None, max_region_ops: int = 400,
                      max_flips: int = 12, deadline: float | None = None) -> EGraphResult:
    """Saturate ``graph`` region by region and return up to ``k`` distinct candidate programs,
    best estimated time first (see the module docstring).

    Raises:
        EGraphDeadline: ``deadline`` (``time.monotonic`` seconds) passed before every region was
            saturated; past it during decoding, the candidates decoded so far are returned.
    """
    dev = get_device(device) if isinstance(device, str) else device
    ceil = dev.as_ceilings()
    folded: dict[int, Node] = {}
    model = graph
    graph = fold_constants(graph, folded)
    itemsize, dname = _dominant_itemsize(graph)
    cost = CostModel(ceil, itemsize, dname)
    t0 = time.perf_counter()
    timing: dict = {}
    results, tables = saturate_regions(graph, limits or Limits(), max_region_ops, cost, deadline,
                                       timing)
    t1 = time.perf_counter()
    base = [r.pick for r in results]
    plans: list[tuple[str, list[dict]]] = [("egraph-argmin", base),
                                           ("egraph-identity", [r.original for r in results])]
    # horizontal fusion everywhere: tree cost counts a shared wide contraction once per slice,
    # so argmin never picks it; the program bound (each kernel once) judges it instead
    # a repeated layer shares its first copy's classes: each choice is made once per structure
    memo: dict = {}

    def choose_once(view, forced):
        key = (id(view.classes), tuple(sorted(forced.items())))
        if key not in memo:
            memo[key] = choose(view, cost, forced)[0]
        return memo[key]
    wide_memo: dict = {}
    for r in results:
        if id(r.view.classes) not in wide_memo:
            wide_memo[id(r.view.classes)] = _wide_forced(r.view)
    wide = [wide_memo[id(r.view.classes)] for r in results]
    if any(w is not None for w in wide):
        plans.append(("egraph-horizontal", [choose_once(r.view, w) if w is not None else r.pick
                                            for w, r in zip(wide, results)]))
    # single flips, cheapest first across regions: programs argmin extraction never returns
    flips = sorted((d, i, c, n) for i, r in enumerate(results) for d, c, n in r.alts)
    n_flips = 0
    for d, i, c, n in flips:
        if n_flips == max_flips:
            break
        r = results[i]
        pick = choose_once(r.view, {c: n})
        if pick.get(c) != n:     # the e-node reads its own class: no program (see ``choose``)
            continue
        n_flips += 1
        alt = list(base)
        alt[i] = pick
        node = r.view.classes[c][n]
        plans.append((f"flip:{r.region.name}:{node.ctor}", alt))
    # the same kind of flip in every region at once (e.g. no attention form anywhere)
    kinds: dict[str, list] = {}
    for i, r in enumerate(results):
        for d, c, n in r.alts:
            key = f"{r.view.classes[c][r.pick[c]].ctor}->{r.view.classes[c][n].ctor}"
            kinds.setdefault(key, []).append((i, c, n))
    for key, items in sorted(kinds.items()):
        alt = list(base)
        by_region: dict[int, dict] = {}
        for i, c, n in items:
            by_region.setdefault(i, {})[c] = n
        for i, forced in by_region.items():
            alt[i] = choose_once(results[i].view, forced)
        plans.append((f"all:{key}", alt))
        if key.endswith(("->LayerNorm", "->RMSNorm")) and any(w is not None for w in wide):
            # the norm form everywhere and the projections it feeds merged (Llama's RMSNorm
            # before Q/K/V and gate/up): neither plan alone has both
            both = list(base)
            for i, r in enumerate(results):
                forced = dict(wide[i] or {}, **by_region.get(i, {}))
                if forced:
                    both[i] = choose_once(r.view, forced)
            plans.append((f"all:{key}+horizontal", both))
    # pre-LN fusion of the two main plans: each normalization read only by contractions formed on
    # load in them (fewer kernels and bytes, more work per GEMM program: the bound judges)
    # (and of each plan that turns a normalization form on everywhere; single-region flips are
    # left out: one more decode of the whole program each); post-LN fusion of the same plans: a
    # normalization also read by a contraction's epilogue (the residual) is formed on load there
    # too, its row statistics computed by the first kernel that forms it
    norm_on = re.compile(r"^(egraph-(argmin|horizontal)|all:.*->(LayerNorm|RMSNorm)(\+horizontal)?)$")
    # each right after its base plan: where nothing fuses, the twins are one program under the
    # base's label (duplicates are dropped after decoding)
    plans = [q for lab, picks in plans for q in ([(lab, picks)] + (
        [(f"{lab}+norm-prologue", picks), (f"{lab}+norm-on-load", picks)]
        if norm_on.search(lab) else []))]
    progs, bounds, seen = [], [], set()
    decoded: dict = {}
    t_choose = time.perf_counter()
    # attention computing its elementwise keys and values (RoPE) itself: a twin of each program
    # whose fusion wrote them for want of the flag, decoded right after it (the search times both:
    # the twin saves a kernel and its bytes, and recomputes the expression per query block)
    queue = collections.deque(plans)
    while queue:
        label, picks = queue.popleft()
        if progs and deadline is not None and time.monotonic() > deadline:
            break                       # out of time: the candidates decoded so far
        try:
            pro, epi, kv, att, mlp, rows = fusion_flags(label)
            p = decode_candidate(graph, results, picks, tables, label, norm_prologue=pro,
                                 memo=decoded, norm_epilogue=epi, kv_prologue=kv, attention=att,
                                 mlp=mlp, rows=rows)
            p.validate()
        except Exception as e:   # a bad alternative must not sink the compile
            log.warning("candidate %s failed to decode: %r", label, e, exc_info=log.isEnabledFor(
                logging.DEBUG))
            continue
        if rows_twin(label, p.notes):
            # decoded last: on a tie of bounds a named form (RMSNorm) stays ahead of its spelling
            # as a generic row kernel
            queue.append((f"{label}+rows", picks))
        if not kv and not rows and any(KV_PROLOGUE_REFUSAL in x for x in p.notes):
            queue.appendleft((f"{label}+kv-prologue", picks))
        if attention_twin(label, p.notes):
            queue.appendleft((f"{label}+attention", picks))
        if mlp_twin(label, p.notes):
            queue.appendleft((f"{label}+mlp", picks))
        sig = p.signature()
        if sig in seen:
            continue
        seen.add(sig)
        progs.append(p)
        bounds.append(program_time_bound(p, dev))
    if not progs:   # every decode failed: the greedy program is always a valid answer
        progs.append(greedy_program(graph, label="greedy-fallback"))
        bounds.append(program_time_bound(progs[0], dev))
    t2 = time.perf_counter()
    order = sorted(range(len(progs)), key=lambda i: bounds[i])[:k]
    stats = [r.stats for r in results]
    # partition: cutting the graph into regions; saturate: egglog runs; extract: choosing
    # e-nodes (per region, then the plans' choices); decode: building, fusing and bounding the
    # candidate programs
    sat_s = sum(r.stats.seconds for r in results)
    part_s = timing.get("partition", 0.0)
    res = EGraphResult([progs[i] for i in order], [bounds[i] for i in order], stats,
                       total_stats(stats), {"partition": part_s, "saturate": sat_s,
                                            "extract": (t_choose - t0) - sat_s - part_s,
                                            "decode": t2 - t_choose},
                       {k: (i, c) for i, r in enumerate(results) for k, c in r.model_classes.items()})
    # the graph given, not only its folded copy: a node and its folded counterpart are one value
    for n in model.nodes():
        f = folded.get(id(n))
        if f is not None and f is not n and id(f) in res.model_keys:
            res.model_keys[id(n)] = res.model_keys[id(f)]
    res.total.seconds = t2 - t0
    return res


def compile_program(graph: Graph, use_egraph: bool = True, device: DeviceSpec | str = "h100",
                    limits: Limits | None = None) -> Program:
    """The program the pipeline hands to codegen: the e-graph's best candidate, or greedy fusion
    alone when ``use_egraph`` is False (``lumc compile --no-egraph``)."""
    if not use_egraph:
        return greedy_program(graph)
    return egraph_candidates(graph, device, k=1, limits=limits).best
