"""Paired matmul: a gated MLP's gate and up projections (two products of one left operand, joined
by ``act(gate) * up``) as one kernel that loads each left tile once, multiplies it by both right
operands into two accumulators and writes only the joined value. Rendered and run in the Triton
interpreter on ragged tiles, with and without the RMSNorm formed on load; the simulator and the
config space price two ``b`` streams and two accumulators."""
from __future__ import annotations

import re
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lumc.backends.devices import get_device
from lumc.backends.simulator import contraction_dims, simulate_kernel_time
from lumc.backends.triton import configs
from lumc.backends.triton.render import render_parts
from lumc.compiler.core.fusion import greedy_program
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.kernels import Kernel
from lumc.ir.tensor import Tensor
from triton_cases import check, egraph_candidates_checked

RNG = np.random.default_rng(0)


def _const(shape):
    return Tensor.const((RNG.standard_normal(shape) * 0.2).astype(np.float32))


def _gated(shape, inner, act="silu", d=dt.f32):
    x = Tensor(input_node("x", shape, d))
    k = shape[-1]
    g, u = x @ _const((k, inner)).cast(d), x @ _const((k, inner)).cast(d)
    h = g / ((-g).exp() + 1.0) if act == "silu" else g.maximum(g.scalar_like(0.0))
    return Graph({"x": x.node}, {"y": (h * u).node})


def _paired_kernel(g: Graph) -> Kernel:
    p = greedy_program(g)
    (call,) = p.calls
    assert dict(call.kernel.attrs).get("paired") is True
    return call.kernel


@pytest.mark.parametrize("shape,inner", [((1, 13, 32), 40), ((2, 7, 48), 24), ((5, 16), 33)])
@pytest.mark.parametrize("act", ["silu", "relu"])
def test_paired_kernel_renders_on_ragged_tiles(shape, inner, act):
    k = _paired_kernel(_gated(shape, inner, act))
    parts = render_parts(k, None)
    assert parts.problem["B_OPERANDS"] == 2 and parts.config_space.startswith("matmul")
    for cfg in (configs.make(4, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1),
                configs.make(4, 2, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=4)):
        check(k, config=cfg)


def test_paired_kernel_in_half_precision():
    check(_paired_kernel(_gated((1, 19, 32), 48, d=dt.f16)),
          config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1))


class LlamaMLP(nn.Module):
    """transformers' LlamaRMSNorm then LlamaMLP (SiLU-gated), with the residual."""

    def __init__(self, width=32, inner=48, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.rand(width) + 0.5)
        self.gate, self.up = nn.Linear(width, inner, bias=False), nn.Linear(width, inner, bias=False)
        self.down = nn.Linear(inner, width, bias=False)
        self.eps = eps

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@pytest.mark.parametrize("b,t", [(1, 13), (2, 8)])
def test_rmsnorm_on_load_feeds_both_products(b, t):
    """The pre-LN candidate forms the RMSNorm once per left tile, for both accumulators: the MLP is
    two kernels (paired gate/up with the norm on load, down-projection with the residual)."""
    torch.manual_seed(0)
    mod, x = LlamaMLP().eval(), torch.randn(b, t, 32)
    res = egraph_candidates_checked(mod, x, k=32)
    # the horizontal plans leave the joined pair apart: no candidate writes a merged [M, 2 I]
    for p in res.candidates:
        for c in p.calls:
            assert not any(tuple(n.shape)[-1] == 96 for n in c.inputs + c.outputs), p.label
    fused = [p for p in res.candidates if len(p.calls) == 2]
    assert fused, {p.label: len(p.calls) for p in res.candidates}
    k = fused[0].calls[0].kernel
    assert dict(k.attrs).get("paired") is True
    assert any(n.op == "Sqrt" or n.op == "Recip" for n in k.meaning.nodes())   # the norm is inside
    check(k, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, N_TILES=1))
    check(k, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=1, N_TILES=2))


@pytest.mark.parametrize("b", [1, 2])
def test_one_row_gate_and_up_are_one_row_kernel(b):
    """Decoding (one row per sequence): gate and up are GEMVs, which the e-graph may spell as a sum
    over the product reshaped without its leading 1 (``views/SumReduce``). They still pair: one row
    kernel sums both products over the same tile of the normalized input and writes only
    ``silu(gate) * up``, so no candidate has three GEMV kernels for the MLP."""
    torch.manual_seed(2)
    mod, x = LlamaMLP(width=48, inner=80).eval(), torch.randn(b, 1, 48)
    res = egraph_candidates_checked(mod, x, k=32)

    def joined(k):
        reds = [n for n in k.meaning.nodes() if n.op == "SumReduce" and n.numel == b * 80]
        return len(reds) == 2 and all(o.numel == b * 80 for o in k.meaning.outputs.values())
    paired = [c.kernel for p in res.candidates for c in p.calls if joined(c.kernel)]
    assert paired, {p.label: p.form_counts() for p in res.candidates}
    assert len(res.best.calls) <= 3, res.best.form_counts()
    parts = render_parts(paired[0], None)
    space = configs.config_space(parts.config_space, parts.problem)
    for cfg in (space[0], space[-1]):
        check(paired[0], config=cfg)


