"""``kernels``: recognize kernel forms as alternatives in the e-class of their primitive meaning.

Each left side is the canonical encoding (``lumc.rewrites.language``) of the composition the
library builds (``Tensor.matmul``, ``lumc.ir.library.norm.softmax`` ...), which ONNX import of
``MatMul``, ``Softmax`` or its ``ReduceMax/Sub/Exp/ReduceSum/Div`` spelling, ``LayerNormalization``
or its ``ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div`` spelling all produce, and the spellings
``torch.export`` adds: an N-D ``matmul`` decomposed into ``bmm`` between merging views (a batch of one
composing the unit dim away), ``masked_fill``'s ``where(drop, fill, scores)``. Every rule is
generated per rank (and axis), so every match is rank-checked. All are ``exact`` (the right side
decodes to the same primitives) but the quotient spellings, ``reassociating`` where they are.
"""
from __future__ import annotations

import numpy as np

from lumc.ir.tensor import LOG2E
from lumc.rewrites.patterns import Rule

F32_LOG2E = float(np.float32(LOG2E))


def fill(value: str, shape: str, tag: str) -> str:
    """Pattern of a float scalar broadcast to ``shape``."""
    return f"(View (Const (Scalar {value} ?dt) ?z{tag}) (Expand {shape}))"


def _getters(var: str, rank: int) -> list[str]:
    return [f"(vec-get {var} {i})" for i in range(rank)]


def _matmul_rule(ra: int, rb: int, bare_a: bool, folded_b: bool) -> Rule:
    """One (rank a, rank b) instance. ``bare_a``: N = 1, so ``a``'s broadcast is a bare reshape
    (a view over another contraction keeps no trivial Expand). ``folded_b``: ``b`` (rank 2) is
    broadcast by an Expand alone; otherwise by a reshape inserting the M axis, then an Expand."""
    f = ra
    a_part = "(View ?a (Reshape ?F))" if bare_a else "(View (View ?a (Reshape ?sa1)) (Expand ?F))"
    b_part = "(View ?b (Expand ?F))" if folded_b else "(View (View ?b (Reshape ?sb1)) (Expand ?F))"
    lhs = f"(View (SumReduce (Mul {a_part} {b_part}) (vec-of {f - 1})) (Reshape ?so))"
    where = [
        "(= ?sa (shape ?a))", f"(= (vec-length ?sa) {ra})", "(= ?sb (shape ?b))",
        f"(= (vec-length ?sb) {rb})", f"(= (vec-get ?sa {ra - 1}) (vec-get ?sb {rb - 2}))",
        "(= ?sa1 (vec-push ?sa 1))",
        f"(= ?F (vec-set ?sa1 {ra} (vec-get ?sb {rb - 1})))",
        f"(= ?so (vec-set ?sa {ra - 1} (vec-get ?sb {rb - 1})))",
    ]
    if bare_a:
        where.append(f"(= (vec-get ?sb {rb - 1}) 1)")
    if not folded_b:
        g = _getters("?sb", rb)
        lead = g[:-2] if rb == ra else ["1"] * (ra - 2)
        where.append(f"(= ?sb1 (vec-of {' '.join(lead)} 1 {g[-2]} {g[-1]}))")
    batch = (2, 3)[: ra - 2]
    bb = batch if rb == ra else ()
    if rb == 2 and not folded_b:
        # b is a matmul result read through a reshape: a @ (x @ w)
        cases = ({"a": ("in", batch + (3, 4), "f32"), "b": "(MatMul ?x ?w)",
                  "x": ("in", (4, 6), "f32"), "w": ("in", (6, 1 if bare_a else 5), "f32")},)
    elif bare_a:
        # a is itself a matmul result read through a reshape: (x @ w) @ v with v [K, 1]
        cases = ({"a": "(MatMul ?x ?w)", "x": ("in", batch + (3, 6), "f32"),
                  "w": ("in", (6, 4), "f32"), "b": ("in", bb + (4, 1), "f32")},)
    else:
        cases = ({"a": ("in", batch + (3, 4), "f32"), "b": ("in", bb + (4, 5), "f32")},
                 {"a": ("in", batch + (3, 4), "f32"), "b": ("in", bb + (4, 1), "f32")},
                 {"a": ("in", batch + (0, 4), "f32"), "b": ("in", bb + (4, 5), "f32")})
    tag = f"{ra}x{rb}" + (" N=1" if bare_a else "") + ("" if folded_b or rb > 2 else " b reshaped")
    return Rule(f"kernels/MatMul: sum(expand(a) * expand(b)) -> matmul(a, b) [{tag}]",
                "exact", lhs, "(MatMul ?a ?b)", tuple(where), cases=cases)


