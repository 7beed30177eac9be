"""Attention with a score function no rule spells, assembled by the fusion
(``compiler/core/fusion_attention.py``).

Gemma-2 caps its attention logits, ``softmax(c * tanh(q k^T * s / c) + mask) @ v``; ``tanh`` lowers
to some twenty primitives, so the e-graph left a score product, a softmax and a value product, the
score matrix written and read twice, plus RoPE kernels. The fusion now assembles one attention kernel
around any elementwise score function when the attention renderer accepts it. Each case builds its
own module; values against torch eager, the kernel through Triton (the interpreter on CPU) against
the reference executor."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lumc.backends import simulator
from lumc.backends.devices import get_device
from lumc.backends.triton import configs
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.frontends.torch_frontend.capture import import_torch
from lumc.compiler.runtime.program import run_program_reference
from triton_cases import check


class CappedAttention(nn.Module):
    """Gemma-2's eager attention: ``tanh`` soft-capped scores, a causal additive mask (or none),
    grouped-query heads, o-proj. ``probs_out`` also returns the probabilities."""

    def __init__(self, width=64, heads=4, kv_heads=2, cap=50.0, causal=True, probs_out=False,
                 cube=False):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.d, bias=False)
        self.v = nn.Linear(width, kv_heads * self.d, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.cap, self.causal, self.probs_out, self.cube = cap, causal, probs_out, cube

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        v = self.v(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        k = k.repeat_interleave(self.h // self.kvh, dim=1)
        v = v.repeat_interleave(self.h // self.kvh, dim=1)
        s = torch.matmul(q, k.transpose(2, 3)) * self.d ** -0.5
        if self.cube:
            s = s * s * s * 1e-3
        elif self.cap is not None:
            s = torch.tanh(s / self.cap) * self.cap
        if self.causal:
            s = s + torch.full((t, t), float("-inf")).triu(1)
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        y = self.o(torch.matmul(p, v).transpose(1, 2).reshape(b, t, -1))
        return (y, p) if self.probs_out else y


def _fewest(mod, x):
    g = import_torch(mod, (x,)).graph
    res = egraph_candidates(g, "h200", k=16)
    return g, min(res.candidates, key=lambda p: len(p.calls))


def _against_eager(g, prog, mod, x):
    with torch.no_grad():
        want = mod(x)
    want = want if isinstance(want, tuple) else (want,)
    got = run_program_reference(prog, g, {next(iter(g.inputs)): x.numpy()})
    for w, gv in zip(want, got.values()):
        np.testing.assert_allclose(gv, w.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cube", [False, True])
@pytest.mark.parametrize("b,t", [(1, 24), (2, 13)])
def test_a_capped_score_function_is_one_attention_kernel(causal, cube, b, t):
    """Soft-capped (or cubed) scores, masked or not, ragged lengths: the fewest-kernel program has
    one attention kernel and no softmax; it matches eager, and the kernel through Triton matches
    the reference under default and ragged tiles."""
    torch.manual_seed(t + 3 * cube + causal)
    mod = CappedAttention(causal=causal, cube=cube).eval()
    x = torch.randn(b, t, 64) * (4.0 if not cube else 1.0)
    g, prog = _fewest(mod, x)
    forms = prog.form_counts()
    assert forms.get("attention") == 1 and "softmax" not in forms, forms
    assert any("assembled into an attention kernel" in n for n in prog.notes), prog.notes
    assert "+attention" in prog.label
    # the candidate as extracted (scores, softmax, values) stays: the search times both
    g2 = import_torch(mod, (x,)).graph
    assert any("softmax" in p.form_counts() for p in egraph_candidates(g2, "h200", k=16).candidates)
    _against_eager(g, prog, mod, x)
    att = next(c.kernel for c in prog.calls if c.kernel.form == "attention")
    check(att, tol=(2e-5, 2e-5))
    check(att, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16), tol=(2e-5, 2e-5))


def test_the_score_function_is_priced():
    """The capped score function's ops (``tanh``: an ``exp2`` and a division among some twenty
    more) are charged per score element; a plain scaled, masked attention costs far less."""
    torch.manual_seed(0)
    x = torch.randn(1, 24, 64)
    dev = get_device("h200")

    def score_s(mod):
        _, prog = _fewest(mod.eval(), x)
        att = next(c.kernel for c in prog.calls if c.kernel.form == "attention")
        return simulator.attention_score_seconds(att, dev)
    capped = score_s(CappedAttention())
    plain = score_s(CappedAttention(cap=None))     # the e-graph's own masked attention form
    elems = 4 * 24 * 24
    # at least the cap's exp2 and division at 8 slots each, plus the scale, mask and polynomial
    assert capped * dev.vector_flops["f32"] >= elems * (2 * 8 + 10), capped
    assert 0 < plain * dev.vector_flops["f32"] <= elems * 4 and capped > 5 * plain, (capped, plain)


def test_probabilities_read_elsewhere_stay_a_softmax_kernel():
    """A model that also returns the probabilities reads the softmax outside the value product:
    no attention is assembled (the probabilities must be written), and values match eager."""
    torch.manual_seed(1)
    mod = CappedAttention(probs_out=True).eval()
    x = torch.randn(1, 16, 64)
    g, prog = _fewest(mod, x)
    assert "attention" not in prog.form_counts(), prog.form_counts()
    _against_eager(g, prog, mod, x)


def test_sdpa_does_not_apply_to_a_capped_score_function():
    """SDPA computes an affine score function only; the extern check refuses the capped kernel
    (its construction raises), so only the Triton kernel can run it."""
    from lumc.compiler.runtime.extern import ExternKernel
    torch.manual_seed(2)
    _, prog = _fewest(CappedAttention().eval(), torch.randn(1, 16, 64))
    att = next(c.kernel for c in prog.calls if c.kernel.form == "attention")
    with pytest.raises(ValueError, match="affine|alpha|score"):
        ExternKernel(att, "sdpa")


def test_gemma2_layers_are_six_kernels_each():
    """transformers' Gemma-2 (eager attention: its soft-capped scores have no SDPA path; 2 layers,
    random weights): attention (RoPE computed on load) is one kernel per layer; per layer QKV,
    attention, o-proj, the post-attention norm kernel, gate/up, down; plus the gather and the
    final norm (was 22 kernels: two softmax, four RoPE, eight more matmuls). Values vs eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    sliding_window=8, vocab_size=500, attn_implementation="eager",
                                    use_cache=False)
    mod = transformers.Gemma2Model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 24))
    g = import_torch(mod, (ids,)).graph
    prog = min(egraph_candidates(g, "h200", k=16).candidates, key=lambda p: len(p.calls))
    forms = prog.form_counts()
    assert len(prog.calls) == 2 + 2 * 6 and forms.get("attention") == 2, forms
    with torch.no_grad():
        want = mod(ids).last_hidden_state.numpy()
    got = run_program_reference(prog, g, {next(iter(g.inputs)): ids.numpy()})
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-5)
    assert math.isfinite(float(np.abs(want).max()))


