"""One large problem per kernel form, for the ahead-of-time check and the GPU benchmark.

Each :class:`BenchCase` holds a kernel (its meaning written with Tensor methods, as a model lowers)
sized to fill an H100/H200, its inputs' specs, the torch eager function computing the same thing,
and what bounds it: ``memory`` (target: the measured copy bandwidth) or ``compute`` (target: the
measured bf16 matmul rate). Sizes are chosen so every case moves at least 256 MiB or does at least
1 TFLOP: small enough to run in seconds, large enough that launch overhead is noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.kernels import Kernel
from lumc.ir.library.conv import conv
from lumc.ir.library.indexing import gather
from lumc.ir.library.norm import layer_norm, rms_norm, softmax
from lumc.ir.tensor import Tensor


@dataclass
class BenchCase:
    """A kernel and its torch eager twin.

    Attributes:
        name: row label (the form, plus the variant where one form has several rows).
        kernel: the lumc kernel.
        torch_fn: ``(*torch tensors) -> tensor``, the same computation in torch.
        bound: ``memory`` or ``compute``.
        baseline: what the target compares with: ``copy`` (bandwidth), ``matmul`` (torch.matmul)
            or ``sdpa`` (scaled_dot_product_attention).
        index_ranges: ``{input position: n}`` for integer inputs drawn in ``[0, n)``.
    """
    name: str
    kernel: Kernel
    torch_fn: Callable
    bound: str
    baseline: str
    index_ranges: dict[int, int]

    @property
    def flops(self) -> int:
        return self.kernel.flops()

    @property
    def bytes(self) -> int:
        return self.kernel.min_bytes()


def _kernel(form: str, build, specs) -> Kernel:
    ins = {f"in{i}": input_node(f"in{i}", tuple(s), d) for i, (s, d) in enumerate(specs)}
    outs = build(*[Tensor(n) for n in ins.values()])
    if isinstance(outs, Tensor):
        outs = (outs,)
    return Kernel(form, Graph(ins, {f"out{i}": t.node for i, t in enumerate(outs)}))


def _attention(scale: float):
    def f(q, k, v):
        return softmax((q @ k.transpose(-1, -2)) * scale, -1).cast(q.dtype) @ v
    return f


def bench_cases(d: dt.DType = dt.bf16, scale: int = 1) -> list[BenchCase]:
    """The cases, in table order. ``scale`` divides the sizes (tests use a small scale)."""
    import torch.nn.functional as F

    s = max(1, scale)
    rows, cols = 32768 // s, 8192
    n_pw = (1 << 28) // s
    mm = 8192 // s
    b, h, L, hd = 4, 32 // min(s, 32), 4096 // s, 128
    cases = [
        BenchCase("pointwise", _kernel("pointwise", lambda x, y: x * y.sigmoid() + x,
                                       [((n_pw,), d), ((n_pw,), d)]),
                  lambda x, y: x * torch_sigmoid(y) + x, "memory", "copy", {}),
        BenchCase("gather", _kernel("gather", lambda t, i: gather(t, i, 0),
                                    [((32000 // s, 4096), d), ((16384 // s,), dt.i64)]),
                  lambda t, i: t[i], "memory", "copy", {1: 32000 // s}),
        BenchCase("reduction", _kernel("reduction", lambda x: x.sum(-1), [((rows, cols), d)]),
                  lambda x: x.sum(-1, dtype=torch_f32()).to(x.dtype), "memory", "copy", {}),
        BenchCase("softmax", _kernel("softmax", lambda x: softmax(x, -1), [((rows, cols), d)]),
                  lambda x: torch_softmax(x), "memory", "copy", {}),
        BenchCase("layernorm", _kernel("layernorm", lambda x, w, bb: layer_norm(x, w, bb)[0],
                                       [((rows, cols), d), ((cols,), d), ((cols,), d)]),
                  lambda x, w, bb: F.layer_norm(x, (x.shape[-1],), w, bb, 1e-5), "memory", "copy",
                  {}),
        BenchCase("rmsnorm", _kernel("rmsnorm", lambda x, w: rms_norm(x, w),
                                     [((rows, cols), d), ((cols,), d)]),
                  lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-5), "memory", "copy", {}),
        BenchCase("matmul", _kernel("matmul", lambda a, bb: a @ bb, [((mm, mm), d), ((mm, mm), d)]),
                  lambda a, bb: a @ bb, "compute", "matmul", {}),
        BenchCase("conv", _kernel("matmul", lambda x, w: conv(x, w, pads=[1, 1, 1, 1]),
                                  [((64 // s, 256, 56, 56), d), ((256, 256, 3, 3), d)]),
                  lambda x, w: F.conv2d(x, w, padding=1), "compute", "matmul", {}),
        BenchCase("attention", _kernel("attention", _attention(hd ** -0.5),
                                       [((b, h, L, hd), d)] * 3),
                  lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "compute", "sdpa", {}),
        # a decoding step's MLP input (Llama-3-8B: hidden 4096, 14336 columns): RMSNorm formed on
        # load in the paired gate/up GEMV, one row kernel writing only silu(gate) * up
        BenchCase("gemv-norm-gate-up", _kernel("reduction", _gated_gemv,
                                               [((1, 1, 4096), d), ((4096,), d),
                                                ((4096, 14336 // s), d), ((4096, 14336 // s), d)]),
                  lambda x, w, wg, wu: _torch_gated_gemv(x, w, wg, wu), "memory", "copy", {}),
        # one very long row: the split (two-stage) reduction, else one program for the whole GPU
        BenchCase("global-sum", _kernel("reduction", lambda x: x.sum(None), [((n_pw,), d)]),
                  lambda x: x.sum(dtype=torch_f32()).to(x.dtype), "memory", "copy", {}),
        # a sandwich norm (Gemma-3: h = x + N_post(s), then N_pre(h) @ W) formed on load, nested:
        # the statistics of s, then of h, then the main loop (``fusion_norms``); 1.1 TFLOP
        BenchCase("matmul-sandwich-norm", _kernel(
            "matmul", _sandwich_matmul,
            [((mm, 4096), d), ((mm, 4096), d), ((4096,), d), ((4096,), d), ((4096, 2 * mm), d)]),
            lambda x, s, w1, w2, w: _torch_sandwich_matmul(x, s, w1, w2, w), "compute", "matmul",
            {}),
        # a BERT-large feed-forward block as one mlp kernel (``render_mlp``): the [M, 4096]
        # intermediate never written; 1.1 TFLOP
        BenchCase("mlp", _kernel("mlp", _mlp, [((65536 // s, 1024), d), ((1024, 4096), d),
                                              ((4096,), d), ((4096, 1024), d)]),
                  lambda x, w1, b1, w2: _torch_mlp(x, w1, b1, w2), "compute", "matmul", {}),
    ]
    return cases


def _mlp(x, w1, b1, w2):
    return (x @ w1 + b1).maximum(0.0) @ w2


def _torch_mlp(x, w1, b1, w2):
    import torch
    return torch.relu(x @ w1 + b1) @ w2


def _gated_gemv(x, w, wg, wu):
    h = rms_norm(x, w)
    g, u = h @ wg, h @ wu
    return g / ((-g).exp() + 1.0) * u


def _torch_gated_gemv(x, w, wg, wu):
    import torch.nn.functional as F
    h = F.rms_norm(x, (x.shape[-1],), w, 1e-5)
    return F.silu(h @ wg) * (h @ wu)


def _sandwich_matmul(x, s, w1, w2, w):
    return rms_norm(x + rms_norm(s, w1), w2) @ w


def _torch_sandwich_matmul(x, s, w1, w2, w):
    import torch.nn.functional as F
    h = x + F.rms_norm(s, (s.shape[-1],), w1, 1e-5)
    return F.rms_norm(h, (h.shape[-1],), w2, 1e-5) @ w


def torch_f32():
    import torch
    return torch.float32


def torch_sigmoid(x):
    import torch
    return torch.sigmoid(x)


def torch_softmax(x):
    import torch
    return torch.softmax(x.float(), -1).to(x.dtype)
