"""The egglog language of lumc, generated from the primitive-op table, and the IR <-> term mapping.

Every row of ``lumc.ir.ops.OPS`` becomes one ``Expr`` constructor named by its ``egglog`` column:
its tensor operands are ``Expr`` arguments, followed by its non-tensor arg encoded by
:data:`ARG_SORTS` (a reduce's axes as ``IVec``, a cast's dtype as ``String``, a view as a ``Step``).
Kernel forms (:data:`FORMS`) add one constructor each; nothing is spelled twice.

Shapes are data: ``(shape e)`` holds every e-class's shape as ``IVec`` (``Vec i64``), so rules
constrain rank by the length of shape and permutation vectors.

Views are encoded as movement steps (``lumc.ir.movement``): ``(View x (Reshape s))``,
``(View x (Permute p))``, ``(View x (Expand s))`` (numpy broadcasting: leading dims may be added)
and ``(View x (Strided k))`` for any other view (pads, windows, overlapping strides), kept whole in
a side table; a slice under a reshape/transpose (a split of fused QKV) is a ``Strided`` box slice
followed by the steps.
Float scalar constants are ``(Const (Scalar v dtype) shape)`` with the value as f64 (exact for
every float dtype, infinities included); boolean scalars are ``(Const (Flag b) shape)``; NaN, -0.0
(egglog's f64 equates it with +0.0), integer and non-scalar constants are
``(Const (Blob key) shape)``. A view that adds dims always ends in an ``Expand`` step (trivial if
nothing broadcasts), so a broadcast operand has one spelling.
Operands of commutative ops are ordered with a broadcast scalar last, so rules need one order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.graph import IotaArg, Node, const_node, iota_node, node, view_node
from lumc.ir.ops import OPS
from lumc.ir.tensor import Tensor
from lumc.ir.views import View
from lumc.rewrites import horizontal as _horizontal
from lumc.ir.movement import compose_view, decompose_refined, decompose_view

# non-tensor argument sorts of each op, after its Expr operands
ARG_SORTS: dict[str, tuple[str, ...]] = {
    "Input": ("String",), "Constant": ("ConstVal", "IVec"), "Iota": ("IVec", "i64", "String"),
    "Cast": ("String",), "SumReduce": ("IVec",), "MaxReduce": ("IVec",), "Gather": ("i64",),
    "View": ("Step",),
}

# kernel forms as constructors: name -> (argument sorts, docstring of the meaning)
FORMS: dict[str, tuple[tuple[str, ...], str]] = {
    "MatMul": (("Expr", "Expr"), "numpy matmul of a [..., M, K] and b [..., K, N]"),
    "Softmax": (("Expr", "i64"), "softmax of x along axis"),
    "LayerNorm": (("Expr", "i64", "f64"),
                  "(x - mean) * recip(sqrt(var + eps)) over dims axis.. (no scale/bias)"),
    "RMSNorm": (("Expr", "i64", "f64"), "x * recip(sqrt(mean(x*x) + eps)) over dims axis.."),
    "Attention": (("Expr", "Expr", "Expr", "Expr"),
                  "softmax(matmul(q, kt) * scale) @ v along the last axis"),
    "AttentionMasked": (("Expr", "Expr", "Expr", "Expr", "Expr"),
                        "softmax(matmul(q, kt) * scale + mask) @ v along the last axis"),
    "AttentionSelect": (("Expr",) * 6,
                        "softmax(where(keep, matmul(q, kt) * scale, fill)) @ v along the last axis"),
    # masked_fill's order (torch's ``scores.masked_fill(drop, -inf)``, ONNX ``Where(drop, -inf, s)``)
    "AttentionFilled": (("Expr",) * 6,
                        "softmax(where(drop, fill, matmul(q, kt) * scale)) @ v along the last axis"),
}
FORM_KERNEL = {"MatMul": "matmul", "Softmax": "softmax", "LayerNorm": "layernorm",
               "RMSNorm": "rmsnorm", "Attention": "attention", "AttentionMasked": "attention",
               "AttentionSelect": "attention", "AttentionFilled": "attention"}


def constructors() -> dict[str, tuple[str, ...]]:
    """``{constructor: argument sorts}`` for every ``Expr`` constructor (ops, then forms)."""
    out: dict[str, tuple[str, ...]] = {}
    for name, row in OPS.items():
        out[row.egglog] = ("Expr",) * row.arity + ARG_SORTS.get(name, ())
    for name, (sorts, _) in FORMS.items():
        out[name] = sorts
    out.update(_horizontal.CTORS)
    return out


def declarations() -> str:
    """The egglog program declaring sorts, constructors and the shape table."""
    ctors = " ".join(f"({c} {' '.join(s)})" if s else f"({c})" for c, s in constructors().items())
    return "\n".join([
        "(sort IVec (Vec i64))",
        "(datatype Step (Reshape IVec) (Permute IVec) (Expand IVec) (Strided i64))",
        "(datatype ConstVal (Scalar f64 String) (Blob String) (Flag bool))",
        f"(datatype Expr {ctors})",
        "(function shape (Expr) IVec :merge old)",
        *_horizontal.FUNCTIONS,
        *ROUNDING_TABLE,
    ])


# ``(split-of dtype)``: Veltkamp's splitting constant 2^(53 - p) + 1 for a float type of p
# significant bits: ``g = v * c; g + (v - g)`` is f64 ``v`` rounded to nearest in that type (Dekker,
# "A floating-point technique for extending the available precision", 1971; exact for normal
# results, which is all a rule compares it with). A rule can so test that a constant is exactly
# ``dtype(1 / N)`` in f64 arithmetic (``rules_kernels.norm_rules``).
SPLIT_BITS = {"f64": 53, "f32": 24, "f16": 11, "bf16": 8}


def split_factor(name: str) -> float:
    """``(split-of name)``: Veltkamp's constant for the float type ``name``."""
    return float(2 ** (53 - SPLIT_BITS[name]) + 1)