def _one_row_matmul_rule(ra: int) -> Rule:
    """``M = 1``: ``b`` needs no broadcast over the rows, so its view into the product space is a
    bare reshape of any value (a grouped-query V, ``[B, G, R, T, D]`` merged to ``[B, G*R, 1, T,
    D]`` for one query) with no Expand to match. It is read as the reshape to ``b``'s own
    ``[..., K, N]`` (the product shape without the unit M axis), then the unit axis inserted:
    row-major reshapes compose, so the two read the same elements."""
    f = ra + 1
    a_part = "(View (View ?a (Reshape ?sa1)) (Expand ?F))"
    lhs = (f"(View (SumReduce (Mul {a_part} (View ?y (Reshape ?F))) (vec-of {f - 2})) "
           "(Reshape ?so))")
    sbm = f"(vec-remove ?F {ra - 2})"
    vb = f"(View ?y (Reshape {sbm}))"
    where = ("(= ?sa (shape ?a))", f"(= (vec-length ?sa) {ra})", f"(= (vec-get ?sa {ra - 2}) 1)",
             "(= ?sa1 (vec-push ?sa 1))", f"(= (vec-length ?F) {f})",
             f"(= (vec-get ?F {ra - 1}) (vec-get ?sa {ra - 1}))",
             f"(= ?so (vec-set ?sa {ra - 1} (vec-get ?F {ra})))")
    batch = (2, 3)[: ra - 2]
    cases = ({"a": ("in", batch + (1, 4), "f32"), "y": ("in", (6, 4, 5) if ra == 4 else (2, 4, 5),
                                                          "f32"),
              "F": batch + (1, 4, 5), "sa1": batch + (1, 4, 1)},)
    return Rule(f"kernels/MatMul: sum(expand(a) * reshape(y)) of one row -> matmul(a, "
                f"reshape(y)) [{ra}x{ra} M=1]", "exact", lhs, f"(MatMul ?a {vb})", where,
                sets=(f"(set (shape {vb}) {sbm})",), cases=cases)


def matmul_rules() -> list[Rule]:
    """``sum(expand(a) * expand(b))`` over K -> ``MatMul(a, b)`` for a [..., M, K], b [..., K, N]."""
    rules = []
    for ra, rb in ((2, 2), (3, 2), (3, 3), (4, 4), (4, 2)):
        for bare_a in (False, True):
            for folded_b in ((True, False) if rb == 2 else (False,)):
                rules.append(_matmul_rule(ra, rb, bare_a, folded_b))
    rules += [_one_row_matmul_rule(ra) for ra in (3, 4)]
    return rules


def _strided_product_host(f: int):
    """A soundness case's left side for the strided-view squeeze rule: the product
    ``SumReduce(Mul(A, B), axis f-1)`` read through a shifted, masked view of its flat layout, a
    rotate-half's piece (the pattern language has no slice: the case builds it in IR from the
    bound inputs)."""
    def build(env):
        from lumc.ir.graph import node
        from lumc.ir.views import View, contiguous_strides
        red = node("SumReduce", [node("Mul", [env["A"], env["B"]])], (f - 1,))
        out = tuple(d for i, d in enumerate(red.shape) if i != f - 1)
        half = out[-1] // 2
        mask = tuple((0, d) for d in out[:-1]) + ((0, out[-1] - half),)
        return node("View", [red], View._make(out, contiguous_strides(out), half, mask))
    return build


def squeeze_rules() -> list[Rule]:
    """A reshape of a contraction result, seen as the matmul's own squeeze then a reshape, so the
    matmul rule finds ``reshape(a @ b)`` when the reshapes were composed into one view."""
    rules = []
    for f in (2, 3, 4):
        g = [f"(vec-get ?sr {i})" for i in range(f + 1)]
        so = f"(vec-of {' '.join(g[:f - 1] + [g[f]])})"
        red = f"(SumReduce (Mul ?A ?B) (vec-of {f - 1}))"
        shape = (2, 3, 4, 5, 6)[:f + 1]
        sq = shape[:f - 1] + shape[f:]
        where = (f"(= ?red {red})", "(= ?sr (shape ?red))", f"(= (vec-length ?sr) {f + 1})")
        sets = (f"(set (shape (View ?red (Reshape {so}))) {so})",)
        ins = {"A": ("in", shape, "f32"), "B": ("in", shape, "f32")}
        rules.append(Rule(f"kernels/View: reshape(contraction) -> reshape(squeeze(contraction)) [r={f}]",
                          "exact", "(View ?red (Reshape ?s2))",
                          f"(View (View ?red (Reshape {so})) (Reshape ?s2))",
                          where + (f"(!= {so} ?s2)",), sets=sets,
                          cases=(dict(ins, s2=tuple(reversed(sq))),)))
        # any other view of the result (RoPE's halves of q's heads, a pad): a strided view reads
        # the flat layout of its source, which the squeeze keeps, so it reads the squeezed matmul
        # alike (and through it a horizontal part: the merged QKV projection)
        rules.append(Rule(f"kernels/View: strided(contraction) -> strided(squeeze(contraction)) [r={f}]",
                          "exact", "(View ?red (Strided ?i))",
                          f"(View (View ?red (Reshape {so})) (Strided ?i))", where, sets=sets,
                          cases=(dict(ins, host=_strided_product_host(f), __lhs__="?host"),)))
    # a permutation of the result that moves the contracted unit axis (a batch-of-one bmm whose
    # heads are merged back: the view composer folds squeeze + permute into one permute)
    for f in (2, 3):
        k = f - 1
        g = [f"(vec-get ?sr {i})" for i in range(f + 1)]
        sq = f"(vec-of {' '.join(g[:k] + g[k + 1:])})"
        red = f"(SumReduce (Mul ?A ?B) (vec-of {k}))"
        shape = (2, 3, 4, 5, 6)[:f + 1]
        for j in range(f + 1):
            rest = [i for i in range(f + 1) if i != j]
            pp = "(vec-of " + " ".join(
                f"(- (vec-get ?p {i}) (min 1 (max 0 (- (vec-get ?p {i}) {k}))))" for i in rest) + ")"
            so = "(vec-get ?so {})"
            out_sq = "(vec-of " + " ".join(so.format(i) for i in rest) + ")"
            inner = f"(View (View ?red (Reshape {sq})) (Permute {pp}))"
            perm = [i for i in reversed(range(f + 1)) if i != k]
            perm.insert(j, k)
            rules.append(Rule(
                f"kernels/View: permute(contraction) -> reshape(permute(squeeze(contraction))) "
                f"[r={f} unit at {j}]", "exact", "(View ?red (Permute ?p))",
                f"(View {inner} (Reshape ?so))",
                (f"(= ?red {red})", "(= ?sr (shape ?red))", f"(= (vec-length ?sr) {f + 1})",
                 f"(= (vec-get ?p {j}) {k})", "(= ?so (shape ?root))"),
                sets=(f"(set (shape (View ?red (Reshape {sq}))) {sq})",
                      f"(set (shape {inner}) {out_sq})"),
                cases=({"A": ("in", shape, "f32"), "B": ("in", shape, "f32"), "p": tuple(perm)},)))
    return rules


