"""The op-handler table of the ONNX importer, and the context a handler receives.

A handler turns one ONNX node into IR through :class:`~lumc.ir.tensor.Tensor` methods and
``lumc.ir.library`` functions; it never evaluates data with numpy (the importer folds constant
results through the reference executor, so folding and running share one semantics). Handlers are
registered with :func:`handler`; an op whose library function is not available is reported as
unsupported by ``check_supported`` instead of failing half-way through an import.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import onnx
from onnx import AttributeProto

from lumc.compiler.frontends.onnx_frontend.loader import tensor_array
from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError, UnsupportedOpError
from lumc.ir.graph import const_node
from lumc.ir.tensor import Tensor

if TYPE_CHECKING:
    from lumc.compiler.frontends.onnx_frontend.importer import GraphImporter

HandlerFn = Callable[["OpContext"], "Tensor | Sequence[Tensor | None]"]
# (node, opset) -> reason the node is unsupported, or None
CheckFn = Callable[[onnx.NodeProto, int], "str | None"]


class NeedsConstantError(UnsupportedOpError):
    """A value lumc needs at compile time (a shape, axes, a trip count) is computed from graph
    inputs. ``inputs`` names them: binding them to constants (``import_onnx`` of a model where they
    are initializers) makes the model importable."""

    def __init__(self, reason: str, *, inputs: Sequence[str] = (), **where):
        self.inputs = list(inputs)
        super().__init__(reason, **where)


@dataclass
class Handler:
    """One registered op: its builder, the library functions it needs, an optional attribute check."""
    fn: HandlerFn
    requires: tuple[str, ...] = ()
    check: CheckFn | None = None


HANDLERS: dict[str, Handler] = {}


def handler(*op_types: str, requires: Sequence[str] = (), check: CheckFn | None = None):
    """Register ``fn`` as the builder of ``op_types``.

    Args:
        requires: library functions the builder calls, as ``"module.function"`` under
            ``lumc.ir.library`` (e.g. ``"conv.conv"``); the op is unsupported while one is missing.
        check: ``(node, opset) -> reason | None`` for attribute values the builder cannot handle.
    """
    def deco(fn: HandlerFn) -> HandlerFn:
        for op in op_types:
            HANDLERS[op] = Handler(fn, tuple(requires), check)
        return fn
    return deco


_LIB_CACHE: dict[str, Any] = {}


def library(qualname: str):
    """The library function ``lumc.ir.library.<module>.<function>``, or None when not available."""
    if qualname not in _LIB_CACHE:
        mod, _, fn = qualname.rpartition(".")
        try:
            _LIB_CACHE[qualname] = getattr(importlib.import_module(f"lumc.ir.library.{mod}"), fn)
        except (ImportError, AttributeError):
            _LIB_CACHE[qualname] = None
    return _LIB_CACHE[qualname]


def lib(qualname: str):
    """Like :func:`library` but raises UnsupportedOpError when the function is missing."""
    f = library(qualname)
    if f is None:
        raise UnsupportedOpError(f"needs lumc.ir.library.{qualname}, which is not available")
    return f


def missing_requirements(h: Handler) -> list[str]:
    return [q for q in h.requires if library(q) is None]


def handler_problems(h: Handler | None, *check_args) -> list[str]:
    """Why a node cannot be lowered by ``h`` (both frontends): no handler, a missing library
    function, or its check's reason on ``check_args``; empty when it can."""
    if h is None:
        return ["not implemented"]
    out = []
    missing = missing_requirements(h)
    if missing:
        out.append("needs " + ", ".join(f"lumc.ir.library.{m}" for m in missing))
    reason = h.check(*check_args) if h.check is not None else None
    if reason:
        out.append(reason)
    return out


def attribute_value(a: onnx.AttributeProto):
    """A Python value for an attribute: ints, floats, str (decoded), TensorProto, GraphProto, lists."""
    if a.type == AttributeProto.STRING:
        return a.s.decode("utf-8", errors="replace")
    if a.type == AttributeProto.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in a.strings]
    if a.type == AttributeProto.INTS:
        return [int(i) for i in a.ints]
    if a.type == AttributeProto.FLOATS:
        return [float(f) for f in a.floats]
    if a.type == AttributeProto.INT:
        return int(a.i)
    if a.type == AttributeProto.FLOAT:
        return float(a.f)
    return onnx.helper.get_attribute_value(a)


@dataclass
class OpContext:
    """What a handler sees of one ONNX node.

    Attributes:
        node: the node proto.
        opset: the default-domain opset of the model.
        inputs: one entry per declared input; None where the name is empty (an omitted optional).
        importer: the graph importer (constant values, subgraphs).
        attrs: attribute values by name (see :func:`attribute_value`).
    """
    node: onnx.NodeProto
    opset: int
    inputs: list[Tensor | None]
    importer: "GraphImporter"
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.attrs = {a.name: attribute_value(a) for a in self.node.attribute}

    @property
    def name(self) -> str:
        return self.node.name or (self.node.output[0] if self.node.output else self.node.op_type)

    @property
    def n_outputs(self) -> int:
        return len(self.node.output)

    def wants_output(self, k: int) -> bool:
        return k < len(self.node.output) and bool(self.node.output[k])

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def input(self, i: int) -> Tensor:
        """Input ``i``; raises ModelError when it is absent (a required input left empty)."""
        if not self.has_input(i):
            raise ModelError(f"required input {i} is missing")
        return self.inputs[i]

    def opt(self, i: int) -> Tensor | None:
        return self.inputs[i] if self.has_input(i) else None

    def const(self, i: int, what: str = "") -> np.ndarray | None:
        """The value of input ``i`` if it is known at import time; None when the input is absent.

        Raises:
            UnsupportedOpError: the input depends on runtime data (a data-dependent shape).
        """
        if not self.has_input(i):
            return None
        folder = self.importer.folder
        v = folder.value(self.inputs[i])
        if v is None:
            raise NeedsConstantError(
                f"input {i}{' (' + what + ')' if what else ''} ({self.node.input[i]!r}) depends on "
                "runtime data; lumc needs it known at compile time",
                inputs=folder.input_names(self.inputs[i].node))
        return v

    def const_ints(self, i: int, what: str = "") -> list[int] | None:
        v = self.const(i, what)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]

    def const_scalar(self, i: int, what: str = ""):
        v = self.const(i, what)
        return None if v is None else np.asarray(v).reshape(-1)[0].item()

    def tensor_attr(self, name: str) -> np.ndarray | None:
        t = self.attrs.get(name)
        return None if t is None else tensor_array(t)

    def run_subgraph(self, graph: onnx.GraphProto,
                     bindings: dict[str, Tensor] | None = None) -> list[Tensor]:
        """Import a subgraph (an ``If`` branch, a loop body with its inputs bound) with the outer
        scope visible; returns its outputs."""
        return self.importer.run_subgraph(graph, bindings)


def constant(value: np.ndarray) -> Tensor:
    """A constant tensor holding exactly ``value`` (dtype kept, even for 0-d f64)."""
    return Tensor(const_node(np.asarray(value)))


def scalar(value, dtype: dt.DType) -> Tensor:
    """A 0-d constant of ``dtype``."""
    return constant(np.array(value, dtype=dtype.np))
