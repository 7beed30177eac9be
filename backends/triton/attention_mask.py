"""Static attention masks: how far along the keys a block of queries can see.

A causal mask built from ``Iota`` compares (or a constant ``tril`` matrix) masks every key past
``q + offset`` for query ``q``, so a flash-attention program owning queries
``[pid_m * BLOCK_M, (pid_m + 1) * BLOCK_M)`` never needs key blocks at or past
``(pid_m + 1) * BLOCK_M + offset``: for a causal mask that halves the work. :func:`key_limit_offset`
finds ``offset`` from the meaning: the score function evaluated at scores ``S = 0`` (numpy, the op
table's reference semantics) gives the mask ``beta`` over the softmax's domain; when it depends on
no kernel input (only ``Iota`` and constants), ``offset = max over queries of (last kept key - q)``,
a bound that holds for any static mask (each row's keys past it are ``-inf``), used only when it
skips something. The mask must not depend on the scores (``where(S == 0, -inf, S)`` masks at
``S = 0`` only): every key masked at ``S = 0`` must stay masked at four probe score tensors (1, -1
and two random draws), else there is no limit. Only ``-inf`` is masked: a NaN score is not skipped.
"""
from __future__ import annotations

import weakref

import numpy as np

from lumc.ir.graph import Node
from lumc.ir.ops import OPS

MAX_MASK_ELEMENTS = 1 << 24      # masks evaluated at render time (16M elements, 16 MB of bools)


def _ancestors(x: Node, stop: Node, inputs_ok: bool = False) -> list[Node] | None:
    """``x``'s ancestors up to ``stop`` (excluded), sources first; None if one is an ``Input``
    (unless ``inputs_ok``)."""
    out, seen, stack = [], set(), [(x, False)]
    while stack:
        n, done = stack.pop()
        if done:
            out.append(n)
            continue
        if n is stop or id(n) in seen:
            continue
        if n.op == "Input" and not inputs_ok:
            return None
        seen.add(id(n))
        stack.append((n, True))
        stack.extend((s, False) for s in n.srcs)
    return out


def _evaluate(nodes: list[Node], x: Node, scores: Node, s: np.ndarray) -> np.ndarray:
    """The score function ``x`` at scores ``s`` (numpy, the op table's reference semantics)."""
    vals = {id(scores): s}
    with np.errstate(all="ignore"):
        for n in nodes:
            vals[id(n)] = (np.zeros(n.shape, n.dtype.np) if n.op == "Input" else
                           np.asarray(OPS[n.op].reference([vals[id(src)] for src in n.srcs],
                                                          n.arg)))
    return vals[id(x)]


def _static_mask(nodes: list[Node], x: Node, scores: Node) -> np.ndarray | None:
    """Where the score function ``x`` is ``-inf`` at scores ``S = 0``, if that does not depend on
    the scores: every position masked there (``log(S)``, or ``where(S == 0, -inf, S)``, would be)
    must stay masked at four probe score tensors (1, -1 and two random draws); else None."""
    masked = np.isneginf(_evaluate(nodes, x, scores, np.zeros(scores.shape, scores.dtype.np)))
    rng = np.random.default_rng(0)
    for probe in (1.0, -1.0, rng.standard_normal(scores.shape) * 8,
                  rng.standard_normal(scores.shape) * 8):
        s = np.broadcast_to(np.asarray(probe, scores.dtype.np), scores.shape)
        if (masked & ~np.isneginf(_evaluate(nodes, x, scores, s))).any():
            return None
    return masked


def mask_depends_on_scores(x: Node, scores: Node) -> bool:
    """Whether which positions the score function ``x`` masks (``-inf``) depends on the scores
    (:func:`_static_mask`; a mask of the kernel's inputs is evaluated with them at zero)."""
    nodes = _ancestors(x, scores, inputs_ok=True)
    return _static_mask(nodes, x, scores) is None


_KEPT: "weakref.WeakKeyDictionary[Node, dict]" = weakref.WeakKeyDictionary()