def operand_rules() -> list[Rule]:
    """A contraction operand's broadcast reshape split in two, so the operand itself appears with
    the rank the matmul rule expects (views compose through size-1 dims, e.g. a batch of 1)."""
    rules = []
    for big in (3, 4, 5):
        g = [f"(vec-get ?s1 {i})" for i in range(big)]
        k = big - 3   # the contracted axis of the broadcast product
        for side, m_axis in (("a", big - 1), ("b", big - 3)):
            s0 = "(vec-of " + " ".join(x for i, x in enumerate(g) if i != m_axis) + ")"
            mul = ("(Mul (View ?root (Expand ?F)) ?B)" if side == "a"
                   else "(Mul ?A (View ?root (Expand ?F)))")
            if side == "a":
                host = "(MatMul (View ?x (Reshape ?xs)) ?w)"
                case = {"x": ("in", (24,), "f32"), "xs": (1,) * (big - 3) + (4, 6),
                        "w": ("in", (1,) * (big - 3) + (6, 5), "f32")}
            else:
                host = "(MatMul ?a (View ?x (Reshape ?xs)))"
                case = {"a": ("in", (1,) * (big - 3) + (4, 6), "f32"), "x": ("in", (30,), "f32"),
                        "xs": (1,) * (big - 3) + (6, 5)}
            rules.append(Rule(
                f"kernels/View: matmul operand {side} reshape -> reshape to its own rank first [r={big}]",
                "exact", "(View ?y (Reshape ?s1))", f"(View (View ?y (Reshape {s0})) (Reshape ?s1))",
                (f"(= ?red (SumReduce {mul} (vec-of {k + 1})))", f"(= (vec-length ?s1) {big})",
                 f"(= (vec-get ?s1 {m_axis}) 1)", "(= ?sy (shape ?y))", f"(!= {s0} ?sy)"),
                sets=(f"(set (shape (View ?y (Reshape {s0}))) {s0})",),
                cases=(dict(case, __lhs__=host),)))
    return rules