ROUNDING_TABLE = ["(function split-of (String) f64 :merge old)"] + [
    f'(set (split-of "{name}") {split_factor(name)!r})' for name in SPLIT_BITS]


OP_OF_CTOR = {row.egglog: name for name, row in OPS.items()}


def ivec(xs) -> str:
    return "(vec-of " + " ".join(str(int(x)) for x in xs) + ")" if len(xs) else "(vec-empty)"


def f64_text(x: float) -> str:
    r = repr(float(x))
    return r if ("." in r or "e" in r or "n" in r) else r + ".0"


def _is_plain_scalar(value: np.ndarray) -> bool:
    """A float scalar egglog's f64 holds faithfully: not NaN, not -0.0 (infinities are fine)."""
    if value.size != 1 or not dt.from_numpy(value.dtype).is_float:
        return False
    v = float(value.reshape(-1)[0])
    return not math.isnan(v) and not (v == 0.0 and math.copysign(1.0, v) < 0)


def _is_flag(value: np.ndarray) -> bool:
    return value.size == 1 and value.dtype == np.bool_


def fold_steps(src_shape, steps: list) -> list:
    """Drop a reshape that only adds leading 1s right before an expand (numpy broadcast)."""
    if len(steps) >= 2 and steps[-1][0] == "expand" and steps[-2][0] == "reshape":
        prev = tuple(src_shape)
        for kind, arg in steps[:-2]:
            prev = tuple(arg) if kind == "reshape" else (
                tuple(prev[p] for p in arg) if kind == "permute" else tuple(arg))
        s1 = tuple(steps[-2][1])
        k = len(s1) - len(prev)
        if k >= 0 and s1[:k] == (1,) * k and s1[k:] == prev:
            return steps[:-2] + [steps[-1]]
    return steps


def triangle_kind(value: np.ndarray) -> tuple[bool, int, int] | None:
    """``(negated, p, q)`` when ``value`` (``[n, n]``, numeric) is the 0/1 mask
    ``where(c, 1, 0)`` with ``c = iota_p < iota_q`` (``not`` it when ``negated``; ``iota_0`` is
    the row index ``i``, ``iota_1`` the column ``j``), bit for bit (a ``-0.0`` is not its ``0``),
    else None."""
    if value.ndim != 2 or value.shape[0] != value.shape[1] or value.dtype == np.bool_ or \
            value.size > (1 << 24):
        return None
    n = value.shape[0]
    if n > 1 and {value[0, -1].item(), value[-1, 0].item()} != {0, 1}:   # cheap: weights
        return None
    i, j = np.indices(value.shape)
    for negated, p, q in ((True, 0, 1), (True, 1, 0), (False, 1, 0), (False, 0, 1)):
        a, b = (i, j) if p == 0 else (j, i)
        c = ~(a < b) if negated else a < b
        want = c.astype(value.dtype)
        # bit for bit: a -0.0 where the mask has 0 compares equal but is not its +0.0 (0 * v)
        if np.array_equal(value, want) and np.array_equal(np.signbit(value), np.signbit(want)):
            return negated, p, q
    return None


