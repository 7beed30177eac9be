"""Horizontal fusion: contractions that share an operand become one over concatenated weights.

Two projections of the same activation, ``x @ w1 (+ b1)`` and ``x @ w2 (+ b2)`` (BERT's Q, K and
V; a gated MLP's gate and up), are each unioned with a column slice of one wider contraction::

    x @ w1 + b1  ==  Part(x @ HCat(w1, w2) + HCat(b1, b2), 0, N1)
    x @ w2 + b2  ==  Part(x @ HCat(w1, w2) + HCat(b1, b2), N1, N1 + N2)

``HCat(a, b)`` concatenates along the last axis; ``Part(e, lo, hi)`` reads columns ``lo..hi`` of
the last axis (a view). Applied again to a result and a third projection, it builds the three-way
QKV contraction, whose column parts the first pair's parts are (the extraction's horizontal
candidate reads every projection from the widest contraction). Each output column of a contraction is computed
from the same operands in the same order whatever the other columns are, so both rules are
``exact``.

Termination: every leaf (input or constant) gets an integer key at encoding (``hbase``, also on
views of it); ``hlast`` of a concatenation is the key of its last part. The rule only appends a
*leaf* weight whose key is above the ``hlast`` of the left side, so each set of projections is
built in one order, once: ``n`` projections of one ``x`` give ``2^n - n - 1`` concatenations.

Weights are concatenated at compile time: :func:`decode_hcat` folds a concatenation of constants
(through views without masks) into one new constant; anything else decodes to the library's
``concat`` (a runtime copy whose cost the bound then shows).
"""
from __future__ import annotations

import weakref

import numpy as np

from lumc.ir.graph import Node, const_node, node
from lumc.ir.tensor import Tensor, concat
from lumc.rewrites.patterns import Rule

# constructors this module adds to the language: name -> argument sorts
CTORS = {"HCat": ("Expr", "Expr"), "Part": ("Expr", "i64", "i64")}
# key functions of the termination order (see the module docstring)
FUNCTIONS = ("(function hbase (Expr) i64 :merge (min old new))",
             "(function hlast (Expr) i64 :merge (min old new))",
             # a strided step that reads columns lo..hi of every row of an n-column source
             "(function colpart (Step) IVec :merge old)")


def column_part(src_shape, box) -> tuple[int, int, int] | None:
    """``(lo, hi, n)`` when the view ``box`` of a contiguous ``src_shape`` reads columns
    ``lo..hi`` of every row of it, rows in order (``src.reshape(-1, n)[:, lo:hi]`` reshaped to
    ``box.shape``; the last axis has ``n`` columns), else None. Such a slice of a contraction is
    the contraction over the weight's columns (:func:`split_rules`)."""
    src_shape = tuple(int(d) for d in src_shape)
    if box.mask is not None or not src_shape or len(box.shape) != len(src_shape):
        return None
    n, w = src_shape[-1], int(box.shape[-1])
    if tuple(box.shape[:-1]) != src_shape[:-1] or w < 1 or w >= n or \
            (w > 1 and box.strides[-1] != 1):
        return None
    row = n
    for d, st in zip(reversed(src_shape[:-1]), reversed(box.strides[:-1])):
        if d != 1 and st != row:
            return None
        row *= d
    lo = int(box.offset)
    return (lo, lo + w, n) if 0 <= lo and lo + w <= n else None


def _const_value(n: Node, depth: int = 16) -> np.ndarray | None:
    """The value of ``n`` when it is a constant read through unmasked views, else None."""
    got = _stored_const(n, depth)
    return None if got is None or got[1] is not None else got[0]


