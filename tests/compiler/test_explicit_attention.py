"""Attention written out (``q @ k.transpose(-2, -1)``, a mask, softmax, ``@ v``), as nanoGPT and
transformers' ``attn_implementation="eager"`` write it, becomes the one attention form.

``torch.export`` decomposes a 4-D ``matmul`` into ``expand``/``view`` to ``[B*H, M, K]``, ``bmm``
and a ``view`` back; at a batch of one the views around the ``bmm`` compose the unit dim away
(3-D operands, a 4-D softmax), and the merge of heads folds the product's squeeze into a permute.
``masked_fill(drop, -inf)`` is ``where(drop, -inf, scores)``, the order opposite to ONNX's usual
``Where(keep, scores, -inf)``. Each of those once left the products as two matmuls and a softmax.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.frontends.torch_frontend.capture import import_torch
from lumc.compiler.runtime.program import run_program_reference


class NanoAttention(nn.Module):
    """nanoGPT's ``CausalSelfAttention`` (its non-flash path), with the causal mask optional."""

    def __init__(self, width=32, heads=4, seq=8, causal=True, fill=float("-inf")):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.heads, self.causal, self.fill = heads, causal, fill
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, self.fill)
        att = F.softmax(att, dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


def _forms_and_check(mod, args):
    """The best candidate's forms; every candidate checked against torch eager."""
    g = import_torch(mod, args).graph
    res = egraph_candidates(g, "h200", k=4)
    feed = {name: a.numpy() for name, a in zip(g.inputs, args)}
    with torch.no_grad():
        want = mod(*args).numpy()
    ref = next(iter(ReferenceExecutor(g)(feed).values()))
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)
    for p in res.candidates:
        got = next(iter(run_program_reference(p, g, feed).values()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return res.best.form_counts()


@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_nanogpt_attention_becomes_one_form(batch, causal):
    torch.manual_seed(batch)
    mod = NanoAttention(causal=causal).eval()
    forms = _forms_and_check(mod, (torch.randn(batch, 8, 32),))
    assert forms.get("attention") == 1 and "softmax" not in forms, forms


def test_a_finite_fill_is_the_same_form():
    """``masked_fill(drop, -1e4)`` (older GPT-2 code): the fill is any tensor, not only -inf."""
    torch.manual_seed(0)
    mod = NanoAttention(causal=True, fill=-1e4).eval()
    forms = _forms_and_check(mod, (torch.randn(1, 8, 32),))
    assert forms.get("attention") == 1 and "softmax" not in forms, forms


class NeoXAttention(nn.Module):
    """GPT-NeoX (Pythia) attention: one QKV projection laid out per head, ``[B, T, H, 3*D]``,
    split by ``chunk`` (transformers) or by slices; optionally partial RoPE (``rotary_pct``) and
    written-out (eager) attention. q, k and v are each every ``3*D``-th run of ``D`` columns:
    no column range of the QKV buffer, so the view is a box slice only of ``[T, H, 3*D]``."""

    def __init__(self, width=32, heads=4, split="chunk", rope=False, eager=False):
        super().__init__()
        self.qkv, self.o = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.h, self.split, self.rope, self.eager = heads, split, rope, eager

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.h
        qkv = self.qkv(x).view(b, t, self.h, 3 * d)
        if self.split == "chunk":
            q, k, v = qkv.transpose(1, 2).chunk(3, dim=-1)
        else:
            q, k, v = (qkv[..., i * d:(i + 1) * d].permute(0, 2, 1, 3) for i in range(3))
        if self.rope:     # rotary on the first half of each head (Pythia's rotary_pct)
            r = d // 2
            inv = 1.0 / 10000 ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
            fr = torch.outer(torch.arange(t, dtype=torch.float32), inv)
            cos, sin = torch.cat((fr, fr), -1).cos(), torch.cat((fr, fr), -1).sin()

            def rot(z):
                zr, zp = z[..., :r], z[..., r:]
                half = torch.cat((-zr[..., r // 2:], zr[..., :r // 2]), -1)
                return torch.cat((zr * cos + half * sin, zp), -1)
            q, k = rot(q), rot(k)
        if self.eager:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            y = F.softmax(att, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("split,rope,eager", [("chunk", False, False), ("slice", False, False),
                                              ("chunk", True, False), ("chunk", False, True),
                                              ("slice", True, True)])
def test_gpt_neox_per_head_qkv_becomes_one_form(batch, split, rope, eager):
    """GPT-NeoX's per-head QKV layout: the attention form reads q, k and v from the projection's
    buffer (they once stayed two matmuls and a softmax: the views were opaque)."""
    torch.manual_seed(batch)
    mod = NeoXAttention(split=split, rope=rope, eager=eager).eval()
    forms = _forms_and_check(mod, (torch.randn(batch, 8, 32),))
    assert forms.get("attention") == 1 and "softmax" not in forms, forms
    assert forms.get("matmul") == 2, forms


class GroupedAttention(nn.Module):
    """Grouped-query attention written out as Llama's eager path writes it: ``kv_heads`` K/V heads
    repeated by ``expand`` + ``reshape`` (``repeat_kv``), ``kv_heads == 1`` being multi-query
    attention; optionally an additive ``-inf`` ``triu`` mask."""

    def __init__(self, width=32, heads=4, kv_heads=1, triu=False, op_on=""):
        super().__init__()
        self.d = width // heads
        self.q, self.o = nn.Linear(width, width), nn.Linear(width, width)
        self.k, self.v = nn.Linear(width, kv_heads * self.d), nn.Linear(width, kv_heads * self.d)
        self.h, self.g, self.triu, self.op_on = heads, kv_heads, triu, op_on

    def forward(self, x):
        b, t, c = x.shape
        q = self.q(x).view(b, t, self.h, self.d)
        if "q" in self.op_on:        # GPT-J: rotary on [B, T, H, D], before the transpose
            q = q * torch.linspace(0.5, 1.5, self.d)
        q = q.transpose(1, 2)
        k, v = (z(x).view(b, t, self.g, self.d).transpose(1, 2) for z in (self.k, self.v))
        if "k" in self.op_on:        # Llama: rotary on the K heads, before repeat_kv
            k = k * torch.linspace(1.5, 0.5, self.d)
        r = self.h // self.g
        k, v = (z[:, :, None].expand(b, self.g, r, t, self.d).reshape(b, self.h, t, self.d)
                for z in (k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        if self.triu:
            att = att + torch.full((t, t), float("-inf")).triu(1)
        return self.o((F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("triu", [False, True])
@pytest.mark.parametrize("op_on", ["", "qk"])
def test_grouped_and_multi_query_attention_become_one_form(batch, kv_heads, triu, op_on):
    """One K/V head (its bmm operand a 2-D value broadcast over the batch at a batch of one, or
    a computed [1, K, N] one when an elementwise op made K), grouped heads at a batch above one
    (the bmm merges the 5-D expand straight to 3-D), and an op on q before its transpose at a
    batch of one (the views compose into one permute that places the unit N axis) once kept
    the softmax and both products."""
    torch.manual_seed(kv_heads)
    mod = GroupedAttention(kv_heads=kv_heads, triu=triu, op_on=op_on).eval()
    forms = _forms_and_check(mod, (torch.randn(batch, 8, 32),))
    assert forms.get("attention") == 1 and "softmax" not in forms, forms


@pytest.mark.parametrize("mod,batch", [(GroupedAttention(kv_heads=2, triu=True), 2),
                                       (GroupedAttention(kv_heads=1, op_on="qk"), 1),
                                       (NeoXAttention(split="chunk", rope=True), 2)],
                         ids=["gqa", "mqa-ops-batch1", "neox-rope"])
def test_grouped_and_per_head_layouts_compile_and_match_eager(mod, batch, tmp_path, monkeypatch):
    """End to end on ``sim:h200`` (the Triton kernels run in the interpreter and are checked):
    the attention kernel reads K and V through the head-repeat views, or q, k and v out of the
    per-head QKV buffer, and gives eager's values."""
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    mod = mod.eval()
    x = torch.randn(batch, 8, 32)
    f = lumc.compile(mod, budget="60s", example_inputs=(x,), device="sim:h200")
    with torch.no_grad():
        want = mod(x)
    torch.testing.assert_close(f(x), want, rtol=1e-4, atol=1e-5)
    r = f.specializations[0].compiled.report_dict()
    assert r["form_counts"].get("attention") == 1 and "softmax" not in r["form_counts"], r


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_transformers_eager_attention_becomes_one_form(arch):
    """transformers' ``eager`` attention (``torch.matmul`` over 4-D heads, an additive mask)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "bert":
        cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                                      intermediate_size=64, vocab_size=50, max_position_embeddings=32,
                                      attn_implementation="eager")
        mod = transformers.BertModel(cfg, add_pooling_layer=False).eval()
        mask = torch.ones(1, 12, dtype=torch.int64)
        mask[:, 9:] = 0
        args = (torch.randint(0, 50, (1, 12)), mask)
    else:
        cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50, n_positions=32,
                                      use_cache=False, attn_implementation="eager")
        mod = transformers.GPT2Model(cfg).eval()
        args = (torch.randint(0, 50, (1, 12)),)
    g = import_torch(mod, args).graph
    forms = egraph_candidates(g, "h200", k=2).best.form_counts()
    assert forms.get("attention") == 1 and "softmax" not in forms, forms


def test_nanogpt_compiles_and_matches_eager(tmp_path, monkeypatch):
    """End to end on ``sim:h200``: three kernels (QKV, attention, projection), eager's values."""
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    mod = NanoAttention(width=64, heads=2, seq=16).eval()
    x = torch.randn(1, 16, 64)
    f = lumc.compile(mod, budget="30s", example_inputs=(x,), device="sim:h200")
    with torch.no_grad():
        want = mod(x)
    torch.testing.assert_close(f(x), want, rtol=1e-4, atol=1e-5)
    r = f.specializations[0].compiled.report_dict()
    assert r["form_counts"].get("attention") == 1 and r["kernels"] == 3, r["form_counts"]


class _Sdpa(nn.Module):
    def __init__(self, is_causal=False):
        super().__init__()
        self.is_causal = is_causal

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.is_causal)


def _padded_masks(kind: str, L: int, S: int, pad: int):
    """A causal-style mask whose first ``pad`` keys are padding: queries ``< pad`` see no key."""
    keep = torch.ones(L, S, dtype=torch.bool).tril()
    keep[:, :pad] = False
    keep = keep[None, None].expand(2, 1, L, S).clone()
    keep[1, 0, :, :] = True          # the second sequence is not padded at all
    if kind == "bool":
        return keep
    m = torch.zeros(2, 1, L, S).masked_fill(~keep, float("-inf"))
    if kind == "float-nan":
        m[0, 0, 1, 5] = float("nan")  # not a mask: the row stays NaN in PyTorch too
    return m


@pytest.mark.parametrize("kind", ["bool", "float", "float-nan"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_rows_with_every_key_masked_are_zero_as_in_pytorch(kind, is_causal):
    """PyTorch's SDPA gives 0 for a query whose every key is masked (a causal mask with left
    padding does this to each pad row); softmax of all -inf is NaN, which lumc returned, and
    a whole model then turned every row NaN. The zeroing keeps the attention form."""
    torch.manual_seed(0)
    L = S = 8
    q, k, v = (torch.randn(2, 3, L, 16) for _ in range(3))
    mask = _padded_masks(kind, L, S, pad=3)
    mod = _Sdpa(is_causal).eval()
    args = (q, k, v, mask)
    with torch.no_grad():
        want = mod(*args).numpy()
    g = import_torch(mod, args).graph
    feed = {name: a.numpy() for name, a in zip(g.inputs, args)}
    got = next(iter(ReferenceExecutor(g)(feed).values()))
    dead = [0, 2] if kind == "float-nan" else [0, 1, 2]   # row 1's NaN is not a mask
    assert (want[0, :, dead] == 0).all() and np.isfinite(want[1]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)      # NaN where torch has NaN
    res = egraph_candidates(g, "h200", k=2)
    if not (is_causal and kind != "bool"):   # a causal select then an added mask: not one form
        assert res.best.form_counts().get("attention") == 1, res.best.form_counts()
    np.testing.assert_allclose(next(iter(run_program_reference(res.best, g, feed).values())), want,
                               rtol=1e-4, atol=1e-6)


class _FinMinMask(nn.Module):
    """transformers' padding mask: ``where(pad, finfo.min, 0)`` from the integer attention mask."""

    def forward(self, q, k, v, attention_mask):
        pad = (attention_mask == 0)[:, None, None, :]
        bias = torch.zeros(pad.shape).masked_fill(pad, torch.finfo(torch.float32).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def test_a_mask_that_cannot_hold_minus_inf_needs_no_dead_row_check():
    """No row of a finfo.min mask is dead (softmax stays finite), so no dead-row check is added; a
    mask that may hold -inf (an input) gets it, from the softmax's own max inside the attention
    kernel (it was a reduction kernel over the mask)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 16) for _ in range(3))
    am = torch.ones(2, 8, dtype=torch.int64)
    am[0, :3] = 0
    def dead_checks(g):     # the zeroing's test: a compare on the softmax's row max
        return sum(n.op == "LessThan" and n.srcs[0].op == "MaxReduce" for n in g.nodes())
    g = import_torch(_FinMinMask().eval(), (q, k, v, am)).graph
    assert egraph_candidates(g, "h200", k=2).best.form_counts() == {"attention": 1}
    assert dead_checks(g) == 0
    mask = torch.zeros(2, 1, 8, 8)
    g = import_torch(_Sdpa().eval(), (q, k, v, mask)).graph
    assert egraph_candidates(g, "h200", k=2).best.form_counts() == {"attention": 1}
    assert dead_checks(g) == 1


@pytest.mark.parametrize("dead", [False, True])
def test_a_constant_mask_is_checked_for_dead_rows_while_lowering(dead):
    """A mask that reads no input (a causal buffer) is evaluated when lowered: without a dead row
    it needs no check at run time; with one, the zeroing stays and matches PyTorch."""
    keep = torch.ones(8, 8, dtype=torch.bool).tril()
    if dead:
        keep[:3, :3] = False

    class C(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("keep", keep)

        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.keep)
    torch.manual_seed(0)
    args = tuple(torch.randn(1, 2, 8, 16) for _ in range(3))
    forms = _forms_and_check(C().eval(), args)
    assert forms == {"attention": 1}, forms      # a dead-row check is the kernel's own max


class _RopeAttention(nn.Module):
    """Llama's eager attention: rotary embeddings on q and k (elementwise ops and a rotate-half),
    then ``torch.matmul`` of 4-D heads; ``k_only`` scales k alone (the smallest such case)."""

    def __init__(self, width=32, heads=4, seq=8, k_only=False):
        super().__init__()
        d = width // heads
        self.qkv = nn.Linear(width, 3 * width)
        self.heads, self.k_only = heads, k_only
        self.register_buffer("cos", torch.randn(seq, d))
        self.register_buffer("sin", torch.randn(seq, d))

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in self.qkv(x).split(c, -1))

        def rot(z):
            return torch.cat([-z[..., d // 2:], z[..., :d // 2]], -1)
        if self.k_only:
            k = k * self.cos
        else:
            q, k = q * self.cos + rot(q) * self.sin, k * self.cos + rot(k) * self.sin
        att = torch.softmax(torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d), dim=-1)
        return torch.matmul(att, v)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("k_only", [True, False])
def test_keys_made_by_elementwise_ops_still_form_attention(batch, k_only):
    """At a batch of one, ``k.transpose(2, 3)`` of a computed ``k`` reaches the bmm as one permute
    that also places the unit axis; the rule sees the squeeze in it (Llama eager: 30 -> 26
    kernels at 2 layers, as sdpa)."""
    torch.manual_seed(0)
    forms = _forms_and_check(_RopeAttention(k_only=k_only).eval(), (torch.randn(batch, 8, 32),))
    assert forms.get("attention") == 1 and "softmax" not in forms, forms


class DecodeStep(nn.Module):
    """One decoding step of grouped-query attention: one new query per sequence, the new K/V row
    appended to a cache (``torch.cat``, both returned), K/V heads repeated by Llama's
    ``repeat_kv`` (5-D expand) or ``repeat_interleave``."""

    def __init__(self, width=64, heads=8, kv_heads=2, repeat="expand"):
        super().__init__()
        self.h, self.g, self.d, self.repeat = heads, kv_heads, width // heads, repeat
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.d, bias=False)

    def forward(self, x, pk, pv):
        b = x.shape[0]
        q = self.q(x).view(b, 1, self.h, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, 1, 2, self.g, self.d).permute(2, 0, 3, 1, 4)
        K, V = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
        r = self.h // self.g
        if self.repeat == "expand":
            Kr, Vr = (z[:, :, None].expand(b, self.g, r, z.shape[2], self.d)
                      .reshape(b, self.h, z.shape[2], self.d) for z in (K, V))
        else:
            Kr, Vr = K.repeat_interleave(r, 1), V.repeat_interleave(r, 1)
        y = F.scaled_dot_product_attention(q, Kr, Vr)
        return y.transpose(1, 2).reshape(b, 1, -1), K, V


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("repeat", ["expand", "interleave"])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_a_decoding_step_of_grouped_query_attention_is_one_form(batch, repeat, kv_heads):
    """One query (M = 1): the value product's V, the cache merged to [B, H, 1, T, D], reaches the
    product through a bare reshape (nothing to broadcast over one row), which no matmul rule read,
    so decoding kept two GEMVs and a softmax; values against torch eager."""
    torch.manual_seed(0)
    mod = DecodeStep(kv_heads=kv_heads, repeat=repeat).eval()
    t = 13
    args = (torch.randn(batch, 1, 64), torch.randn(batch, kv_heads, t, 8),
            torch.randn(batch, kv_heads, t, 8))
    g = import_torch(mod, args).graph
    res = egraph_candidates(g, "h200", k=4)
    feed = {name: a.numpy() for name, a in zip(g.inputs, args)}
    with torch.no_grad():
        want = [w.numpy() for w in mod(*args)]
    for p in res.candidates:
        got = list(run_program_reference(p, g, feed).values())
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=p.label)
    forms = res.best.form_counts()
    assert forms.get("attention") == 1 and "softmax" not in forms, forms
    att = next(c.kernel for c in res.best.calls if c.kernel.form == "attention")
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backends"))
    from triton_cases import check
    from lumc.backends.triton import configs
    check(att, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))   # the interpreter