def batch_merge_rules() -> list[Rule]:
    """``reshape(bmm(reshape(a), reshape(b)))`` with the batch dims merged and split back ->
    ``MatMul(a, b)`` over the unmerged batch, for ``a [B..., M, K]``, ``b [B..., K, N]``.

    This is torch's own decomposition of an N-D ``matmul`` (``expand``, ``view`` to
    ``[prod B, M, K]``, ``bmm``, ``view`` back: ``torch/_decomp/decompositions.py``), which
    ``torch.export`` emits for ``q @ k.transpose(-2, -1)`` and ``p @ v`` over heads; without it,
    the attention rules never see a 4-D product. ``exact``: a row-major reshape that merges
    leading dims pairs the same ``[M, K]`` and ``[K, N]`` blocks."""
    rules = []
    for r in (4, 5):
        nb = r - 2
        ga, gb = _getters("?sa", r), _getters("?sb", r)
        merged = ga[0]
        for x in ga[1:nb]:
            merged = f"(* {merged} {x})"
        where = ["(= ?sa (shape ?a))", f"(= (vec-length ?sa) {r})", "(= ?sb (shape ?b))",
                 f"(= (vec-length ?sb) {r})", f"(= {ga[r - 1]} {gb[r - 2]})",
                 *(f"(= {ga[i]} {gb[i]})" for i in range(nb)),
                 f"(= ?sa3 (vec-of {merged} {ga[r - 2]} {ga[r - 1]}))",
                 f"(= ?sb3 (vec-of {merged} {gb[r - 2]} {gb[r - 1]}))",
                 f"(= ?so (vec-of {' '.join(ga[:r - 1])} {gb[r - 1]}))"]
        batch = (2, 3, 2)[:nb]
        cases = ({"a": ("in", batch + (3, 4), "f32"), "b": ("in", batch + (4, 5), "f32")},
                 {"a": ("in", (1,) + batch[1:] + (3, 4), "f32"),
                  "b": ("in", (1,) + batch[1:] + (4, 1), "f32")})
        rules.append(Rule(f"kernels/MatMul: reshape(bmm(merge(a), merge(b))) -> matmul(a, b) "
                          f"[r={r}]", "exact",
                          "(View (MatMul (View ?a (Reshape ?sa3)) (View ?b (Reshape ?sb3))) "
                          "(Reshape ?so))", "(MatMul ?a ?b)", tuple(where), cases=cases))
    # grouped-query attention's ``k[:, :, None].expand(B, G, R, T, D).reshape(B, G*R, T, D)``
    # merged for the bmm straight from the 5-D expand: the merge of the three batch dims goes
    # through the 4-D [B, G*R, T, D] (row-major reshapes compose), which the rules above read
    g5 = _getters("?sx", 5)
    mid = f"(vec-of {g5[0]} (* {g5[1]} {g5[2]}) {g5[3]} {g5[4]})"
    rules.append(Rule("kernels/View: merge(B, G, R) of a 5-D value -> merge(B, G*R) of its "
                      "[B, G*R, ., .] reshape [r=5]", "exact", "(View ?x (Reshape ?s3))",
                      f"(View (View ?x (Reshape {mid})) (Reshape ?s3))",
                      ("(= ?sx (shape ?x))", "(= (vec-length ?sx) 5)",
                       f"(= ?s3 (vec-of (* (* {g5[0]} {g5[1]}) {g5[2]}) {g5[3]} {g5[4]}))"),
                      sets=(f"(set (shape (View ?x (Reshape {mid}))) {mid})",),
                      cases=({"x": ("in", (2, 2, 3, 4, 5), "f32"), "s3": (12, 4, 5)},)))
    # the transpose taken after the merge (``k.transpose(2, 3)`` of a computed k: torch merges
    # the contiguous k, then views it transposed): the same view as the merge of the transpose
    gx = _getters("?sx", 4)
    tr = "(View ?x (Permute (vec-of 0 1 3 2)))"
    s_t = f"(vec-of (* {gx[0]} {gx[1]}) {gx[3]} {gx[2]})"
    rules.append(Rule("kernels/View: transpose(merge(x)) -> merge(transpose(x)) [r=4]", "exact",
                      "(View (View ?x (Reshape ?s3)) (Permute (vec-of 0 2 1)))",
                      f"(View {tr} (Reshape {s_t}))",
                      ("(= ?sx (shape ?x))", "(= (vec-length ?sx) 4)",
                       f"(= ?s3 (vec-of (* {gx[0]} {gx[1]}) {gx[2]} {gx[3]}))"),
                      sets=(f"(set (shape {tr}) (vec-of {gx[0]} {gx[1]} {gx[3]} {gx[2]}))",),
                      cases=({"x": ("in", (2, 3, 4, 5), "f32"), "s3": (6, 4, 5)},)))
    # a batch of one: the views around the bmm compose the unit dim away, so the operands are 3-D
    # ([H, M, K]) while the softmax between the products is 4-D ([1, H, M, N]); the products are
    # given their 4-D form (the unit dim put on the operands), both where the result is reshaped
    # up to 4-D (the scores) and where a 4-D operand is reshaped down to 3-D (the probabilities)
    ga, gb = _getters("?sa", 3), _getters("?sb", 3)
    a4, b4 = f"(vec-of 1 {' '.join(ga)})", f"(vec-of 1 {' '.join(gb)})"
    so4 = f"(vec-of 1 {ga[0]} {ga[1]} {gb[2]})"
    base = ("(= ?sa (shape ?a))", "(= (vec-length ?sa) 3)", "(= ?sb (shape ?b))",
            "(= (vec-length ?sb) 3)", f"(= {ga[2]} {gb[1]})", f"(= {ga[0]} {gb[0]})")
    va, vb = f"(View ?a (Reshape {a4}))", f"(View ?b (Reshape {b4}))"
    rules.append(Rule("kernels/MatMul: reshape(bmm(a, b)) to a unit batch -> matmul of the unit-batch "
                      "operands [r=3]", "exact", "(View (MatMul ?a ?b) (Reshape ?so))",
                      f"(MatMul {va} {vb})", base + (f"(= ?so {so4})",),
                      sets=(f"(set (shape {va}) {a4})", f"(set (shape {vb}) {b4})"),
                      cases=({"a": ("in", (3, 4, 5), "f32"), "b": ("in", (3, 5, 2), "f32"),
                              "so": (1, 3, 4, 2)},)))
    g4 = _getters("?s4", 4)
    a3 = f"(vec-of {' '.join(g4[1:])})"
    mm = f"(MatMul ?p {vb})"
    rules.append(Rule("kernels/MatMul: bmm(squeeze(p), b) of a unit-batch p -> squeeze(matmul(p, "
                      "unsqueeze(b))) [r=3]", "exact", "(MatMul (View ?p (Reshape ?sa)) ?b)",
                      f"(View {mm} (Reshape (vec-of {ga[0]} {ga[1]} {gb[2]})))",
                      ("(= ?s4 (shape ?p))", "(= (vec-length ?s4) 4)", f"(= {g4[0]} 1)",
                       f"(= ?sa {a3})", "(= ?sb (shape ?b))", "(= (vec-length ?sb) 3)",
                       f"(= {ga[2]} {gb[1]})", f"(= {ga[0]} {gb[0]})"),
                      sets=(f"(set (shape {vb}) {b4})",
                            f"(set (shape {mm}) (vec-of 1 {ga[0]} {ga[1]} {gb[2]}))"),
                      cases=({"p": ("in", (1, 3, 4, 5), "f32"), "b": ("in", (3, 5, 2), "f32"),
                              "sa": (3, 4, 5)},)))
    # one K/V head for every query head (multi-query attention: ``k.expand`` over the heads at a
    # batch of one): the bmm's ``b`` is a 2-D operand broadcast over the batch, given its 4-D form
    # as an Expand over the unit batch and the heads, so both products meet the attention rules
    g2 = _getters("?sb", 2)
    b4x = f"(vec-of 1 {ga[0]} {g2[0]} {g2[1]})"
    vbx = f"(View ?b (Expand {b4x}))"
    base2 = ("(= ?sa (shape ?a))", "(= (vec-length ?sa) 3)", "(= ?sb (shape ?b))",
             "(= (vec-length ?sb) 2)", f"(= {ga[2]} {g2[0]})")
    rules.append(Rule("kernels/MatMul: reshape(bmm(a, b)) of a batch-broadcast b to a unit batch -> "
                      "matmul of the unit-batch operands [r=3 b=2]", "exact",
                      "(View (MatMul ?a ?b) (Reshape ?so))", f"(MatMul {va} {vbx})",
                      base2 + (f"(= ?so (vec-of 1 {ga[0]} {ga[1]} {g2[1]}))",),
                      sets=(f"(set (shape {va}) {a4})", f"(set (shape {vbx}) {b4x})"),
                      cases=({"a": ("in", (3, 4, 5), "f32"), "b": ("in", (5, 2), "f32"),
                              "so": (1, 3, 4, 2)},)))
    # a computed K of one head ([1, K, N] after its own elementwise op, RoPE's k * cos) broadcast
    # over a batch of heads: the same product with the unit batch squeezed off b (numpy
    # broadcasting), which the rule above reads
    g3 = _getters("?sb", 3)
    sq = f"(View ?b (Reshape (vec-of {g3[1]} {g3[2]})))"
    rules.append(Rule("kernels/MatMul: bmm(a, b) with b's unit batch broadcast -> bmm(a, squeeze b) "
                      "[r=3]", "exact", "(MatMul ?a ?b)", f"(MatMul ?a {sq})",
                      ("(= ?sa (shape ?a))", "(= (vec-length ?sa) 3)", "(= ?sb (shape ?b))",
                       "(= (vec-length ?sb) 3)", f"(= {g3[0]} 1)", f"(!= {ga[0]} 1)",
                       f"(= {ga[2]} {g3[1]})"),
                      sets=(f"(set (shape {sq}) (vec-of {g3[1]} {g3[2]}))",),
                      cases=({"a": ("in", (3, 4, 5), "f32"), "b": ("in", (1, 5, 2), "f32")},)))
    b4p = f"(vec-of 1 {g4[1]} {g2[0]} {g2[1]})"
    vbp = f"(View ?b (Expand {b4p}))"
    mmp = f"(MatMul ?p {vbp})"
    rules.append(Rule("kernels/MatMul: bmm(squeeze(p), b) of a unit-batch p and a batch-broadcast b "
                      "-> squeeze(matmul(p, expand(b))) [r=3 b=2]", "exact",
                      "(MatMul (View ?p (Reshape ?sa)) ?b)",
                      f"(View {mmp} (Reshape (vec-of {ga[0]} {ga[1]} {g2[1]})))",
                      ("(= ?s4 (shape ?p))", "(= (vec-length ?s4) 4)", f"(= {g4[0]} 1)",
                       f"(= ?sa {a3})", "(= ?sb (shape ?b))", "(= (vec-length ?sb) 2)",
                       f"(= {ga[2]} {g2[0]})"),
                      sets=(f"(set (shape {vbp}) {b4p})",
                            f"(set (shape {mmp}) (vec-of 1 {ga[0]} {ga[1]} {g2[1]}))"),
                      cases=({"p": ("in", (1, 3, 4, 5), "f32"), "b": ("in", (5, 2), "f32"),
                              "sa": (3, 4, 5)},)))
    return rules


