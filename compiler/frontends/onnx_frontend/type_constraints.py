"""The ONNX schema's type constraints between a node's inputs.

An op's schema binds several inputs to one type parameter (``LayerNormalization``'s ``X``,
``Scale`` and ``B`` are all ``T``); a model whose inputs disagree there is invalid, and onnxruntime
refuses to load it. Handlers that widen every input to a compute type (the norms) would otherwise
accept such a model and compute in the wider type, so the importer checks the binding before any
handler runs. Ops outside the default domain, and non-homogeneous variadic inputs (``Loop``'s
carried values), are not checked.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import onnx
import onnx.defs

from lumc.ir.errors import ModelError


@lru_cache(maxsize=None)
def _input_params(op_type: str, opset: int) -> tuple[tuple[str, ...], str | None] | None:
    """``(type parameter of each formal input, parameter of a homogeneous variadic tail or None)``
    for ops whose inputs share a type parameter; None when there is nothing to check."""
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
    """Raise ModelError when two inputs bound to one type parameter have different element types.

    ``inputs``: the node's input values in order (None where omitted); values without a ``dtype``
    (sequences) are skipped."""
    if node.domain not in ("", "ai.onnx"):
        return
    spec = _input_params(node.op_type, opset)
    if spec is None:
        return
    fixed, tail = spec
    seen: dict[str, tuple[int, object]] = {}
    for i, v in enumerate(inputs):
        param = fixed[i] if i < len(fixed) else tail
        d = getattr(v, "dtype", None)
        if not param or d is None:
            continue
        if param not in seen:
            seen[param] = (i, d)
            continue
        j, first = seen[param]
        if d != first:
            raise ModelError(
                f"input {j} ({node.input[j]!r}) is {first} but input {i} ({node.input[i]!r}) is "
                f"{d}; {node.op_type} binds both to one type {param} (an invalid model, which "
                "onnxruntime refuses too)",
                node=node.name or (node.output[0] if node.output else node.op_type),
                op=node.op_type, opset=opset)
