"""Graph inputs that index a table: their valid ranges, for ``--random`` and for run-time checks.

An integer graph input that reaches the index operand of a ``Gather``, ``GatherElements``,
``GatherND``, ``ScatterElements`` (``Scatter``) or ``ScatterND`` node (directly, or through
value-preserving ops: ``Cast``, ``Identity``, ``Reshape``, ``Unsqueeze``, ``Squeeze``, ``Flatten``,
``Expand``, ``Transpose``) must lie in ``[-n, n)``, ``n``
the size of the axis it indexes (ONNX); one shifted on the way by a constant ``c``
(``Add(ids, c)``, ``Add(c, ids)``, ``Sub(ids, -c)``) in ``[-n - c, n - c)``. :func:`index_uses`
finds those inputs and sizes from the ONNX graph (table shapes from initializers, else ONNX shape
inference at the concrete input shapes), so that

* ``--random`` (and a compile's default example inputs) draws such an input in ``[0, n - c)``
  instead of the generic ``[0, 8)`` (token-type ids into a 2-row table);
* a run checks the given values first and refuses an index outside its table in one line naming
  the node, the index and the range (:func:`check_index_inputs`), on every backend.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx

from lumc.ir.errors import InputError

_PASS_THROUGH = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand",
                 "Transpose"}
_GATHERS = {"Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND"}
_ND = {"GatherND", "ScatterND"}     # the index's last axis addresses the leading dims of the data


class IndexRangeInputError(InputError):
    """A graph input indexes a table outside ``[-n, n)``."""


@dataclass(frozen=True)
class IndexUse:
    """One table an input indexes: the node (name or ``op #k``; in lumc's own graph of a torch
    module, the FX node that made the gather, or None where that is not known: lumc's node ids
    mean nothing to its user), its op, and the axis size ``n``
    (valid indices ``[-n, n)``); for ``GatherND``, ``per_last`` gives each component's size
    along the index's last axis (``size`` is their minimum)."""
    node: str | None
    op: str
    size: int
    per_last: tuple[int, ...] = ()
    negative: bool = True     # False: valid indices are [0, n) (torch embedding, index_select)
    offset: int = 0           # the table is indexed at the input's value plus this (``emb(ids + 1)``)


def _shapes(model: onnx.ModelProto, input_shapes: Mapping[str, tuple]) -> dict[str, tuple]:
    """``{value name: static shape}`` for initializers and, by shape inference, other values."""
    out = {t.name: tuple(t.dims) for t in model.graph.initializer}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in input_shapes and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            shape.Clear()
            for d in input_shapes[vi.name]:
                shape.dim.add().dim_value = int(d)
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:   # an exotic model: initializer shapes are still known
        return out
    for vi in list(m.graph.value_info) + list(m.graph.input):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(
                d.HasField("dim_value") for d in tt.shape.dim):
            out.setdefault(vi.name, tuple(d.dim_value for d in tt.shape.dim))
    return out