def operand_permute_rules() -> list[Rule]:
    """A bmm operand reached by one permute that also places its unit axis (the M axis of ``b``,
    the N axis of ``a``), seen as the squeeze, the permute of the other axes and the reshape that
    inserts the unit axis, so the matmul rule finds the operand. At a batch of one the views
    compose into such a permute when the operand is made by an elementwise op: ``b`` from RoPE's
    ``k * cos`` then ``k.transpose(-2, -1)`` (``permute([1, H, T, D], (1, 0, 3, 2))``), ``a`` from
    an op on ``q`` in ``[B, T, H, D]`` before its ``transpose(1, 2)`` (GPT-J's rotary:
    ``permute([1, T, H, D], (2, 1, 3, 0))``). ``exact``: a permutation of unit axes moves no
    element."""
    rules = []
    g = [f"(vec-get ?p {i})" for i in range(4)]
    so = "(vec-get ?so {})"
    for side, unit, mul, keep, lhs_case in (
            ("b", 1, "(Mul ?A (View ?root (Expand ?F)))", (0, 2, 3),
             {"__lhs__": "(MatMul ?a (View (View ?y (Reshape ?s3)) (Permute ?p3)))",
              "a": ("in", (2, 3, 4), "f32"), "y": ("in", (1, 2, 5, 4), "f32"), "s3": (2, 5, 4),
              "p3": (0, 2, 1)}),
            ("a", 3, "(Mul (View ?root (Expand ?F)) ?B)", (0, 1, 2),
             {"__lhs__": "(MatMul (View (View ?y (Reshape ?s3)) (Permute ?p3)) ?b)",
              "b": ("in", (4, 5, 3), "f32"), "y": ("in", (1, 2, 4, 5), "f32"), "s3": (2, 4, 5),
              "p3": (1, 0, 2)})):
        u = g[unit]                            # the input axis that becomes the unit axis
        pp = "(vec-of " + " ".join(f"(- {g[i]} (min 1 (max 0 (- {g[i]} {u}))))" for i in keep) + ")"
        sq = f"(vec-remove ?sy {u})"
        out3 = "(vec-of " + " ".join(so.format(i) for i in keep) + ")"
        inner = f"(View (View ?y (Reshape {sq})) (Permute {pp}))"
        rules.append(Rule(
            f"kernels/View: bmm operand {side} permuted with its unit axis -> "
            f"reshape(permute(squeeze {side})) [r=4]",
            "exact", "(View ?y (Permute ?p))", f"(View {inner} (Reshape ?so))",
            (f"(= ?red (SumReduce {mul} (vec-of 2)))", "(= ?so (shape ?root))",
             "(= (vec-length ?so) 4)", f"(= {so.format(unit)} 1)", "(= ?sy (shape ?y))"),
            sets=(f"(set (shape (View ?y (Reshape {sq}))) {sq})", f"(set (shape {inner}) {out3})"),
            cases=(lhs_case,)))
    return rules


