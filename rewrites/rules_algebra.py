"""``algebra``: identities, constant folding, reduction algebra and matmul-chain association.

Constant folding works on float scalars held as f64: an f64 product, sum or quotient of two
values of a narrower float dtype, rounded once to that dtype when decoded, equals the IEEE result
in that dtype (products are exact in f64; for sums and quotients double rounding is innocuous since
53 >= 2p + 2 for p <= 24, Figueroa 1995), so the folds are ``exact``.
"""
from __future__ import annotations

from lumc.rewrites.patterns import Rule
from lumc.rewrites.rules_kernels import fill

_X = {"x": ("in", (3, 5), "f32"), "dt": "f32", "z0": (), "S": (3, 5)}
_X0 = {"x": ("in", (0, 5), "f32"), "dt": "f32", "z0": (), "S": (0, 5)}


def identity_rules() -> list[Rule]:
    one, zero = fill("1.0", "?S", "0"), fill("0.0", "?S", "0")
    return [
        # x * 1 = x for every x, NaN and -0.0 included
        Rule("algebra/Mul: x * 1 -> x", "exact", f"(Mul ?x {one})", "?x",
             cases=(_X, _X0)),
        # x + 0 turns -0.0 into +0.0: valid up to the sign of zero
        Rule("algebra/Add: x + 0 -> x", "domain", f"(Add ?x {zero})", "?x", cases=(_X, _X0)),
        # x * 0 is NaN for x = inf or NaN
        Rule("algebra/Mul: x * 0 -> 0", "domain", f"(Mul ?x {zero})", zero, cases=(_X,)),
        # 1 / (1 / x) loses x where 1/x overflows or underflows
        Rule("algebra/Recip: recip(recip(x)) -> x", "domain", "(Recip (Recip ?x))", "?x",
             cases=({"x": ("in", (4, 3), "f32")},)),
        # x / 1 = x for every x, NaN and -0.0 included (IEEE division by 1 is exact)
        Rule("algebra/Div: x / 1 -> x", "exact", f"(Div ?x {one})", "?x", cases=(_X, _X0)),
        # 1 / x is the reciprocal: both correctly rounded (Recip renders as div_rn), inf, NaN
        # and +-0 included (an exporter's Div(1, sqrt(v)): RMSNorm, ONNX's Reciprocal spelled out)
        Rule("algebra/Div: 1 / x -> recip(x)", "exact", f"(Div {one} ?x)", "(Recip ?x)",
             cases=(_X, _X0)),
    ]


def fast_math_rules() -> list[Rule]:
    """Rewrites that change results beyond the sign of zero for speed; only under fast math
    (``Limits.fast_math``), never by default."""
    xy = {"x": ("in", (4, 5), "f32"), "y": ("in", (4, 5), "f32")}
    return [
        # a / b = a * (1/b): two roundings instead of one (up to 1.5 ulp), and 1/b may overflow
        # or underflow where a / b does not; a reciprocal shared by many quotients is cheaper
        Rule("algebra/Div: a / b -> a * recip(b) [fast math]", "reassociating", "(Div ?x ?y)",
             "(Mul ?x (Recip ?y))", cases=(xy, dict(xy, x=("in", (0, 5), "f32"),
                                                    y=("in", (0, 5), "f32")))),
    ]


FAST_MATH = frozenset(r.name for r in fast_math_rules())


def fold_rules() -> list[Rule]:
    a, b = fill("?a", "?S", "1"), fill("?b", "?S", "2")
    new = "(Const (Scalar {v} ?dt) (vec-empty))"
    cases = ({"a": 0.1, "b": -3.0e-3, "dt": "f32", "z1": (), "z2": (), "S": (4, 3)},
             {"a": 3.0e38, "b": 10.0, "dt": "f32", "z1": (), "z2": (1,), "S": (2,)})
    out = []
    for op, sym in (("Mul", "*"), ("Add", "+")):
        v = f"({sym} ?a ?b)"
        # a zero product may be -0.0, which egglog's f64 equates with +0.0: not folded
        guard = (f"(!= {v} 0.0)",) if op == "Mul" else ()
        out.append(Rule(f"algebra/{op}: fold c1 {sym} c2", "exact", f"({op} {a} {b})",
                        f"(View {new.format(v=v)} (Expand ?S))", guard,
                        sets=(f"(set (shape {new.format(v=v)}) (vec-empty))",), cases=cases))
    inv = new.format(v="(/ 1.0 ?a)")
    quot = new.format(v="(/ ?a ?b)")
    # a zero quotient may be -0.0 (egglog's f64 equates it with +0.0), x/0 is inf or NaN: not folded
    out.append(Rule("algebra/Div: fold c1 / c2", "exact", f"(Div {a} {b})",
                    f"(View {quot} (Expand ?S))", ("(!= ?b 0.0)", "(!= ?a 0.0)", "(< (abs ?a) inf)",
                                                   "(< (abs ?b) inf)", "(!= (/ ?a ?b) 0.0)"),
                    sets=(f"(set (shape {quot}) (vec-empty))",),
                    cases=({"a": 14.999999, "b": 3.0, "dt": "f32", "z1": (), "z2": (), "S": (4, 3)},
                           {"a": 3.0e38, "b": 0.1, "dt": "f32", "z1": (), "z2": (1,), "S": (2,)})))
    out.append(Rule("algebra/Recip: fold recip(c)", "exact", f"(Recip {a})",
                    f"(View {inv} (Expand ?S))", ("(!= ?a 0.0)", "(< (abs ?a) inf)"),
                    sets=(f"(set (shape {inv}) (vec-empty))",),
                    cases=({"a": 3.0, "dt": "f32", "z1": (), "S": (4, 3)},
                           {"a": 1.0e-40, "dt": "f32", "z1": (), "S": (2,)})))
    return out


