"""``views``: compose and cancel views, and move them through elementwise ops.

Permutations are pushed down through elementwise ops (toward the reads, where they fold into the
load's index expression and cancel against other permutations); broadcasts are pulled up out of
unary ops (compute on the small shape). Pulling them out of binary ops too never saturates together
with constant folding (each fold exposes a new pull), so that direction is left out. Per
op rules are generated from the op table's groups; permutation rules per rank. All are ``exact``:
an unmasked view only renames which element an elementwise op reads.
"""
from __future__ import annotations

from lumc.ir.ops import BINARY, OPS, UNARY
from lumc.rewrites.patterns import Rule

RANKS = (2, 3, 4, 5)


def _perm_of(p: str, q: str, r: int) -> str:
    """``p`` after ``q``: element ``j`` is ``p[q[j]]``."""
    return "(vec-of " + " ".join(f"(vec-get {p} (vec-get {q} {j}))" for j in range(r)) + ")"


def _permuted(s: str, p: str, r: int) -> str:
    return "(vec-of " + " ".join(f"(vec-get {s} (vec-get {p} {j}))" for j in range(r)) + ")"


def _swap(r: int) -> tuple[int, ...]:
    return tuple(range(r - 2)) + (r - 1, r - 2)


def _host(shape, p, q) -> dict:
    """A case whose left side is ``permute(exp2(permute(x, p)), q)``: the IR cannot compose the
    two views across the op, the e-graph pushes ``q`` down and then composes."""
    return {"__lhs__": "(View (Exp2 (View ?x (Permute ?p))) (Permute ?q))",
            "x": ("in", shape, "f32"), "p": p, "q": q}


def compose_rules() -> list[Rule]:
    out = []
    for r in RANKS:
        shape = (2, 3, 4, 5, 6)[:r]
        ident = "(vec-of " + " ".join(map(str, range(r))) + ")"
        out.append(Rule(f"views/View: permute(permute(x, p), q) -> permute(x, p[q]) [r={r}]",
                        "exact", "(View (View ?x (Permute ?p)) (Permute ?q))",
                        f"(View ?x (Permute {_perm_of('?p', '?q', r)}))",
                        (f"(= (vec-length ?p) {r})", "(= ?rs (shape ?root))"),
                        sets=(f"(set (shape (View ?x (Permute {_perm_of('?p', '?q', r)}))) ?rs)",),
                        cases=(_host(shape, _swap(r), tuple(range(1, r)) + (0,)),
                               _host(shape, _swap(r), _swap(r)))))
        out.append(Rule(f"views/View: permute(x, identity) -> x [r={r}]", "exact",
                        f"(View ?x (Permute {ident}))", "?x",
                        cases=(_host(shape, _swap(r), _swap(r)),)))
    out += [
        # nested reshapes appear when the kernels ruleset splits a contraction's squeeze out
        Rule("views/View: reshape(reshape(x, s1), s2) -> reshape(x, s2)", "exact",
             "(View (View ?x (Reshape ?s1)) (Reshape ?s2))", "(View ?x (Reshape ?s2))",
             cases=({"__lhs__": "(View (SumReduce (Mul ?A ?B) (vec-of 1)) (Reshape ?s2))",
                     "A": ("in", (2, 3, 4), "f32"), "B": ("in", (2, 3, 4), "f32"),
                     "s2": (4, 2)},)),
        # the encoder ends every rank-growing view in an Expand, trivial or not
        Rule("views/View: expand(x, shape x) -> x", "exact", "(View ?x (Expand ?s))", "?x",
             ("(= ?s (shape ?x))",),
             cases=({"__lhs__": "(View ?x (Reshape ?s1))", "x": ("in", (4, 6), "f32"),
                     "s1": (4, 6, 1)},)),
        # keepdims=False then unsqueeze, once a guard between them is gone
        Rule("views/View: reshape(x, shape x) -> x", "exact", "(View ?x (Reshape ?s))", "?x",
             ("(= ?s (shape ?x))",),
             cases=({"__lhs__": "(View (Where (LessThan ?m ?ninf) ?ninf ?m) (Reshape (vec-of 3 1)))",
                     "m": "(View (SumReduce ?x (vec-of 1)) (Reshape (vec-of 3)))",
                     "ninf": '(View (Const (Scalar -inf "f32") (vec-empty)) (Expand (vec-of 3)))',
                     "x": ("in", (3, 5), "f32")},)),
        # a reshape that drops a leading 1 before a broadcast: broadcasting adds it back
        Rule("views/View: expand(reshape(y, s), S) -> expand(y, S) where shape y = [1, *s]",
             "exact", "(View (View ?y (Reshape ?s)) (Expand ?S))", "(View ?y (Expand ?S))",
             ("(= ?sy (shape ?y))", "(= ?sy (vec-append (vec-of 1) ?s))",
              "(>= (vec-length ?S) (vec-length ?sy))"),
             cases=({"__lhs__": "(View (Where (LessThan ?m ?ninf) ?ninf ?m) (Expand (vec-of 3 5)))",
                     "m": "(View (SumReduce ?x (vec-of 1)) (Reshape (vec-of 1)))",
                     "ninf": '(View (Const (Scalar -inf "f32") (vec-empty)) (Expand (vec-of 1)))',
                     "x": ("in", (1, 5), "f32")},)),
    ]
    out.append(Rule(
        # a contraction over a leading 1 read without it: a batch of one lines up with rank-1-lower
        # contractions (an LSTM's input and recurrent products), so their kernels can merge. The
        # same sums, in an order the summing code picks (numpy's einsum and sum differ)
        "views/SumReduce: sum(p, [a]) with shape p = [1, *s] -> reshape(sum(reshape(p, s), [a-1]))",
        "reassociating", "(SumReduce ?p ?ax)",
        "(View (SumReduce (View ?p (Reshape (vec-remove ?sp 0))) (vec-of (- (vec-get ?ax 0) 1))) "
        "(Reshape ?sr))",
        ("(= ?p (Mul ?u ?v))", "(= ?sp (shape ?p))", "(>= (vec-length ?sp) 3)",
         "(= (vec-get ?sp 0) 1)", "(= (vec-length ?ax) 1)", "(>= (vec-get ?ax 0) 1)",
         "(= ?sr (shape ?root))"),
        sets=("(set (shape (SumReduce (View ?p (Reshape (vec-remove ?sp 0))) (vec-of (- (vec-get "
              "?ax 0) 1)))) (vec-set (vec-remove ?sp 0) (- (vec-get ?ax 0) 1) 1))",),
        cases=({"u": ("in", (1, 1, 6, 5), "f32"), "v": ("in", (1, 1, 6, 5), "f32"),
                "p": "(Mul ?u ?v)", "ax": (2,)},
               {"u": ("in", (1, 4, 3), "f32"), "v": ("in", (1, 4, 3), "f32"),
                "p": "(Mul ?u ?v)", "ax": (1,)})))
    for k in (1, 2):
        ones = "(vec-of " + " ".join(["1"] * k) + ")"
        # numpy broadcasting prepends 1s: spell that reshape out, so one pattern serves both
        out.append(Rule(
            f"views/View: expand(x, S) -> expand(reshape(x, [1]*{k} + shape x), S)", "exact",
            "(View ?x (Expand ?S))", f"(View (View ?x (Reshape (vec-append {ones} ?sx))) (Expand ?S))",
            ("(= ?sx (shape ?x))", f"(= (vec-length ?S) (+ (vec-length ?sx) {k}))"),
            cases=({"x": ("in", (3, 1), "f32"), "S": (2,) * k + (3, 4)},
                   {"x": ("in", (5,), "f32"), "S": (1,) * k + (5,)})))
    return out


