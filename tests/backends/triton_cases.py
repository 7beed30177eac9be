"""Kernels built by hand for the Triton backend tests: one builder per form, plus the checker.

Each builder makes a :class:`~lumc.ir.kernels.Kernel` whose meaning is written with Tensor methods
over placeholders ``in0..``; :func:`check` runs it through the generated Triton code (the interpreter
on CPU) and compares with the reference executor on the same meaning.
"""
from __future__ import annotations

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.kernels import Kernel
from lumc.ir.tensor import Tensor
from lumc.ir.library.conv import conv
from lumc.ir.library.norm import layer_norm, rms_norm, softmax
from lumc.ir.library.reduce import prefix_contraction

# (rtol, atol) per output dtype for kernels that reassociate sums; values compared in float64
TOL = {"f64": (1e-9, 1e-12), "f32": (2e-5, 2e-5), "f16": (2e-2, 2e-2), "bf16": (3e-2, 3e-2),
       "i64": (0, 0), "i32": (0, 0), "i8": (0, 0), "u8": (0, 0), "bool": (0, 0)}


def make_kernel(form: str, build, specs, attrs=()) -> Kernel:
    """``build(*tensors) -> Tensor | tuple`` over placeholders of ``specs = [(shape, dtype)]``."""
    ins = {f"in{i}": input_node(f"in{i}", tuple(s), d) for i, (s, d) in enumerate(specs)}
    outs = build(*[Tensor(n) for n in ins.values()])
    if isinstance(outs, Tensor):
        outs = (outs,)
    return Kernel(form, Graph(ins, {f"out{i}": t.node for i, t in enumerate(outs)}), tuple(attrs))