def select_rules() -> list[Rule]:
    """Comparisons of constants and selects on constant conditions (guards exporters emit
    around values known at export time, e.g. JAX's ``isfinite`` of a constant)."""
    a, b = fill("?a", "?S", "1"), fill("?b", "?S", "2")

    def flag(v: str) -> str:
        return f"(View (Const (Flag {v}) (vec-empty)) (Expand ?S))"

    def sets(v: str) -> tuple[str, ...]:
        return (f"(set (shape (Const (Flag {v}) (vec-empty))) (vec-empty))",)

    ab = {"dt": "f32", "z1": (), "z2": (), "S": (4, 3)}
    xy = {"x": ("in", (3, 5), "f32"), "y": ("in", (3, 5), "f32"), "z": (), "S": (3, 5)}
    ninf = fill("-inf", "?S", "1"), fill("-inf", "?S", "2")
    # egglog orders NaN above inf (ordered floats): the guards keep NaN out of the folds
    finite = ("(<= ?a inf)", "(<= ?b inf)")
    return [
        Rule("algebra/LessThan: fold c1 < c2 (true)", "exact", f"(LessThan {a} {b})", flag("true"),
             ("(< ?a ?b)",) + finite, sets=sets("true"),
             cases=(dict(ab, a=0.0, b=float("inf")), dict(ab, a=float("-inf"), b=-3.5))),
        Rule("algebra/LessThan: fold c1 < c2 (false)", "exact", f"(LessThan {a} {b})",
             flag("false"), ("(<= ?b ?a)",) + finite, sets=sets("false"),
             cases=(dict(ab, a=0.0, b=0.0), dict(ab, a=float("inf"), b=1.0e30))),
        Rule("algebra/Where: where(true, x, y) -> x", "exact",
             "(Where (View (Const (Flag true) ?z) (Expand ?S)) ?x ?y)", "?x", cases=(xy,)),
        Rule("algebra/Where: where(false, x, y) -> y", "exact",
             "(Where (View (Const (Flag false) ?z) (Expand ?S)) ?x ?y)", "?y", cases=(xy,)),
        # max(x, -inf) as where(x < -inf, -inf, x): nothing is below -inf, NaN included
        Rule("algebra/Where: where(x < -inf, -inf, x) -> x", "exact",
             f"(Where (LessThan ?x {ninf[0]}) {ninf[1]} ?x)", "?x",
             cases=({"x": ("in", (4, 3), "f32"), "dt": "f32", "z1": (), "z2": (), "S": (4, 3)},)),
    ]


def reduction_rules() -> list[Rule]:
    c = fill("?c", "?S", "0")
    cr = "(View (Const (Scalar ?c ?dt) ?z0) (Expand ?R))"
    base = {"x": ("in", (4, 6), "f32"), "dt": "f32", "z0": (), "S": (4, 6)}
    return [
        # sum(x * c) = sum(x) * c: one multiply per output instead of per input (rounding differs)
        Rule("algebra/SumReduce: sum(x * c) -> sum(x) * c", "reassociating",
             f"(SumReduce (Mul ?x {c}) ?ax)", f"(Mul (SumReduce ?x ?ax) {cr})",
             ("(= ?R (shape ?root))", "(< (abs ?c) inf)"),
             sets=("(set (shape (SumReduce ?x ?ax)) ?R)", "(set (shape (Const (Scalar ?c ?dt) ?z0)) ?z0)",
                   f"(set (shape {cr}) ?R)"),
             cases=(dict(base, c=0.125, ax=(1,)), dict(base, c=-3.0, ax=(0,)),
                    dict(base, x=("in", (0, 6), "f32"), S=(0, 6), c=2.0, ax=(0,)))),
    ]


