"""Static attention masks: how far along the keys a block of queries can see.

A causal mask built from ``Iota`` compares (or a constant ``tril`` matrix) masks every key past
``q + offset`` for query ``q``, so a flash-attention program owning queries
``[pid_m * BLOCK_M, (pid_m + 1) * BLOCK_M)`` never needs key blocks at or past
``(pid_m + 1) * BLOCK_M + offset``: for a causal mask that halves the work. :func:`key_limit_offset`
finds ``offset`` from the meaning: the score function evaluated at scores ``S = 0`` (numpy, the op
table's reference semantics) gives the mask ``beta`` over the softmax's domain; when it depends on
no kernel input (only ``Iota`` and constants), ``offset = max over queries of (last kept key - q)``,
a bound that holds for any static mask (each row's keys past it are ``-inf``), used only when it
skips something.
"""
from __future__ import annotations

import numpy as np

from lumc.ir.graph import Node
from lumc.ir.ops import OPS

MAX_MASK_ELEMENTS = 1 << 24      # masks evaluated at render time (16M elements, 16 MB of bools)


def _ancestors(x: Node, stop: Node) -> list[Node] | None:
    """``x``'s ancestors up to ``stop`` (excluded), sources first; None if one is an ``Input``."""
    out, seen, stack = [], set(), [(x, False)]
    while stack:
        n, done = stack.pop()
        if done:
            out.append(n)
            continue
        if n is stop or id(n) in seen:
            continue
        if n.op == "Input":
            return None
        seen.add(id(n))
        stack.append((n, True))
        stack.extend((s, False) for s in n.srcs)
    return out


def key_limit_offset(x: Node, scores: Node, t_groups: dict, n_keys: int) -> int | None:
    """The ``offset`` of the module docstring, or None (a data-dependent or unhelpful mask).

    Args:
        x: the softmax's operand (the score function's value over the softmax domain ``T``).
        scores: the score product's node (``S``), set to 0.
        t_groups: ``{"batch"|"query"|"key": [dims of T]}`` (``AttentionPlan.t_groups``).
        n_keys: the number of keys.
    """
    if x.numel > MAX_MASK_ELEMENTS:
        return None
    nodes = _ancestors(x, scores)
    if nodes is None:
        return None
    vals = {id(scores): np.zeros(scores.shape, scores.dtype.np)}
    with np.errstate(all="ignore"):
        for n in nodes:
            vals[id(n)] = np.asarray(OPS[n.op].reference([vals[id(s)] for s in n.srcs], n.arg))
    beta = vals[id(x)]
    t = x.shape
    order = t_groups["batch"] + t_groups["query"] + t_groups["key"]
    rest = [d for d in range(len(t)) if d not in order]          # size-1 dims
    nq = int(np.prod([t[d] for d in t_groups["query"]], dtype=np.int64))
    kept = np.isfinite(np.transpose(beta, order + rest)).reshape(-1, nq, n_keys).any(axis=0)
    rows = kept.any(axis=1)
    if not rows.any():
        return None
    last = n_keys - 1 - np.argmax(kept[:, ::-1], axis=1)        # last kept key per query
    q = np.arange(nq)
    offset = int((last - q)[rows].max())
    return offset if offset < n_keys - 1 else None
