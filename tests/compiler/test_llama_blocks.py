"""Llama-style blocks (RMSNorm, gated MLP) written by hand: the RMSNorm in the spellings of real
code bases compiles to the same kernels as transformers' own (the norm formed on load in the
paired gate/up contraction) and matches eager; ``--why-not`` names what keeps the rest apart."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lumc


class _GatedBlock(nn.Module):
    """``x + down(silu(gate(n(x))) * up(n(x)))`` with RMSNorm ``n`` written as ``spelling``."""

    def __init__(self, width: int, ffn: int, spelling: str):
        super().__init__()
        self.spelling, self.eps = spelling, 1e-6
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(width))
        self.gate, self.up = nn.Linear(width, ffn, bias=False), nn.Linear(width, ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def norm(self, x):
        if self.spelling == "hf":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        ms = x.pow(2).sum(-1, keepdim=True) / x.shape[-1]      # the mean written out
        if self.spelling == "rsqrt":
            return x * torch.rsqrt(ms + self.eps) * self.weight
        return x / torch.sqrt(ms + self.eps) * self.weight

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@pytest.mark.parametrize("spelling", ["rsqrt", "div"])
def test_rmsnorm_with_mean_as_sum_over_n_is_a_prologue(spelling, tmp_path, monkeypatch):
    """``sum(x*x) / N`` (here N = 48, whose reciprocal is inexact) is the RMSNorm's mean: the norm
    is formed on load in the paired gate/up matmul, not a row kernel of its own."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    mod = nn.Sequential(_GatedBlock(48, 80, spelling), _GatedBlock(48, 80, spelling)).eval()
    x = torch.randn(1, 24, 48) * 3.0
    f = lumc.compile(mod, budget="30s", example_inputs=(x,), device="sim:h200")
    with torch.no_grad():
        got, want = f(x), mod(x)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-4
    r = f.specializations[0].compiled.report_dict()
    assert r["form_counts"] == {"matmul": 4}, (r["form_counts"], r["candidate_label"])
    assert "norm-prologue" in r["candidate_label"], r["candidate_label"]


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(_GatedBlock(48, 80, "hf"), _GatedBlock(48, 80, "hf"))
        self.final = _GatedBlock(48, 80, "hf")

    def forward(self, x):
        return self.final.norm(self.blocks(x))


def test_why_not_names_the_paired_chain_the_residual_and_the_final_norm(tmp_path, monkeypatch):
    """Two gated blocks and a final RMSNorm: 5 kernels (paired gate/up, down + residual, twice;
    the norm). The paired kernel's product feeds the down-projection because no form chains a
    paired matmul (not: a '+mlp' candidate lost); the residual stream is read in the next
    down-projection's epilogue and by the next norm; the final norm has no epilogue form."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    mod = _Decoder().eval()
    x = torch.randn(1, 24, 48)
    f = lumc.compile(mod, budget="30s", example_inputs=(x,), device="sim:h200")
    with torch.no_grad():
        got, want = f(x), mod(x)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-4
    cm = f.specializations[0].compiled
    assert [c.kernel.form for c in cm.program.calls] == ["matmul"] * 4 + ["rmsnorm"]
    pairs = cm.report_dict()["why_not"]["pairs"]
    rules = {(e["producer"], e["consumer"]): e["rule"] for e in pairs}
    assert set(rules) == {(0, 1), (1, 2), (1, 3), (2, 3), (3, 4)}, rules
    for pair in ((0, 1), (2, 3)):
        assert rules[pair].startswith("the producer is a paired matmul"), rules[pair]
    assert rules[(1, 3)].startswith("#3 reads it in its epilogue (a residual add)"), rules[(1, 3)]
    assert rules[(1, 3)].endswith("#2 also reads it, so it is written once for all its readers")
    assert "whole-row epilogue" in rules[(3, 4)] and "model output" in rules[(3, 4)], rules[(3, 4)]
