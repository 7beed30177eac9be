"""The mlp form (``fusion_chain``, ``render_mlp``, ``simulator_mlp``): two chained contractions in
one kernel, the intermediate never written.

Values through Triton (the interpreter) are checked against torch eager in float64 under ragged
tiles, at the interpreter's config and at a GPU-sized config that cuts many F blocks and column
tiles; the fusion is checked to refuse what the kernel cannot compute; the simulated time is
checked against its bound, and the workspace against its formula.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lumc.backends.devices import get_device
from lumc.backends.simulator import config_bound, simulate_kernel_time, workspace_bytes
from lumc.backends.triton import configs
from lumc.backends.triton.launch import TritonKernel
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.frontends.torch_frontend import import_torch
from triton_cases import run_calls

F_ = torch.nn.functional


class Block(torch.nn.Module):
    """``kind``: ``post`` (BERT: ``y = LN(x); y + down(gelu(up(y)))``), ``pre`` (GPT-2:
    ``x + down(gelu(up(LN(x))))``), ``plain`` (``down(relu(up(x)))``, no bias on down)."""

    def __init__(self, d: int, f: int, n: int, kind: str):
        super().__init__()
        self.kind = kind
        self.ln = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, f)
        self.down = torch.nn.Linear(f, n, bias=kind != "plain")

    def forward(self, x):
        if self.kind == "post":
            y = self.ln(x)
            return y + self.down(F_.gelu(self.up(y)))
        if self.kind == "pre":
            return x + self.down(F_.gelu(self.up(self.ln(x))))
        return self.down(F_.relu(self.up(x)))


def _mlp_program(model, x):
    imp = import_torch(model, (x,))
    res = egraph_candidates(imp.graph, "h200", k=64)
    progs = [p for p in res.candidates if any(c.kernel.form == "mlp" for c in p.calls)]
    return imp, res, progs


def _out(prog):
    """The node a kernel writes for the program's one output (a free reshape of it, or itself)."""
    out = next(iter(prog.outputs.values()))
    while out.op == "View":
        out = out.srcs[0]
    return out


def _run(prog, feeds: dict, cfg=None) -> dict:
    """Every kernel through Triton; ``cfg`` for those of space ``mlp``."""
    return run_calls(prog, feeds, cfg, "mlp")


# many F blocks (two per program) and column tiles, ragged at every edge
GPU_CFG = configs.make(4, 2, BLOCK_M=16, BLOCK_F=32, BLOCK_K=16, BLOCK_N=16, F_TILES=2,
                       PRECISION="ieee")


@pytest.mark.parametrize("kind,shape,f,n", [
    ("post", (1, 20, 48), 200, 48),     # M, F and N ragged against every tile
    ("pre", (1, 7, 40), 72, 40),
    ("plain", (13, 24), 96, 40),        # rank 2, N != K (no residual)
])
def test_mlp_kernel_matches_eager_float64(kind, shape, f, n):
    torch.manual_seed(len(shape) * 100 + f)
    model = Block(shape[-1], f, n, kind).eval()
    x = torch.randn(*shape)
    imp, res, progs = _mlp_program(model, x)
    assert progs, [p.label for p in res.candidates]
    prog = min(progs, key=lambda p: len(p.calls))
    assert all("+mlp" in p.label for p in progs)
    want = model.double()(x.double()).detach().numpy()
    name = next(iter(imp.graph.inputs))
    out = _out(prog)
    for cfg in (None, GPU_CFG):
        got = _run(prog, {name: x.numpy()}, cfg)[id(out)]
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


def test_mlp_kernel_propagates_non_finite_like_eager():
    """An inf in one row of the input reaches that row of the output as eager's does (NaN where
    eager has NaN), and the masked lanes past F and N (zeroed, never 0 * inf) add nothing."""
    torch.manual_seed(3)
    model = Block(24, 40, 24, "plain").eval()
    x = torch.randn(9, 24)
    x[4, 3] = float("inf")
    x[6, 0] = float("nan")
    imp, _, progs = _mlp_program(model, torch.randn(9, 24))
    prog = min(progs, key=lambda p: len(p.calls))
    want = model(x).detach().numpy()
    out = _out(prog)
    for cfg in (None, GPU_CFG):
        got = _run(prog, {next(iter(imp.graph.inputs)): x.numpy()}, cfg)[id(out)].reshape(9, 24)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(np.isinf(got), np.isinf(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-5)
        assert not np.isfinite(want[4]).all() and np.isnan(want[6]).all()


class TwoReaders(Block):
    """The intermediate also read by an elementwise op outside the chain: it must be written."""

    def forward(self, x):
        h = F_.relu(self.up(x))
        return self.down(h), h.sum(-1)


def test_no_chain_when_the_intermediate_has_another_reader():
    model = TwoReaders(16, 32, 16, "plain").eval()
    _, res, progs = _mlp_program(model, torch.randn(5, 16))
    assert not progs
    assert all("+mlp" not in p.label for p in res.candidates)


class Batched(torch.nn.Module):
    """Chained batched products (attention without its softmax): batch dims, no mlp form."""

    def forward(self, q, k, v):
        return torch.relu(q @ k.transpose(-1, -2)) @ v


def test_no_chain_past_eight_column_tiles():
    """A program accumulates every column tile of its rows (at most 8 of 256): a down-projection
    to N = 2056 stays a matmul kernel; N = 2048 is an mlp kernel."""
    for n, chained in ((2056, False), (2048, True)):
        model = Block(16, 32, n, "plain").eval()
        _, res, progs = _mlp_program(model, torch.randn(4, 16))
        assert bool(progs) == chained, n


def test_no_chain_for_one_row():
    """A decoding step's GEMVs (M = 1) stay two kernels: the row kernels serve them."""
    model = Block(40, 72, 40, "pre").eval()
    _, res, progs = _mlp_program(model, torch.randn(1, 1, 40))
    assert not progs and res.candidates


def test_no_chain_for_batched_contractions():
    args = (torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 8, 16))
    imp = import_torch(Batched().eval(), args)
    res = egraph_candidates(imp.graph, "h200", k=64)
    assert not any(c.kernel.form == "mlp" for p in res.candidates for c in p.calls)


