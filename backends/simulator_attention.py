"""Simulator pricing of what an attention kernel does besides its two products (see
:mod:`lumc.backends.simulator`, which adds these to the kernel's body): the sizes of its tiles
(``attention_problem``), its operands' elementwise prologues (RoPE, a QK-norm: the query's once,
the keys' and values' once per query block) and its score function per score element."""
from __future__ import annotations

import math
import weakref

from lumc.backends.devices import DeviceSpec
from lumc.backends.triton.configs import next_pow2, score_bytes
from lumc.backends.triton.contraction import as_contraction, tensor_core_contractions
from lumc.backends.triton.dot_precision import dot_dtype
from lumc.ir.kernels import Kernel
from lumc.ir.views import prod

_ATTENTION: "weakref.WeakKeyDictionary[Kernel, dict]" = weakref.WeakKeyDictionary()


def attention_problem(kernel: Kernel) -> dict:
    """The sizes :func:`~lumc.backends.triton.configs.attention_shared_memory` reads, from the
    meaning of an attention kernel (the renderer's ``problem``, ``render_attention``): the padded
    head widths ``BLOCK_D``/``BLOCK_DV`` (powers of two, at least 16), the keys ``N``, the
    operands' ``itemsize`` and dot dtype, and ``SCORE_BYTES``, the bytes per score of the
    masks and biases read beside q, k and v."""
    hit = _ATTENTION.get(kernel)
    if hit is not None:
        return hit
    nodes = kernel.meaning.nodes()
    # scores first: the values' product reads them (a QK-norm's sum(x * x) is not a product)
    prods = [c.node for c in tensor_core_contractions(nodes)]
    s1, s2 = prods[0], prods[-1]
    m1, m2 = s1.srcs[0], s2.srcs[0]
    d = prod(m1.shape[a] for a in s1.arg)
    keys = prod(m2.shape[a] for a in s2.arg)
    dv = m2.numel // max(s1.numel, 1)
    hit = {"BLOCK_D": max(16, next_pow2(d)), "BLOCK_DV": max(16, next_pow2(dv)), "N": keys,
           "itemsize": m1.srcs[0].dtype.itemsize, "dot_dtype": dot_dtype(m1.srcs[0].dtype),
           "SCORE_BYTES": score_bytes(nodes, (m1.srcs[0], m1.srcs[1], m2.srcs[1]))}
    _ATTENTION[kernel] = hit
    return hit


def _expression_ops(x) -> int:
    """Elementwise ops an operand's expression issues to form its tile once: each compute node's
    element count (a reduction's, of a QK-norm formed on load: its operand's), down to the
    kernel's inputs (views and constants are reads, not ops)."""
    total, seen, stack = 0, set(), [x]
    while stack:
        n = stack.pop()
        if id(n) in seen or n.op in ("Input", "Constant", "Iota"):
            continue
        seen.add(id(n))
        if n.op in ("SumReduce", "MaxReduce"):
            total += n.srcs[0].numel
        elif n.op != "View":
            total += n.numel
        stack.extend(n.srcs)
    return total


_PROLOGUES: "weakref.WeakKeyDictionary[Kernel, dict]" = weakref.WeakKeyDictionary()


def attention_prologues(kernel: Kernel) -> dict:
    """The operand prologues of an attention kernel (RoPE, ``fusion``'s ``_attention_prologue``; a
    QK-norm, ``fusion_norms.HeadNormInAttention``): ``PROLOGUE_Q``, the ops forming the query once, ``PROLOGUE_KV``, the
    keys' and values' (formed once per query block), and ``M``, the queries per batch and head."""
    hit = _PROLOGUES.get(kernel)
    if hit is None:
        prods = [c.node for c in tensor_core_contractions(kernel.meaning.nodes())]
        m1, m2 = prods[0].srcs[0], prods[-1].srcs[0]
        hit = _PROLOGUES[kernel] = {
            "M": as_contraction(prods[0]).M, "PROLOGUE_Q": _expression_ops(m1.srcs[0]),
            "PROLOGUE_KV": _expression_ops(m1.srcs[1]) + _expression_ops(m2.srcs[1])}
    return hit


def attention_prologue_seconds(kernel: Kernel, cfg: dict, dev: DeviceSpec) -> float:
    """CUDA-core time of an attention kernel's elementwise operand prologues: the query's once, the
    keys' and values' once per query block (``ceil(M / BLOCK_M)`` programs load each key tile), at
    the fp32 vector peak (``render_attention`` evaluates them on the loaded tiles; the caller
    spreads it over the SMs the grid fills, and it adds to the body: the loads they follow are not
    overlapped)."""
    p = attention_prologues(kernel)
    if not (p["PROLOGUE_Q"] or p["PROLOGUE_KV"]):
        return 0.0
    blocks = math.ceil(p["M"] / int(cfg.get("BLOCK_M", 64)))
    return (p["PROLOGUE_Q"] + p["PROLOGUE_KV"] * blocks) / dev.vector_flops["f32"]


# issue slots per result of an fp32 op relative to an FMA on sm_90: 128 FMA results per clock
# per SM, 16 for the multi-function unit's exp2, log2, sin, reciprocal and square root (CUDA C++
# Programming Guide, "Arithmetic Instructions" throughput table, compute capability 9.0); an IEEE
# division is a reciprocal and its Newton corrections
SFU_OPS = {"Exp2": 8, "Log2": 8, "Sin": 8, "Recip": 8, "Sqrt": 8, "Div": 8}
_SCORE_OPS: "weakref.WeakKeyDictionary[Kernel, int]" = weakref.WeakKeyDictionary()


def attention_score_seconds(kernel: Kernel, dev: DeviceSpec) -> float:
    """CUDA-core time of an attention kernel's score function ``f`` (``render_attention``: the
    elementwise ops between the score product and the softmax's reductions, a mask or Gemma-2's
    ``c * tanh(s / c)``), evaluated once per score element; multi-function-unit ops weighted by
    :data:`SFU_OPS`, at the fp32 vector peak (the caller spreads it over the SMs the grid fills).
    The softmax's own ``exp2`` is in the form's efficiency, not here."""
    ops = _SCORE_OPS.get(kernel)
    if ops is None:
        nodes = kernel.meaning.nodes()
        prods = [c.node for c in tensor_core_contractions(nodes)]
        ops = 0
        if prods:
            dep, after = {prods[0]}, set()      # f: on the scores, before the softmax's sums
            for n in nodes:
                if n is prods[0] or not any(s in dep or s in after for s in n.srcs):
                    continue
                if n.op in ("SumReduce", "MaxReduce") or any(s in after for s in n.srcs):
                    after.add(n)
                else:
                    dep.add(n)
            ops = sum(SFU_OPS.get(n.op, 1) * n.numel for n in dep
                      if n is not prods[0] and n.op not in ("View", "Cast"))
        _SCORE_OPS[kernel] = ops
    return ops / dev.vector_flops["f32"]
