"""Spelling forms: a kernel form whose meaning is exactly the composition a model wrote.

The forms of ``lumc.rewrites.language.FORMS`` decode to the library's own composition (``Softmax``
to ``norm.softmax``), so only spellings equal to it bit for bit may become them. Exporters write
other spellings of the same kernels: JAX/Flax computes a layer norm's variance in one pass as
``max(E[x^2] - E[x]^2, 0)``, which is not the two-pass form and differs from it by more than
rounding when the mean is large. Rewriting one into the other would change results; naming it
does not. A spelling rule unions its left side with a constructor whose arguments are the left
side's free variables, and whose meaning is the left side itself, instantiated with them
(:func:`lumc.rewrites.patterns.lhs_node`): ``exact`` by construction. The form tells extraction
and fusion that the whole composition is one row kernel (the row engine of the Triton backend
renders any reductions over the same axes with their prologue and epilogue).

Each spelling registers its constructor in ``language.FORMS`` and ``language.FORM_KERNEL`` at
import (``language`` imports this module last), so the language declares it like any form.
"""
from __future__ import annotations

from dataclasses import dataclass

from lumc.ir.graph import Node
from lumc.rewrites import language
from lumc.rewrites.patterns import Rule, bound_vars, lhs_node, var_sorts


@dataclass(frozen=True)
class Spelling:
    """A spelling form: constructor ``ctor`` with ``args`` (names) of ``sorts``, meaning ``rule.lhs``."""
    ctor: str
    args: tuple[str, ...]
    sorts: tuple[str, ...]
    rule: Rule

    def build(self, values: list, tables: language.Tables) -> Node:
        """The primitive IR of the form applied to decoded argument values."""
        return lhs_node(self.rule, dict(zip(self.args, values)), tables)


SPELLINGS: dict[str, Spelling] = {}


def spelling_rule(name: str, ctor: str, kernel: str, lhs: str, where: tuple[str, ...],
                  cases: tuple[dict, ...], doc: str) -> Rule:
    """A ``kernels`` rule naming ``lhs`` as form ``ctor`` of kernel form ``kernel``; registers the
    constructor (arguments: the free variables of ``lhs`` and ``where``, Expr ones first)."""
    proto = Rule(name, "exact", lhs, "?x", where)
    ctors = {c: s for c, s in language.constructors().items()}
    sorts = var_sorts(proto, ctors)
    free = [v for v in sorts if v not in bound_vars(proto) and v != "root"]
    free.sort(key=lambda v: (sorts[v] != "Expr", v))
    rhs = f"({ctor} {' '.join('?' + v for v in free)})"
    rule = Rule(name, "exact", lhs, rhs, where, cases=cases, form=kernel)
    sp = Spelling(ctor, tuple(free), tuple(sorts[v] for v in free), rule)
    SPELLINGS[ctor] = sp
    language.FORMS[ctor] = (sp.sorts, doc)
    language.FORM_KERNEL[ctor] = kernel
    return rule


def _fill(value: str, shape: str, tag: str) -> str:
    return f"(View (Const (Scalar {value} ?dt) ?z{tag}) (Expand {shape}))"


def _ln_moments(scaled: bool) -> Rule:
    """Layer norm with the one-pass variance of JAX/Flax (``jax.numpy.var`` under a
    ``max(., 0)``), over one axis, optionally with the scale multiplied into the reciprocal:

        mean = sum(x) * (1/K);  var = max(sum(x*x) * (1/K) - mean * mean, 0)
        y = (x - mean) * (rsqrt(var + eps) [* scale])
    """
    # broadcasts back are reshape-then-expand: the views ruleset adds that spelling where the
    # encoder wrote one Expand (a reshape adding leading 1s only)
    red = "(View (SumReduce {x} ?ax) (Reshape ?M))"
    mean = f"(Mul {red.format(x='?x')} {_fill('?invn', '?M', '0')})"
    ex2 = f"(Mul {red.format(x='(Mul ?x ?x)')} {_fill('?invn', '?M', '0')})"
    var = f"(Add {ex2} (Mul (Mul ?mean ?mean) {_fill('-1.0', '?M', '1')}))"
    zero = _fill("0.0", "?M", "2")
    clamp = f"(Where (LessThan ?var {zero}) {zero} ?var)"
    rs = f"(View (Recip (Sqrt (Add (View ?v0 (Reshape ?R)) {_fill('?eps', '?R', '3')}))) (Expand ?S))"
    d = f"(Add ?x (Mul (View (View ?mean (Reshape ?R)) (Expand ?S)) {_fill('-1.0', '?S', '4')}))"
    where = (f"(= ?mean {mean})", f"(= ?var {var})", f"(= ?v0 {clamp})", f"(= ?d {d})",
             "(= (vec-length ?ax) 1)", "(= ?S (shape ?x))")
    shape, ax = (3, 6, 5), (1,)
    base = {"x": ("in", shape, "f32"), "ax": ax, "M": (3, 5), "R": (3, 1, 5), "dt": "f32",
            "invn": 1.0 / 6, "eps": 1e-6, "z0": (), "z1": (), "z2": (), "z3": (), "z4": ()}
    tag = "scaled" if scaled else "plain"
    if scaled:
        lhs = f"(Mul ?d (Mul {rs} ?g))"
        cases = (dict(base, g=("in", shape, "f32")),
                 dict(base, x=("in", (2, 7), "f32"), ax=(1,), M=(2,), R=(2, 1),
                      g="(View ?gw (Expand (vec-of 2 7)))", gw=("in", (7,), "f32"), invn=1.0 / 7))
    else:
        lhs = f"(Mul ?d {rs})"
        cases = (base,)
    return spelling_rule(
        f"kernels/LayerNorm: (x - mean) * rsqrt(max(E[x^2] - mean^2, 0) + eps) -> one-pass "
        f"layer norm [{tag}]", f"LayerNormMoments{'Scaled' if scaled else ''}", "layernorm",
        lhs, where, cases, "layer norm with the one-pass variance max(E[x^2] - E[x]^2, 0), as written")


