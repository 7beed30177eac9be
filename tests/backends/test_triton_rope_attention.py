"""Rotary embeddings (RoPE) computed inside the attention kernel, and the Q/K/V projections of a
RoPE model merged into one contraction.

Llama's ``q * cos + rotate_half(q) * sin`` over the projections' heads once cost two pointwise
kernels each for q and k: the negated half read through a concatenation's pad was written, and the
rotated q and k were written for the attention kernel to read. Now the query's expression is
computed where the attention kernel loads its tile (once per element), and the ``+kv-prologue``
candidate does the same for the keys (recomputed per query block: the search times it against the
twin that writes them). The rotate-half's pieces read the projection through strided views, which
the e-graph now also sees over the squeezed matmul, so the merged QKV projection (a horizontal
part) feeds RoPE too.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lumc.backends.devices import get_device
from lumc.backends.simulator import attention_prologue_seconds, attention_prologues
from lumc.backends.triton import configs
from triton_cases import check, egraph_candidates_checked, rotate_half


class RopeAttention(nn.Module):
    """Llama's attention block: bias-free Q/K/V, RoPE on q and k, SDPA (causal or not), o-proj."""

    def __init__(self, width=32, heads=2, kv_heads=2, seq=16, causal=True, explicit=False):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, width // heads
        self.q = nn.Linear(width, heads * self.d, bias=False)
        self.k = nn.Linear(width, kv_heads * self.d, bias=False)
        self.v = nn.Linear(width, kv_heads * self.d, bias=False)
        self.o = nn.Linear(heads * self.d, width, bias=False)
        self.causal, self.explicit = causal, explicit
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        ang = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        v = self.v(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kvh != self.h:
            k = k.repeat_interleave(self.h // self.kvh, dim=1)
            v = v.repeat_interleave(self.h // self.kvh, dim=1)
        if self.explicit:
            s = (q @ k.transpose(2, 3)) / self.d ** 0.5
            if self.causal:
                s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            y = s.softmax(-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, t, self.h * self.d))


@pytest.mark.parametrize("b,t,width,heads,kv,causal,explicit", [
    (1, 16, 32, 2, 2, True, False),
    (2, 13, 64, 4, 4, False, False),     # a ragged sequence, batch > 1
    (1, 12, 64, 4, 2, True, False),      # grouped-query attention
    (1, 16, 32, 2, 2, True, True),       # attention written out (transformers "eager")
])
def test_rope_is_computed_inside_attention(b, t, width, heads, kv, causal, explicit):
    torch.manual_seed(0)
    mod = RopeAttention(width, heads, kv, seq=16, causal=causal, explicit=explicit).eval()
    res = egraph_candidates_checked(mod, torch.randn(b, t, width))
    by_label = {p.label: p for p in res.candidates}
    # without +kv-prologue the query's RoPE is in the attention kernel, the keys' is written
    base = [p for lab, p in by_label.items() if "attention" in p.form_counts()
            and not lab.endswith("+kv-prologue")]
    assert base and min(p.form_counts().get("pointwise", 0) for p in base) == 1, \
        {lab: p.form_counts() for lab, p in by_label.items()}
    twins = [p for lab, p in by_label.items() if lab.endswith("+kv-prologue")]
    assert twins, list(by_label)
    best = min(twins, key=lambda p: len(p.calls))
    assert best.form_counts().get("pointwise", 0) == 0, best.form_counts()
    # the attention kernel with both prologues renders, on ragged tiles
    att = next(c.kernel for c in best.calls if c.kernel.form == "attention")
    assert sum(n.op == "Mul" for n in att.meaning.nodes()) >= 6   # q, k: * cos, * sin; 2 products
    check(att, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))
    check(att, config=configs.make(4, 1, BLOCK_M=32, BLOCK_N=16))
    # the simulator prices the prologues: q's once, k's once per query block
    prob = attention_prologues(att)
    q_elems, k_elems = b * heads * t * (width // heads), b * heads * t * (width // heads)
    assert prob["PROLOGUE_Q"] >= 3 * q_elems and prob["PROLOGUE_KV"] >= 3 * k_elems * kv // heads
    dev = get_device("h200")
    one, per_row = (attention_prologue_seconds(att, {"BLOCK_M": bm}, dev) for bm in (t, 1))
    assert per_row - one == pytest.approx(prob["PROLOGUE_KV"] * (t - 1) / dev.vector_flops["f32"])
    plain = next(c.kernel for c in base[0].calls if c.kernel.form == "attention")
    assert attention_prologues(plain)["PROLOGUE_KV"] == 0


def test_rope_reads_the_merged_qkv_projection():
    """Q/K/V share the input: the horizontal candidate computes them as one contraction, and RoPE's
    rotate-half pieces read it too (not a second Q or K projection)."""
    torch.manual_seed(0)
    mod = RopeAttention(64, 4, 4, seq=16).eval()
    res = egraph_candidates_checked(mod, torch.randn(1, 16, 64))
    best = {}
    for p in res.candidates:
        best.setdefault(len(p.calls), p)
    fewest = best[min(best)]
    assert "horizontal" in fewest.label and fewest.label.endswith("+kv-prologue"), fewest.label
    mms = [c for c in fewest.calls if c.kernel.form == "matmul"]
    assert len(mms) == 2, [c.outputs[0].shape for c in mms]   # QKV merged, o-proj
    assert tuple(mms[0].outputs[0].shape)[-1] == 3 * 64
    assert len(fewest.calls) == 3, fewest.form_counts()
