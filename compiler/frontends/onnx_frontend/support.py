"""``check_supported``: one up-front verdict on whether lumc can import a model.

Every node (including those inside ``If`` branches) is checked for: an op in the handler table, in
the default domain; the library functions its handler needs; attribute values the handler rejects;
and the element types of every value it reads or writes (from the file's declarations plus ONNX
shape inference). All problems are reported together in one :class:`UnsupportedOpError`.
"""
from __future__ import annotations

import math
from collections import defaultdict

import onnx
import onnx.inliner
from onnx import AttributeProto

from lumc.compiler.frontends.onnx_frontend.loader import ONNX_TO_DTYPE, default_opset, onnx_type_name
from lumc.compiler.frontends.onnx_frontend.registry import HANDLERS, handler_problems
from lumc.ir.errors import ModelError, UnsupportedOpError

# attributes that name an element type the node produces
_DTYPE_ATTRS = ("to", "dtype", "output_dtype", "stash_type", "softmax_precision", "precision")
_MAX_NAMES = 4


_BIG_TENSOR = 1 << 16   # bytes; initializers above this are dropped before type inference


def _without_weight_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its large initializers turned into graph inputs of the same type and shape:
    type inference needs no weight values, and serializing gigabytes of weights for it is slow
    (and fails past 2 GB). Weight bytes are never copied."""
    src = model.graph
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    g = light.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared = {vi.name for vi in src.input}
    for t in src.initializer:
        if math.prod(t.dims) * 8 <= _BIG_TENSOR and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Declared and inferred types of every named value, across subgraphs."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weight_data(model), strict_mode=False)
    except Exception:  # inference is best effort: fall back to what the file declares
        inferred = model
    types: dict[str, onnx.TypeProto] = {}

    def visit(g: onnx.GraphProto):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.WhichOneof("value") is not None:
                types.setdefault(vi.name, vi.type)
        for t in g.initializer:
            tp = onnx.TypeProto()
            tp.tensor_type.elem_type = t.data_type
            types.setdefault(t.name, tp)
        for n in g.node:
            for a in n.attribute:
                if a.type == AttributeProto.GRAPH:
                    visit(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        visit(sg)

    visit(inferred.graph)
    return types


def _type_problem(tp: onnx.TypeProto | None) -> str | None:
    if tp is None:
        return None
    kind = tp.WhichOneof("value")
    if kind != "tensor_type":
        return kind.replace("_type", "") if kind else None
    et = tp.tensor_type.elem_type
    if et == 0 or et in ONNX_TO_DTYPE:
        return None
    return onnx_type_name(et)


def _node_problems(node: onnx.NodeProto, opset: int, types) -> list[str]:
    """Reasons ``node`` is unsupported (empty when it is supported)."""
    if node.domain not in ("", "ai.onnx"):
        return [f"domain {node.domain}"]
    h = HANDLERS.get(node.op_type)
    if h is None:
        return ["not implemented"]
    out = handler_problems(h, node, opset)
    bad = set()
    for name in list(node.input) + list(node.output):
        if name:
            p = _type_problem(types.get(name))
            if p:
                bad.add(p)
    for a in node.attribute:
        if a.name in _DTYPE_ATTRS and a.type == AttributeProto.INT and a.i not in ONNX_TO_DTYPE:
            bad.add(onnx_type_name(a.i))
        if a.type == AttributeProto.TENSOR and a.t.data_type not in ONNX_TO_DTYPE:
            bad.add(onnx_type_name(a.t.data_type))
        if a.type in (AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS):
            bad.add("sparse tensor")
    if bad:
        out.append("on " + ", ".join(sorted(bad)))
    return out


def _walk(graph: onnx.GraphProto):
    """Every node of ``graph`` and of its subgraphs, depth first."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from _walk(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from _walk(sg)


def _opset_or_zero(model: onnx.ModelProto) -> int:
    try:
        return default_opset(model)
    except ModelError:  # only other domains imported: their nodes are reported as unsupported
        return 0


def unsupported_nodes(model: onnx.ModelProto) -> dict[str, list[str]]:
    """``{"OpType (reason)": [node names]}`` for every unsupported node; empty when all are fine."""
    if model.functions:   # model-local functions are inlined by load_model; check what it sees
        model = onnx.inliner.inline_local_functions(model)
    opset = _opset_or_zero(model)
    types = _value_types(model)
    found: dict[str, list[str]] = defaultdict(list)
    for k, node in enumerate(_walk(model.graph)):
        name = node.name or (node.output[0] if node.output else f"#{k}")
        for reason in _node_problems(node, opset, types):
            found[f"{node.op_type} ({reason})"].append(name)
    return dict(found)


def check_supported(model: onnx.ModelProto) -> None:
    """Raise before any import work if the model uses anything lumc cannot handle.

    Raises:
        UnsupportedOpError: one error listing every unsupported op type (with the reason: not
            implemented, a missing library function, an attribute value, an element type) and the
            names of its nodes, with the model's opset.
        ModelError: the model imports no default opset.
        UnsupportedOpError: the default opset is newer than the installed onnx package knows
            (``onnx.defs.onnx_opset_version()``): its ops' semantics are unknown to lumc.
    """
    opset = _opset_or_zero(model)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise UnsupportedOpError(f"the model imports ai.onnx opset {opset}; lumc supports ai.onnx "
                                 f"opsets up to {newest} (the newest the installed onnx knows)")
    found = unsupported_nodes(model)
    if not found:
        return
    parts = []
    for key in sorted(found):
        names = found[key]
        shown = ", ".join(repr(n) for n in names[:_MAX_NAMES])
        more = f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else ""
        parts.append(f"{key} at node{'s' if len(names) > 1 else ''} {shown}{more}")
    raise UnsupportedOpError(f"{len(found)} unsupported op kind{'s' if len(found) > 1 else ''}: "
                             + "; ".join(parts), opset=_opset_or_zero(model) or None)
