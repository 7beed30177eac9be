"""The rule schedule: rulesets composed in stages, run under limits, with statistics.

Stages, in order (each a loop of iterations, each iteration first saturating the ``shapes``
analysis so new terms have shapes for the rank checks of the next):

1. ``rewrite``: ``algebra`` (not the expansive association rules), ``views`` and ``layout``;
2. ``kernels``: form recognition (after the identities and folds it relies on), spelling forms
   (``lumc.rewrites.spellings``) included, with the rulesets of stage 1 still running on what
   recognition adds;
3. ``expansive``: matmul association, under egglog's back-off scheduler, passed whole to one
   ``run-schedule`` call so the scheduler persists across iterations (egglog 13.2 rebuilds it per
   call; see EGGLOG-NOTES.md). Unrestricted association otherwise blows up within 6 iterations.

Every stage stops at saturation or at a limit (iterations, e-nodes, seconds); the statistics say
which. ``domain`` rules are left out unless asked for.

The engine is the low-level ``egglog.bindings`` API (``parse_program``/``run_program``/
``serialize``); graphs go in as text in chunks of 64 lines. ``tests/rewrites`` pass on egglog 13.2
(Python 3.11) and 14.0 (Python 3.12); run reports are read defensively since their classes moved
between releases.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

try:
    from egglog import bindings
except ImportError as _e:   # the GPU image has no egglog: every other stage (and import) still works
    bindings = None
    EGGLOG_MISSING: str | None = str(_e)
else:
    EGGLOG_MISSING = None

from lumc.ir.ops import OPS
from lumc.rewrites import (horizontal, rules_algebra, rules_kernels, rules_layout, rules_views,
                           spellings)
from lumc.rewrites.language import FORMS, declarations
from lumc.rewrites.patterns import Rule

CHUNK = 64
RULE_CHUNK = 8        # declarations and rules sent to egglog per program
# a region's global names (the Encoder's ``$e<n>``), string literals (input names) skipped
GLOBAL_NAME = re.compile(r'("(?:[^"\\]|\\.)*")|\$(\w+)')


def all_rules() -> list[Rule]:
    """Every rule of every ruleset, in schedule order."""
    return (rules_algebra.rules() + rules_views.rules() + rules_layout.rules()
            + rules_kernels.rules() + spellings.rules() + horizontal.rules())


def shape_rules() -> list[str]:
    """The ``shapes`` analysis: the shape of a new elementwise or view term from its operands.

    Forms need none (a form is always unioned into an e-class that has its shape), nor do the
    terms rules build with an explicit ``set`` (reductions, matmuls); each analysis rule costs the
    engine memory, so there are only these."""
    out = []

    def rule(query: str, shape: str):
        out.append(f"(rule ({query}) ((set (shape e) {shape})) :ruleset shapes)")

    for name, row in OPS.items():
        c = row.egglog
        if row.group in ("unary", "binary", "ternary") or name == "Contiguous":
            args = " ".join(f"a{i}" for i in range(row.arity)) + (" t" if name == "Cast" else "")
            first = "a1" if name == "Where" else "a0"
            rule(f"(= e ({c} {args})) (= s (shape {first}))", "s")
    rule("(= e (View a0 (Reshape s)))", "s")
    rule("(= e (View a0 (Expand s)))", "s")
    for r in range(1, 7):
        rule(f"(= e (View a0 (Permute p))) (= s (shape a0)) (= (vec-length p) {r})",
             "(vec-of " + " ".join(f"(vec-get s (vec-get p {j}))" for j in range(r)) + ")")
    return out


@dataclass
class Limits:
    """Limits of one region's run.

    Attributes:
        iterations: per stage.
        nodes: e-nodes (all ``Expr`` constructors) at which a stage stops.
        seconds: wall-clock time for the whole region.
        backoff_iterations: iterations of the expansive stage.
        domain: include ``domain`` rules (wrong on some inputs; off by default).
        expansive: run the association stage at all.
        fast_math: include the fast-math rules (``rules_algebra.FAST_MATH``: division as a
            reciprocal product; off by default).
    """
    iterations: int = 12
    nodes: int = 60_000
    seconds: float = 10.0
    backoff_iterations: int = 6
    domain: bool = False
    expansive: bool = True
    fast_math: bool = False


@dataclass
class RunStats:
    """Statistics of one saturation (one region, or a total over regions)."""
    region: str = ""
    enodes: int = 0
    eclasses: int = 0
    iterations: int = 0
    seconds: float = 0.0
    stop: str = ""
    stages: list = field(default_factory=list)      # [(stage, iterations, stop)]
    matches: dict = field(default_factory=dict)     # {rule name: matches}

    def line(self) -> str:
        st = ", ".join(f"{s}:{i}it/{why}" for s, i, why in self.stages)
        return (f"{self.region or 'total'}: {self.enodes} e-nodes, {self.eclasses} e-classes, "
                f"{self.iterations} iterations, {self.seconds:.2f} s, stop: {self.stop} ({st})")


def total_stats(parts: list[RunStats]) -> RunStats:
    tot = RunStats(region="total")
    stops: dict[str, int] = {}
    for p in parts:
        tot.enodes += p.enodes
        tot.eclasses += p.eclasses
        tot.iterations += p.iterations
        tot.seconds += p.seconds
        stops[p.stop] = stops.get(p.stop, 0) + 1
        for k, v in p.matches.items():
            tot.matches[k] = tot.matches.get(k, 0) + v
    tot.stop = ", ".join(f"{k} x{v}" for k, v in sorted(stops.items()))
    return tot


class Saturator:
    """One egglog engine with the language and rules loaded; saturates regions one at a time
    (``push``/``pop`` around each, so the declarations are parsed once)."""

    def __init__(self, limits: Limits | None = None, rules: list[Rule] | None = None):
        self.limits = limits or Limits()
        rules = all_rules() if rules is None else rules
        self.rules = [r for r in rules if (self.limits.domain or r.numerics != "domain")
                      and (self.limits.fast_math or r.name not in rules_algebra.FAST_MATH)]
        if bindings is None:
            raise ImportError(f"the e-graph stage needs egglog, which is not installed "
                              f"({EGGLOG_MISSING})")
        self.egraph = bindings.EGraph()
        self._runs = 0
        self._ctors = set()
        from lumc.rewrites.language import constructors
        self._ctors = set(constructors())
        expansive = rules_algebra.EXPANSIVE
        text = [declarations(), "(ruleset shapes)"]
        text += [f"(ruleset {r})" for r in ("algebra", "views", "layout", "kernels", "expansive")]
        text += shape_rules()
        for r in self.rules:
            text.append(r.egglog("expansive" if r.name in expansive else None))
        # in chunks: egglog 13.2's parser takes memory about quadratic in one program's length
        # (EGGLOG-NOTES.md; the rules as one program: 1.4 GB at 152 rules)
        for k in range(0, len(text), RULE_CHUNK):
            self._run("\n".join(text[k:k + RULE_CHUNK]))

    def _run(self, text: str):
        return self.egraph.run_program(*self.egraph.parse_program(text))

    def size(self) -> int:
        """E-nodes of ``Expr`` constructors (from ``print-size``)."""
        out = self._run("(print-size)")
        sizes = getattr(out[0], "sizes", None) if out else None
        if sizes is None:   # older/newer bindings print "name: n" lines
            text = "\n".join(str(o) for o in out)
            sizes = [(a.strip(), int(b)) for a, _, b in (ln.partition(":") for ln in
                                                         text.splitlines()) if b.strip().isdigit()]
        return sum(n for name, n in sizes if name in self._ctors)

    def _report(self, out) -> tuple[bool, dict, int]:
        """``(updated, matches per rule, iterations)`` of a ``run-schedule``, across bindings
        versions (the report object moved between releases)."""
        rep = next((o.report for o in out if hasattr(o, "report")), None)
        if rep is None and hasattr(self.egraph, "run_report"):
            rep = self.egraph.run_report()
        if rep is None:
            return True, {}, 1
        return (bool(getattr(rep, "updated", True)), dict(getattr(rep, "num_matches_per_rule", {})),
                len(getattr(rep, "iterations", ())) or 1)

    def _stage(self, name: str, schedule: str, t0: float, stats: RunStats) -> bool:
        """Iterate ``schedule`` until saturation or a limit; False when a limit stopped it."""
        lim = self.limits
        for it in range(1, lim.iterations + 1):
            updated, matches, _ = self._report(self._run(f"(run-schedule {schedule})"))
            for k, v in matches.items():
                stats.matches[k] = stats.matches.get(k, 0) + v
            stats.iterations += 1
            if not updated:
                stats.stages.append((name, it, "saturated"))
                return True
            if self.size() > lim.nodes:
                stats.stages.append((name, it, "node limit"))
                return False
            if time.perf_counter() - t0 > lim.seconds:
                stats.stages.append((name, it, "time limit"))
                return False
        stats.stages.append((name, lim.iterations, "iteration limit"))
        return True

    def saturate(self, lines: list[str], region: str = "") -> tuple[dict, RunStats]:
        """Insert a region (encoder lines), run the schedule, return the serialized e-graph (JSON
        as a dict) and the run's statistics.

        The region's global names (``$e3``) are bound as ``$r<run>_e3_`` inside the engine and
        given back as written in the serialization's ``let`` fields: no name is bound twice in one
        engine, and none is a prefix of another. With egglog 13.2 a name inside a term can
        resolve to another global that is a prefix of it: ``(Where $e31 $e9 $e3)`` read as
        ``(Where $e3 $e9 $e3)`` (an ArgMax region: an i64 condition, candidates that failed to
        decode), and ``(Where $e45 $e31 $e3)`` as ``(Where $e45 $e3 $e3)`` (a torch floor
        division that compiled to a truncating one, silently)."""
        stats = RunStats(region=region)
        t0 = time.perf_counter()
        self._runs += 1
        tag = f"$r{self._runs}_"
        # each name ends in "_": egglog 13.2 can resolve a global name inside a term to another
        # global that is a prefix of it (``$r1_e31`` read as ``$r1_e3``, in a parent term
        # inserted after both: ``(Where $e45 $e31 $e3)`` became ``(Where $e45 $e3 $e3)``, and a
        # torch floor division compiled to a truncating one); no name is a prefix of another
        # once every name is terminated
        lines = [GLOBAL_NAME.sub(lambda m: m.group(1) or tag + m.group(2) + "_", ln)
                 for ln in lines]
        self._run("(push)")
        try:
            for i in range(0, len(lines), CHUNK):
                self._run("\n".join(lines[i:i + CHUNK]))
            self._run("(run-schedule (saturate shapes))")
            ok = self._stage("rewrite", "(seq (saturate shapes) (run algebra) (run views) "
                             "(run layout))", t0, stats)
            if ok:
                ok = self._stage("kernels", "(seq (saturate shapes) (run algebra) (run views) "
                                 "(run layout) (run kernels))", t0, stats)
            if ok and self.limits.expansive and any(
                    r.name in rules_algebra.EXPANSIVE for r in self.rules):
                n = self.limits.backoff_iterations
                updated, matches, iters = self._report(self._run(
                    f"(run-schedule (let-scheduler bo (back-off)) (repeat {n} "
                    "(seq (saturate shapes) (run-with bo expansive))))"))
                for k, v in matches.items():
                    stats.matches[k] = stats.matches.get(k, 0) + v
                stats.iterations += iters
                why = "saturated" if not updated else "iteration limit"
                if self.size() > self.limits.nodes:
                    why = "node limit"
                stats.stages.append(("expansive", iters, why))
            stats.stop = next((w for _, _, w in stats.stages if w != "saturated"), "saturated")
            data = json.loads(self.egraph.serialize([]).to_json())
        finally:
            self._run("(pop)")
        for d in data["class_data"].values():
            if d.get("let"):
                d["let"] = ",".join("$" + n.strip()[len(tag):].removesuffix("_")
                                    if n.strip().startswith(tag) else n.strip()
                                    for n in d["let"].split(","))
        classes = {n["eclass"] for n in data["nodes"].values()
                   if data["class_data"].get(n["eclass"], {}).get("type") == "Expr"}
        stats.eclasses = len(classes)
        stats.enodes = sum(1 for n in data["nodes"].values() if n["op"] in self._ctors)
        stats.seconds = time.perf_counter() - t0
        return data, stats
