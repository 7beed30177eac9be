"""Compile a PyTorch module with lumc: a module in, a callable out.

    python examples/compile_torch.py

The module is captured once with ``torch.export`` (its parameters become weights; the callable
keeps no reference to the module). ``seq`` is a named dynamic dim: its range 2..512 is compiled
once, one plan per size bucket, and a call of any length re-sizes its bucket's plan (README, One
artifact for many sizes). The callable takes and returns torch tensors on the module's device.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim

import lumc


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def main():
    torch.manual_seed(0)
    model = Block().eval()
    seq = Dim("seq", min=2, max=512)
    compiled = lumc.compile(model, budget="30s", example_inputs=(torch.randn(2, 16, 64),),
                            dynamic_shapes=({1: seq},))

    with torch.no_grad():
        for t in (16, 37):
            x = torch.randn(2, t, 64)
            y, ref = compiled(x), model(x)
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            print(f"seq {t:3d}: output {tuple(y.shape)}, max rel error vs eager {err:.2e}")
    print(compiled.report())

    # torch.compile works too: backend="lumc" is registered through an entry point
    fast = torch.compile(model, backend="lumc")
    with torch.no_grad():
        x = torch.randn(1, 8, 64)
        err = ((fast(x) - model(x)).abs().max() / model(x).abs().max()).item()
    print(f"torch.compile(backend='lumc'): max rel error vs eager {err:.2e}")


if __name__ == "__main__":
    main()
