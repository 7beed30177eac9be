"""Extraction: read a saturated e-graph, choose e-nodes by roofline cost, decode them back to IR.

The e-graph arrives serialized (``egglog.bindings.EGraph.serialize(...).to_json()``); extraction is
done here in Python from one set of roots (every output of a region at once), never with egglog's
``(extract ...)`` or ``greedy-dag`` extractor, which abort the process on large DAGs
(EGGLOG-NOTES.md).

* :class:`EGraphView` holds the ``Expr`` e-classes, their e-nodes, shapes and the primitive values.
* Views cost nothing (they fold into reads), except a permutation that moves the innermost
  axis, charged half a pass of its bytes: an uncoalesced read, so cancelled transposes win.
* A reduction of a broadcast product (a contraction) reads each operand once: its bytes are the
  operands' own sizes (views followed down to the tensor they read), not the product's. A spelling
  form (``lumc.rewrites.spellings``) costs one row kernel reading its tensor arguments once.
* :func:`choose` finds, for every e-class, the e-node of least *tree* cost (local cost plus the
  costs of its distinct child classes) by fixpoint iteration; the local cost is the roofline time of
  the kernel an e-node stands for (``enode_cost``), so a form that reads its input once beats the
  reductions it replaces.
* :func:`alternatives` lists the decisions where another e-node would change the kernel list
  (a form or not, an association); flipping them gives candidates argmin extraction never picks.
* :func:`decode` rebuilds IR nodes for chosen e-nodes and records which IR nodes are form roots.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from lumc.backends.simulator import DRAM_LATENCY_S
from lumc.ir.graph import Node
from lumc.ir.views import prod
from lumc.rewrites.language import FORM_KERNEL, FORMS, OP_OF_CTOR, Tables, decode_node
from lumc.rewrites.spellings import SPELLINGS

FORM_ATTRS = {"Softmax": ("axis",), "LayerNorm": ("axis", "eps"), "RMSNorm": ("axis", "eps"),
              "Attention": (), "AttentionMasked": (), "AttentionSelect": (),
              "AttentionFilled": ()}
STRUCTURAL = frozenset(FORMS) | {"SumReduce", "MaxReduce", "Contiguous"}


@dataclass
class ENode:
    ctor: str
    args: list[str]   # child e-class ids, in order (Expr and primitive alike)


@dataclass
class EGraphView:
    """The parts of a serialized e-graph extraction needs."""
    classes: dict[str, list[ENode]] = field(default_factory=dict)   # Expr e-classes
    values: dict[str, Any] = field(default_factory=dict)            # non-Expr e-class -> value
    shapes: dict[str, tuple] = field(default_factory=dict)
    lets: dict[str, str] = field(default_factory=dict)              # "$e3" -> e-class

    @staticmethod
    def from_json(data: dict, ctors: set[str]) -> "EGraphView":
        v = EGraphView()
        nodes, cdata = data["nodes"], data["class_data"]
        cls_of = {k: n["eclass"] for k, n in nodes.items()}
        for c, d in cdata.items():
            for name in (d.get("let") or "").split(","):
                if name.strip():
                    v.lets[name.strip()] = c
        prim: dict[str, tuple] = {}
        shape_rows = []
        for k, n in nodes.items():
            c, op = n["eclass"], n["op"]
            kids = [cls_of[ch] for ch in n["children"]]
            typ = cdata.get(c, {}).get("type")
            if op in ctors and typ == "Expr":
                v.classes.setdefault(c, []).append(ENode(op, kids))
            elif op == "shape":
                shape_rows.append((kids[0], c))
            elif op in ("hbase", "hlast", "colpart", "split-of"):
                # horizontal fusion's functions: keys, or (colpart) a function whose value, a
                # vec-of, shares its e-class; the rounding table (``language.ROUNDING_TABLE``):
                # a constant per float type; not values themselves
                continue
            elif typ in ("i64", "f64", "String", "bool"):
                v.values[c] = _literal(op, typ)
            elif prim.get(c, ("",))[0] not in ("vec-of", "vec-empty"):
                prim[c] = (op, kids)     # a vector's literal wins over another term equal to it

        def value(c):
            if c in v.values:
                return v.values[c]
            op, kids = prim[c]
            if op == "vec-of":
                val = tuple(int(value(k)) for k in kids)
            elif op == "vec-empty":
                val = ()
            elif op == "Scalar":
                val = ("Scalar", [value(kids[0]), value(kids[1])])
            elif op in ("Blob", "Flag"):
                val = (op, [value(kids[0])])
            else:   # Step constructors
                val = (op, value(kids[0]))
            v.values[c] = val
            return val

        for c in prim:
            value(c)
        for e, s in shape_rows:
            v.shapes[e] = v.values[s]
        return v


def _literal(op: str, typ: str):
    if typ == "String":
        return op[1:-1]
    if typ == "i64":
        return int(op)
    if typ == "bool":
        return op == "true"
    return float(op.replace("NaN", "nan"))


@dataclass
class CostModel:
    """Roofline local costs (seconds) of e-nodes on a device given as plain ceilings."""
    ceilings: dict
    itemsize: int = 4
    dtype: str = "f32"

    def bw(self, elems: float) -> float:
        return elems * self.itemsize / self.ceilings["bandwidth"]

    def flops(self, n: float, tensor: bool) -> float:
        table = self.ceilings["tensor_flops" if tensor else "vector_flops"]
        return n / table.get(self.dtype, min(table.values()))

    def enode_cost(self, g: EGraphView, c: str, n: ENode) -> float:
        out = prod(g.shapes.get(c, (1,)))
        launch = self.ceilings["launch_s"]
        ctor = n.ctor

        def shp(i):
            return g.shapes.get(n.args[i], (1,))
        if ctor == "View":
            step = g.values.get(n.args[1], ("", ()))
            if step[0] == "Permute" and step[1] and step[1][-1] != len(step[1]) - 1:
                # a read that moves the innermost axis is uncoalesced: half the bandwidth
                return 0.5 * self.bw(out)
            return 0.0
        if ctor in ("Input", "Const", "Iota"):
            return 0.0
        if ctor == "Part":   # a column slice: a view
            return 0.0
        if ctor == "HCat":   # constants concatenate at compile time; anything else is a copy
            if all(_is_constant(g, a) for a in n.args):
                return 0.0
            return self.bw(2 * out) + launch
        if ctor in ("SumReduce", "MaxReduce"):
            ops = _contraction_operands(g, n.args[0]) if ctor == "SumReduce" else None
            if ops is not None:   # a broadcast product: each operand is read once, not per use
                reads = sum(base_elems(g, a) for a in ops)
                return max(self.flops(2 * prod(shp(0)), True), self.bw(reads + out)) + launch
            return self.bw(prod(shp(0)) + out) + launch
        if ctor == "Contiguous":
            return self.bw(2 * out) + launch
        if ctor == "MatMul":
            a, b = shp(0), shp(1)
            k = a[-1] if a else 1
            return max(self.flops(2 * out * k, True), self.bw(prod(a) + prod(b) + out)) + launch
        if FORM_KERNEL.get(ctor) == "scan":   # a prefix sum: its operand read once, an add per
            # element, and ceil(L / 1024) serial steps per row (``lumc.backends.simulator_scan``)
            ax = g.values.get(n.args[SPELLINGS[ctor].args.index("ax")], (0,))
            big = shp(0)
            length = big[int(ax[0])] if ax and len(big) > int(ax[0]) else 1
            chain = math.ceil(length / 1024) * DRAM_LATENCY_S
            return max(self.flops(2 * out, False), self.bw(base_elems(g, n.args[0]) + out),
                       chain) + launch
        if ctor in SPELLINGS:   # one row kernel (CUDA cores) reading its tensor arguments once
            args = [a for a in n.args if a in g.classes]
            reads = sum(base_elems(g, a) for a in args)
            work = 2 * sum(prod(g.shapes.get(a, (1,))) for a in args) + 8 * out
            return max(self.flops(work, False), self.bw(reads + out)) + launch
        if ctor in ("Softmax", "LayerNorm", "RMSNorm"):
            return max(self.flops(8 * out, False), self.bw(2 * out)) + launch
        if ctor.startswith("Attention"):
            q, kt, v = shp(0), shp(1), shp(2)
            s = prod(q[:-1]) * kt[-1]
            fl = 2 * s * q[-1] + 2 * s * v[-1]
            extra = sum(prod(shp(i)) for i in range(4, len(n.args)))
            return max(self.flops(fl, True), self.bw(prod(q) + prod(kt) + prod(v) + out
                                                     + extra)) + launch
        return self.flops(out, False)


def base_elems(g: EGraphView, c: str, depth: int = 8) -> int:
    """Elements a read of e-class ``c`` must move: views (broadcasts, reshapes) are followed down
    to the tensor they read, so a broadcast operand counts its own size."""
    best = prod(g.shapes.get(c, (1,)))
    for _ in range(depth):
        view = next((n for n in g.classes.get(c, ()) if n.ctor == "View" and g.values.get(
            n.args[1], ("",))[0] in ("Expand", "Reshape", "Permute")), None)
        if view is None:
            break
        c = view.args[0]
        best = min(best, prod(g.shapes.get(c, (1,))))
    return best


def _is_constant(g: EGraphView, c: str, depth: int = 16) -> bool:
    """Whether class ``c`` holds a constant, possibly through views and concatenations."""
    for _ in range(depth):
        ns = g.classes.get(c, ())
        if any(n.ctor == "Const" for n in ns):
            return True
        cat = next((n for n in ns if n.ctor == "HCat"), None)
        if cat is not None:
            return all(_is_constant(g, a, depth - 1) for a in cat.args)
        view = next((n for n in ns if n.ctor == "View"), None)
        if view is None:
            return False
        c = view.args[0]
    return False


def _contraction_operands(g: EGraphView, c: str) -> list[str] | None:
    """The two operand classes when class ``c`` holds a product of two views, else None."""
    for n in g.classes.get(c, ()):
        if n.ctor == "Mul" and all(any(m.ctor == "View" for m in g.classes.get(a, ()))
                                   for a in n.args):
            return list(n.args)
    return None


def _expr_kids(g: EGraphView, n: ENode) -> list[str]:
    return [a for a in n.args if a in g.classes]


def choose(g: EGraphView, cost: CostModel, forced: dict[str, int] | None = None
           ) -> tuple[dict[str, int], dict[str, float]]:
    """Least tree-cost e-node per e-class: ``({class: node index}, {class: cost})``.

    ``forced`` pins some classes to a given e-node (its cost is then whatever that node costs).
    A pin whose e-node cannot be computed (its children derive only from the pinned class
    itself, as a view of the class's inverse view does) would leave the class, and every class
    above it, without a pick; such a pin is released (the class keeps its free choice, so
    ``pick[c] != forced[c]`` says so), since no program computes it.
    An e-node's cost is its local cost plus the costs of its distinct child classes, never below
    any child's, so Knuth's generalization of Dijkstra's algorithm applies ("A generalization of
    Dijkstra's algorithm", IPL 1977): classes are settled cheapest first, each once, and an e-node
    is priced when its last child class settles. A fixpoint iteration instead can re-price a class
    exponentially often on a DAG with many shared paths. Classes left unsettled (only cycles or
    infinite costs below them) have no pick and cost ``inf``.
    """
    forced = dict(forced or {})
    while True:
        pick, best = _settle(g, cost, forced)
        cyclic = [c for c in forced if c not in pick]
        if not cyclic:
            return pick, best
        for c in cyclic:   # once every pin settles, so does every class the free choice settles
            del forced[c]


def _settle(g: EGraphView, cost: CostModel, forced: dict[str, int]
            ) -> tuple[dict[str, int], dict[str, float]]:
    """One pass of :func:`choose`'s settlement with ``forced`` pinned (a pinned class may be
    left without a pick)."""
    kids: dict[tuple[str, int], list[str]] = {}
    waiting: dict[tuple[str, int], int] = {}
    parents: dict[str, list[tuple[str, int]]] = {}
    heap: list[tuple[float, int, int, str]] = []
    seq = 0
    for c, ns in g.classes.items():
        for i in ([forced[c]] if c in forced else range(len(ns))):
            ks = sorted(set(_expr_kids(g, ns[i])))
            kids[(c, i)] = ks
            waiting[(c, i)] = len(ks)
            for k in ks:
                parents.setdefault(k, []).append((c, i))
            if not ks:
                t = cost.enode_cost(g, c, ns[i])
                if t < math.inf:
                    heapq.heappush(heap, (t, i, seq, c))
                    seq += 1
    best: dict[str, float] = {c: math.inf for c in g.classes}
    pick: dict[str, int] = {}
    while heap:
        t, i, _, c = heapq.heappop(heap)
        if c in pick:
            continue
        best[c], pick[c] = t, i
        for p, j in parents.get(c, ()):
            waiting[(p, j)] -= 1
            if waiting[(p, j)] == 0 and p not in pick:
                tp = cost.enode_cost(g, p, g.classes[p][j]) + sum(best[k] for k in kids[(p, j)])
                if tp < math.inf:
                    heapq.heappush(heap, (tp, j, seq, p))
                    seq += 1
    return pick, best


def reachable(g: EGraphView, pick: dict[str, int], roots: list[str]) -> list[str]:
    """Classes the chosen e-nodes reach from ``roots``, children first."""
    order, seen = [], set()
    for r in roots:
        stack = [(r, False)]
        while stack:
            c, done = stack.pop()
            if done:
                order.append(c)
                continue
            if c in seen:
                continue
            if c not in pick:
                raise KeyError(f"e-class {c} has no chosen e-node (unsettled: only cycles or "
                               "infinite costs below it)")
            seen.add(c)
            stack.append((c, True))
            for k in _expr_kids(g, g.classes[c][pick[c]]):
                if k not in seen:
                    stack.append((k, False))
    return order


def dag_cost(g: EGraphView, cost: CostModel, pick: dict[str, int], roots: list[str]) -> float:
    """Sum of local costs over the chosen DAG (each class once)."""
    return sum(cost.enode_cost(g, c, g.classes[c][pick[c]]) for c in reachable(g, pick, roots))


def alternatives(g: EGraphView, pick: dict[str, int], best: dict[str, float], roots: list[str]
                 ) -> list[tuple[float, str, int]]:
    """``[(tree-cost increase, class, node)]`` for structural decisions on the chosen DAG."""
    out = []
    for c in reachable(g, pick, roots):
        chosen = g.classes[c][pick[c]]
        for i, n in enumerate(g.classes[c]):
            if i == pick[c] or (n.ctor not in STRUCTURAL and chosen.ctor not in STRUCTURAL):
                continue
            if n.ctor == chosen.ctor and n.ctor not in ("MatMul",):
                continue
            kids = set(_expr_kids(g, n))
            if c in kids or any(best.get(k, math.inf) == math.inf for k in kids):
                continue
            out.append((sum(best[k] for k in kids) - best[c], c, i))
    out.sort(key=lambda t: t[0])
    return out


@dataclass
class FormRecord:
    form: str
    attrs: tuple
    inputs: list[Node]


def decode(g: EGraphView, pick: dict[str, int], roots: list[str], tables: Tables,
           forms: dict[int, FormRecord], classes: dict | None = None) -> dict[str, Node]:
    """IR nodes of the chosen e-nodes for ``roots`` (``{class: node}``); form roots go to
    ``forms`` (``{id(node): FormRecord}``); ``classes`` (if given) gets ``{id(node): class}`` of
    every node built (and ``(class, views)`` for the node under a built view chain)."""
    built: dict[str, Node] = {}
    for c in reachable(g, pick, roots):
        n = g.classes[c][pick[c]]
        args = [built[a] if a in g.classes else g.values[a] for a in n.args]
        x = decode_node(n.ctor, args, tables)
        built[c] = x
        if classes is not None:
            classes.setdefault(id(x), c)
            # a form decoded as views over its own result (a matmul's reshape, attention's):
            # the base under the same views holds the same values in every candidate
            b, chain = x, []
            while b.op == "View":
                chain.append(b.arg)
                b = b.srcs[0]
            if chain:
                classes.setdefault(id(b), (c, tuple(chain)))
        if n.ctor in FORMS and n.ctor != "MatMul":
            ins = [a for a in args if isinstance(a, Node)]
            vals = [a for a in args if not isinstance(a, Node)]
            attrs = tuple(sorted(zip(FORM_ATTRS.get(n.ctor, ()), vals)))
            if n.ctor.startswith("Attention"):
                kind = {"Attention": "none", "AttentionMasked": "add", "AttentionSelect": "select",
                        "AttentionFilled": "fill"}
                attrs += (("masked", n.ctor != "Attention"), ("mask", kind[n.ctor]))
            root = x
            while root.op == "View":   # a form ending in a reshape (attention's matmul) is its base
                root = root.srcs[0]
            forms[id(root)] = FormRecord(FORM_KERNEL[n.ctor], tuple(sorted(attrs)), ins)
    return {r: built[r] for r in roots}


__all__ = ["EGraphView", "CostModel", "choose", "alternatives", "decode", "dag_cost",
           "reachable", "FormRecord", "OP_OF_CTOR"]