@dataclass
class Tables:
    """Side tables of an encoding: what the terms name but cannot hold."""
    blobs: dict[str, Node] = field(default_factory=dict)
    strided: list[View] = field(default_factory=list)
    leaves: dict[str, Node] = field(default_factory=dict)   # Input name -> node to decode to

    def strided_id(self, v: View) -> int:
        self.strided.append(v)
        return len(self.strided) - 1


class Encoder:
    """Writes IR nodes as egglog ``let`` lines, one e-class variable per node (``$e<n>``).

    Args:
        tables: side tables shared by every region of one graph.
        externals: ``{id(node): name}`` for nodes read from outside (other regions); they become
            ``(Input name)`` leaves.
    """

    def __init__(self, tables: Tables, externals: dict[int, str] | None = None):
        self.tables = tables
        self.externals = externals or {}
        self.var: dict[int, str] = {}
        self.lines: list[str] = []
        self._n = 0
        self._keys: dict[str, int] = {}   # leaf (or view of one) -> its key (rewrites.horizontal)

    def _key(self, var: str, key: int | None = None) -> str:
        """Give ``var`` the termination key of horizontal fusion (a new one by default)."""
        k = len(self._keys) if key is None else key
        self._keys[var] = k
        self.lines.append(f"(set (hbase {var}) {k})")
        self.lines.append(f"(set (hlast {var}) {k})")
        return var

    def _fresh(self, expr: str, shape) -> str:
        name = f"$e{self._n}"
        self._n += 1
        self.lines.append(f"(let {name} {expr})")
        self.lines.append(f"(set (shape {name}) {ivec(shape)})")
        return name

    def _is_fill(self, n: Node) -> bool:
        while n.op == "View":
            n = n.srcs[0]
        return n.op == "Constant" and (_is_plain_scalar(n.arg.value) or _is_flag(n.arg.value))

    def encode(self, n: Node) -> str:
        """The e-class variable of ``n`` (encoding its operands first, iteratively)."""
        if id(n) in self.var:
            return self.var[id(n)]
        stack = [(n, False)]
        while stack:
            x, ready = stack.pop()
            if id(x) in self.var:
                continue
            srcs = () if id(x) in self.externals else x.srcs
            if not ready:
                stack.append((x, True))
                stack.extend((s, False) for s in srcs if id(s) not in self.var)
                continue
            self.var[id(x)] = self._encode_one(x)
        return self.var[id(n)]

    def _scalar_term(self, value, d: dt.DType, shape) -> str:
        """A scalar of dtype ``d`` broadcast to ``shape``, as the encoder spells it."""
        if d.is_bool:
            cv = f"(Flag {'true' if value else 'false'})"
        elif d.is_float:
            cv = f'(Scalar {f64_text(float(value))} "{d.name}")'
        else:
            c = const_node(np.asarray(value, dtype=d.np))
            self.tables.blobs[c.arg.digest[:20]] = c
            cv = f'(Blob "{c.arg.digest[:20]}")'
        scalar = self._fresh(f"(Const {cv} (vec-empty))", ())
        return self._fresh(f"(View {scalar} (Expand {ivec(shape)}))", shape)

    def _triangle(self, var: str, x: Node) -> None:
        """A folded triangular 0/1 mask (a cumsum's, ``lumc.ir.library.reduce``) is also written
        as the iota comparison it was folded from, in the same e-class (exact: the values were
        compared), so the scan rules (``lumc.rewrites.spellings``) see it."""
        kind = triangle_kind(x.arg.value)
        if kind is None:
            return
        negated, p, q = kind
        shape = tuple(x.shape)
        cond = self._fresh(f'(LessThan (Iota {ivec(shape)} {p} "i64") (Iota {ivec(shape)} {q} "i64"))',
                           shape)
        if negated:
            cond = self._fresh(f"(Where {cond} {self._scalar_term(False, dt.bool_, shape)} "
                               f"{self._scalar_term(True, dt.bool_, shape)})", shape)
        one, zero = (self._scalar_term(v, x.dtype, shape) for v in (1, 0))
        tri = self._fresh(f"(Where {cond} {one} {zero})", shape)
        self.lines.append(f"(union {var} {tri})")

    def _encode_one(self, x: Node) -> str:
        if id(x) in self.externals:
            name = self.externals[id(x)]
            self.tables.leaves[name] = x
            return self._key(self._fresh(f'(Input "{name}")', x.shape))
        row = OPS[x.op]
        if x.op == "Input":
            self.tables.leaves[x.arg.name] = x
            return self._key(self._fresh(f'(Input "{x.arg.name}")', x.shape))
        if x.op == "Constant":
            val = x.arg.value
            if _is_plain_scalar(val):
                cv = f'(Scalar {f64_text(float(val.reshape(-1)[0]))} "{x.dtype.name}")'
            elif _is_flag(val):
                cv = f"(Flag {'true' if bool(val.reshape(-1)[0]) else 'false'})"
            else:
                key = x.arg.digest[:20]
                self.tables.blobs[key] = x
                var = self._key(self._fresh(f'(Const (Blob "{key}") {ivec(x.shape)})', x.shape))
                self._triangle(var, x)
                return var
            return self._fresh(f"(Const {cv} {ivec(x.shape)})", x.shape)
        if x.op == "Iota":
            a: IotaArg = x.arg
            return self._fresh(f'(Iota {ivec(a.shape)} {a.axis} "{a.dtype.name}")', x.shape)
        if x.op == "View":
            src = x.srcs[0]
            cur = self.var[id(src)]
            steps = decompose_view(src.shape, x.arg)
            src_shape = tuple(src.shape)
            if steps is None:
                sliced = decompose_refined(src.shape, x.arg)
                if sliced is None:
                    return self._fresh(f"(View {cur} (Strided {self.tables.strided_id(x.arg)}))",
                                       x.shape)
                refined, box, steps = sliced
                if refined != src_shape:     # a per-head split (GPT-NeoX's fused QKV)
                    cur = self._fresh(f"(View {cur} (Reshape {ivec(refined)}))", refined)
                src_shape = box.shape
                sid = self.tables.strided_id(box)
                cur = self._fresh(f"(View {cur} (Strided {sid}))", box.shape)
                cols = _horizontal.column_part(refined, box)
                if cols is not None:
                    self.lines.append(f"(set (colpart (Strided {sid})) {ivec(cols)})")
            if len(x.shape) > len(src_shape) and (not steps or steps[-1][0] != "expand"):
                steps = steps + [("expand", tuple(x.shape))]   # rank growth always ends in Expand
            steps = fold_steps(src_shape, steps)
            shape = tuple(src_shape)
            for kind, arg in steps:
                if kind == "permute":
                    shape = tuple(shape[p] for p in arg)
                    step = f"(Permute {ivec(arg)})"
                else:
                    shape = tuple(arg)
                    step = f"({kind.capitalize()} {ivec(arg)})"
                nxt = self._fresh(f"(View {cur} {step})", shape)
                if cur in self._keys:   # a view of a leaf (a transposed weight) keeps its key
                    self._key(nxt, self._keys[cur])
                cur = nxt
            return cur
        ops = [self.var[id(s)] for s in x.srcs]
        if "commutative" in row.props and self._is_fill(x.srcs[0]) and not self._is_fill(x.srcs[1]):
            ops = ops[::-1]
        args = list(ops)
        if x.op == "Cast":
            args.append(f'"{x.arg.name}"')
        elif x.op in ("SumReduce", "MaxReduce"):
            args.append(ivec(x.arg))
        elif x.op == "Gather":
            args.append(str(int(x.arg)))
        var = self._fresh(f"({row.egglog} {' '.join(args)})", x.shape)
        if x.op == "Cast" and ops[0] in self._keys:   # a weight stored narrower keeps its key
            self._key(var, self._keys[ops[0]])
        return var


