"""GPT-2 small, BERT-base and a Llama in plain torch (random weights), for ``make gpu-check``.

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


class _RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):                                 # as transformers' LlamaRMSNorm
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class _LlamaBlock(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.d, bias=False)
        self.v = nn.Linear(width, kv_heads * self.d, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.gate, self.up = nn.Linear(width, ffn, bias=False), nn.Linear(width, ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)
        self.n1, self.n2 = _RMSNorm(width), _RMSNorm(width)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.heads, self.d).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.d).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(self.heads // self.kv, dim=1)     # grouped-query attention
        v = v.repeat_interleave(self.heads // self.kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """A Llama-architecture decoder at TinyLlama-1.1B's sizes (Zhang et al. 2024: width 2048, 32
    heads, 4 key/value heads, SwiGLU FFN 5632, vocabulary 32000; 22 layers there, ``layers`` here):
    RMSNorm, rotary embeddings (base 10000, ``rotate_half``), grouped-query causal attention
    through SDPA. ``forward(ids [B, T] int64) -> hidden [B, T, width]`` (the final norm's output)."""

    def __init__(self, layers: int = 4, width: int = 2048, heads: int = 32, kv_heads: int = 4,
                 ffn: int = 5632, vocab: int = 32000, positions: int = 2048):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_LlamaBlock(width, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = _RMSNorm(width)
        d = width // heads
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        ang = torch.outer(torch.arange(positions).float(), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin(), persistent=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.embed(ids)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.norm(x)


def transformer(name: str, layers: int | None = None, dtype=torch.float32, seq: int = 128,
                seed: int = 0):
    """``(module, example_inputs)`` for ``gpt2``, ``bert`` or ``llama`` at ``dtype`` and sequence
    ``seq``."""
    torch.manual_seed(seed)
    kw = {} if layers is None else {"layers": layers}
    mod = {"gpt2": GPT2, "bert": BERT, "llama": Llama}[name](**kw).eval().to(dtype)
    ids = torch.randint(0, 1000, (1, seq))
    if name in ("gpt2", "llama"):
        return mod, (ids,)
    mask = torch.ones(1, seq, dtype=torch.int64)
    mask[:, seq - seq // 8:] = 0                          # some padding
    return mod, (ids, mask)
