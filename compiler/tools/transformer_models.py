"""GPT-2 small and BERT-base in plain torch (random weights), for ``make gpu-check``.

The GPU image has torch and Triton but not ``transformers``, so the two reference transformers of
the GPU check are written here at their published sizes (GPT-2 small: 12 layers, width 768, 12
heads, vocabulary 50257, Radford et al. 2019; BERT-base: 12 layers, width 768, 12 heads, FFN 3072,
vocabulary 30522, Devlin et al. 2019), with the same computation as the ``transformers`` modules
(pre-LN causal decoder with tanh-GELU; post-LN encoder with erf-GELU and a padding mask; attention
through ``F.scaled_dot_product_attention``, as transformers' default ``sdpa`` implementation), so
lumc, torch eager and ``torch.compile`` see the same work. ``layers`` shrinks them for tests.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x, bias=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        # as transformers' default ("sdpa") attention: scale 1/sqrt(head), causal or additive mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int, causal: bool, pre_ln: bool):
        super().__init__()
        self.pre_ln = pre_ln
        self.attn = _Attention(width, heads, causal)
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.fc, self.out = nn.Linear(width, ffn), nn.Linear(ffn, width)
        self.gelu = "tanh" if pre_ln else "none"

    def forward(self, x, bias=None):
        if self.pre_ln:                                   # GPT-2
            x = x + self.attn(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate=self.gelu))
        x = self.ln1(x + self.attn(x, bias))              # BERT
        return self.ln2(x + self.out(F.gelu(self.fc(x), approximate=self.gelu)))


class GPT2(nn.Module):
    """GPT-2 small: ``forward(ids [B, T] int64) -> logits [B, T, vocab]``."""

    def __init__(self, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 50257,
                 positions: int = 1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.blocks = nn.ModuleList(_Block(width, heads, 4 * width, True, True) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.T           # tied output embedding


class BERT(nn.Module):
    """BERT-base encoder: ``forward(ids [B, T] int64, mask [B, T] int64) -> hidden [B, T, width]``."""

    def __init__(self, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 30522,
                 positions: int = 512):
        super().__init__()
        self.words, self.pos = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.types = nn.Embedding(2, width)
        self.ln = nn.LayerNorm(width)
        self.blocks = nn.ModuleList(_Block(width, heads, 4 * width, False, False)
                                    for _ in range(layers))

    def forward(self, ids, mask):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.words(ids) + self.pos(pos) + self.types(torch.zeros_like(ids)))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for blk in self.blocks:
            x = blk(x, bias)
        return x


def transformer(name: str, layers: int | None = None, dtype=torch.float32, seq: int = 128,
                seed: int = 0):
    """``(module, example_inputs)`` for ``gpt2`` or ``bert`` at ``dtype`` and sequence ``seq``."""
    torch.manual_seed(seed)
    kw = {} if layers is None else {"layers": layers}
    mod = (GPT2(**kw) if name == "gpt2" else BERT(**kw)).eval().to(dtype)
    ids = torch.randint(0, 1000, (1, seq))
    if name == "gpt2":
        return mod, (ids,)
    mask = torch.ones(1, seq, dtype=torch.int64)
    mask[:, seq - seq // 8:] = 0                          # some padding
    return mod, (ids, mask)
