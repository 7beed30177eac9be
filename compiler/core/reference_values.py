"""Reference values of kernel boundaries, captured incrementally for the numerics checks.

Every kernel a search times is first checked against the reference executor on the values its
inputs take in the model. Candidates are many programs over mostly the same nodes (e-graph
rewrites keep every node they do not change: nodes are hash-consed), so a candidate's boundary
values are largely held already when it is first checked. A capture computes only what is missing,
on the sub-graph between the values held and the values wanted: every held value becomes an input
of that sub-graph, so nothing above it runs again.

* The model runs once at the start for its outputs, keeping the boundary values of the first
  (best-bound) candidate that are nodes of the model graph, which the search checks first.
* A later candidate's capture evaluates the nodes between the held values and its missing
  boundary values, once.
* Candidates that differ upstream decode distinct nodes downstream, though those compute the
  same e-class (``Program.value_keys``: region and e-class of each decoded node). A value held for
  one node of an e-class serves every candidate's node of that e-class (same shape and dtype): it
  differs from a candidate's own reference by rounding at most (the e-class joins exact and
  ``reassociating`` rewrites only), far inside a check's tolerance, so it is not computed again.
* Values over :data:`MAX_KEPT_BYTES` are not kept (their kernels are reported unchecked).
* ``seconds`` is the wall time spent in reference runs here (the report's ``reference_s``).
"""
from __future__ import annotations

import time

import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.ir.errors import LumcError
from lumc.ir.graph import Graph, Node, input_node
from lumc.ir.provenance import rebuilt

MAX_KEPT_BYTES = 256 << 20   # a kernel boundary value larger than this is not kept for checks


def _boundaries(p) -> list[Node]:
    return [n for c in p.calls for n in (*c.inputs, *c.outputs)
            if n.op != "Constant" and n.nbytes <= MAX_KEPT_BYTES]


class ReferenceValues:
    """Reference values of kernel boundary nodes (``{id(node): array}`` through :meth:`get`),
    computed on first use (see the module docstring).

    Args:
        graph: the model's primitive graph.
        programs: the candidates (``Program.graph`` is the graph their calls bind, if rewritten).
        inputs: ``{input name: array}`` of the checks.
    """

    def __init__(self, graph: Graph, programs: list, inputs: dict):
        self.graph = graph
        self.inputs = inputs
        self.programs = programs
        self.seconds = 0.0
        self.owners: dict[int, list[int]] = {}
        for i, p in enumerate(programs):
            for n in _boundaries(p):
                self.owners.setdefault(id(n), []).append(i)
        self.captured: set[int] = set()
        self.values: dict[int, np.ndarray] = {}
        # id(node) -> id of the first boundary node of its e-class (module docstring)
        # (a model node first: the model run below keeps it)
        self.alias: dict[int, int] = {}
        in_model = {id(n) for n in graph.nodes()}
        first: dict[tuple, Node] = {}
        keyed = []
        for p in programs:
            keys = getattr(p, "value_keys", None) or {}
            keyed += [((keys[id(n)], n.shape, n.dtype), n) for n in _boundaries(p) if id(n) in keys]
        for k, n in sorted(keyed, key=lambda kn: id(kn[1]) not in in_model):
            f = first.setdefault(k, n)
            if f is not n:
                self.alias[id(n)] = id(f)
        keep = {id(n) for n in graph.inputs.values()}
        if programs:   # the first candidate's boundaries the model graph holds, by node or e-class
            keep |= {self.alias.get(id(n), id(n)) for n in _boundaries(programs[0])} & in_model
        t0 = time.perf_counter()
        self.outputs, kept = ReferenceExecutor(graph).run_keeping(inputs, keep)
        self.seconds += time.perf_counter() - t0
        self.values.update(kept)

    def _held(self, n: Node) -> bool:
        return id(n) in self.values or self.alias.get(id(n)) in self.values

    def _capture(self, i: int) -> None:
        self.captured.add(i)
        want = [n for n in _boundaries(self.programs[i]) if not self._held(n)]
        if want:
            t0 = time.perf_counter()
            got = self.compute(want)
            self.values.update(got)
            for k, v in got.items():      # the first of its e-class, for the candidates after
                a = self.alias.get(k)
                if a is not None and a not in self.values:
                    self.values[a] = v
            self.seconds += time.perf_counter() - t0

    def compute(self, want: list[Node]) -> dict[int, np.ndarray]:
        """``{id(node): value}`` of ``want``, evaluating only the nodes between the values held
        and them (held values and model inputs become inputs of that sub-graph)."""
        memo: dict[int, Node] = {}
        feed: dict[str, np.ndarray] = {}
        leaves: dict[str, Node] = {}
        for w in want:
            stack = [(w, False)]
            while stack:
                x, ready = stack.pop()
                if id(x) in memo:
                    continue
                if self._held(x) or x.op == "Input":   # held: an input here
                    name = f"held{x.id}" if x.op != "Input" else x.arg.name
                    ph = input_node(name, x.shape, x.dtype) if x.op != "Input" else x
                    feed[name] = self.inputs[x.arg.name] if x.op == "Input" else \
                        self._value(id(x))
                    leaves[name] = ph
                    memo[id(x)] = ph
                    continue
                if x.op in ("Constant", "Iota"):
                    memo[id(x)] = x
                    continue
                if not ready:
                    stack.append((x, True))
                    stack.extend((s, False) for s in x.srcs if id(s) not in memo)
                    continue
                srcs = tuple(memo[id(s)] for s in x.srcs)
                memo[id(x)] = rebuilt(x, srcs)
        sub = Graph(leaves, {f"w{k}": memo[id(w)] for k, w in enumerate(want)})
        _, kept = ReferenceExecutor(sub).run_keeping(feed, {id(memo[id(w)]) for w in want})
        return {id(w): kept[id(memo[id(w)])] for w in want if id(memo[id(w)]) in kept}

    def _value(self, key: int):
        v = self.values.get(key)
        return v if v is not None else self.values.get(self.alias.get(key))

    def get(self, key: int, default=None):
        if self._value(key) is None:
            for i in self.owners.get(key, ()):
                if i not in self.captured:
                    self._capture(i)
                    break
        v = self._value(key)
        return default if v is None else v


def drawn_inputs_error(e: LumcError) -> LumcError:
    """``e`` (an index outside its table, an integer ``Mod`` by 0, met running the model on
    example inputs lumc drew, for some or all of its inputs, because they were not given) with what
    to do about it: those values are lumc's, not the user's, so the compile needs inputs the model
    takes."""
    return type(e)(f"{e.reason}, at example inputs lumc drew (for the inputs not given: N(0, 1) "
                   "floats, integers in [0, 8) where no table bounds them); give inputs the model "
                   "takes (lumc compile --input NAME=FILE.npy or --inputs FILE.npz; "
                   "lumc.compile(..., example_inputs={name: array}))", node=e.node, op=e.op)
