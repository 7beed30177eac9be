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
from typing import TYPE_CHECKING, Any

from lumc.ir.graph import Node

if TYPE_CHECKING:   # language imports the spelling forms, which are rules: import it late
    from lumc.rewrites.language import Tables

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
        form: for a *spelling* rule (``lumc.rewrites.spellings``), the kernel form its right side
            names; the right side is then a form constructor whose meaning is this left side.
    """
    name: str
    numerics: str
    lhs: str
    rhs: str
    where: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    cases: tuple[dict, ...] = field(default=(), compare=False)
    form: str = ""

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
    if tok in ("true", "false"):
        return tok == "true"
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
    "vec-append": lambda a, b: tuple(a) + tuple(b),
    "vec-remove": lambda v, i: tuple(x for k, x in enumerate(v) if k != int(i)),
    "*": lambda a, b: a * b, "/": lambda a, b: a / b, "+": lambda a, b: a + b,
    "-": lambda a, b: a - b, "to-f64": float, "abs": abs,
    "shape": lambda n: tuple(n.shape),
    "split-of": lambda name: _split_factor(name),
}


def _split_factor(name: str) -> float:
    from lumc.rewrites.language import split_factor    # late, as Tables above
    return split_factor(name)
_STEPS = {"Reshape", "Permute", "Expand", "Strided"}
_CONSTVALS = {"Scalar", "Blob", "Flag"}


def instantiate(text: str, env: dict[str, Any], tables: Tables) -> Any:
    """Evaluate a pattern text with ``env`` bindings (``?var`` -> value) into IR/Python values.

    Expr constructors decode to IR nodes (``lumc.rewrites.language.decode_node``); ``vec-of``
    and arithmetic primitives evaluate in Python; ``Step``/``ConstVal`` values are tuples.
    """
    from lumc.rewrites.language import decode_node, decode_step
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


# argument sorts of the non-Expr constructors a pattern may use
_VALUE_SORTS = {"Scalar": ("f64", "String"), "Blob": ("String",), "Flag": ("bool",),
                "Reshape": ("IVec",), "Permute": ("IVec",), "Expand": ("IVec",),
                "Strided": ("i64",)}
_IVEC_PRIMS = {"vec-of", "vec-empty", "vec-push", "vec-set", "vec-remove", "vec-append",
               "shape"}


def var_sorts(rule: Rule, ctors: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """The egglog sort of every variable of ``rule``'s left side and ``where`` facts, read off the
    argument positions it appears in (``ctors``: ``{constructor: argument sorts}``)."""
    sorts: dict[str, str] = {}
    table = dict(ctors, **_VALUE_SORTS)

    def walk(t):
        if not isinstance(t, list):
            return
        head, args = t[0], t[1:]
        if head in table:
            for a, srt in zip(args, table[head]):
                if isinstance(a, str) and a.startswith("?"):
                    sorts.setdefault(a[1:], srt)
        elif head in ("vec-get", "vec-length", "vec-set", "vec-push", "vec-remove") and args:
            if isinstance(args[0], str) and args[0].startswith("?"):
                sorts.setdefault(args[0][1:], "IVec")
        elif head == "=" and len(args) == 2:
            for var, expr in ((args[0], args[1]), (args[1], args[0])):
                if isinstance(var, str) and var.startswith("?") and isinstance(expr, list):
                    sorts.setdefault(var[1:], "IVec" if expr[0] in _IVEC_PRIMS else
                                     "i64" if expr[0] in ("vec-get", "vec-length") else "Expr")
        for a in args:
            walk(a)

    walk(parse_sexpr(rule.lhs))
    for f in rule.where:
        walk(parse_sexpr(f))
    return sorts


def bound_vars(rule: Rule) -> set[str]:
    """Variables a ``where`` fact defines from others (``(= ?v (...))``)."""
    out = set()
    for f in rule.where:
        t = parse_sexpr(f)
        if t[0] == "=":
            for var, expr in ((t[1], t[2]), (t[2], t[1])):
                if isinstance(var, str) and var.startswith("?") and isinstance(expr, list):
                    out.add(var[1:])
    return out


def lhs_node(rule: Rule, env: dict[str, Any], tables: Tables) -> Node:
    """The IR of the rule's left side under ``env`` (where-bound sub-patterns first)."""
    return instantiate(rule.lhs, bind_where(rule, env, tables), tables)