# ---- decoding: terms back to IR ---------------------------------------------------------------
def _t(x: Node) -> Tensor:
    return Tensor(x)


def decode_form(name: str, args: list) -> Node:
    """The primitive IR of a form constructor applied to decoded arguments."""
    from lumc.ir.library import norm
    if name == "MatMul":
        return _t(args[0]).matmul(_t(args[1])).node
    if name == "Softmax":
        return norm.softmax(_t(args[0]), int(args[1])).node
    if name in ("LayerNorm", "RMSNorm"):
        x, axis, eps = _t(args[0]), int(args[1]), float(args[2])
        axes = tuple(range(axis % x.ndim if x.ndim else 0, x.ndim))    # axis -1: the last dim
        eps_t = np.asarray(eps, dtype=x.dtype.np)
        # the form's arithmetic is x's dtype, as the patterns it folds compute it (Tensor.mean
        # widens f16/bf16 to f32; a form over f16 is f16 sums, what its rules matched)
        n = int(np.prod([x.shape[a] for a in axes]))

        def mean(t):
            return t.sum(axes, keepdims=True).mul(1.0 / n if n else np.nan)
        if name == "LayerNorm":
            m = mean(x)
            d = x.sub(m)
            var = mean(d.mul(d))
            return x.sub(m).mul(var.add(Tensor.const(eps_t)).sqrt().recip()).node
        ms = mean(x.mul(x))
        return x.mul(ms.add(Tensor.const(eps_t)).sqrt().recip()).node
    if name.startswith("Attention"):
        q, kt, v, s = (_t(a) for a in args[:4])
        scores = q.matmul(kt).mul(s)
        if name == "AttentionMasked":
            scores = scores.add(_t(args[4]))
        elif name == "AttentionSelect":
            scores = _t(args[4]).where(scores, _t(args[5]))
        elif name == "AttentionFilled":
            scores = _t(args[4]).where(_t(args[5]), scores)
        return norm.softmax(scores, -1).matmul(v).node
    raise KeyError(f"unknown form {name}")


