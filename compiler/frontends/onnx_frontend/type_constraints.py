"""The ONNX schema's type constraints on a node's inputs.

An op's schema binds several inputs to one type parameter (``LayerNormalization``'s ``X``,
``Scale`` and ``B`` are all ``T``) and lists the types that parameter allows (``ReduceSum``'s ``T``
has no int8). A model whose inputs disagree there, or use a type outside the list, is invalid, and
onnxruntime refuses to load it. Handlers that widen every input to a compute type (the norms, the
reductions) would otherwise accept such a model and compute something, so the importer checks the
types before any handler runs. Ops outside the default domain, and non-homogeneous variadic inputs
(``Loop``'s carried values), are not checked.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import onnx
import onnx.defs

from lumc.compiler.frontends.onnx_frontend.loader import DTYPE_TO_ONNX
from lumc.ir.errors import ModelError


@lru_cache(maxsize=None)
def _allowed_tensor_types(op_type: str, opset: int) -> dict[str, frozenset[str]]:
    """``{type parameter: element types it allows}`` (``'float'``, ``'int8'``...) for the
    parameters that allow tensors; empty for an op without a schema."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return {}
    out = {}
    for c in schema.type_constraints:
        names = frozenset(t[len("tensor("):-1] for t in c.allowed_type_strs
                          if t.startswith("tensor("))
        if names:
            out[c.type_param_str] = names
    return out


def _onnx_type_name(d) -> str | None:
    """The schema's spelling of lumc dtype ``d`` (``'float'``, ``'bfloat16'``), or None."""
    k = DTYPE_TO_ONNX.get(d)
    return None if k is None else onnx.TensorProto.DataType.Name(k).lower()


@lru_cache(maxsize=None)
def _input_params(op_type: str, opset: int) -> tuple[tuple[str, ...], str | None] | None:
    """``(type parameter of each formal input, parameter of a homogeneous variadic tail or None)``
    for ops whose inputs are bound to type parameters; None when there is nothing to check."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    params = {c.type_param_str for c in schema.type_constraints}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    fixed: list[str] = []
    tail = None
    for p in schema.inputs:
        name = p.type_str if p.type_str in params else ""
        if p.option == variadic:
            tail = name if (name and p.is_homogeneous) else None
            break
        fixed.append(name)
    return tuple(fixed), tail


def check_input_types(node: onnx.NodeProto, inputs: Sequence, opset: int) -> None:
    """Raise ModelError when two inputs bound to one type parameter have different element types,
    or an input's element type is not one its parameter allows.

    ``inputs``: the node's input values in order (None where omitted); values without a ``dtype``
    (sequences) are skipped."""
    if node.domain not in ("", "ai.onnx"):
        return
    spec = _input_params(node.op_type, opset)
    if spec is None:
        return
    fixed, tail = spec
    seen: dict[str, tuple[int, object]] = {}
    where = {"node": node.name or (node.output[0] if node.output else node.op_type),
             "op": node.op_type, "opset": opset}
    for i, v in enumerate(inputs):
        param = fixed[i] if i < len(fixed) else tail
        d = getattr(v, "dtype", None)
        if not param or d is None:
            continue
        allowed = _allowed_tensor_types(node.op_type, opset).get(param)
        name = _onnx_type_name(d)
        if allowed and name is not None and name not in allowed:
            raise ModelError(
                f"input {i} ({node.input[i]!r}) is {name}, which {node.op_type}-{_since(node, opset)} "
                f"does not allow for its type {param} (allowed: {', '.join(sorted(allowed))}; an "
                "invalid model, which onnxruntime refuses too)", **where)
        if param not in seen:
            seen[param] = (i, d)
            continue
        j, first = seen[param]
        if d != first:
            raise ModelError(
                f"input {j} ({node.input[j]!r}) is {first} but input {i} ({node.input[i]!r}) is "
                f"{d}; {node.op_type} binds both to one type {param} (an invalid model, which "
                "onnxruntime refuses too)", **where)


def _since(node: onnx.NodeProto, opset: int) -> int:
    """The version of ``node``'s op that the model's opset selects (``ReduceSum-13``)."""
    return onnx.defs.get_schema(node.op_type, opset, "").since_version
