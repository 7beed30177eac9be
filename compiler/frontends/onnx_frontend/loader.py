"""Reading ONNX models: bytes/paths to ``ModelProto``, dtype mapping, declared input/output specs.

Nothing here builds IR. ``load_model`` turns every way a model can arrive into a checked
``onnx.ModelProto`` (model-local functions inlined), and raises :class:`ModelError` with one line
for a missing, truncated or corrupt file. ``model_input_specs`` / ``model_output_specs`` report the
declared interface, with dynamic dims as names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, numpy_helper

from lumc.compiler.runtime.onnx_files import external_data_locations, graph_tensors  # noqa: F401
from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError

# ONNX element types lumc can hold; every other type (string, complex, float8e8m0...) makes the
# node that touches it unsupported.
ONNX_TO_DTYPE: dict[int, dt.DType] = {
    TensorProto.FLOAT: dt.f32,
    TensorProto.DOUBLE: dt.f64,
    TensorProto.FLOAT16: dt.f16,
    TensorProto.BFLOAT16: dt.bf16,
    TensorProto.INT64: dt.i64,
    TensorProto.INT32: dt.i32,
    TensorProto.INT16: dt.i16,
    TensorProto.INT8: dt.i8,
    TensorProto.UINT64: dt.u64,
    TensorProto.UINT32: dt.u32,
    TensorProto.UINT16: dt.u16,
    TensorProto.UINT8: dt.u8,
    TensorProto.BOOL: dt.bool_,
    # storage-only: cast and moved, never computed on (lumc.ir.dtypes)
    TensorProto.FLOAT8E4M3FN: dt.f8e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: dt.f8e4m3fnuz,
    TensorProto.FLOAT8E5M2: dt.f8e5m2,
    TensorProto.FLOAT8E5M2FNUZ: dt.f8e5m2fnuz,
    TensorProto.FLOAT4E2M1: dt.f4e2m1,
    TensorProto.INT4: dt.i4,
    TensorProto.UINT4: dt.u4,
    TensorProto.INT2: dt.i2,
    TensorProto.UINT2: dt.u2,
}
DTYPE_TO_ONNX: dict[dt.DType, int] = {v: k for k, v in ONNX_TO_DTYPE.items()}


def onnx_type_name(elem_type: int) -> str:
    """``TensorProto.INT16`` -> ``"int16"`` (for messages)."""
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type{elem_type}"


def dtype_of(elem_type: int, *, where: str = "") -> dt.DType:
    """The lumc dtype of an ONNX element type.

    Raises:
        ModelError: for a type lumc does not support (the checker reports these earlier as
            unsupported ops; this is the last guard).
    """
    try:
        return ONNX_TO_DTYPE[elem_type]
    except KeyError:
        raise ModelError(f"{where}element type {onnx_type_name(elem_type)} is not supported") from None


@dataclass
class TensorSpec:
    """A named tensor interface: shape (ints, or names for dynamic dims) and dtype."""
    name: str
    shape: tuple[int | str, ...]
    dtype: dt.DType


def load_model(src: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Read a model from a path, serialized bytes or a ``ModelProto``.

    External data next to a file is loaded. Model-local functions are inlined so that the importer
    only ever sees graph nodes.

    Returns:
        the model proto.
    Raises:
        ModelError: the file is missing or unreadable, the bytes are truncated or not an ONNX model,
            or the model has no graph.
    """
    if isinstance(src, onnx.ModelProto):
        model = src
        if not _sorted_everywhere(model.graph):    # the user's proto is theirs: sort a copy
            model = onnx.ModelProto()
            model.CopyFrom(src)
            sort_nodes(model.graph)
        check_model_valid(model, "the model")
    elif isinstance(src, (bytes, bytearray, memoryview)):
        model = _parse(bytes(src), "model bytes")
        sort_nodes(model.graph)
        check_model_valid(model, "model bytes")
    elif isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        if not os.path.exists(path):
            raise ModelError(f"model file {path!r} does not exist")
        if os.path.isdir(path):
            raise ModelError(f"model path {path!r} is a directory, not an ONNX file")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ModelError(f"cannot read model file {path!r}: {e.strerror}") from None
        model = _parse(data, f"model file {path!r}")
        base = os.path.dirname(os.path.abspath(path))
        _check_external_files(model, base, path)
        sort_nodes(model.graph)
        # before external data: a small proto
        check_model_valid(model, f"model file {path!r}", external_checked=True)
        try:
            onnx.load_external_data_for_model(model, base)
        except Exception as e:  # OSError, ValueError, onnx's checker.ValidationError
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelError(f"external data of {path!r} cannot be loaded: {first}") from None
    else:
        raise ModelError(f"cannot load a model from a {type(src).__name__}")
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelError("the model has no graph (empty, truncated or not an ONNX model)")
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:  # onnx raises its C++ errors as plain exceptions
            raise ModelError(f"cannot inline the model's local functions: {e}") from None
    return model


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """Names ``graph``'s nodes (and their subgraphs') read that it does not define: values of an
    enclosing graph."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for n in graph.node for o in n.output}
    used = {i for n in graph.node for i in _node_reads(n)}
    return used - defined


def _node_reads(n: onnx.NodeProto) -> set[str]:
    """What a node reads: its inputs, and the enclosing values its subgraphs read."""
    reads = {i for i in n.input if i}
    for a in n.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            reads |= _free_names(g)
    return reads


def _is_sorted(graph: onnx.GraphProto) -> bool:
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    return all(producer.get(i, -1) < k for k, n in enumerate(graph.node) for i in _node_reads(n))


def _subgraphs(graph: onnx.GraphProto):
    for n in graph.node:
        for a in n.attribute:
            yield from ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))


def _sorted_everywhere(graph: onnx.GraphProto) -> bool:
    return _is_sorted(graph) and all(_sorted_everywhere(g) for g in _subgraphs(graph))


def sort_nodes(graph: onnx.GraphProto) -> None:
    """Order ``graph``'s nodes (and its subgraphs') so each comes after what it reads, keeping the
    given order where it already is one (a stable topological sort). The ONNX spec requires sorted
    nodes and ``onnx.checker`` refuses others, but onnxruntime sorts them itself, and tools write
    such graphs (onnxruntime's ``convert_float_to_float16(keep_io_types=True)`` appends its input
    casts last). A cycle is left as it is, for the checker to name."""
    import networkx as nx
    for g in _subgraphs(graph):
        sort_nodes(g)
    if _is_sorted(graph):
        return
    nodes = list(graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    needs = [{producer[i] for i in _node_reads(n) if i in producer and producer[i] != k}
             for k, n in enumerate(nodes)]
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(nodes)))
    dag.add_edges_from((d, k) for k, deps in enumerate(needs) for d in deps)
    try:     # Kahn's order, the smallest ready index first: the given order where it is one
        order = list(nx.lexicographical_topological_sort(dag))
    except nx.NetworkXUnfeasible:
        return
    del graph.node[:]
    graph.node.extend(nodes[k] for k in order)


def check_model_valid(model: onnx.ModelProto, what: str = "the model",
                      external_checked: bool = False) -> None:
    """Validate ``model`` as onnxruntime would before running it: ``onnx.checker.check_model``
    (IR version, opset imports, every node against its op schema: input and output counts,
    required attributes, attribute types; graph topology) and declared dims >= 0.

    ``external_checked``: the model's external data files were found next to its file
    (:func:`_check_external_files`) and are loaded with onnx's own checks of their locations
    (nothing absolute, nothing outside the folder) right after. The checker, given a proto in
    memory, looks for them in the current directory instead, and refused every model with external
    data unless run from its folder; for the check, their locations are marked as in-memory data
    (a leading ``#``, which the checker does not look up) and restored after.

    Raises:
        ModelError: one line with the checker's reason and the node it names.
    """
    for vi in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.HasField("shape"):
            for k, d in enumerate(tt.shape.dim):
                # -1 is how Paddle and others write an unknown dim (onnxruntime accepts it; it
                # becomes a dynamic dim, see value_spec); any other negative dim is invalid
                if d.HasField("dim_value") and d.dim_value < -1:
                    raise ModelError(f"{what} is invalid: value {vi.name!r} declares dim {k} as "
                                     f"{d.dim_value}; dims are >= 0 (or -1, unknown)")
    # the checker demands a shape on every graph input and output, onnxruntime does not: lend an
    # empty one for the check and take it back (no copy of a model that may hold its weights)
    lent = [vi.type.tensor_type for vi in (*model.graph.input, *model.graph.output)
            if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]
    for tt in lent:
        tt.shape.SetInParent()
    marked = []
    if external_checked:
        marked = [e for t in graph_tensors(model.graph) if t.data_location == TensorProto.EXTERNAL
                  for e in t.external_data if e.key == "location"]
        for e in marked:
            e.value = "#" + e.value
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        reason = " ".join(str(e).replace("==> Context:", ";").split())
        if marked:
            reason = reason.replace("'#", "'")
        raise ModelError(f"{what} is invalid (onnx.checker): {reason[:400]}") from None
    except ValueError:   # a proto over protobuf's 2 GB limit: it cannot be checked in memory
        pass
    finally:
        for tt in lent:
            tt.ClearField("shape")
        for e in marked:
            e.value = e.value[1:]


def _check_external_files(model: onnx.ModelProto, base: str, path: str) -> None:
    """Every external-data file the model names exists next to it (one line naming the tensor and
    the file, instead of onnx's checker error)."""
    for t in graph_tensors(model.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in t.external_data if e.key == "location"), None)
        if not location:
            raise ModelError(f"tensor {t.name!r} of {path!r} is stored externally but names no file")
        f = os.path.join(base, location)
        if not os.path.isfile(f):
            what = "is missing" if not os.path.exists(f) else "is not a regular file"
            raise ModelError(f"tensor {t.name!r}: its external data file {location!r} {what} "
                             f"(looked next to {path!r})")


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    if not data:
        raise ModelError(f"{what} is empty")
    if data[:2] == b"PK":   # an ONNX protobuf never starts so (field 10 is not in ModelProto)
        from lumc.compiler.runtime.artifact import PYTORCH_HINT, pytorch_archive
        kind = pytorch_archive(data)
        if kind:
            raise ModelError(f"{what} is a PyTorch file ({kind}), not an ONNX model; "
                             f"{PYTORCH_HINT}")
        raise ModelError(f"{what} is a zip archive (a compiled .lumc artifact?), not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # protobuf's DecodeError and friends
        raise ModelError(f"{what} is truncated or corrupt (not a valid ONNX protobuf)") from None
    # protobuf accepts many random byte strings as a message with unknown fields: demand a graph
    if not model.HasField("graph"):
        raise ModelError(f"{what} is truncated or corrupt (no graph found)")
    return model


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default (``ai.onnx``) opset the model imports.

    Raises:
        ModelError: when the model imports no default opset.
    """
    for oi in model.opset_import:
        if oi.domain in ("", "ai.onnx"):
            return int(oi.version)
    raise ModelError("the model imports no ai.onnx opset")


def initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}


def value_spec(vi: onnx.ValueInfoProto, *, strict: bool = True) -> TensorSpec:
    """The declared spec of a graph input/output; unnamed dynamic dims (no name, ``dim_value`` -1,
    or a placeholder name like ``?``, :data:`PLACEHOLDER_DIMS`) become ``<name>_dim<k>``.

    Raises:
        ModelError: (``strict``) for a non-tensor value or an unsupported element type.
    """
    t = vi.type
    if not t.HasField("tensor_type"):
        raise ModelError(f"value {vi.name!r} is not a tensor ({t.WhichOneof('value')})")
    tt = t.tensor_type
    dtype = dtype_of(tt.elem_type, where=f"value {vi.name!r}: ")
    dims: list[int | str] = []
    if tt.HasField("shape"):
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param.strip() not in PLACEHOLDER_DIMS:
                dims.append(d.dim_param)
            else:   # -1, '?' (Paddle and others): each axis its own dynamic dim
                dims.append(f"{vi.name}_dim{k}")
    return TensorSpec(vi.name, tuple(dims), dtype)


# dim_param spellings exporters use for "unknown" (Paddle writes '?' on every dynamic axis, others
# -1 or None): not a name, so two axes spelled alike are not the same dim
PLACEHOLDER_DIMS = frozenset({"", "?", "-1", "None", "none", "unknown", "dynamic"})


def has_shape(vi: onnx.ValueInfoProto) -> bool:
    return vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")


def model_input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Declared specs of the model's real inputs (initializers excluded).

    Raises:
        ModelError: for a non-tensor input or an unsupported element type.
    """
    inits = initializer_names(model.graph)
    return [value_spec(vi) for vi in model.graph.input if vi.name not in inits]


def model_output_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Declared specs of the model's outputs (as written in the file; not trusted by the importer).

    Raises:
        ModelError: for a non-tensor output or an unsupported element type.
    """
    return [value_spec(vi) for vi in model.graph.output]


def tensor_array(t: onnx.TensorProto, base_dir: str | None = None) -> np.ndarray:
    """A numpy copy of an initializer or attribute tensor, in its lumc dtype.

    Raises:
        ModelError: for an unsupported element type, or data that does not match its dims.
    """
    dtype_of(t.data_type, where=f"tensor {t.name!r}: ")
    try:
        arr = numpy_helper.to_array(t, base_dir or "")
    except Exception as e:
        raise ModelError(f"tensor {t.name!r} cannot be read: {e}") from None
    return np.array(arr, copy=True)
