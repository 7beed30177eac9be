"""Soundness harness: build a rule's left side from a case, saturate, and check every alternative
the e-graph holds for it against the left side numerically, by the rule's numerics class."""
from __future__ import annotations

import functools

import numpy as np

from lumc.backends.devices import H100_SXM
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.extract import CostModel, EGraphView, choose, decode
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.rewrites.language import Encoder, Tables, constructors
from lumc.rewrites.patterns import Rule, instantiate, lhs_node
from lumc.rewrites.schedule import Limits, Saturator, all_rules

SEVERITY = {"exact": 0, "reassociating": 1, "domain": 2}


@functools.lru_cache(maxsize=1)
def saturator() -> Saturator:
    return Saturator(Limits(domain=True, fast_math=True, iterations=8, backoff_iterations=4))


def special_array(shape, dtype, rng, finite_only=False) -> np.ndarray:
    """Random normal values with inf, -inf, NaN, +0, -0 and large magnitudes sprinkled in."""
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    x = rng.standard_normal(shape).astype(dtype)
    if x.size == 0:
        return x
    flat = x.reshape(-1)
    specials = [0.0, -0.0, 1e15, -1e15, 3.0e-39]
    if not finite_only:
        specials += [np.inf, -np.inf, np.nan]
    idx = rng.choice(flat.size, size=min(flat.size, max(1, flat.size // 4)), replace=False)
    for k, i in enumerate(idx):
        flat[i] = specials[k % len(specials)]
    return flat.reshape(shape)


def agree(a: np.ndarray, b: np.ndarray, numerics: str, ref64: np.ndarray | None,
          mag: np.ndarray | None = None) -> str | None:
    """None when ``a`` and ``b`` agree by ``numerics``, else a reason."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {a.shape}{a.dtype} vs {b.shape}{b.dtype}"
    if a.size == 0:
        return None
    if a.dtype.kind == "V" and "float" in a.dtype.name:   # ml_dtypes (bf16, fp8): compare widened
        a, b = a.astype(np.float32), b.astype(np.float32)  # (exactly: widening is injective)
        ref64 = None if ref64 is None else ref64.astype(np.float64)
    if a.dtype.kind != "f":
        return None if np.array_equal(a, b) else "integer values differ"
    if numerics == "exact":
        ua = np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")
        ub = np.ascontiguousarray(b).view(f"u{b.dtype.itemsize}")
        same = (ua == ub) | (np.isnan(a) & np.isnan(b))
        return None if same.all() else f"not bit-identical at {int((~same).sum())} positions"
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    if numerics == "reassociating":
        # where only one side overflowed or met inf - inf, the exact result is out of range
        odd = fa != fb
        if ref64 is not None and odd.any():
            big = ~np.isfinite(ref64) | (np.abs(ref64) > np.finfo(a.dtype).max / 1e3)
            if (odd & ~big).any():
                return "non-finite in one side only, where the exact result is in range"
    if numerics == "reassociating" and mag is not None:
        # |error| <= n eps sum|terms|: bound by the left side evaluated on |inputs| (which is at
        # least |a| for a sum; a quotient rounded twice, as in a softmax, is bounded by |a|)
        both &= np.isfinite(mag)
        bound = 1e-4 * np.maximum(np.abs(np.where(both, mag, 0)), np.abs(np.where(both, a, 0))) + 1e-30
    else:
        bound = 1e-5 * np.abs(np.where(both, a, 0)) + 1e-30
    diff = np.abs(np.where(both, a, 0).astype(np.float64) - np.where(both, b, 0))
    return None if (diff <= bound).all() else f"values differ beyond the {numerics} bound"


def check_rule_case(rule: Rule, case: dict, seed: int = 0) -> dict:
    """Build, saturate, compare. Returns ``{"matches": n, "checked": alternatives}``; raises
    AssertionError on a disagreement."""
    tables = Tables()
    env, inputs, deferred = {}, {}, {}
    for k, b in case.items():
        if k == "__lhs__":
            continue
        if isinstance(b, tuple) and len(b) == 3 and b[0] == "in":
            env[k] = inputs[k] = input_node(f"v_{k}", b[1], dt.BY_NAME[b[2]])
        elif (isinstance(b, str) and b.startswith("(")) or callable(b):
            deferred[k] = b
        else:
            env[k] = b
    for k, text in deferred.items():
        # a pattern text, or a builder of IR the pattern language cannot write (a sliced view)
        env[k] = text(env) if callable(text) else instantiate(text, env, tables)
    # a case may give a host expression in which the rule's left side appears during saturation
    lhs = (instantiate(case["__lhs__"], env, tables) if "__lhs__" in case
           else lhs_node(rule, env, tables))
    g = Graph({n.arg.name: n for n in inputs.values()}, {"out": lhs})
    enc = Encoder(tables)
    root_var = enc.encode(lhs)
    data, stats = saturator().saturate(enc.lines, rule.name)
    fired = stats.matches.get(rule.name, 0)
    numerics = max((r.numerics for r in saturator().rules if stats.matches.get(r.name)),
                   key=SEVERITY.get, default="exact")
    numerics = max(numerics, rule.numerics, key=SEVERITY.get)
    view = EGraphView.from_json(data, set(constructors()))
    root = view.lets[root_var]
    pick, _ = choose(view, CostModel(H100_SXM.as_ceilings()))
    rng = np.random.default_rng(seed)
    feed = {n.arg.name: special_array(n.shape, n.dtype.np, rng, numerics == "domain")
            for n in inputs.values()}
    want = ReferenceExecutor(g)(feed)["out"]
    ref64 = ReferenceExecutor(g, "float64")(feed)["out"]
    # the scale of the terms a reassociation reorders: the left side on |inputs|, in float64
    mag = ReferenceExecutor(g, "float64")({k: np.abs(v) for k, v in feed.items()})["out"]
    checked = 0
    for i in range(len(view.classes[root])):
        alt = dict(pick)
        alt[root] = i
        try:
            node = decode(view, alt, [root], tables, {})[root]
        except (KeyError, RecursionError):
            continue   # this alternative needs the root itself below it: a cycle, not a program
        got = ReferenceExecutor(Graph(g.inputs, {"out": node}))(feed)["out"]
        why = agree(want, got, numerics, ref64, mag)
        assert why is None, (f"{rule.name}: alternative {view.classes[root][i].ctor} of the root "
                             f"disagrees ({numerics}): {why}")
        checked += 1
    return {"matches": fired, "checked": checked}


def rules_by_law() -> dict[str, list[Rule]]:
    out: dict[str, list[Rule]] = {}
    for r in all_rules():
        out.setdefault(r.law, []).append(r)
    return out
