"""Lowering an ATen-level FX graph, specialized to concrete shapes, into a lumc primitive graph.

The walk visits the live nodes (those the outputs depend on) in order. Placeholders are bound by the
caller (weights as constants, user inputs as ``Input`` leaves); symbolic sizes (``sym_size``, Python
arithmetic on SymInts) evaluate to plain ints, since the concrete input shapes fix them; each ATen
call goes to its handler (:mod:`.registry`). Every tensor result that does not depend on an input is
folded to a constant on the spot (the ONNX frontend's :class:`ConstantFolder`: the reference
executor's numpy semantics), so shape-only subgraphs leave no trace; index expressions (elementwise
ops over ``arange``: a causal mask) stay computations a kernel forms from its indices (see
:mod:`lumc.compiler.frontends.onnx_frontend.folding`).
Each result is checked against the shape and dtype PyTorch traced for it.
"""
from __future__ import annotations

import math
import operator
from collections import Counter, defaultdict
from typing import Any, Callable

import torch

from lumc.compiler.frontends.onnx_frontend.folding import ConstantFolder
from lumc.compiler.frontends.torch_frontend.registry import (HANDLERS, TORCH_TO_DTYPE, LoweringContext,
                                                   op_name)
from lumc.compiler.frontends.onnx_frontend.registry import handler_problems
from lumc.ir.errors import LumcError, ShapeError, UnsupportedOpError
from lumc.ir.provenance import record
from lumc.ir.tensor import Tensor

# Python-level functions on sizes that FX graphs call between ATen ops (SymInt arithmetic)
SYM_FUNCTIONS: dict[Callable, Callable] = {
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.floordiv: operator.floordiv, operator.truediv: operator.truediv,
    operator.mod: operator.mod, operator.pow: operator.pow, operator.neg: operator.neg,
    operator.eq: operator.eq, operator.ne: operator.ne, operator.lt: operator.lt,
    operator.le: operator.le, operator.gt: operator.gt, operator.ge: operator.ge,
    operator.and_: operator.and_, operator.or_: operator.or_, operator.not_: operator.not_,
    operator.getitem: operator.getitem, math.ceil: math.ceil, math.floor: math.floor,
    math.sqrt: math.sqrt, torch.sym_float: float, torch.sym_int: int, torch.sym_max: max,
    torch.sym_min: min, torch.sym_not: operator.not_, torch.sym_sqrt: math.sqrt,
    torch.sym_ite: lambda c, a, b: a if c else b,
}
# ops that only assert facts PyTorch already checked while tracing
NO_OPS = frozenset({
    "aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
    "aten._assert_async.msg", "aten._functional_assert_async.msg",
    "aten._functional_sym_constrain_range_for_size.default",
})
_MAX_NAMES = 4


