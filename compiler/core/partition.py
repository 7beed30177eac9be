"""Partition a primitive graph into regions that are saturated separately.

A region is a run of compute nodes in topological order. Cuts go where the fewest values cross
them (the *live set*: computed values made before the cut and read after it), which in a
transformer is between layers, where only the hidden state and a mask are live; a pattern such as
softmax, whose inside keeps two or more values live, is never cut in half at those points. When
the pieces between the narrowest points repeat (a deep model's layers, :func:`layer_cuts`), every
such point is a cut, so each layer is a region and identical ones are saturated once. Leaves
(inputs, weights) are not assigned to regions: every region that reads one encodes it itself, so
they stay shared by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lumc.ir.graph import Graph, Node


@dataclass
class Region:
    """Compute nodes saturated together.

    Attributes:
        index: position in launch order.
        nodes: the region's nodes (compute nodes and the views over them), topological order.
        roots: nodes read after the region: compute nodes later regions read, and model outputs
            (a view output is a root itself, so a matmul output keeps its reshape and its form).
        externals: compute nodes of earlier regions that this region reads (through views or
            not); the views are encoded in this region.
    """
    index: int
    nodes: list[Node] = field(default_factory=list)
    roots: list[Node] = field(default_factory=list)
    externals: list[Node] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"region{self.index}"


def _is_compute(n: Node) -> bool:
    return n.op not in ("Input", "Constant", "Iota", "View")


def _view_base(n: Node) -> Node:
    while n.op == "View":
        n = n.srcs[0]
    return n


MIN_LAYER_OPS = 40     # a repeated segment smaller than this merges into the next one
MIN_REPEATS = 4        # layer cuts only for a structure repeated at least this often


def layer_cuts(compute: list[Node], live: list[int], max_ops: int) -> list[int] | None:
    """Cuts at every narrowest point (the least live set of the graph's middle), when the pieces
    between them repeat: the layers of a transformer, each then a region of its own, so that
    structurally identical regions are saturated once (``egraph_pipeline.saturate_regions``).

    Pieces under :data:`MIN_LAYER_OPS` nodes merge into the next; None (window cuts instead) when
    no piece structure occurs :data:`MIN_REPEATS` times or a piece exceeds ``2 * max_ops``.
    """
    n = len(compute)
    if n < 2 * MIN_REPEATS * MIN_LAYER_OPS:
        return None
    mid = live[n // 10: n - n // 10]
    m = min(mid)
    points = [i + 1 for i in range(n - 1) if live[i] == m]
    # of those, the kind that recurs most (by the nodes on either side: before each layer norm,
    # not inside one softmax that happens to be as narrow)
    kinds: dict[tuple, list[int]] = {}
    for c in points:
        kinds.setdefault((compute[c - 1].op, compute[c - 1].shape, compute[c].op,
                          compute[c].shape), []).append(c)
    if not kinds:
        return None
    points = max(kinds.values(), key=len)
    cuts, start = [], 0
    for c in points:
        if c - start >= MIN_LAYER_OPS:
            cuts.append(c)
            start = c
    if not cuts:
        return None
    bounds = [0] + cuts + [n]
    sigs: dict[tuple, int] = {}
    for a, b in zip(bounds, bounds[1:]):
        if b - a > 2 * max_ops:
            return None
        sig = tuple((x.op, x.shape) for x in compute[a:b])
        sigs[sig] = sigs.get(sig, 0) + 1
    if max(sigs.values()) < MIN_REPEATS:
        return None
    return _split_ends(compute, cuts, [s for s, k in sigs.items() if k >= MIN_REPEATS])


def _split_ends(compute: list[Node], cuts: list[int], repeated: list[tuple]) -> list[int]:
    """``cuts`` with the first and last pieces split where they end (begin) with a repeated piece:
    the embeddings before the first layer's piece and the head after the last layer's, each a
    region of its own, so the layer pieces at both ends are saturated once with the others."""
    def sig(a, b):
        return tuple((x.op, x.shape) for x in compute[a:b])
    out = list(cuts)
    for s in repeated:
        k = len(s)
        head = out[0]
        if head - k >= MIN_LAYER_OPS // 4 and sig(head - k, head) == s:
            out.insert(0, head - k)
            break
    for s in repeated:
        k = len(s)
        tail = out[-1]
        if len(compute) - (tail + k) >= MIN_LAYER_OPS // 4 and sig(tail, tail + k) == s:
            out.append(tail + k)
            break
    return out


def partition(graph: Graph, max_ops: int = 400, min_ops: int | None = None) -> list[Region]:
    """Cut ``graph`` into regions of at most about ``max_ops`` compute nodes.

    Each cut lies between ``min_ops`` (default ``max_ops // 2``) and ``max_ops`` nodes after the
    previous one, at the position with the smallest live set (the last such on ties). A live value
    that greedy fusion would not write to memory (the centred input inside a layer norm) counts
    twice: a cut there splits a row kernel the e-graph could otherwise recognize whole.
    """
    from lumc.compiler.core.fusion import GreedyFusion
    realized = GreedyFusion(graph).realized
    order = graph.nodes()
    compute = [n for n in order if _is_compute(n)]
    if min_ops is None:
        min_ops = max_ops // 2
    pos = {id(n): i for i, n in enumerate(compute)}
    last_use: dict[int, int] = {}
    for n in compute:
        for s in n.srcs:
            b = _view_base(s)
            if id(b) in pos:
                last_use[id(b)] = max(last_use.get(id(b), -1), pos[id(n)])
    for o in graph.outputs.values():
        b = _view_base(o)
        if id(b) in pos:
            last_use[id(b)] = len(compute)
    # live[i]: values made at or before i and read after i
    delta = [0] * (len(compute) + 2)
    for n in compute:
        i, j = pos[id(n)], last_use.get(id(n), pos[id(n)])
        if j > i:
            w = 1 if id(n) in realized else 2
            delta[i] += w
            delta[j] -= w
    live, acc = [], 0
    for i in range(len(compute)):
        acc += delta[i]
        live.append(acc)
    cuts = layer_cuts(compute, live, max_ops)
    start = len(compute) if cuts is not None else 0
    cuts = cuts or []
    while len(compute) - start > max_ops:
        lo, hi = start + min_ops, min(start + max_ops, len(compute) - 1)
        best = min(range(lo, hi + 1), key=lambda i: (live[i], -i))
        cuts.append(best + 1)
        start = best + 1
    bounds = [0] + cuts + [len(compute)]
    region_of: dict[int, int] = {}
    regions = []
    for r, (a, b) in enumerate(zip(bounds, bounds[1:])):
        reg = Region(r)
        for n in compute[a:b]:
            region_of[id(n)] = r
        regions.append(reg)
    # views belong to the region of their first compute consumer (or of their base for outputs)
    for n in order:
        if _is_compute(n):
            regions[region_of[id(n)]].nodes.append(n)
    for n in compute:
        r = region_of[id(n)]
        for src in n.srcs:
            b = _view_base(src)
            rb = region_of.get(id(b))
            if rb is not None and rb != r:
                # b is made in its region and read here as a leaf; the views over it are encoded
                # here, where the patterns that use them (a matmul's broadcast) live
                if b not in regions[r].externals:
                    regions[r].externals.append(b)
                if b not in regions[rb].roots:
                    regions[rb].roots.append(b)
    for o in graph.outputs.values():
        b = _view_base(o)
        if id(b) in region_of and o not in regions[region_of[id(b)]].roots:
            regions[region_of[id(b)]].roots.append(o)
    return regions