def _unary_term(op: str, x: str) -> str:
    return f"({OPS[op].egglog} {x} ?t)" if op == "Cast" else f"({OPS[op].egglog} {x})"


def push_rules() -> list[Rule]:
    """Per op of the table's unary, binary and ternary groups; one rule serves every rank (the
    permutation's length is checked against the operand's rank; the ``shapes`` analysis gives the
    new views their shapes)."""
    out = []
    rank_ok = "(= (vec-length ?p) (vec-length (shape ?x)))"
    for op in sorted(UNARY):
        cast = {"t": "f16"} if op == "Cast" else {}
        out.append(Rule(
            f"views/{op}: permute({op.lower()}(x)) -> {op.lower()}(permute(x))", "exact",
            f"(View {_unary_term(op, '?x')} (Permute ?p))",
            _unary_term(op, "(View ?x (Permute ?p))"), (rank_ok,),
            cases=tuple(dict(cast, x=("in", shape, "f32"), p=_swap(len(shape)))
                        for shape in ((3, 4), (3, 4, 2), (0, 4, 2), (3, 4, 2, 5, 2)))))
        out.append(Rule(
            f"views/{op}: {op.lower()}(expand(x)) -> expand({op.lower()}(x))", "exact",
            _unary_term(op, "(View ?x (Expand ?s))"),
            f"(View {_unary_term(op, '?x')} (Expand ?s))", ("(= ?sx (shape ?x))",),
            sets=(f"(set (shape {_unary_term(op, '?x')}) ?sx)",),
            cases=(dict(cast, x=("in", (3, 1), "f32"), s=(2, 3, 4)),)))
    for op in sorted(BINARY):
        e = OPS[op].egglog
        out.append(Rule(
            f"views/{op}: permute({op.lower()}(x, y)) -> {op.lower()}(permute x, permute y)",
            "exact", f"(View ({e} ?x ?y) (Permute ?p))",
            f"({e} (View ?x (Permute ?p)) (View ?y (Permute ?p)))", (rank_ok,),
            cases=tuple({"x": ("in", shape, "f32"), "y": ("in", shape, "f32"),
                         "p": _swap(len(shape))} for shape in ((3, 4), (3, 4, 2), (3, 4, 2, 5)))))
    for op in sorted(n for n, row in OPS.items() if row.group == "ternary"):
        e = OPS[op].egglog
        out.append(Rule(
            f"views/{op}: permute({op.lower()}(c, x, y)) -> {op.lower()}(permute c, permute x, "
            "permute y)", "exact", f"(View ({e} ?c ?x ?y) (Permute ?p))",
            f"({e} (View ?c (Permute ?p)) (View ?x (Permute ?p)) (View ?y (Permute ?p)))",
            (rank_ok,),
            cases=tuple({"c": ("in", shape, "bool"), "x": ("in", shape, "f32"),
                         "y": ("in", shape, "f32"), "p": _swap(len(shape))}
                        for shape in ((3, 4), (3, 4, 2, 5)))))
    return out


def rules() -> list[Rule]:
    return compose_rules() + push_rules()