def _nodes(x) -> list:
    """The IR nodes of the tensors in ``x`` (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(x, Tensor):
        return [x.node]
    if isinstance(x, (tuple, list)):
        return [n for v in x for n in _nodes(v)]
    if isinstance(x, dict):
        return [n for v in x.values() for n in _nodes(v)]
    return []


def live_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The nodes the graph's output depends on, in graph order (dead code and asserts dropped)."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    live = {out}
    for n in reversed(graph.nodes):
        if n in live:
            live.update(n.all_input_nodes)
    return [n for n in graph.nodes if n in live]


def _dtype_problems(node: torch.fx.Node) -> set[str]:
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else [vals]
    bad = set()
    for v in vals:
        if isinstance(v, torch.Tensor) and v.dtype not in TORCH_TO_DTYPE:
            bad.add(str(v.dtype).replace("torch.", ""))
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor) and v.dtype not in TORCH_TO_DTYPE:
            bad.add(str(v.dtype).replace("torch.", ""))
    return bad


RANDOM_OP = ("random sampling: lumc compiles deterministic inference graphs (dropout in training "
             "mode: call module.eval() before compiling)")


def node_problems(node: torch.fx.Node) -> list[str]:
    """Reasons ``node`` cannot be lowered (empty when it can)."""
    if node.op in ("placeholder", "output", "get_attr"):
        return []
    if node.op != "call_function":
        return [f"{node.op} is not an ATen op (lower the module with torch.export first)"]
    if node.target in SYM_FUNCTIONS:
        return []
    name = op_name(node.target)
    if name in NO_OPS:
        return []
    h = HANDLERS.get(name)
    if h is None:
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            # torch.compile hands over dropout in training mode as bernoulli, rand_like as is
            return [RANDOM_OP]
        return ["not implemented"]
    out = handler_problems(h, node)
    bad = _dtype_problems(node)
    if bad:
        out.append("on " + ", ".join(sorted(bad)))
    return out


def unsupported_nodes(graph: torch.fx.Graph) -> dict[str, list[str]]:
    """``{"aten.op (reason)": [node names]}`` for every live node lumc cannot lower."""
    found: dict[str, list[str]] = defaultdict(list)
    for n in live_nodes(graph):
        for reason in node_problems(n):
            found[f"{op_name(n.target)} ({reason})"].append(n.name)
    return dict(found)


def check_supported(graph: torch.fx.Graph) -> None:
    """Raise before any lowering work if the graph uses anything lumc cannot lower.

    Raises:
        UnsupportedOpError: one line listing every unsupported op (with the reason: not
            implemented, a missing library function, an argument value, a dtype) and its nodes.
    """
    found = unsupported_nodes(graph)
    if not found:
        return
    if len(found) == 1:
        (key, names), = found.items()
        op, _, reason = key[:-1].partition(" (")
        also = ""
        if len(names) > 1:
            shown = ", ".join(repr(m) for m in names[1:_MAX_NAMES])
            also = f" (also at {shown}{', ...' if len(names) > _MAX_NAMES else ''})"
        raise UnsupportedOpError(f"unsupported ATen op: {reason}{also}", node=names[0], op=op)
    parts = []
    for key in sorted(found):
        names = found[key]
        shown = ", ".join(repr(n) for n in names[:_MAX_NAMES])
        extra = f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else ""
        parts.append(f"{key} at node{'s' if len(names) > 1 else ''} {shown}{extra}")
    raise UnsupportedOpError(f"{len(found)} unsupported ATen op kinds: " + "; ".join(parts))


def concrete_int(s, env: dict) -> int:
    """A SymInt (or int) evaluated under ``env`` (``{sympy symbol: int}``)."""
    if isinstance(s, torch.SymInt):
        e = s.node.expr
        return int(e.xreplace(env)) if env else int(e)
    return int(s)


class FxLowering:
    """One walk of an FX graph at concrete shapes.

    Args:
        graph: an ATen-level FX graph (``torch.export`` after ``run_decompositions``, or ``make_fx``).
        bindings: ``{placeholder name: Tensor | Python value}``.
        sym_env: ``{sympy symbol: int}`` for the symbolic sizes in the graph's metadata.
        constants: ``{get_attr target: Tensor}`` for graphs that keep tensors as attributes.
    """

    def __init__(self, graph: torch.fx.Graph, bindings: dict[str, Any], sym_env: dict | None = None,
                 constants: dict[str, Tensor] | None = None):
        self.graph = graph
        self.bindings = bindings
        self.sym_env = sym_env or {}
        self.constants = constants or {}
        self.folder = ConstantFolder()
        self.op_counts: Counter[str] = Counter()

    def run(self) -> list[Any]:
        """Lower every live node; returns the flat list of output values (Tensors or Python values).

        Raises:
            UnsupportedOpError: a handler met an argument value it cannot lower.
            ShapeError / LumcError: a handler's result disagrees with the traced shape or dtype.
        """
        env: dict[torch.fx.Node, Any] = {}

        def resolve(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(resolve(x) for x in a)
            if isinstance(a, dict):
                return {k: resolve(v) for k, v in a.items()}
            if isinstance(a, torch.SymInt):
                return concrete_int(a, self.sym_env)
            if isinstance(a, (torch.SymFloat, torch.SymBool)):
                v = a.node.expr.xreplace(self.sym_env)
                return float(v) if isinstance(a, torch.SymFloat) else bool(v)
            return a

        for n in live_nodes(self.graph):
            if n.op == "placeholder":
                env[n] = self.bindings[n.name]
            elif n.op == "get_attr":
                env[n] = self.constants[n.target]
            elif n.op == "output":
                return list(resolve(n.args[0]))
            else:
                args, kwargs = resolve(n.args), resolve(n.kwargs)
                env[n] = self._call(n, args, kwargs)
                # run-time errors at these primitives (an index outside its table) name this node
                record(_nodes(env[n]), _nodes((args, kwargs)), n.name, op_name(n.target))
        raise LumcError("the FX graph has no output node")

    def _call(self, n: torch.fx.Node, args, kwargs):
        if n.target in SYM_FUNCTIONS:
            return SYM_FUNCTIONS[n.target](*args, **kwargs)
        name = op_name(n.target)
        if name in NO_OPS:
            return None
        h = HANDLERS.get(name)
        if h is None:
            raise UnsupportedOpError("not implemented", node=n.name, op=name)
        ctx = LoweringContext(n, self.sym_env)
        self.op_counts[name] += 1
        try:
            out = h.fn(ctx, *args, **kwargs)
        except LumcError as e:
            if e.node is None:
                raise type(e)(e.reason + (f" (in {e.op})" if e.op and e.op != name else ""),
                              node=n.name, op=name) from None
            raise
        except Exception as e:  # a handler bug or an argument form it does not expect: name the node
            raise LumcError(f"cannot lower: {type(e).__name__}: {e}", node=n.name, op=name) from e
        return self._finish(n, ctx, out)

    def _finish(self, n: torch.fx.Node, ctx: LoweringContext, out):
        val = n.meta.get("val")
        if isinstance(out, Tensor):
            return self._checked(n, ctx, out, val)
        if isinstance(out, (tuple, list)):
            vals = val if isinstance(val, (tuple, list)) else [None] * len(out)
            return type(out)(self._checked(n, ctx, o, v) if isinstance(o, Tensor) else o
                             for o, v in zip(out, vals))
        return out

    def _checked(self, n, ctx, t: Tensor, val) -> Tensor:
        if isinstance(val, torch.Tensor):
            want = tuple(concrete_int(d, self.sym_env) for d in val.shape)
            if tuple(t.shape) != want:
                raise ShapeError(f"lowered to shape {t.shape}, PyTorch traced {want}",
                                 node=n.name, op=ctx.op)
            wd = TORCH_TO_DTYPE.get(val.dtype)
            if wd is not None and t.dtype != wd:
                t = t.cast(wd)   # PyTorch's declared result dtype wins (e.g. an i64 index result)
        return self.folder.fold(t)


_DETACH = {"detach.default", "detach_copy.default"}


def grad_outputs(gm: torch.fx.GraphModule) -> list[bool]:
    """Per output of an exported graph, whether a path from a placeholder reaches it without a
    ``detach``: ``x.detach()`` (or a value computed from detached ones only) never requires
    gradients in eager, though the imported graph, where a detach is the identity, reads ``x``
    (``capture.KEEP_UNDECOMPOSED`` keeps the detaches)."""
    live: dict = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            live[n] = True
        elif n.op == "call_function" and getattr(n.target, "__name__", "") in _DETACH:
            live[n] = False
        else:
            live[n] = any(live.get(a, False) for a in n.all_input_nodes)
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return [isinstance(o, torch.fx.Node) and live.get(o, False) for o in outs]
