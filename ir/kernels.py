"""Kernel forms: the units a backend renders, each with its meaning in primitives.

A :class:`Kernel` is one launch: a kernel form (``pointwise``, ``reduction``, ``matmul``, ``softmax``,
``layernorm``, ``rmsnorm``, ``attention``, ``gather``, ``mlp``, ``scan``) plus its *meaning*, a
small primitive :class:`~lumc.ir.graph.Graph` whose ``Input`` leaves are the tensors the kernel
reads (named ``in0, in1, ...``) and whose outputs are the tensors it writes (``out0, ...``). Constants that are
scalars may live inside the meaning; weight tensors are inputs. ``attrs`` carries form-specific
structure a renderer needs and cannot cheaply re-derive (reduction axes, the matmul's A/B input
positions, norm epsilon...).

Costs (source: the roofline model, Williams, Waterman & Patterson, CACM 2009):

* ``flops``: the sum of the meaning's primitive FLOP counts (``lumc.ir.ops``), where a
  ``SumReduce(Mul(a, b))`` pair counts 2 per multiply-add.
* ``min_bytes``: every input read once plus every output written once, in their dtypes. An input
  read only as a ``Gather`` table, or only through views that address part of it (a slice), counts
  just the elements those reads address (``min(its size, the gathered or viewed elements)``): an
  embedding lookup moves the rows it gathers, not the whole table. With that, ``max(flops / peak,
  min_bytes / bandwidth)`` is the roofline estimate of the kernel's time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lumc.ir.graph import Graph, Node
from lumc.ir.ops import OPS

FORMS = ("pointwise", "reduction", "matmul", "softmax", "layernorm", "rmsnorm", "attention",
         "gather", "mlp", "scan")


@dataclass(frozen=True, eq=False)
class Kernel:
    """One kernel launch.

    Attributes:
        form: one of :data:`FORMS`.
        meaning: primitive graph over placeholders ``in0..`` producing ``out0..``.
        attrs: form-specific structure, as a sorted tuple of ``(name, value)`` pairs.
        covers: ids (or names) of the model-graph nodes this kernel computes, for reports/comments.
    """
    form: str
    meaning: Graph
    attrs: tuple[tuple[str, Any], ...] = ()
    covers: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"unknown kernel form {self.form!r}; forms are {FORMS}")

    def attr(self, name: str, default=None):
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def inputs(self) -> list[Node]:
        return list(self.meaning.inputs.values())

    @property
    def outputs(self) -> list[Node]:
        return list(self.meaning.outputs.values())

    def content_hash(self) -> str:
        """Hash of the kernel's form, attrs and meaning graph (shapes, dtypes, constants): equal
        for kernels that compute the same thing (a model's repeated layers), 32 hex digits."""
        import hashlib
        from lumc.ir.serialize import graph_to_bytes
        doc, npz, _ = graph_to_bytes(self.meaning, origins=False)   # model node names aside
        h = hashlib.sha256()
        h.update(self.form.encode())
        h.update(repr(self.attrs).encode())
        h.update(doc)
        h.update(npz)
        return h.hexdigest()[:32]

    def flops(self) -> int:
        """Arithmetic work in FLOP (a multiply-add counts 2). A ``scan`` kernel's triangular
        contraction counts one add per element of its result (a prefix sum), and its index mask
        (nodes that read no input) nothing: the scan never forms it."""
        if self.form == "scan":
            return self._scan_flops()
        total = 0
        for n in self.meaning.nodes():
            row = OPS[n.op]
            total += row.flops(tuple(s.shape for s in n.srcs), n.shape, n.arg)
        return total

    def _scan_flops(self) -> int:
        nodes = self.meaning.nodes()
        products = {id(n.srcs[0]) for n in nodes      # the contractions' [.., L, L, ..] products
                    if n.op == "SumReduce" and n.srcs[0].op == "Mul" and n.srcs[0].shape != n.shape}
        data: set[int] = set()     # nodes that read an input (the mask reads none)
        total = 0
        for n in nodes:
            if n.op != "Input" and not any(id(s) in data for s in n.srcs):
                continue
            data.add(id(n))
            if n.op == "Input" or id(n) in products:
                continue
            scan = n.op == "SumReduce" and id(n.srcs[0]) in products
            total += n.numel if scan else OPS[n.op].flops(tuple(s.shape for s in n.srcs),
                                                          n.shape, n.arg)
        return total

    def min_bytes(self) -> int:
        """Bytes the kernel must move: each input read once (only the elements its gathers and
        partial views address), each output written once."""
        return sum(self.read_bytes()) + sum(n.nbytes for n in self.outputs)

    def read_bytes(self) -> list[int]:
        """Bytes each input (``in0, in1, ...``) must be read: its size, or only the elements that
        its gathers and partial views address."""
        users: dict[int, list[tuple[Node, int]]] = {}
        for n in self.meaning.nodes():
            for pos, s in enumerate(n.srcs):
                users.setdefault(id(s), []).append((n, pos))
        out = []
        for x in self.inputs:
            addressed = 0
            for u, pos in users.get(id(x), []):
                if u.op == "Gather" and pos == 0:
                    addressed += u.numel
                elif u.op == "View":
                    valid = 1
                    for lo_hi, d in zip(u.arg.mask or [(0, d) for d in u.shape], u.shape):
                        valid *= max(0, min(lo_hi[1], d) - lo_hi[0])
                    addressed += valid
                else:
                    addressed += x.numel
            if x.numel and id(x) in users:
                out.append(min(x.numel, addressed) * x.dtype.itemsize)
            else:
                out.append(x.nbytes)
        return out

    def arithmetic_intensity(self) -> float:
        """FLOP per byte of ``min_bytes`` (0 for a kernel that moves nothing)."""
        b = self.min_bytes()
        return self.flops() / b if b else 0.0