class FusedGateUpMLP(nn.Module):
    """transformers' Phi3MLP after an RMSNorm: one ``gate_up_proj`` of twice the width, split by
    ``chunk`` (or by explicit slices), then ``up * silu(gate)`` and the down-projection."""

    def __init__(self, width=32, inner=48, eps=1e-6, split="chunk"):
        super().__init__()
        self.w = nn.Parameter(torch.rand(width) + 0.5)
        self.gate_up = nn.Linear(width, 2 * inner, bias=False)
        self.down = nn.Linear(inner, width, bias=False)
        self.eps, self.inner, self.split = eps, inner, split

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w
        y = self.gate_up(h)
        if self.split == "chunk":
            gate, up = y.chunk(2, dim=-1)
        else:   # up first: the halves in the other order
            up, gate = y[..., :self.inner], y[..., self.inner:]
        return x + self.down(up * F.silu(gate))


@pytest.mark.parametrize("b,t,split", [(1, 13, "chunk"), (2, 8, "slices")])
def test_fused_gate_up_weight_is_split_into_a_paired_kernel(b, t, split):
    """A model that stores gate and up as one wide weight (Phi-3) reads the halves of one product
    through column slices; the e-graph unions each half with the product over the weight's columns
    (``horizontal.split_rules``), so the MLP is two kernels as for separate weights, and no kernel
    writes the wide [M, 2 I] product."""
    torch.manual_seed(1)
    mod, x = FusedGateUpMLP(split=split).eval(), torch.randn(b, t, 32)
    res = egraph_candidates_checked(mod, x, k=32)
    fused = [p for p in res.candidates if len(p.calls) == 2]
    assert fused, {p.label: len(p.calls) for p in res.candidates}
    assert len(res.best.calls) == 2, res.best.label
    k = fused[0].calls[0].kernel
    assert dict(k.attrs).get("paired") is True
    assert all(tuple(n.shape)[-1] != 96 for c in fused[0].calls for n in c.outputs)
    check(k, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, N_TILES=1))


def test_simulator_and_configs_price_two_right_operands():
    paired = _paired_kernel(_gated((1, 512, 1024), 2048))
    x = Tensor(input_node("x", (1, 512, 1024), dt.f32))
    single = greedy_program(Graph({"x": x.node}, {"y": (x @ _const((1024, 2048))).node})).calls[0].kernel
    assert contraction_dims(paired).operands_b == 2 and contraction_dims(single).operands_b == 1
    dev = get_device("h200")
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3,
           "PRECISION": "tf32x3"}
    tp, ts = simulate_kernel_time(paired, cfg, dev), simulate_kernel_time(single, cfg, dev)
    assert 1.6 * ts < tp < 2.4 * ts        # twice the work, one launch
    prob = render_parts(paired, None).problem
    one = dict(prob, B_OPERANDS=1)
    for space in ("matmul",):
        both = {str(c) for c in configs.config_space(space, prob)}
        alone = {str(c) for c in configs.config_space(space, one)}
        assert both < alone                 # two accumulators rule out the largest tiles
        for c in configs.config_space(space, prob):
            assert c["BLOCK_M"] * c["BLOCK_N"] * 2 <= configs.REG_TILE * c.num_warps // 4
    c = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_stages": 3}
    assert configs.shared_memory_estimate("matmul", prob, c) == 3 * (64 + 2 * 64) * 32 * 4


@pytest.mark.parametrize("p", ["fp8", "fp16", "bf16", "tf32x3"])
def test_paired_kernel_at_each_precision_matches_its_emulation(p):
    """Both products at a reduced precision: the ``a`` tile is converted (or scaled and quantized
    to e4m3) once for the two, each ``b`` tile on its own; the result is the numpy emulation's
    (``dot_rounding``) within fp32 accumulation-order noise."""
    from lumc.backends.precision import dot_rounding
    from lumc.backends.reference import ReferenceExecutor
    from lumc.backends.triton.launch import TritonKernel
    k = _paired_kernel(_gated((2, 9, 80), 40))
    tk = TritonKernel(k)
    if p in ("fp8", "fp16", "bf16"):
        branch = re.split(r"\n\s*(?:elif|else)\b", tk.source.split(f"PRECISION == {p!r}:")[1])[0]
        assert branch.count("a_q =" if p == "fp8" else "a_c =") == 1, branch
        assert branch.count("tl.dot(") == 2
    ins = [RNG.standard_normal(n.shape).astype(np.float32) for n in k.inputs]
    cfg = configs.make(4, 2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, PRECISION=p)
    got = tk(*ins, config=cfg)[0].numpy()
    feed = {n.arg.name: v for n, v in zip(k.inputs, ins)}
    ref = next(iter(ReferenceExecutor(k.meaning, dot_operands=dot_rounding(cfg.kwargs()))(feed)
                    .values()))
    exact = next(iter(ReferenceExecutor(k.meaning, "float64")(feed).values()))
    scale = np.abs(exact).max()
    assert np.abs(got - ref).max() / scale < 1e-5
    if p != "tf32x3":        # and it really is the reduced precision
        assert np.abs(ref - exact).max() / scale > 1e-5
