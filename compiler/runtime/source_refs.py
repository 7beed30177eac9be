"""Weights stored once in an artifact: constants that are a source initializer, byte for byte.

An artifact compiled from ONNX holds the source model (``source.onnx``, for ``lumc run --check``,
the index ranges and the bench's weights hash) and the primitive graph's constants
(``consts.npz``). Most of the graph's constants are the model's initializers unchanged: the
MiniLM-L3 artifact of ``make demo`` was 137.7 MB for a 69.1 MB model, two copies of every weight
(74.9 MB now). A constant whose bytes are an initializer's is stored as the initializer's name
(``lumc.ir.serialize``'s ``s{k}``), and read back from ``source.onnx``, which is kept byte for
byte as the user gave it. A constant that is initializers concatenated along its last axis (the
horizontal fusion's Q/K/V and gate/up weights) is stored as their names, in order. Constants the
compile made otherwise (a transposed, folded or bf16-rounded one) keep their own bytes.

Only initializers of at least :data:`MIN_SHARED_BYTES` are matched (a smaller one costs more in the
lookup than it saves). Matching is by length, then SHA-256 of the bytes (equal digests: equal
bytes, whatever dtype and shape each side gives them); the constant keeps its own dtype and shape
(``m{k}``), and the digest is stored with the name and checked on load.
"""
from __future__ import annotations

import hashlib

import numpy as np

from lumc.ir.errors import ArtifactError

MIN_SHARED_BYTES = 1 << 16


def _initializers(source: bytes) -> dict:
    """``{name: initializer}`` of the main graph and its subgraphs (If, Loop, Scan), for the names
    that occur once (a name two graphs both use cannot say which it is)."""
    import onnx
    model = onnx.load_from_string(source)      # external data is never loaded from bytes
    out, twice, seen = {}, set(), [model.graph]
    while seen:
        g = seen.pop()
        for init in g.initializer:
            if init.name in out:
                twice.add(init.name)
            out[init.name] = init
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    seen.append(a.g)
                seen.extend(a.graphs)
    return {k: v for k, v in out.items() if k and k not in twice}


def _array_bytes(init) -> bytes | None:
    """An initializer's data as the little-endian bytes ``numpy_helper.to_array`` gives, or None
    where it has none here (external data) or no numpy form."""
    from onnx import numpy_helper
    try:
        a = numpy_helper.to_array(init)
    except Exception:                 # external data, or a type numpy cannot hold
        return None
    if a.dtype.hasobject:
        return None
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


class SharedWeights:
    """The ``external`` hook of :func:`lumc.ir.serialize.graph_to_bytes` for one source model:
    ``self(array)`` is ``(name, sha256)`` of an initializer with exactly ``array``'s bytes,
    ``(name1, name2, ..., sha256)`` of initializers whose concatenation along ``array``'s last axis
    it is, or None (``sha256``: of ``array``'s bytes).

    Args:
        source: the source model's ONNX bytes.
    """

    def __init__(self, source: bytes):
        self._by_size: dict[int, list] = {}
        for init in _initializers(source).values():
            data = _array_bytes(init)
            if data is not None and len(data) >= MIN_SHARED_BYTES:
                self._by_size.setdefault(len(data), []).append((init.name, data))
        self._digests: dict[str, str] = {}

    def _digest(self, name: str, data: bytes) -> str:
        if name not in self._digests:
            self._digests[name] = hashlib.sha256(data).hexdigest()
        return self._digests[name]

    def __call__(self, array: np.ndarray) -> tuple[str, ...] | None:
        array = np.ascontiguousarray(array)
        cands = self._by_size.get(array.nbytes)
        if cands:
            want = hashlib.sha256(array.tobytes()).hexdigest()
            for name, data in cands:
                if self._digest(name, data) == want:
                    return name, want
        if array.ndim == 0 or array.nbytes < MIN_SHARED_BYTES:
            return None
        parts = self._concatenation(array)
        return (*parts, hashlib.sha256(array.tobytes()).hexdigest()) if parts else None

    def _concatenation(self, array: np.ndarray) -> list[str] | None:
        """The initializers whose bytes, row by row, are ``array``'s concatenated along its last
        axis (a Q/K/V or gate/up weight the horizontal fusion concatenated at compile time), in
        order, or None. Greedy from the row's start; a candidate is rejected on its first row."""
        rows = int(np.prod(array.shape[:-1], dtype=np.int64))
        width = array.nbytes // max(rows, 1)
        if rows == 0 or width == 0:
            return None
        mat = array.reshape(-1).view(np.uint8).reshape(rows, width)
        cands = [(name, np.frombuffer(data, np.uint8).reshape(rows, -1))
                 for size, group in self._by_size.items()
                 if size % rows == 0 and size // rows < width for name, data in group]
        out, at = [], 0
        while at < width:
            hit = next(((name, c.shape[1]) for name, c in cands if at + c.shape[1] <= width
                        and np.array_equal(mat[0, at:at + c.shape[1]], c[0])
                        and np.array_equal(mat[:, at:at + c.shape[1]], c)), None)
            if hit is None:
                return None
            out.append(hit[0])
            at += hit[1]
        return out if len(out) > 1 else None


class SourceWeights:
    """The ``source`` hook of :func:`lumc.ir.serialize.graph_from_bytes`: an initializer's bytes
    by name, from the artifact's ``source.onnx`` (parsed on the first lookup).

    Args:
        source: the ``source.onnx`` part's bytes, or None when the artifact has none.
    Raises (on lookup):
        ArtifactError: no source part, an unreadable one, or no initializer of that name (the
            caller names the artifact and part).
    """

    def __init__(self, source: bytes | None):
        self.source = source
        self._inits: dict | None = None

    def __call__(self, name: str) -> bytes:
        if self.source is None:
            raise ArtifactError("a weight is stored in 'source.onnx', which the artifact lacks")
        if self._inits is None:
            try:
                self._inits = _initializers(self.source)
            except Exception as e:
                raise ArtifactError(f"part 'source.onnx' is not a readable ONNX model "
                                    f"({type(e).__name__})") from None
        init = self._inits.get(name)
        data = _array_bytes(init) if init is not None else None
        if data is None:
            raise ArtifactError(f"part 'source.onnx' has no initializer {name!r} with data, "
                                "which the artifact's weights name")
        return data
