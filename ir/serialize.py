"""Serialization of primitive graphs: a JSON node list plus an ``.npz`` of constants.

Used by artifacts, so a saved program runs without its source model. The format is versioned;
reading a different version raises :class:`~lumc.ir.errors.ArtifactError`. Constants are stored as
raw bytes with their lumc dtype name, so bf16 survives the round trip.

A constant may instead name its bytes in another store (``s{k}``: one or more keys and the SHA-256
of the bytes it was written with, with the ``m{k}`` dtype and shape as always; several keys'
bytes are concatenated row by row along the last axis): an artifact stores a
weight that is byte for byte one of its source model's initializers once, in ``source.onnx``
(``lumc.compiler.runtime.source_refs``). The writer's ``external`` hook picks such constants, the
reader's ``source`` hook returns their bytes, which must hash as they did when written (a store
whose content changed is an error, not other weights).
"""
from __future__ import annotations

import hashlib
import io
import json

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import ArtifactError
from lumc.ir.graph import ConstArg, Graph, InputArg, IotaArg, Node, node
from lumc.ir.provenance import RUNTIME_CHECKED, origin, set_origin
from lumc.ir.views import View

FORMAT = "lumc-graph/1"


def _arg_to_json(a, consts: list[np.ndarray]):
    if a is None:
        return None
    if isinstance(a, InputArg):
        return {"input": a.name, "shape": list(a.shape), "dtype": a.dtype.name}
    if isinstance(a, IotaArg):
        return {"iota": a.axis, "shape": list(a.shape), "dtype": a.dtype.name}
    if isinstance(a, ConstArg):
        consts.append(a.value)
        return {"const": len(consts) - 1}
    if isinstance(a, View):
        return {"view": [list(a.shape), list(a.strides), a.offset,
                         None if a.mask is None else [list(m) for m in a.mask]]}
    if isinstance(a, dt.DType):
        return {"dtype": a.name}
    if isinstance(a, tuple):
        return {"axes": [int(x) for x in a]}
    if isinstance(a, int):
        return {"int": a}
    raise TypeError(f"cannot serialize node arg {a!r}")


def _arg_from_json(j, consts):
    if j is None:
        return None
    if "input" in j:
        return InputArg(j["input"], tuple(j["shape"]), dt.BY_NAME[j["dtype"]])
    if "iota" in j:
        return IotaArg(tuple(j["shape"]), j["iota"], dt.BY_NAME[j["dtype"]])
    if "const" in j:
        return ConstArg(consts[j["const"]])
    if "view" in j:
        shape, strides, offset, mask = j["view"]
        return View(tuple(shape), tuple(strides), offset,
                    None if mask is None else tuple(tuple(m) for m in mask))
    if "dtype" in j:
        return dt.BY_NAME[j["dtype"]]
    if "axes" in j:
        return tuple(j["axes"])
    if "int" in j:
        return j["int"]
    raise ArtifactError(f"unknown node argument {j!r} in a serialized graph")


def graph_to_bytes(graph: Graph, external=None, origins: bool = True
                   ) -> tuple[bytes, bytes, dict[int, int]]:
    """Serialize ``graph``.

    Args:
        graph: the graph.
        external: ``external(array) -> (key, ..., sha256 hex of its bytes) or None``: a
            constant it names is stored as those keys (their bytes concatenated along its last
            axis) and the digest (``s{k}``) instead of its bytes; None stores every constant's
            bytes.
        origins: also store the model node each ``Gather`` and ``Mod`` came from
            (:mod:`lumc.ir.provenance`); False for content hashes, which names must not change.

    Returns:
        ``(json bytes, npz bytes, index)``: ``index`` maps ``id(node)`` to its position in the node
        list, so callers (plans) can refer to nodes by position.
    """
    order = graph.nodes()
    reached = {id(n) for n in order}
    # an input that feeds nothing (folded away) is still part of the signature: keep it first
    order = [n for n in graph.inputs.values() if id(n) not in reached] + order
    index = {id(n): k for k, n in enumerate(order)}
    consts: list[np.ndarray] = []
    nodes = [{"op": n.op, "srcs": [index[id(s)] for s in n.srcs], "arg": _arg_to_json(n.arg, consts)}
             for n in order]
    doc = {"format": FORMAT, "nodes": nodes,
           "inputs": {k: index[id(n)] for k, n in graph.inputs.items()},
           "outputs": {k: index[id(n)] for k, n in graph.outputs.items()}}
    # the model node of each primitive a run can refuse at (an index outside its table, an
    # integer Mod by 0), so a loaded artifact's error names it too (lumc.ir.provenance)
    named = {str(k): list(o) for k, n in enumerate(order)
             if origins and n.op in RUNTIME_CHECKED and (o := origin(n)) is not None}
    if named:
        doc["origins"] = named
    buf = io.BytesIO()
    arrays = {}
    for k, c in enumerate(consts):
        ref = external(c) if external is not None else None
        if ref is not None:
            arrays[f"s{k}"] = np.array(list(ref))
        else:
            arrays[f"c{k}"] = np.frombuffer(c.tobytes(), dtype=np.uint8)
        arrays[f"m{k}"] = np.array([dt.from_numpy(c.dtype).name] + [str(d) for d in c.shape])
    np.savez(buf, **arrays)
    return json.dumps(doc).encode(), buf.getvalue(), index