def softmax_rules() -> list[Rule]:
    """``exp(x - max x) * recip(sum exp(x - max x))`` -> ``Softmax(x, axis)``."""
    rules = []
    for r in range(1, 5):
        for a in range(r):
            e = (f"(Exp2 (Mul (Add ?x (Mul (View (MaxReduce ?x (vec-of {a})) (Expand ?S)) "
                 f"{fill('-1.0', '?S', '1')})) {fill('?l2e', '?S', '2')}))")
            lhs = f"(Mul ?e (Recip (View (SumReduce ?e (vec-of {a})) (Expand ?S))))"
            where = (f"(= ?e {e})", "(= ?S (shape ?x))", f"(= (vec-length ?S) {r})",
                     "(> ?l2e 1.44)", "(< ?l2e 1.446)")
            shape = tuple((2, 3, 5, 4)[:r])
            cases = ({"x": ("in", shape, "f32"), "dt": "f32", "z1": (), "z2": (), "l2e": F32_LOG2E},
                     {"x": ("in", (0,) + shape[1:], "f32"), "dt": "f32", "z1": (), "z2": (),
                      "l2e": F32_LOG2E})
            rules.append(Rule(f"kernels/Softmax: exp(x - max x) / sum exp(x - max x) -> softmax(x) "
                              f"[r={r} axis={a}]", "exact", lhs, f"(Softmax ?x {a})", where,
                              cases=cases))
            # an exporter's ReduceSum/Div spelling divides (IEEE Div); the form multiplies by one
            # reciprocal per row: at most 1 ulp more per probability, so ``reassociating``
            div = f"(Div ?e (View (SumReduce ?e (vec-of {a})) (Expand ?S)))"
            rules.append(Rule(f"kernels/Softmax: exp(x - max x) / sum exp(x - max x) [Div] -> "
                              f"softmax(x) [r={r} axis={a}]", "reassociating", div,
                              f"(Softmax ?x {a})", where, cases=cases))
    return rules