class SharedScores(nn.Module):
    """Capped scores that something besides the one softmax reads: a model output (``scores``) or
    a second softmax (``two``)."""

    def __init__(self, two=False):
        super().__init__()
        self.qkv = nn.Linear(32, 96, bias=False)
        self.two = two

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 16).permute(2, 0, 3, 1, 4)
        s = torch.tanh(torch.matmul(q, k.transpose(2, 3)) * 0.25 / 5.0) * 5.0
        y = torch.matmul(F.softmax(s, dim=-1), v)
        if self.two:
            return y + torch.matmul(F.softmax(s * 0.5, dim=-1), v)
        return y, s


@pytest.mark.parametrize("two", [False, True])
def test_scores_read_elsewhere_are_not_assembled(two):
    """The attention kernel writes only its values. Scores that are also a model output were
    assembled anyway: the output cut the score product into a kernel of its own, labelled
    attention with one contraction, which cannot render (the search dropped that candidate
    silently). Two softmaxes over the same scores were both assembled, then both dropped as
    overlapping, their softmax forms lost with them (11 kernels where 7 were). Now nothing is
    assembled and the note says why; every candidate renders and matches eager."""
    from lumc.backends.triton.launch import TritonKernel
    torch.manual_seed(4)
    mod = SharedScores(two).eval()
    x = torch.randn(1, 12, 32) * 3
    g = import_torch(mod, (x,)).graph
    cands = egraph_candidates(g, "h200", k=16).candidates
    assert not any("+attention" in p.label for p in cands), [p.label for p in cands]
    assert any("read elsewhere" in n for p in cands for n in p.notes)
    for p in cands:
        for c in p.calls:
            TritonKernel(c.kernel)                  # renders (raised RenderError for an output)
    prog = min(cands, key=lambda p: len(p.calls))
    assert prog.form_counts().get("softmax") == (2 if two else 1), prog.form_counts()
    _against_eager(g, prog, mod, x)


def test_sdpa_refuses_a_score_function_affine_only_for_positive_scores():
    """``|S|`` equals ``S`` at every probe of 0 and above: the probe accepted it as affine and
    SDPA computed ``softmax(S)`` where the model has ``softmax(|S|)``; negative probes refuse it.
    The scaled, causally masked attention is still accepted."""
    from lumc.compiler.runtime.extern import ExternKernel

    class Abs(CappedAttention):
        def forward(self, x):
            b, t, _ = x.shape
            q = self.q(x).view(b, t, self.h, self.d).transpose(1, 2)
            k = self.k(x).view(b, t, self.kvh, self.d).transpose(1, 2)
            v = self.v(x).view(b, t, self.kvh, self.d).transpose(1, 2)
            k = k.repeat_interleave(self.h // self.kvh, dim=1)
            v = v.repeat_interleave(self.h // self.kvh, dim=1)
            s = torch.matmul(q, k.transpose(2, 3)).abs() * self.d ** -0.5
            p = F.softmax(s, dim=-1)
            return self.o(torch.matmul(p, v).transpose(1, 2).reshape(b, t, -1))
    torch.manual_seed(5)
    x = torch.randn(1, 16, 64)
    _, prog = _fewest(Abs().eval(), x)
    att = next(c.kernel for c in prog.calls if c.kernel.form == "attention")
    with pytest.raises(ValueError, match="affine|alpha|score"):
        ExternKernel(att, "sdpa")
    _, prog = _fewest(CappedAttention(cap=None).eval(), x)
    ExternKernel(next(c.kernel for c in prog.calls if c.kernel.form == "attention"), "sdpa")