def _stored_const(n: Node, depth: int = 16):
    """``(value, cast)`` when ``n`` is a constant read through unmasked views, optionally under one
    ``Cast`` (a weight stored in a narrower dtype, ``lumc.compiler.core.precision``): ``value`` is
    the stored constant seen through the views, ``cast`` the Cast's target dtype or None."""
    views = []
    cast = None
    while depth > 0:
        if n.op == "View":
            if n.arg.mask is not None:
                return None
            views.append(n.arg)
        elif n.op == "Cast" and cast is None:
            cast = n.arg          # elementwise: the views above it read the stored constant alike
        else:
            break
        n = n.srcs[0]
        depth -= 1
    if n.op != "Constant":
        return None
    val = np.ascontiguousarray(n.arg.value)
    for v in reversed(views):
        flat = val.reshape(-1)
        item = flat.itemsize
        val = np.lib.stride_tricks.as_strided(
            flat[v.offset:] if flat.size else flat, shape=tuple(v.shape),
            strides=tuple(s * item for s in v.strides))
        val = np.ascontiguousarray(val)
    return val, cast


# {concatenated constant: (a, b)}: how a weight concatenated at compile time was made, so a
# compile elsewhere can make it again from the model's own weights (``compiler/core/carried.py``)
HCAT_SOURCES: "weakref.WeakKeyDictionary[Node, tuple[Node, Node]]" = weakref.WeakKeyDictionary()


def decode_hcat(a: Node, b: Node) -> Node:
    """``concat([a, b], axis=-1)``: a new constant when both are constants (stored in one dtype
    and cast alike: the concatenation keeps the narrow storage), else the library's concatenation
    (pads and a select)."""
    ga, gb = _stored_const(a), _stored_const(b)
    if ga is not None and gb is not None and ga[1] == gb[1] and ga[0].dtype == gb[0].dtype:
        c = const_node(np.concatenate([ga[0], gb[0]], axis=-1))
        HCAT_SOURCES[c] = (a, b)
        return c if ga[1] is None else node("Cast", (c,), ga[1])
    return concat([Tensor(a), Tensor(b)], -1).node


def decode_part(x: Node, lo: int, hi: int) -> Node:
    """Columns ``lo..hi`` of the last axis of ``x`` (a view)."""
    return Tensor(x).slice([int(lo)], [int(hi)], [-1]).node


def _linear(x: str, w: str, b: str | None, s: str) -> str:
    mm = f"(MatMul {x} {w})"
    return f"(Add {mm} (View {b} (Expand {s})))" if b else mm


def _pair_rule(bias: bool) -> Rule:
    b1, b2 = ("?b1", "?b2") if bias else (None, None)
    lhs = _linear("?x", "?w1", b1, "?S")
    wide_w = "(HCat ?w1 ?w2)"
    wide = _linear("?x", wide_w, "(HCat ?b1 ?b2)" if bias else None, "?W")
    where = [
        f"(= ?o2 {_linear('?x', '?w2', b2, '?S2')})",
        "(= ?k1 (hlast ?w1))", "(= ?k2 (hbase ?w2))", "(< ?k1 ?k2)",
        "(= ?sw1 (shape ?w1))", "(= (vec-length ?sw1) 2)",
        "(= ?sw2 (shape ?w2))", "(= (vec-length ?sw2) 2)",
        "(= (vec-get ?sw1 0) (vec-get ?sw2 0))",
        "(= ?n1 (vec-get ?sw1 1))", "(= ?n (+ ?n1 (vec-get ?sw2 1)))",
        "(= ?S (shape ?root))", "(= ?S2 (shape ?o2))",
        "(= ?W (vec-set ?S (- (vec-length ?S) 1) ?n))",
    ]
    sets = [
        f"(set (shape {wide_w}) (vec-of (vec-get ?sw1 0) ?n))",
        f"(set (hlast {wide_w}) ?k2)",
        f"(set (shape (MatMul ?x {wide_w})) ?W)",
        f"(set (shape (Part {wide} 0 ?n1)) ?S)",
        f"(union ?o2 (Part {wide} ?n1 ?n))",
        f"(set (shape (Part {wide} ?n1 ?n)) ?S2)",
    ]
    if bias:
        # a bias per column of its own projection (a one-element bias broadcast over the row
        # would give the concatenation 1 + n2 values where the wide product has n)
        where += ["(= ?sb1 (shape ?b1))", "(= (vec-length ?sb1) 1)", "(= (vec-get ?sb1 0) ?n1)",
                  "(= ?sb2 (shape ?b2))", "(= (vec-length ?sb2) 1)",
                  "(= (vec-get ?sb2 0) (vec-get ?sw2 1))"]
        sets.insert(0, "(set (shape (HCat ?b1 ?b2)) (vec-of ?n))")
    host = f"(Add {lhs} {_linear('?x', '?w2', b2, '?S')})"
    case = {"x": ("in", (5, 6), "f32"), "w1": ("in", (6, 4), "f32"), "w2": ("in", (6, 4), "f32"),
            "S": (5, 4), "__lhs__": host}
    if bias:
        case.update(b1=("in", (4,), "f32"), b2=("in", (4,), "f32"))
    tag = "bias" if bias else "no bias"
    return Rule(f"kernels/MatMul: x @ w1, x @ w2 -> parts of x @ concat(w1, w2) [{tag}]", "exact",
                lhs, f"(Part {wide} 0 ?n1)", tuple(where), sets=tuple(sets), cases=(case,))