def decode_step(src: Node, step: tuple, tables: Tables) -> Node:
    kind, arg = step
    if kind == "Reshape":
        return _t(src).reshape(arg).node
    if kind == "Permute":
        return _t(src).permute(arg).node
    if kind == "Expand":
        return _t(src).expand(arg).node
    v = tables.strided[int(arg)]
    return view_node(src, lambda u: compose_view(u, v))


def decode_node(ctor: str, args: list, tables: Tables) -> Node:
    """IR node of constructor ``ctor`` over decoded ``args`` (Nodes for Expr operands, Python
    values for the rest: tuples for IVec, ``(kind, value)`` for Step and ConstVal)."""
    if ctor in _spellings.SPELLINGS:
        return _spellings.SPELLINGS[ctor].build(args, tables)
    if ctor == "HCat":
        return _horizontal.decode_hcat(args[0], args[1])
    if ctor == "Part":
        return _horizontal.decode_part(args[0], args[1], args[2])
    if ctor in FORMS:
        return decode_form(ctor, args)
    op = OP_OF_CTOR[ctor]
    if op == "Input":
        return tables.leaves[args[0]]
    if op == "Constant":
        (kind, val), shape = args
        if kind == "Blob":
            return tables.blobs[val[0]]
        if kind == "Flag":
            return const_node(np.full(tuple(shape), bool(val[0]), dtype=np.bool_))
        v, dname = val
        return const_node(np.full(tuple(shape), v, dtype=dt.BY_NAME[dname].np))
    if op == "Iota":
        return iota_node(tuple(args[0]), int(args[1]), dt.BY_NAME[args[2]])
    if op == "View":
        return decode_step(args[0], args[1], tables)
    row = OPS[op]
    srcs = args[:row.arity]
    rest = args[row.arity:]
    if op == "Cast":
        return _t(srcs[0]).cast(dt.BY_NAME[rest[0]]).node
    if op in ("SumReduce", "MaxReduce"):
        return node(op, srcs, tuple(int(a) for a in rest[0]))
    if op == "Gather":
        return node(op, srcs, int(rest[0]))
    return node(op, srcs, None)


# spelling forms register themselves in FORMS and FORM_KERNEL (they need the names above)
from lumc.rewrites import spellings as _spellings  # noqa: E402