def test_simulated_time_is_above_bound_and_workspace_is_the_partials():
    """Every legal config of BERT-sized mlp kernels (M 128, K 768, F 3072, N 768): simulated time
    >= the config's bound >= the kernel's roofline; ``workspace_bytes`` is ``2 cdiv(F, BLOCK_F) M
    N 4``; configs past the shared memory the fitted estimate gives are illegal."""
    torch.manual_seed(0)
    model = Block(768, 3072, 768, "post").eval()
    _, _, progs = _mlp_program(model, torch.randn(1, 128, 768))
    kernel = next(c.kernel for p in progs for c in p.calls if c.kernel.form == "mlp")
    tk = TritonKernel(kernel)
    dev = get_device("h200")
    space = configs.config_space("mlp", tk.rendered.problem)
    assert space
    roof = max(kernel.flops() / dev.dot_peak("tf32x3"), kernel.min_bytes() / dev.hbm_bandwidth)
    for c in space:
        kw = dict(c.kwargs(), PRECISION="tf32x3")
        t, b = simulate_kernel_time(kernel, kw, dev), config_bound(kernel, kw, dev)
        assert t >= b >= roof, (kw, t, b, roof)
        splits = math.ceil(3072 / (kw["BLOCK_F"] * kw["F_TILES"]))
        assert workspace_bytes(kernel, kw) == 2 * splits * 128 * 768 * 4
        assert configs.mlp_shared_memory(4, kw) <= configs.SMEM_LIMIT
    # what ptxas said of these tiles at 8 warps, tf32x3 (cuda:90, Triton 3.6): 16 x 64 x 128 at
    # F_TILES 3 spills 8 B and 16 x 128 x 128 at F_TILES 2 spills 192 B (refused); 16 x 64 x 128
    # at F_TILES 1 and 16 x 32 x 256 at F_TILES 4 do not (offered)
    tiles = {(k["BLOCK_M"], k["BLOCK_F"], k["BLOCK_N"], k["F_TILES"])
             for k in (c.kwargs() for c in space) if k["num_warps"] == 8 and k["BLOCK_K"] == 32}
    assert (16, 64, 128, 3) not in tiles and (16, 128, 128, 2) not in tiles
    assert (16, 64, 128, 1) in tiles and (16, 32, 256, 4) in tiles


@pytest.mark.parametrize("kind,shape", [("plain", (5, 8)), ("plain", (5, 1)), ("post", (2, 5, 8))])
def test_no_chain_for_a_hidden_width_of_one(kind, shape):
    """F = 1 (``Linear(d, 1)`` then ``Linear(1, n)``): the first product has no column dim, so it
    is elementwise over its left operand (a normalization's kernel may write it, leaving the mlp
    kernel a bare sum: "found 1" contraction) and its W1 tile has no column index (a
    ``[BLOCK_K, 1]`` or scalar ``tl.dot`` operand); the fusion offers no mlp kernel and the
    renderer refuses one, and the two-kernel candidates still match eager."""
    torch.manual_seed(5)
    model = Block(shape[-1], 1, 8 if kind == "plain" else shape[-1], kind).eval()
    x = torch.randn(*shape)
    imp, res, progs = _mlp_program(model, x)
    assert not progs, [p.label for p in progs]
    assert all("+mlp" not in p.label for p in res.candidates)


def test_renderer_refuses_a_hidden_width_of_one():
    from lumc.backends.triton.codegen import RenderError
    from lumc.backends.triton.render_mlp import chained_contractions
    from triton_cases import make_kernel
    from lumc.ir import dtypes as dt
    from lumc.ir.library.activations import relu
    k = make_kernel("mlp", lambda x, w1, w2: relu(x @ w1) @ w2,
                    [((5, 8), dt.f32), ((8, 1), dt.f32), ((1, 8), dt.f32)])
    with pytest.raises(RenderError, match="F = 1"):
        chained_contractions(k.meaning.nodes())


def test_no_chain_for_float64():
    """fp64 products are not ``tl.dot`` operands of the mlp kernel (``DOT_DTYPES``): the fusion
    offers no +mlp candidate the renderer would refuse."""
    model = Block(8, 16, 8, "plain").double().eval()
    _, res, progs = _mlp_program(model, torch.randn(5, 8, dtype=torch.float64))
    assert not progs and res.candidates
    assert all("+mlp" not in p.label for p in res.candidates)


@pytest.mark.parametrize("f,n", [(8, 8), (12, 16), (16, 40)])
def test_small_widths_have_legal_configs(f, n):
    """F or N at most 16: the space offers 16-wide blocks, and the GPU default is one of them."""
    p = {"M": 20, "K": 48, "F": f, "N": n, "itemsize": 4, "dot_dtype": "f32"}
    space = configs.config_space("mlp", p)
    assert space
    assert configs._legal("mlp", p, configs.default_config("mlp", p).kwargs())