def _two_sums() -> Rule:
    """Two reductions of same-shape operands over the same axes, added (with a bias on the first),
    as the LSTM lowering writes a gate pre-activation ``x @ W + b + h @ R``: one row kernel with
    two reductions instead of two kernels (same-shape operands once ``views`` drops a batch of one).
    """
    lhs = "(Add (View (Add ?r1 ?b) (Reshape ?s2)) (View ?r2 (Reshape ?s2)))"
    where = ("(= ?r1 (SumReduce ?p ?ax))", "(= ?r2 (SumReduce ?q ?ax))",
             "(= (shape ?p) (shape ?q))")
    case = {"p": ("in", (1, 6, 5), "f32"), "q": ("in", (1, 6, 5), "f32"),
            "b": ("in", (1, 1, 5), "f32"), "ax": (1,), "s2": (1, 5)}
    return spelling_rule(
        "kernels/Add: reshape(sum(p) + b) + reshape(sum(q)) -> one row kernel [two sums]",
        "TwoSums", "reduction", lhs, where, (case,),
        "reshape(sum(p, ax) + b) + reshape(sum(q, ax)) with shape p = shape q, as written")


def _scan(mask_view: str, negated: bool) -> Rule:
    """A contraction with the triangular 0/1 mask of ``lumc.ir.library.reduce.cumsum``
    (``out[i] = sum_j M[i, j] v[j]``, ``M = j <= i``, ``j < i`` exclusive, mirrored reversed) as a
    ``scan`` kernel: a prefix sum of ``v`` in ``O(L)`` instead of ``L^2`` multiply-adds. The form's
    meaning is the contraction as written; the backend (``lumc.backends.scan_structure``) checks the
    mask's strides and values and that ``v`` is finite by construction (the scan and the
    contraction differ where ``0 * inf`` is NaN), else the form is dropped. ``mask_view``: how the
    ``[L, L]`` mask ``?m`` reaches the product's shape (a reshape inserting 1s, then an expand;
    an expand alone when the scan axis is the last; none for a rank-1 scan)."""
    iotas = '(LessThan (Iota ?s ?p "i64") (Iota ?s ?q "i64"))'
    cond = f"(Where {iotas} ?f ?t)" if negated else iotas
    lhs = f"(SumReduce (Mul {mask_view} ?b) ?ax)"
    where = (f"(= ?m (Where {cond} ?one ?zero))",)
    n = 5
    m_shape = f"(vec-of {n} {n})"

    def fill(v):
        return f"(View (Const (Scalar {v} \"f32\") (vec-empty)) (Expand {m_shape}))"
    flags = {"f": f"(View (Const (Flag false) (vec-empty)) (Expand {m_shape}))",
             "t": f"(View (Const (Flag true) (vec-empty)) (Expand {m_shape}))"} if negated else {}
    base = dict(flags, s=(n, n), p=1 if negated else 0, q=0 if negated else 1,
                one=fill("1.0"), zero=fill("0.0"))
    if mask_view == "?m":
        case = dict(base, b=f"(View (View ?v (Reshape (vec-of 1 {n}))) (Expand {m_shape}))",
                    v=("in", (n,), "f32"), ax=(1,))
    elif "Reshape" in mask_view:
        big = f"(vec-of 3 {n} {n} 2)"
        case = dict(base, mr=(1, n, n, 1), big=(3, n, n, 2), ax=(2,),
                    b=f"(View (View ?v (Reshape (vec-of 3 1 {n} 2))) (Expand {big}))",
                    v=("in", (3, n, 2), "f32"))
    else:
        big = f"(vec-of 3 {n} {n})"
        case = dict(base, big=(3, n, n), ax=(2,),
                    b=f"(View (View ?v (Reshape (vec-of 3 1 {n}))) (Expand {big}))",
                    v=("in", (3, n), "f32"))
    view = {"?m": "none", "(View ?m (Expand ?big))": "expand"}.get(mask_view, "reshape")
    tag = f"{'inclusive' if negated else 'exclusive'}, mask view {view}"
    return spelling_rule(
        f"kernels/SumReduce: sum_j tri(i, j) * v[j] -> prefix sum of v [{tag}]",
        f"CumSum{'Inclusive' if negated else 'Exclusive'}{view.capitalize()}", "scan", lhs,
        where, (case,), "sum over j of a triangular 0/1 mask M[i, j] times v[j] (a prefix sum)")


SCAN_MASK_VIEWS = ("(View (View ?m (Reshape ?mr)) (Expand ?big))", "(View ?m (Expand ?big))", "?m")
RULES = [_ln_moments(True), _ln_moments(False), _two_sums()] + [
    _scan(v, neg) for v in SCAN_MASK_VIEWS for neg in (False, True)]


def rules() -> list[Rule]:
    return list(RULES)
