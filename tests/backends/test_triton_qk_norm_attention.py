"""QK-norm formed inside the attention kernel.

Qwen3, Gemma-3 and StableLM-2 normalize every head of q and k (RMSNorm or LayerNorm over the head
dim) before RoPE and attention. Each norm was its own kernel: it read the projection's heads and
wrote them normalized for attention to read again, two kernels per layer. The attention kernel loads
each q (and k) tile with its whole head dim, so it now computes the row statistics from the tile it
loaded and normalizes it there (``fusion_norms.HeadNormInAttention``, ``render_attention``): the
query's always, the keys' in the ``+kv-prologue`` candidates (recomputed per query block; the search
times them against the twin that writes the keys). A norm whose rows are not the head dim (OLMo-2
normalizes all heads of q together) stays a kernel.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.frontends.torch_frontend.capture import import_torch
from lumc.compiler.runtime.program import run_program_reference
from lumc.backends.devices import get_device
from lumc.backends.extern import extern_impls, simulate_extern_time
from lumc.backends.simulator import attention_prologue_seconds, attention_prologues
from lumc.backends.triton import configs
from triton_cases import check, egraph_candidates_checked, rotate_half


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class QKNormAttention(nn.Module):
    """Qwen3-style attention: per-head norm of q and k (RMSNorm, or LayerNorm as StableLM-2's
    ``qk_layernorm``; or, ``whole=True``, OLMo-2's norm over all heads of q and k), then RoPE
    (optional), grouped-query SDPA, o-proj."""

    def __init__(self, width=64, heads=4, kv_heads=2, seq=16, norm="rms", rope=True,
                 whole=False, causal=True):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, width // heads
        self.q = nn.Linear(width, heads * self.d, bias=False)
        self.k = nn.Linear(width, kv_heads * self.d, bias=False)
        self.v = nn.Linear(width, kv_heads * self.d, bias=False)
        self.o = nn.Linear(heads * self.d, width, bias=False)
        qd, kd = (heads * self.d, kv_heads * self.d) if whole else (self.d, self.d)
        make = (lambda d: RMSNorm(d)) if norm == "rms" else (lambda d: nn.LayerNorm(d, eps=1e-5))
        self.qn, self.kn = make(qd), make(kd)
        if norm != "rms":
            for m in (self.qn, self.kn):
                nn.init.normal_(m.weight, 1.0, 0.1)
                nn.init.normal_(m.bias, 0.0, 0.1)
        self.rope, self.whole, self.causal = rope, whole, causal
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        emb = torch.outer(torch.arange(seq).float(), inv).repeat(1, 2)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.whole:
            q, k = self.qn(q), self.kn(k)
        q = q.view(b, t, self.h, self.d)
        k = k.view(b, t, self.kvh, self.d)
        if not self.whole:
            q, k = self.qn(q), self.kn(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, self.kvh, self.d).transpose(1, 2)
        if self.rope:
            cos, sin = self.cos[:t], self.sin[:t]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if self.kvh != self.h:
            k = k.repeat_interleave(self.h // self.kvh, dim=1)
            v = v.repeat_interleave(self.h // self.kvh, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, t, self.h * self.d))


NORM_FORMS = ("rmsnorm", "layernorm")


def _norm_kernels(p) -> int:
    return sum(p.form_counts().get(f, 0) for f in NORM_FORMS)


@pytest.mark.parametrize("b,t,width,heads,kv,norm,rope", [
    (1, 16, 64, 4, 2, "rms", True),      # Qwen3: RMSNorm per head, RoPE, grouped-query
    (2, 13, 64, 4, 4, "rms", True),      # a ragged sequence, batch > 1
    (1, 16, 96, 4, 4, "ln", False),      # LayerNorm per head (StableLM-2), head dim 24: padded tile
    (1, 12, 64, 2, 1, "ln", True),       # multi-query, LayerNorm then RoPE
])
def test_qk_norm_is_formed_inside_attention(b, t, width, heads, kv, norm, rope):
    torch.manual_seed(0)
    mod = QKNormAttention(width, heads, kv, seq=16, norm=norm, rope=rope).eval()
    res = egraph_candidates_checked(mod, torch.randn(b, t, width))
    by_label = {p.label: p for p in res.candidates}
    # without +kv-prologue the query's norm is in the attention kernel, the keys' is its own kernel
    base, best = by_label.get("egraph-horizontal"), by_label.get("egraph-horizontal+kv-prologue")
    assert base is not None and best is not None, list(by_label)
    assert _norm_kernels(base) == 1, base.form_counts()
    assert _norm_kernels(best) == 0 and best.form_counts().get("pointwise", 0) == 0, \
        best.form_counts()
    assert len(best.calls) == 3, best.form_counts()      # QKV, attention, o-proj
    att = next(c.kernel for c in best.calls if c.kernel.form == "attention")
    assert sum(n.op == "Sqrt" for n in att.meaning.nodes()) == 2    # q's and k's rstd
    # the kernel renders and matches the reference in the interpreter, on ragged tiles
    check(att, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))
    check(att, config=configs.make(4, 1, BLOCK_M=32, BLOCK_N=16))
    # the simulator prices the norm's work: the row sums read every element of q and k
    d = width // heads
    prob = attention_prologues(att)
    assert prob["PROLOGUE_Q"] >= 4 * b * heads * t * d
    assert prob["PROLOGUE_KV"] >= 4 * b * kv * t * d
    dev = get_device("h200")
    plain = next(c.kernel for c in base.calls if c.kernel.form == "attention")
    assert attention_prologues(plain)["PROLOGUE_KV"] == 0      # the keys' norm is its own kernel
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    assert attention_prologue_seconds(att, cfg, dev) > attention_prologue_seconds(plain, cfg, dev)
    # SDPA (an extern) computes the norms as eager torch ops before it: each is charged
    if "sdpa" in extern_impls(att):
        assert simulate_extern_time(att, {"IMPL": "sdpa"}, dev) > \
            simulate_extern_time(plain, {"IMPL": "sdpa"}, dev)

def test_a_norm_over_all_heads_stays_a_kernel():
    """OLMo-2 normalizes q (and k) over every head together: its rows are not the head dim the
    attention kernel loads, so the norm is not formed there; the program is still exact."""
    torch.manual_seed(0)
    mod = QKNormAttention(64, 4, 4, seq=16, whole=True).eval()
    res = egraph_candidates_checked(mod, torch.randn(1, 16, 64))
    for p in res.candidates:
        if "attention" in p.form_counts():
            att = next(c.kernel for c in p.calls if c.kernel.form == "attention")
            assert not any(n.op == "Sqrt" for n in att.meaning.nodes()), p.label


def test_qwen3_layers_are_five_kernels_each():
    """transformers' Qwen3 (2 layers, random weights): gather, then per layer QKV (its RMSNorm
    formed on load), attention (q_norm, k_norm and RoPE on load), o-proj + residual, the paired
    gate/up, down + residual; the final norm. Values against torch eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   vocab_size=500, attn_implementation="sdpa", use_cache=False)
    mod = transformers.Qwen3Model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 24))
    g = import_torch(mod, (ids,)).graph
    res = egraph_candidates(g, "h200", k=8)
    fewest = min(res.candidates, key=lambda p: len(p.calls))
    assert len(fewest.calls) == 2 + 2 * 5, fewest.form_counts()
    with torch.no_grad():
        want = mod(ids).last_hidden_state.numpy()
    got = run_program_reference(fewest, g, {next(iter(g.inputs)): ids.numpy()})
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-5)
    att = next(c.kernel for c in fewest.calls if c.kernel.form == "attention")
    check(att, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))


