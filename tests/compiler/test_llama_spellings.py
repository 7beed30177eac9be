"""Llama-style blocks as people write them by hand: the RMSNorm and the gated MLP in the
spellings of real code bases compile to the same kernels as transformers' own (the norm formed on
load in the paired gate/up contraction) and match eager."""
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