def random_inputs(kernel: Kernel, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, n in kernel.meaning.inputs.items():
        d = n.dtype
        if d.is_float:
            a = (rng.standard_normal(n.shape) * scale).astype(np.float32).astype(d.np)
        elif d.is_bool:
            a = rng.random(n.shape) < 0.5
        else:
            a = rng.integers(-5 if d.kind == "int" else 0, 6, size=n.shape).astype(d.np)
        out[name] = a
    return out


def check(kernel: Kernel, inputs: dict | None = None, variant=None, config=None, tol=None,
          seed: int = 0):
    """Run ``kernel`` through Triton and the reference; assert equal outputs. Returns the kernel."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.backends.triton import TritonKernel
    from lumc.backends.triton.launch import to_numpy
    inputs = random_inputs(kernel, seed) if inputs is None else inputs
    ref = ReferenceExecutor(kernel.meaning)(inputs)
    tk = TritonKernel(kernel, variant)
    outs = tk(*[inputs[n] for n in kernel.meaning.inputs], config=config)
    for (name, r), o in zip(ref.items(), outs):
        got = to_numpy(o)
        assert got.shape == r.shape, (name, got.shape, r.shape)
        assert got.dtype == r.dtype, (name, got.dtype, r.dtype)
        rtol, atol = tol or TOL[kernel.meaning.outputs[name].dtype.name]
        finite = np.abs(r[np.isfinite(r)].astype(np.float64)) if r.dtype.kind == "f" or \
            r.dtype == dt.bf16.np else np.zeros(0)
        # absolute tolerance relative to the output's scale: sums of K terms cancel to small values
        atol = atol * max(1.0, float(finite.max()) if finite.size else 1.0)
        if rtol == 0 and atol == 0:
            np.testing.assert_array_equal(got, r, err_msg=f"{kernel.form} {name}")
        else:
            np.testing.assert_allclose(got.astype(np.float64), r.astype(np.float64), rtol=rtol,
                                       atol=atol, equal_nan=True, err_msg=f"{kernel.form} {name}")
    return tk


# ---- builders per form ---------------------------------------------------------------------------
def attention(scale: float, causal: bool = False, bias: bool = False, bool_mask: bool = False):
    """``softmax(q k^T * scale [+ bias] [masked]) v`` with Tensor ops (as a model would write it)."""
    def f(q, k, v, *rest):
        s = (q @ k.transpose(-1, -2)) * scale
        if causal:
            L, S = s.shape[-2], s.shape[-1]
            qi = Tensor.iota((L, S), 0)
            ki = Tensor.iota((L, S), 1)
            s = ki.le(qi).where(s, float("-inf"))
        if bias:
            s = s + rest[0]
        if bool_mask:
            s = rest[0].where(s, float("-inf"))
        return softmax(s, -1).cast(q.dtype) @ v
    return f


def softmax_kernel(shape, d, axis=-1):
    return make_kernel("softmax", lambda x: softmax(x, axis), [(shape, d)])


def layernorm_kernel(shape, d):
    n = shape[-1]
    return make_kernel("layernorm", lambda x, s, b: layer_norm(x, s, b)[0],
                       [(shape, d), ((n,), d), ((n,), d)])


def rmsnorm_kernel(shape, d):
    return make_kernel("rmsnorm", lambda x, s: rms_norm(x, s), [(shape, d), ((shape[-1],), d)])


def matmul_kernel(m, k, n, d, epilogue=False):
    if epilogue:
        return make_kernel("matmul", lambda a, b, c: (a @ b + c).maximum(0.0),
                           [((m, k), d), ((k, n), d), ((n,), d)])
    return make_kernel("matmul", lambda a, b: a @ b, [((m, k), d), ((k, n), d)])


def conv_kernel(d):
    return make_kernel("matmul", lambda x, w, b: conv(x, w, b, pads=[1, 1, 1, 1], strides=[2, 1]),
                       [((2, 3, 9, 11), d), ((5, 3, 3, 3), d), ((5,), d)])


__all__ = ["TOL", "make_kernel", "random_inputs", "check", "attention", "softmax_kernel",
           "layernorm_kernel", "rmsnorm_kernel", "matmul_kernel", "conv_kernel", "dt", "Tensor"]


def assert_compiles_for_hopper(rendered, cfg) -> None:
    """``rendered`` at ``cfg`` compiled ahead of time for cuda:90 (no GPU needed): no error, no
    spilled bytes, and tensor-core instructions (HGMMA or HMMA) in its SASS."""
    from lumc.backends.triton.aot import compile_aot
    r = compile_aot(rendered, cfg)
    assert r.error is None, r.error
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert any(op.startswith(("HGMMA", "HMMA")) for op in r.tensor_core), r.tensor_core


# ---- torch modules through the e-graph --------------------------------------------------------
def rotate_half(x):
    """RoPE's ``cat(-x2, x1)`` over the last axis (Llama's ``rotate_half``), on torch tensors."""
    import torch
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def egraph_candidates_checked(mod, x, k: int = 64):
    """The e-graph's candidates for ``mod(x)`` (a torch module of one tensor), each run on the
    reference executor and checked against torch eager (rtol 1e-4, atol 1e-5)."""
    import torch
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    from lumc.compiler.frontends.torch_frontend.capture import import_torch
    from lumc.compiler.runtime.program import run_program_reference
    g = import_torch(mod, (x,)).graph
    res = egraph_candidates(g, "h200", k=k)
    feed = {next(iter(g.inputs)): x.numpy()}
    with torch.no_grad():
        want = mod(x).numpy()
    for p in res.candidates:
        got = next(iter(run_program_reference(p, g, feed).values()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=p.label)
    return res


def run_calls(prog, feeds: dict, cfg=None, space: str | None = None) -> dict:
    """Every call of program ``prog`` through its generated Triton kernel, in order, and
    ``{id(model node): numpy array}`` of every value they write; ``feeds`` by model input name;
    ``cfg`` for the kernels of config space ``space`` (the others at their run config)."""
    from lumc.backends.triton.launch import TritonKernel, to_numpy
    env = {}
    for call in prog.calls:
        args = [env[id(n)] if id(n) in env else (feeds[n.arg.name] if n.op == "Input"
                                                 else n.arg.value) for n in call.inputs]
        tk = TritonKernel(call.kernel)
        got = tk(*args, config=cfg if tk.rendered.config_space == space else None)
        for node_, o in zip(call.outputs, got):
            env[id(node_)] = to_numpy(o)
    return env


def _qkv_cache(x, w, b):
    """``(q, k, v)`` of a merged projection, the key and value split into 12 heads of 64."""
    from lumc.ir.tensor import split
    q, k, v = split(x @ w + b, [768, 768, 768], 1)
    return (q, *(t.reshape((128, 12, 64)).permute((1, 0, 2)) for t in (k, v)))


def every_form_kernels() -> list[tuple[str, Kernel, str | None]]:
    """``(case, kernel, variant)`` for every kernel form at GPU-filling sizes, with the cases whose
    Triton code differs (int64 indexing, looped rows, masks, split TF32, paired and mlp
    contractions): what the ahead-of-time compile tests build for ``cuda:90``."""
    from lumc.backends.triton.benchcases import bench_cases
    kernels = [(c.name, c.kernel, None) for c in bench_cases(dt.bf16)]
    kernels += [("matmul-f16", bench_cases(dt.f16)[6].kernel, None),
                ("matmul-f32", bench_cases(dt.f32)[6].kernel, None),
                ("softmax-looped", softmax_kernel((1024, 65536), dt.bf16), "looped"),
                ("layernorm-looped", layernorm_kernel((1024, 65536), dt.bf16), "looped"),
                # indices past 2**31: int64 index arithmetic must compile too
                ("pointwise-int64", make_kernel("pointwise", lambda a: a.sigmoid(),
                                                [((2 ** 31 + 8,), dt.bf16)]), None),
                ("reduction-int64", make_kernel("reduction", lambda a: a.max(0),
                                                [((2 ** 20 + 1, 2049), dt.bf16)]), None),
                ("matmul-int64", make_kernel("matmul", lambda a, b: a @ b,
                                             [((65537, 32768), dt.bf16), ((32768, 64), dt.bf16)]),
                 None),
                # BERT's select mask: two bool paddings combined in the loop, fill -inf
                ("attention-select", make_kernel(
                    "attention", lambda q, k, v, qm, km: softmax(qm.logical_and(km).where(
                        (q @ k.transpose(-1, -2)) * 0.125, float("-inf")), -1).cast(q.dtype) @ v,
                    [((8, 16, 512, 64), dt.bf16)] * 3 + [((1, 1, 512, 1), dt.bool_),
                                                         ((8, 1, 1, 512), dt.bool_)]), None),
                # fp32 (split TF32) at BERT-base's shape with its padding mask: the key loop's
                # pipelined K/V and mask tiles (the 128x64, 2-stage tile took 232 KiB)
                ("attention-f32", make_kernel(
                    "attention", lambda q, k, v, km: softmax(km.where(
                        (q @ k.transpose(-1, -2)) * 0.125, float("-inf")), -1) @ v,
                    [((1, 12, 128, 64), dt.f32)] * 3 + [((1, 1, 1, 128), dt.bool_)]), None),
                # CumSum as a scan (render_scan): int64, reversed, a carried sum over 4 blocks;
                # float with the library's finite-operand prologue, exclusive, not the last axis
                ("scan-i64", make_kernel("scan", lambda a: prefix_contraction(
                    a, 1, reverse=True), [((64, 4097), dt.i64)]), None),
                ("scan-f32", make_kernel("scan", lambda a: prefix_contraction(
                    a.lt(a.scalar_like(np.inf)).where(a.scalar_like(-np.inf).lt(a).where(
                        a, a.scalar_like(0.0)), a.scalar_like(0.0)), 1, exclusive=True),
                    [((8, 4096, 16), dt.f32)]), None),
                # a gated MLP's gate and up in one kernel: two b tiles, two accumulators
                ("matmul-paired", make_kernel(
                    "matmul", lambda x, wg, wu: (x @ wg).maximum(0.0) * (x @ wu),
                    [((1024, 1024), dt.bf16), ((1024, 2816), dt.bf16), ((1024, 2816), dt.bf16)],
                    [("paired", True)]), None),
                # GPT-2's QKV projection returning its key and value as a cache ([B, H, S, D]):
                # stored through the views by the matmul (fusion_stored), the digits' int math
                ("matmul-stored", make_kernel("matmul", _qkv_cache,
                                              [((128, 768), dt.bf16), ((768, 2304), dt.bf16),
                                               ((2304,), dt.bf16)]), None),
                # BERT-base's feed-forward block in fp32 (split TF32): the F_TILES loop's live
                # column-tile accumulators
                ("mlp-f32", make_kernel(
                    "mlp", lambda x, w1, w2: (x @ w1).maximum(0.0) @ w2,
                    [((128, 768), dt.f32), ((768, 3072), dt.f32), ((3072, 768), dt.f32)]), None)]
    return kernels