def test_bf16_qk_norm_in_attention_matches_the_reference():
    """A bf16 model normalizes in fp32 (casts around the norm, as Qwen3's RMSNorm): the fused
    kernel runs them on the loaded tile, in the interpreter, as the reference does."""
    torch.manual_seed(0)
    mod = QKNormAttention(128, 4, 2, seq=16, norm="rms", rope=True).eval()

    class Bf16(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m.to(torch.bfloat16)

        def forward(self, x):
            return self.m(x.to(torch.bfloat16))

    x = torch.randn(1, 11, 128)
    g = import_torch(Bf16(mod), (x,)).graph
    res = egraph_candidates(g, "h200", k=16)
    best = {p.label: p for p in res.candidates}["egraph-horizontal+kv-prologue"]
    assert _norm_kernels(best) == 0, best.form_counts()
    att = next(c.kernel for c in best.calls if c.kernel.form == "attention")
    assert any(n.op == "Cast" for n in att.meaning.nodes())
    check(att, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))


def qk_norm_attention_kernel(b, h, t, d, dtype, norm="rms", causal=True):
    """An attention kernel built without the e-graph (the GPU image has no egglog): RMSNorm or
    LayerNorm of every q and k head over the head dim, in fp32 between casts, formed on load."""
    from lumc.ir import dtypes as dt
    from lumc.ir.library.norm import layer_norm, rms_norm
    from triton_cases import attention, make_kernel

    def f(q, k, v, wq, wk):
        def n_(x, w):
            x32 = x.cast(dt.f32)
            y = rms_norm(x32, w, epsilon=1e-6) if norm == "rms" else layer_norm(x32, w)[0]
            return y.cast(dtype)
        return attention(d ** -0.5, causal=causal)(n_(q, wq), n_(k, wk), v)
    return make_kernel("attention", f, [((b, h, t, d), dtype)] * 3 + [((d,), dt.f32)] * 2)


@pytest.mark.parametrize("norm", ["rms", "ln"])
@pytest.mark.parametrize("d", [64, 80])
def test_qk_norm_attention_kernel_without_the_egraph(norm, d):
    from lumc.ir import dtypes as dt
    k = qk_norm_attention_kernel(2, 3, 21, d, dt.f32, norm)
    check(k, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_qk_norm_attention_on_the_device(dtype):
    """Compiled for the GPU (not the interpreter): the fused norms' tile sums, at bf16 and fp32."""
    from lumc.ir import dtypes as dt
    d = getattr(dt, dtype)
    k = qk_norm_attention_kernel(2, 8, 200, 128, d)
    for bm, bn in ((64, 64), (128, 32)):
        check(k, config=configs.make(4, 2, BLOCK_M=bm, BLOCK_N=bn))
