"""Rules as data: pattern text over ``?variables``, compiled to egglog and instantiated as IR.

A :class:`Rule` states ``lhs -> rhs`` in the term language of ``lumc.rewrites.language`` (egglog
s-expressions), with ``?name`` variables, extra ``where`` facts (which may bind sub-patterns,
``(= ?e (Exp2 ...))``, or check values, ``(< ?c 1.5)``) and ``sets`` actions for the shapes of
new terms. The same data serves two masters:

* :meth:`Rule.egglog` writes the egglog ``rule`` command (``?x`` becomes ``v_x``);
* :func:`instantiate` evaluates a pattern with concrete bindings into an IR node, so the soundness
  test can build the left side of every rule from its ``cases`` and check what the e-graph unions
  with it, numerically, against the rule's numerics class.

Numerics classes: ``exact`` (bit-identical results), ``reassociating`` (rounding may differ;
non-finite positions agree), ``domain`` (valid only on finite inputs, or up to the sign of zero;
off by default).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lumc.ir.graph import Node
from lumc.rewrites.language import Tables, decode_node, decode_step

RULESETS = ("algebra", "views", "kernels", "layout")
NUMERICS = ("exact", "reassociating", "domain")


@dataclass(frozen=True)
class Rule:
    """One rewrite ``lhs -> rhs`` (see the module docstring).

    Attributes:
        name: ``ruleset/op: law``; rank instances of one law add `` [tag]``.
        numerics: ``exact``, ``reassociating`` or ``domain``.
        lhs, rhs: pattern texts; the rule unions ``rhs`` into the e-class matched by ``lhs``.
        where: extra query facts (``?root`` names the matched e-class).
        sets: extra actions after the union (shapes of new terms).
        cases: soundness cases, each ``{var: binding}``; an ``Expr`` var binds to
            ``("in", shape, dtype)`` (a random input) or to a pattern text over other vars.
    """
    name: str
    numerics: str
    lhs: str
    rhs: str
    where: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    cases: tuple[dict, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if self.numerics not in NUMERICS:
            raise ValueError(f"{self.name}: numerics {self.numerics!r} not in {NUMERICS}")
        if self.ruleset not in RULESETS:
            raise ValueError(f"{self.name}: ruleset {self.ruleset!r} not in {RULESETS}")

    @property
    def ruleset(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def law(self) -> str:
        """The name without its instance tag."""
        return self.name.split(" [", 1)[0]

    def egglog(self, ruleset: str | None = None) -> str:
        """The egglog ``rule`` command (in ``ruleset``, default the rule's own)."""
        facts = [f"(= ?root {self.lhs})", *self.where]
        acts = [f"(union ?root {self.rhs})", *self.sets]
        body = " ".join(_vars(f) for f in facts)
        head = " ".join(_vars(a) for a in acts)
        name = self.name.replace('"', "'")
        return f'(rule ({body}) ({head}) :ruleset {ruleset or self.ruleset} :name "{name}")'


def _vars(text: str) -> str:
    return re.sub(r"\?([A-Za-z_][A-Za-z0-9_]*)", r"v_\1", text)


# ---- s-expressions ------------------------------------------------------------------------------
_TOKEN = re.compile(r'\s*(\(|\)|"[^"]*"|[^\s()]+)')


def parse_sexpr(text: str):
    """Parse one s-expression into nested lists of tokens (strings keep their quotes)."""
    tokens = [t for t in _TOKEN.findall(text)]
    pos = 0

    def read():
        nonlocal pos
        t = tokens[pos]
        pos += 1
        if t == "(":
            out = []
            while tokens[pos] != ")":
                out.append(read())
            pos += 1
            return out
        return t

    tree = read()
    if pos != len(tokens):
        raise ValueError(f"trailing text after s-expression: {text!r}")
    return tree


def _literal(tok: str) -> Any:
    if tok.startswith('"'):
        return tok[1:-1]
    if re.fullmatch(r"-?\d+", tok):
        return int(tok)
    return float(tok)


_PRIMS = {
    "vec-of": lambda *xs: tuple(int(x) for x in xs),
    "vec-empty": lambda: (),
    "vec-push": lambda v, x: tuple(v) + (int(x),),
    "vec-get": lambda v, i: v[int(i)],
    "vec-set": lambda v, i, x: tuple(x if k == int(i) else y for k, y in enumerate(v)),
    "vec-length": lambda v: len(v),
    "*": lambda a, b: a * b, "/": lambda a, b: a / b, "+": lambda a, b: a + b,
    "-": lambda a, b: a - b, "to-f64": float, "abs": abs,
    "shape": lambda n: tuple(n.shape),
}
_STEPS = {"Reshape", "Permute", "Expand", "Strided"}
_CONSTVALS = {"Scalar", "Blob"}


def instantiate(text: str, env: dict[str, Any], tables: Tables) -> Any:
    """Evaluate a pattern text with ``env`` bindings (``?var`` -> value) into IR/Python values.

    Expr constructors decode to IR nodes (``lumc.rewrites.language.decode_node``); ``vec-of``
    and arithmetic primitives evaluate in Python; ``Step``/``ConstVal`` values are tuples.
    """
    def ev(t):
        if isinstance(t, str):
            if t.startswith("?"):
                return env[t[1:]]
            return _literal(t)
        head, args = t[0], [ev(a) for a in t[1:]]
        if head in _PRIMS:
            return _PRIMS[head](*args)
        if head in _STEPS:
            return (head, args[0])
        if head in _CONSTVALS:
            return (head, args if head == "Scalar" else args)
        if head == "View":
            return decode_step(args[0], args[1], tables)
        return decode_node(head, args, tables)
    return ev(parse_sexpr(text))


def _free(t, env) -> set[str]:
    if isinstance(t, str):
        return {t[1:]} if t.startswith("?") and t[1:] not in env else set()
    out: set[str] = set()
    for x in t:
        out |= _free(x, env)
    return out


def bind_where(rule: Rule, env: dict[str, Any], tables: Tables) -> dict[str, Any]:
    """Extend ``env`` with what the rule's ``(= ?v expr)`` facts define, in dependency order
    (sub-patterns such as ``(= ?e (Exp2 ...))`` and computed values such as ``(vec-push ?s 1)``)."""
    env = dict(env)
    facts = []
    for f in rule.where:
        t = parse_sexpr(f)
        if t[0] != "=":
            continue
        for var, expr in ((t[1], t[2]), (t[2], t[1])):
            if isinstance(var, str) and var.startswith("?") and isinstance(expr, list):
                facts.append((var[1:], expr))
    changed = True
    while changed:
        changed = False
        for var, expr in facts:
            if var not in env and not _free(expr, env):
                env[var] = instantiate(_unparse(expr), env, tables)
                changed = True
    return env


def _unparse(t) -> str:
    return t if isinstance(t, str) else "(" + " ".join(_unparse(x) for x in t) + ")"


def lhs_node(rule: Rule, env: dict[str, Any], tables: Tables) -> Node:
    """The IR of the rule's left side under ``env`` (where-bound sub-patterns first)."""
    return instantiate(rule.lhs, bind_where(rule, env, tables), tables)