def _kept(x: Node, scores: Node, t_groups: dict, n_keys: int) -> np.ndarray | None:
    """``[queries, keys]``: whether any batch keeps the key for the query (see
    :func:`key_limit_offset`); None for a mask of the inputs, of the scores, or too large.
    Memoized per score function (a kernel is rendered once per config)."""
    key = (id(scores), n_keys, tuple((k, tuple(v)) for k, v in sorted(t_groups.items())))
    memo = _KEPT.setdefault(x, {})
    if key not in memo:
        memo[key] = _kept_now(x, scores, t_groups, n_keys)
    return memo[key]


def _kept_now(x: Node, scores: Node, t_groups: dict, n_keys: int) -> np.ndarray | None:
    if x.numel > MAX_MASK_ELEMENTS:
        return None
    nodes = _ancestors(x, scores)
    if nodes is None:
        return None
    masked = _static_mask(nodes, x, scores)
    if masked is None:
        return None
    t = x.shape
    order = t_groups["batch"] + t_groups["query"] + t_groups["key"]
    rest = [d for d in range(len(t)) if d not in order]          # size-1 dims
    nq = int(np.prod([t[d] for d in t_groups["query"]], dtype=np.int64))
    # only -inf is skipped: a NaN or +inf score still reaches the softmax (and makes its row NaN)
    return ~np.transpose(masked, order + rest).reshape(-1, nq, n_keys).all(axis=0)


def key_limit_offset(x: Node, scores: Node, t_groups: dict, n_keys: int,
                     exact: bool = False) -> int | None:
    """The ``offset`` of the module docstring, or None (a data-dependent or unhelpful mask).

    Args:
        x: the softmax's operand (the score function's value over the softmax domain ``T``).
        scores: the score product's node (``S``), set to 0.
        t_groups: ``{"batch"|"query"|"key": [dims of T]}`` (``AttentionPlan.t_groups``).
        n_keys: the number of keys.
        exact: only a mask that keeps exactly the keys ``k <= q + offset`` (a causal mask, shifted)
            has an offset (what a size-generic kernel may rely on: :func:`sized_key_limit`).
    """
    kept = _kept(x, scores, t_groups, n_keys)
    if kept is None:
        return None
    rows = kept.any(axis=1)
    if not rows.any():
        return None
    last = n_keys - 1 - np.argmax(kept[:, ::-1], axis=1)        # last kept key per query
    q = np.arange(kept.shape[0])
    offset = int((last - q)[rows].max())
    if exact and not np.array_equal(kept, np.arange(n_keys)[None, :] <= q[:, None] + offset):
        return None
    return offset if offset < n_keys - 1 else None


def sized_key_limit(x: Node, scores: Node, t_groups: dict, n_keys: int, sub_of) -> int | None:
    """The offset a size-generic kernel may skip by (``lumc.backends.triton.size_generic``): the
    kernel is rendered once at probe sizes and serves every size of its bucket, so the literal
    offset must hold at all of them. Only an exact shifted-causal mask qualifies, with the same
    offset at the probe and at six other sizes (``sub_of(k)``: the Substitution of the probes'
    sizes moved by ``k``, for k in -2, -1, 1, 2, 7 and doubled; None where that size is invalid),
    so a mask whose limit moves with the size (a key every 19 positions, a bottom-right mask over
    two ranged dims) is not skipped."""
    from lumc.ir.symbolic import Resizer
    lim = key_limit_offset(x, scores, t_groups, n_keys, exact=True)
    if lim is None:
        return None
    for k in (-2, -1, 1, 2, 7, "double"):
        sub = sub_of(k)
        if sub is None:
            continue
        r = Resizer(sub)
        xs, ss = r(x), r(scores)
        keys = int(np.prod([xs.shape[d] for d in t_groups["key"]], dtype=np.int64))
        if key_limit_offset(xs, ss, t_groups, keys, exact=True) != lim:
            return None
    return lim