def squeeze_rules() -> list[Rule]:
    """A 1x1 convolution (or linear layer) of a global average pool, as the conv lowering writes
    it over ``F = [N, O, C, 1, 1, 1, 1]``, becomes one contraction over channels and pixels:

        sum_c w[o, c] * (k * sum_hw y[c, h, w])  ->  k * sum_{c, h, w} w[o, c] * y[c, h, w]

    The squeeze of a squeeze-and-excitation block then reads the feature map once, in one kernel,
    instead of a pooling kernel and a GEMV kernel. Distributing the scale and merging the two sums
    change the order of rounding: ``reassociating``."""
    n, c, h, w = (f"(vec-get ?sy {i})" for i in range(4))
    o = "(vec-get ?F 1)"
    gap = f"(Mul (SumReduce ?y (vec-of 2 3)) {fill('?k', '?G', '0')})"
    lhs = f"(SumReduce (Mul (View (View {gap} (Reshape ?s1)) (Expand ?F)) ?wb) (vec-of 2 4 6))"
    p = f"(vec-of {n} {o} {c} {h} {w})"
    yb = f"(View (View ?y (Reshape (vec-of {n} 1 {c} {h} {w}))) (Expand {p}))"
    wb = f"(View (View ?wb (Reshape (vec-of {n} {o} {c} 1 1))) (Expand {p}))"
    red_shape = f"(vec-of {n} {o} 1 1 1)"
    red = f"(SumReduce (Mul {yb} {wb}) (vec-of 2 3 4))"
    kfill = f"(View (Const (Scalar ?k ?dt) ?z0) (Expand {red_shape}))"
    rhs = f"(View (Mul {red} {kfill}) (Reshape ?F1))"
    where = ("(= ?sy (shape ?y))", "(= (vec-length ?sy) 4)",
             f"(= ?s1 (vec-of {n} 1 {c} 1 1 1 1))", f"(= ?F (vec-of {n} {o} {c} 1 1 1 1))",
             "(= ?F1 (shape ?root))", "(< (abs ?k) inf)")
    sets = (f"(set (shape {red}) {red_shape})",)
    case = {"y": ("in", (2, 3, 4, 5), "f32"), "wb": ("in", (2, 6, 3, 1, 1, 1, 1), "f32"),
            "k": 0.05, "dt": "f32", "z0": (), "G": (2, 3, 1, 1), "s1": (2, 1, 3, 1, 1, 1, 1),
            "F": (2, 6, 3, 1, 1, 1, 1)}
    return [Rule("algebra/SumReduce: w . mean_hw(y) -> mean over (c, h, w) of w * y [1x1 conv]",
                 "reassociating", lhs, rhs, where, sets=sets,
                 cases=(case, dict(case, k=0.25, y=("in", (1, 4, 1, 1), "f32"), G=(1, 4, 1, 1),
                                   s1=(1, 1, 4, 1, 1, 1, 1), F=(1, 2, 4, 1, 1, 1, 1),
                                   wb=("in", (1, 2, 4, 1, 1, 1, 1), "f32"))))]


def association_rules() -> list[Rule]:
    """Matmul chains both ways, rank 2 and batched rank 3 (expansive: run under back-off)."""
    out = []
    for r in (2, 3):
        g = lambda v: [f"(vec-get {v} {i})" for i in range(r)]   # noqa: E731
        sb, sc, sa = g("?sb"), g("?sc"), g("?sa")
        bc = " ".join(sb[:-1] + [sc[-1]])
        ab = " ".join(sa[:-1] + [sb[-1]])
        where = ("(= ?sa (shape ?a))", "(= ?sb (shape ?b))", "(= ?sc (shape ?c))",
                 f"(= (vec-length ?sa) {r})", f"(= (vec-length ?sb) {r})",
                 f"(= (vec-length ?sc) {r})")
        batch = (2,) * (r - 2)
        case = {"a": ("in", batch + (3, 4), "f32"), "b": ("in", batch + (4, 5), "f32"),
                "c": ("in", batch + (5, 1), "f32")}
        out.append(Rule(f"algebra/MatMul: (a @ b) @ c -> a @ (b @ c) [r={r}]", "reassociating",
                        "(MatMul (MatMul ?a ?b) ?c)", "(MatMul ?a (MatMul ?b ?c))", where,
                        sets=(f"(set (shape (MatMul ?b ?c)) (vec-of {bc}))",), cases=(case,)))
        out.append(Rule(f"algebra/MatMul: a @ (b @ c) -> (a @ b) @ c [r={r}]", "reassociating",
                        "(MatMul ?a (MatMul ?b ?c))", "(MatMul (MatMul ?a ?b) ?c)", where,
                        sets=(f"(set (shape (MatMul ?a ?b)) (vec-of {ab}))",), cases=(case,)))
    return out


EXPANSIVE = frozenset(r.name for r in association_rules())


def rules() -> list[Rule]:
    return (identity_rules() + fold_rules() + select_rules() + reduction_rules()
            + squeeze_rules() + association_rules() + fast_math_rules())