def _axis_sizes(node: onnx.NodeProto, data_shape: tuple, index_shape: tuple | None
                ) -> tuple[int, ...] | None:
    """The sizes an index addresses: one axis (Gather, GatherElements, the scatters), or
    GatherND's (ScatterND's) ``k`` dims after the batch dims, one per component of the index's last
    axis."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    r = len(data_shape)
    if node.op_type in _ND:
        b = int(attrs.get("batch_dims", 0))
        if index_shape is None or not index_shape:
            return None
        dims = tuple(data_shape[b:b + index_shape[-1]])
        return dims if dims and len(dims) == index_shape[-1] else None
    axis = int(attrs.get("axis", 0))
    if not -r <= axis < r:
        return None
    return (data_shape[axis],)


def _integer_scalars(model: onnx.ModelProto) -> dict[str, int]:
    """``{value name: c}`` for the one-element integer constants of the top-level graph: an
    initializer (a constant to lumc even when also listed as an input), or a ``Constant``."""
    out = {}
    tensors = [(t.name, t) for t in model.graph.initializer]
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.attribute:
            a = node.attribute[0]
            if a.name == "value":
                tensors.append((node.output[0], a.t))
            elif a.name in ("value_int", "value_ints"):
                out[node.output[0]] = onnx.helper.get_attribute_value(a)
    for name, t in tensors:
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            out[name] = onnx.numpy_helper.to_array(t)
    return {k: int(np.reshape(v, -1)[0]) for k, v in out.items() if np.size(v) == 1}


def _shift(node: onnx.NodeProto, k: int, scalars: Mapping[str, int]) -> int | None:
    """The constant ``c`` that ``node`` adds to its operand ``k``: ``Add(x, c)``, ``Add(c, x)``
    give ``c``, ``Sub(x, c)`` gives ``-c``; None for anything else (``Sub(c, x)`` negates)."""
    if node.op_type not in ("Add", "Sub") or len(node.input) != 2:
        return None
    c = scalars.get(node.input[1 - k])
    if c is None or (node.op_type == "Sub" and k != 0):
        return None
    return c if node.op_type == "Add" else -c


def index_uses(model: onnx.ModelProto, input_shapes: Mapping[str, tuple]) -> dict[str, list[IndexUse]]:
    """``{graph input name: [IndexUse]}`` for the integer inputs that index a table (top-level
    graph only; see the module docstring). ``input_shapes`` gives the concrete input shapes.
    An input shifted by a constant before the lookup has the shift as the use's ``offset``."""
    inits = {t.name for t in model.graph.initializer}
    ints = [vi.name for vi in model.graph.input if vi.name not in inits
            and vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in (
                onnx.TensorProto.INT64, onnx.TensorProto.INT32)]
    if not ints:
        return {}
    consumers: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            consumers.setdefault(name, []).append((k, node))
    shapes = None
    scalars = _integer_scalars(model)
    out: dict[str, list[IndexUse]] = {}
    for name in ints:
        seen, stack = set(), [(name, 0)]    # (value, what it adds to the input)
        while stack:
            v, offset = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            for k, node in consumers.get(v, []):
                if node.op_type in _PASS_THROUGH and k == 0:
                    stack.extend((o, offset) for o in node.output if o)
                elif (c := _shift(node, k, scalars)) is not None:
                    stack.extend((o, offset + c) for o in node.output if o)
                elif node.op_type in _GATHERS and k == 1:
                    if shapes is None:
                        shapes = _shapes(model, input_shapes)
                    data = shapes.get(node.input[0])
                    sizes = _axis_sizes(node, data, shapes.get(v)) if data is not None else None
                    if sizes:
                        pos = list(model.graph.node).index(node)
                        per = tuple(int(d) for d in sizes) if node.op_type in _ND else ()
                        out.setdefault(name, []).append(
                            IndexUse(node.name or f"{node.op_type} #{pos}", node.op_type,
                                     int(min(sizes)), per, offset=offset))
    return out


def random_int_highs(uses: Mapping[str, list[IndexUse]]) -> dict[str, int]:
    """``{input name: h}``: draw the input in ``[0, h)``, ``h`` the smallest end of its valid
    ranges (``n - offset``: ``n`` for an unshifted index, ``n - 2`` for ``ids + 2``); inputs whose
    ranges leave no such ``h > 0`` are left out."""
    out = {}
    for k, v in uses.items():
        h = min((u.size - u.offset for u in v), default=0)
        zero_ok = all((-u.size if u.negative else 0) - u.offset <= 0 for u in v)
        if h > 0 and zero_ok:
            out[k] = h
    return out