def _column_slice_host(a_shape, b_shape, lo: int, hi: int):
    """A soundness case's left side: columns ``lo..hi`` of ``a @ b`` (the pattern language has no
    slice: the case builds it in IR from the bound inputs, as ``torch.chunk`` lowers)."""
    def build(env):
        return Tensor(env["A"]).matmul(Tensor(env["B"])).slice([lo], [hi], [-1]).node
    return {"A": ("in", a_shape, "f32"), "B": ("in", b_shape, "f32"), "host": build,
            "__lhs__": "?host"}


def split_rules() -> list[Rule]:
    """A column slice of a contraction is the contraction over the weight's columns::

        (x @ w)[..., lo:hi]  ==  x @ w[..., lo:hi]

    the inverse of :func:`_pair_rule`, for a model that stores the wide weight itself (Phi-3's
    ``gate_up_proj`` read through ``chunk``): its halves become two contractions of one left
    operand, which the fusion pairs in one kernel with the gated product as epilogue. Each output
    column is computed from the same operands in the same order, so the rule is ``exact``. The
    encoder marks the strided steps that read whole rows' columns (``colpart``,
    :func:`column_part`)."""
    part = "(Part ?b ?lo ?hi)"
    narrow = f"(MatMul ?a {part})"
    cols = "(Part ?y ?lo ?hi)"
    return [Rule("kernels/MatMul: columns lo..hi of x @ w -> x @ w[..., lo:hi]", "exact",
                 "(View ?y (Strided ?k))", f"(View {cols} (Reshape ?so))",
                 ("(= ?y (MatMul ?a ?b))", "(= ?c (colpart (Strided ?k)))",
                  "(= ?sy (shape ?y))", "(= ?r (vec-length ?sy))",
                  "(= (vec-get ?sy (- ?r 1)) (vec-get ?c 2))",
                  "(= ?lo (vec-get ?c 0))", "(= ?hi (vec-get ?c 1))",
                  "(= ?sb (shape ?b))", "(= ?so (shape ?root))"),
                 # the slice is a Part of the wide contraction (which the horizontal candidate
                 # keeps, ``egraph_pipeline._wide_forced``) and the narrow contraction
                 sets=(f"(union {cols} {narrow})",
                       f"(set (shape {part}) (vec-set ?sb (- (vec-length ?sb) 1) (- ?hi ?lo)))",
                       f"(set (shape {cols}) (vec-set ?sy (- ?r 1) (- ?hi ?lo)))",
                       f"(set (shape (View {cols} (Reshape ?so))) ?so)"),
                 cases=(_column_slice_host((5, 6), (6, 8), 2, 5),
                        _column_slice_host((2, 3, 6), (6, 8), 4, 8),
                        _column_slice_host((2, 3, 6), (2, 6, 8), 0, 3)))]


def rules() -> list[Rule]:
    return [_pair_rule(True), _pair_rule(False)] + split_rules()