def softmax_scale_rules() -> list[Rule]:
    """``softmax(s / c [+ m | where(keep, ., f)])`` -> the same with ``s * (1/c)``, for a finite
    non-zero scalar ``c`` (attention's ``scores / sqrt(d)``), so the attention forms, which scale
    by a product, match. Only inside a softmax: the quotient's extra half ulp enters an ``exp``
    whose own error is larger, so the probabilities move by about 1 ulp (``reassociating``); the
    general reciprocal rewrite is fast-math only (``rules_algebra.FAST_MATH``)."""
    rules = []
    inv = "(Const (Scalar (/ 1.0 ?c) ?dt) (vec-empty))"
    scaled = f"(Mul ?s (View {inv} (Expand ?S)))"
    contexts = {"": "{}", " + m": "(Add {} ?m)", " select": "(Where ?keep {} ?f)",
                " fill": "(Where ?drop ?f {})"}
    for r in range(1, 5):
        a = r - 1
        shape = tuple((2, 3, 5, 4)[:r])
        case = {"s": ("in", shape, "f32"), "c": 5.656854249492381, "dt": "f32", "z0": (), "S": shape,
                "m": ("in", shape, "f32"), "keep": ("in", shape, "bool"), "f": ("in", shape, "f32"),
                "drop": ("in", shape, "bool")}
        for tag, ctx in contexts.items():
            lhs_arg = ctx.format(f"(Div ?s {fill('?c', '?S', '0')})")
            rhs_arg = ctx.format(scaled)
            rules.append(Rule(
                f"kernels/Softmax: softmax(s / c{tag}) -> softmax(s * (1/c){tag}) [r={r}]",
                "reassociating", f"(Softmax {lhs_arg} {a})", f"(Softmax {rhs_arg} {a})",
                ("(= ?S (shape ?s))", f"(= (vec-length ?S) {r})", "(!= ?c 0.0)",
                 "(< (abs ?c) inf)"),
                sets=(f"(set (shape {inv}) (vec-empty))", f"(set (shape (View {inv} (Expand ?S))) ?S)",
                      f"(set (shape {scaled}) ?S)", f"(set (shape {rhs_arg}) ?S)"),
                cases=({k: v for k, v in case.items() if f"?{k}" in lhs_arg or k in ("dt", "z0", "S")},)))
    return rules


def _norm_case(shape) -> dict:
    return {"x": ("in", shape, "f32"), "dt": "f32", "z0": (), "z1": (), "z3": (),
            "invn": float(np.float32(1.0 / shape[-1])), "eps": float(np.float32(1e-5)),
            "R": tuple(shape[:-1]) + (1,)}


def _mean(x: str, ax: str, tag: str) -> str:
    return f"(Mul (SumReduce {x} {ax}) {fill('?invn', '?R', tag)})"


def norm_rules() -> list[Rule]:
    """Layer norm (no scale/bias) and RMS norm over the last dim, as the library writes them."""
    rules = []
    for r in range(1, 5):
        ax = f"(vec-of {r - 1})"
        # the mean's scale is exactly dtype(1 / N), what the form's decoding multiplies by
        # (``Tensor.mean``): 1 / (N - 1), within 0.1% of it from N = 1002, is another function
        n_ok = (f"(= ?nv (/ 1.0 (to-f64 (vec-get ?S {r - 1}))))", "(= ?nsf (split-of ?dt))",
                "(= ?ng (* ?nv ?nsf))", "(= ?invn (+ ?ng (- ?nv ?ng)))")
        rsq = f"(View (Recip (Sqrt (Add ?var {fill('?eps', '?R', '3')}))) (Expand ?S))"
        shape = tuple((2, 3, 4, 6)[:r - 1]) + (7,)
        ln_where = (
            f"(= ?mean {_mean('?x', ax, '0')})",
            f"(= ?d (Add ?x (Mul (View ?mean (Expand ?S)) {fill('-1.0', '?S', '1')})))",
            f"(= ?var {_mean('(Mul ?d ?d)', ax, '0')})",
            "(= ?S (shape ?x))", f"(= (vec-length ?S) {r})", *n_ok)
        rules.append(Rule(f"kernels/LayerNorm: (x - mean x) * rsqrt(var x + eps) -> layernorm(x) "
                          f"[r={r}]", "exact", f"(Mul ?d {rsq})", f"(LayerNorm ?x {r - 1} ?eps)",
                          ln_where, cases=(_norm_case(shape), _norm_case((0,) + shape[1:])
                                           if r > 1 else _norm_case(shape))))
        rms_where = (f"(= ?var {_mean('(Mul ?x ?x)', ax, '0')})", "(= ?S (shape ?x))",
                     f"(= (vec-length ?S) {r})", *n_ok)
        rules.append(Rule(f"kernels/RMSNorm: x * rsqrt(mean(x*x) + eps) -> rmsnorm(x) [r={r}]",
                          "exact", f"(Mul ?x {rsq})", f"(RMSNorm ?x {r - 1} ?eps)", rms_where,
                          cases=(_norm_case(shape),)))
        # the product written the other way round (an exporter's Mul(Reciprocal(Sqrt(.)), x)):
        # IEEE multiplication commutes
        rules.append(Rule(f"kernels/LayerNorm: rsqrt(var x + eps) * (x - mean x) -> layernorm(x) "
                          f"[r={r} swapped]", "exact", f"(Mul {rsq} ?d)",
                          f"(LayerNorm ?x {r - 1} ?eps)", ln_where, cases=(_norm_case(shape),)))
        rules.append(Rule(f"kernels/RMSNorm: rsqrt(mean(x*x) + eps) * x -> rmsnorm(x) [r={r} swapped]",
                          "exact", f"(Mul {rsq} ?x)", f"(RMSNorm ?x {r - 1} ?eps)", rms_where,
                          cases=(_norm_case(shape),)))
        # an exporter's Sqrt/Div spelling divides (IEEE Div); the forms multiply by one reciprocal
        # square root per row: at most 1 ulp more per element, so ``reassociating``
        sq = f"(View (Sqrt (Add ?var {fill('?eps', '?R', '3')})) (Expand ?S))"
        rules.append(Rule(f"kernels/LayerNorm: (x - mean x) / sqrt(var x + eps) -> layernorm(x) "
                          f"[r={r} Div]", "reassociating", f"(Div ?d {sq})",
                          f"(LayerNorm ?x {r - 1} ?eps)", ln_where, cases=(_norm_case(shape),)))
        rules.append(Rule(f"kernels/RMSNorm: x / sqrt(mean(x*x) + eps) -> rmsnorm(x) [r={r} Div]",
                          "reassociating", f"(Div ?x {sq})", f"(RMSNorm ?x {r - 1} ?eps)",
                          rms_where, cases=(_norm_case(shape),)))
        # the mean written out as sum(x*x) / N (IEEE Div by the row length): the form multiplies
        # by dtype(1/N), at most 1 ulp apart in the mean (none for N a power of two), so
        # ``reassociating``, as the Div spelling above
        rms_div_where = (f"(= ?var (Div (SumReduce (Mul ?x ?x) {ax}) {fill('?n', '?R', '0')}))",
                         "(= ?S (shape ?x))", f"(= (vec-length ?S) {r})",
                         f"(= ?n (to-f64 (vec-get ?S {r - 1})))")
        div_case = dict(_norm_case(shape), n=float(shape[-1]))
        for tag, lhs in (("", f"(Mul ?x {rsq})"), (" swapped", f"(Mul {rsq} ?x)"),
                         (" Div", f"(Div ?x {sq})")):
            rules.append(Rule(f"kernels/RMSNorm: x * rsqrt(sum(x*x) / N + eps) -> rmsnorm(x) "
                              f"[r={r}{tag} sum/N]", "reassociating", lhs,
                              f"(RMSNorm ?x {r - 1} ?eps)", rms_div_where, cases=(div_case,)))
    return rules