def check_index_inputs(uses: Mapping[str, list[IndexUse]], inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse an input value outside the range of a table it indexes.

    Raises:
        IndexRangeInputError: one line naming the node, the input, the index and the range.
    """
    checks, comps = [], {}      # (name, use, component key, n); key -> the values it spans
    for name, lst in uses.items():
        x = inputs.get(name)
        if x is None:
            continue
        # a torch tensor is checked where it lives (a GPU tensor: reductions there, no copy)
        x = x if type(x).__module__.startswith("torch") else np.asarray(x)
        if math.prod(x.shape) == 0:
            continue
        for u in lst:
            per = u.per_last and x.ndim and x.shape[-1] == len(u.per_last)
            for j, n in (enumerate(u.per_last) if per else [(None, u.size)]):
                key = (name, j)
                if key not in comps:
                    comps[key] = x if j is None else x[..., j]
                checks.append((name, u, key, n))
    if not checks:
        return
    extremes = _extremes(comps)
    for name, u, key, n in checks:
        lo, hi = extremes[key]
        # the input's own valid range: the table's, less the offset added before indexing
        first, end = (-n if u.negative else 0) - u.offset, n - u.offset
        if lo < first or hi >= end:
            bad = lo if lo < first else hi
            plus = f" (it indexes at its value {u.offset:+d})" if u.offset else ""
            raise IndexRangeInputError(
                f"index {bad} in input {name!r} is out of range [{first}, {end}) of the "
                f"table it indexes{plus}", node=u.node, op=u.op)


def _extremes(comps: dict) -> dict:
    """``{key: (min, max)}`` as Python ints. Torch tensors' extremes are reduced where they live and
    read back in one transfer (on a GPU, one synchronization per call, not two per table)."""
    out, torch_keys = {}, []
    for key, c in comps.items():
        if isinstance(c, np.ndarray):
            out[key] = (int(c.min()), int(c.max()))
        else:
            torch_keys.append(key)
    by_device: dict = {}
    for k in torch_keys:
        by_device.setdefault(comps[k].device, []).append(k)
    for keys in by_device.values():
        import torch
        vals = torch.stack([v for k in keys for v in (comps[k].min().to(torch.int64),
                                                      comps[k].max().to(torch.int64))]).tolist()
        for i, k in enumerate(keys):
            out[k] = (vals[2 * i], vals[2 * i + 1])
    return out


def _fx_node(g) -> tuple[str | None, str]:
    """``(node name, op)`` of the model node that made the primitive gather ``g``
    (:mod:`lumc.ir.provenance`: ``('embedding', 'aten.embedding.default')``), else
    ``(None, 'Gather')``."""
    from lumc.ir.provenance import origin
    return origin(g) or (None, "Gather")


def graph_index_uses(graph) -> dict[str, list[IndexUse]]:
    """``{graph input name: [IndexUse]}`` from lumc's own graph, for a model with no ONNX source (a
    torch module): an integer input that reaches a ``Gather``'s index as given (through views that
    read every element, and widening integer casts) must lie in ``[0, n)``, as PyTorch's
    ``embedding``, ``index_select`` and ``gather`` require; through the negative-index wrap
    ``where(i < 0, i + n, i)`` (``ir.library.indexing.normalize_indices``: advanced indexing) in
    ``[-n, n)``. A GPU kernel masks an index outside its table (a row of zeros, or with 32-bit
    indexing another row), so the run refuses it first (:func:`check_index_inputs`)."""
    from lumc.ir.ops import apply_view
    inputs = {id(n): k for k, n in graph.inputs.items() if n.dtype.is_int}
    if not inputs:
        return {}

    def reads_all(v) -> bool:
        src = v.srcs[0]
        if v.arg.mask is not None or src.numel > 1 << 22:
            return False
        seen = apply_view(np.arange(src.numel).reshape(src.shape), v.arg)
        return np.unique(seen).size == src.numel

    def scalar(c, depth: int = 0):
        """The integer ``c`` holds where it is one (a scalar constant, through views, casts and
        integer arithmetic of such: ``sub(i, 1)`` lowers to ``i + 1 * -1``), else None."""
        while c.op in ("View", "Cast"):
            c = c.srcs[0]
        if c.op in ("Add", "Mul") and depth < 8 and c.dtype.is_int:
            a, b = (scalar(x, depth + 1) for x in c.srcs)
            if a is None or b is None:
                return None
            return a + b if c.op == "Add" else a * b
        v = np.asarray(c.arg.value) if c.op == "Constant" else None
        return int(v.reshape(-1)[0]) if v is not None and v.size == 1 else None

    def unwrapped(x, n: int):
        """``i`` where ``x = where(i < 0, i + n, i)``, else None."""
        if x.op != "Where" or x.srcs[0].op != "LessThan":
            return None
        i, add, lt = x.srcs[2], x.srcs[1], x.srcs[0]
        if lt.srcs[0] is not i or scalar(lt.srcs[1]) != 0 or add.op != "Add" or i not in add.srcs:
            return None
        return i if scalar(add.srcs[1] if add.srcs[0] is i else add.srcs[0]) == n else None

    def shifted(x):
        """``(i, c)`` where ``x = i + c`` (``i - c`` is ``i + -c``), ``c`` an integer scalar."""
        if x.op != "Add" or not x.dtype.is_int:
            return None
        a, b = x.srcs
        if (c := scalar(b)) is not None:
            return a, c
        return (b, c) if (c := scalar(a)) is not None else None

    out: dict[str, list[IndexUse]] = {}
    for g in graph.nodes():
        if g.op != "Gather":
            continue
        n = int(g.srcs[0].shape[int(g.arg)])
        x, wraps, offset = g.srcs[1], 0, 0
        for _ in range(32):
            if x.op == "View" and reads_all(x):
                x = x.srcs[0]
            elif x.op == "Cast" and x.srcs[0].dtype.is_int and \
                    x.dtype.itemsize >= x.srcs[0].dtype.itemsize:
                x = x.srcs[0]
            elif not offset and (i := unwrapped(x, n)) is not None:
                x, wraps = i, wraps + 1
            elif (step := shifted(x)) is not None:     # i + c: the input's range moves by -c
                x, offset = step[0], offset + step[1]
            else:
                break
        negative = wraps == 1
        # two wraps (one the user's) allow [-2n, n), and a wrap of a shifted value is not one
        # range of the input: those stay unchecked
        if id(x) in inputs and wraps <= 1 and x.dtype.is_int:
            out.setdefault(inputs[id(x)], []).append(
                IndexUse(*_fx_node(g), n, (), negative, offset))
    return out