def _joined(parts: list[bytes], shape: tuple, dtype, k: int) -> bytes:
    """Stored parts concatenated row by row along the constant's last axis (one part: itself)."""
    if len(parts) == 1:
        return parts[0]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if rows == 0 or any(len(p) % rows for p in parts):
        raise ArtifactError(f"constant {k}'s stored parts do not split into its {rows} rows")
    return np.concatenate([np.frombuffer(p, np.uint8).reshape(rows, -1) for p in parts],
                          axis=1).tobytes()


def graph_from_bytes(doc_bytes: bytes, npz_bytes: bytes, source=None) -> tuple[Graph, list[Node]]:
    """Rebuild a graph; returns it and the node list in serialized order.

    Args:
        source: ``source(key) -> bytes`` for constants stored by keys (``graph_to_bytes``'s
            ``external``); it raises :class:`ArtifactError` for a key it does not hold. Bytes
            whose SHA-256 is not the one written are an :class:`ArtifactError` too.
    Raises:
        ArtifactError: on a foreign format, a broken node list or unreadable constants (a key
            with no ``source``, or bytes that do not fill the constant's shape).
    """
    try:
        doc = json.loads(doc_bytes)
        if doc.get("format") != FORMAT:
            raise ArtifactError(f"graph format {doc.get('format')!r}, expected {FORMAT!r}")
        with np.load(io.BytesIO(npz_bytes), allow_pickle=False) as z:
            consts = []
            k = 0
            while f"m{k}" in z:
                meta = list(z[f"m{k}"])
                dtype = dt.BY_NAME[str(meta[0])]
                shape = tuple(int(d) for d in meta[1:])
                if f"c{k}" in z:
                    data = z[f"c{k}"].tobytes()
                elif source is None:
                    raise ArtifactError(f"constant {k} is stored in the source model, which "
                                        "this graph was read without")
                else:
                    *keys, digest = (str(v) for v in z[f"s{k}"])
                    data = _joined([source(key) for key in keys], shape, dtype, k)
                    if hashlib.sha256(data).hexdigest() != digest:
                        raise ArtifactError(f"the source model's weight {'+'.join(keys)!r} is "
                                            "not the one compiled (its bytes' sha256 differs)")
                need = dtype.np.itemsize * int(np.prod(shape, dtype=np.int64))
                if len(data) != need:
                    raise ArtifactError(f"constant {k} holds {len(data)} bytes, its shape "
                                        f"{list(shape)} of {dtype.name} needs {need}")
                consts.append(np.frombuffer(data, dtype=dtype.np).reshape(shape))
                k += 1
        nodes: list[Node] = []
        for j in doc["nodes"]:
            nodes.append(node(j["op"], [nodes[s] for s in j["srcs"]], _arg_from_json(j["arg"], consts)))
        for k, (name, op) in doc.get("origins", {}).items():
            set_origin(nodes[int(k)], str(name), str(op))
        g = Graph({k: nodes[v] for k, v in doc["inputs"].items()},
                  {k: nodes[v] for k, v in doc["outputs"].items()})
        return g, nodes
    except ArtifactError:
        raise
    except Exception as e:  # any structural damage is one clear error, not a traceback
        raise ArtifactError(f"serialized graph is corrupt ({type(e).__name__}: {e})") from None