def attention_rules() -> list[Rule]:
    """``softmax(q @ kt * scale [+ mask | select | fill]) @ v`` -> one attention form, in fp32 and
    in a half-precision model's spelling (bf16/f16 scores, the softmax widened to f32 and rounded
    back: the library's softmax, so the form decodes to the same computation)."""
    rules = []
    for r in (2, 3, 4):
        batch = (2, 3)[: r - 2]
        s_fill = fill("?c", "?S", "0")
        scores = f"(Mul (MatMul ?q ?kt) {s_fill})"
        where = ("(= ?S (shape (MatMul ?q ?kt)))", "(= ?sq (shape ?q))", f"(= (vec-length ?sq) {r})")
        ins = {"q": ("in", batch + (5, 8), "f32"), "kt": ("in", batch + (8, 5), "f32"),
               "v": ("in", batch + (5, 6), "f32")}
        case = dict(ins, c=0.35, dt="f32", z0=(), S=batch + (5, 5))
        score_shape = batch + (5, 5)
        variants = (   # tag, law, the softmax's operand, the form, the operands it adds
            ("", "softmax(q @ kt * s)", scores, f"(Attention ?q ?kt ?v {s_fill})", {}),
            (" mask", "softmax(q @ kt * s + m)", f"(Add {scores} ?m)",
             f"(AttentionMasked ?q ?kt ?v {s_fill} ?m)", {"m": "float"}),
            (" select", "softmax(where(keep, q @ kt * s, f))", f"(Where ?keep {scores} ?f)",
             f"(AttentionSelect ?q ?kt ?v {s_fill} ?keep ?f)", {"keep": "bool", "f": "float"}),
            (" fill", "softmax(where(drop, f, q @ kt * s))", f"(Where ?drop ?f {scores})",
             f"(AttentionFilled ?q ?kt ?v {s_fill} ?drop ?f)", {"drop": "bool", "f": "float"}))
        for tag, law, inner, ctor, extra in variants:
            for half in (False, True):
                fdt = "bf16" if half else "f32"
                vcase = {k: (v[0], v[1], fdt) if isinstance(v, tuple) and v[:1] == ("in",) else v
                         for k, v in case.items()}
                vcase["dt"] = fdt
                vcase.update({k: ("in", score_shape, "bool" if kind == "bool" else fdt)
                              for k, kind in extra.items()})
                if half:
                    name = (f"kernels/Attention: cast(softmax(cast(scores{tag}, f32))) @ v -> "
                            f"attention [r={r}{tag} half]")
                    lhs = f'(MatMul (Cast (Softmax (Cast {inner} "f32") {r - 1}) ?dt) ?v)'
                else:
                    name = f"kernels/Attention: {law} @ v -> attention [r={r}{tag}]"
                    lhs = f"(MatMul (Softmax {inner} {r - 1}) ?v)"
                rules.append(Rule(name, "exact", lhs, ctor, where, cases=(vcase,)))
    return rules


def rules() -> list[Rule]:
    return (squeeze_rules() + operand_rules() + operand_permute_rules() + matmul_rules()
            + batch_merge_rules()
            + softmax_rules()
            + softmax_scale_rules() + norm_rules() + attention_rules())
