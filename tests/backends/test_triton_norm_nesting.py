"""Sandwich norms: a normalization read inside another normalization's kernel is formed on load there.

Gemma-2/3, OLMo-2 and GLM-4 normalize a sublayer's output before the residual add,
``h = x + N_post(s)``, and read ``h`` twice: through the next pre-norm (``N_pre(h) @ W``) and as the
residual of the next post-norm kernel (``h + N_post2(d)``). Neither reader is a contraction, so
``h`` was always written by a norm kernel of its own: two per layer. Now (``fusion_norms``) ``h``
is formed on load inside both: the pre-norm's contraction computes ``h``'s row statistics, then
the pre-norm's, in its prologue loops (nested), and the row kernel of the next post-norm takes
``h``'s statistics as one more row reduction. Nesting stops one deep: the inputs of a norm formed
on load that way are written, so every layer keeps one norm kernel (the residual stream is
written once per layer) instead of two.

Each case builds its own graph and runs every kernel through Triton (the interpreter on CPU)
against numpy in float64: ragged widths, rows of very different scale, both norm kinds."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends import simulator
from lumc.backends.devices import get_device
from lumc.backends.triton import configs
from lumc.backends.triton.launch import TritonKernel
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.core.fusion import greedy_program
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import norm
from lumc.ir.tensor import Tensor
from triton_cases import run_calls

NORMS = ("layernorm", "rmsnorm")


def _norm(kind, s, g, b):
    if kind == "rmsnorm":
        return norm.rms_norm(s, Tensor.const(g))
    return norm.layer_norm(s, Tensor.const(g), Tensor.const(b))[0]


def _norm64(kind, x, g, b, eps=1e-5):
    if kind == "rmsnorm":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * g + b


def _sandwich(shape, ffn, layers, kind, rng):
    """``layers`` sandwich blocks (a projection standing in for attention), then a final norm:
    ``h = x + Npa(Nin(x) @ Wa)``, ``x = h + Npf2(relu(Npf(h) @ W1) @ W2)``."""
    width = shape[-1]

    def nparams():
        return (rng.uniform(0.5, 1.5, width).astype(np.float32),
                (rng.standard_normal(width) * 0.1).astype(np.float32))

    ps = [{"nin": nparams(), "npa": nparams(), "npf": nparams(), "npf2": nparams(),
           "wa": (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
           "w1": (rng.standard_normal((width, ffn)) / np.sqrt(width)).astype(np.float32),
           "w2": (rng.standard_normal((ffn, width)) / np.sqrt(ffn)).astype(np.float32)}
          for _ in range(layers)]
    fin = nparams()
    x0 = Tensor(input_node("x", shape, dt.f32))
    x = x0
    for p in ps:
        h = x + _norm(kind, _norm(kind, x, *p["nin"]) @ Tensor.const(p["wa"]), *p["npa"])
        u = (_norm(kind, h, *p["npf"]) @ Tensor.const(p["w1"])).maximum(0.0)
        x = h + _norm(kind, u @ Tensor.const(p["w2"]), *p["npf2"])
    out = _norm(kind, x, *fin)

    def want(xv):
        x = xv.astype(np.float64)
        for p in ps:
            h = x + _norm64(kind, _norm64(kind, x, *p["nin"]) @ p["wa"], *p["npa"])
            u = np.maximum(_norm64(kind, h, *p["npf"]) @ p["w1"], 0)
            x = h + _norm64(kind, u @ p["w2"], *p["npf2"])
        return _norm64(kind, x, *fin)
    return Graph({"x": x0.node}, {"y": out.node}), want


def _x(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    flat[0] *= 300.0            # rows of very different scale: statistics are per row
    flat[-1] = flat[-1] * 1e-3 + 5.0
    return x


def _on_load(graph, mlp: bool = False):
    res = egraph_candidates(graph, "h200", k=32)
    progs = [p for p in res.candidates if "+norm-on-load" in p.label
             and ("+mlp" in p.label) == mlp]
    assert progs, [p.label for p in res.candidates]
    return min(progs, key=lambda p: len(p.calls))


def _run(prog, feeds: dict, cfg=None) -> dict:
    """Every kernel through Triton; ``cfg`` for those of space ``matmul_rows``."""
    return run_calls(prog, feeds, cfg, "matmul_rows")


CFGS = (None,
        configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8, N_TILES=2,
                     PRECISION="ieee"))


@pytest.mark.parametrize("kind", NORMS)
def test_sandwich_layers_mlp_twin_matches_float64(kind):
    """The ``+mlp`` twin of the same plan (``fusion_chain``): each FFN's up-projection, activation
    and down-projection one mlp kernel, whose first operand is the pre-FFN norm formed on load over
    a residual plus a norm (nested statistics); values through Triton match float64 under ragged
    tiles (M = 13, F = 24 split over two F blocks by the interpreter's config)."""
    rng = np.random.default_rng(11)
    graph, want = _sandwich((13, 40), 24, 2, kind, rng)
    prog = _on_load(graph, mlp=True)
    forms = [c.kernel.form for c in prog.calls]
    assert forms.count("mlp") == 2 and forms.count("matmul") == 2, forms
    xv = _x((13, 40), rng)
    ref = want(xv)
    got = _run(prog, {"x": xv})[id(prog.outputs["y"])]
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kind", NORMS)
@pytest.mark.parametrize("shape,ffn,layers", [((13, 40), 24, 2), ((1, 9, 48), 72, 3)])
def test_sandwich_layers_keep_one_norm_kernel_each(kind, shape, ffn, layers):
    """Per layer three contractions and one norm kernel (was two): the post-attention norm plus
    residual is formed on load in the pre-FFN norm's contraction (nested statistics) and in the
    post-FFN norm's row kernel; values through Triton match float64 under ragged tiles."""
    rng = np.random.default_rng(len(shape) * 7 + ffn + layers)
    graph, want = _sandwich(shape, ffn, layers, kind, rng)
    prog = _on_load(graph)
    forms = [c.kernel.form for c in prog.calls]
    assert forms.count("matmul") == 3 * layers, forms
    assert forms.count(kind) == layers + 1, (forms, prog.notes)
    assert any("nest one deep" in n for n in prog.notes), prog.notes
    xv = _x(shape, rng)
    ref = want(xv)
    out = prog.outputs["y"]
    for cfg in CFGS:
        got = _run(prog, {"x": xv}, cfg)[id(out)]
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2e-4,
                                   atol=2e-4 * np.abs(ref).max())


def _nested_matmul(kind):
    rng = np.random.default_rng(11)
    graph, _ = _sandwich((1, 128, 256), 512, 2, kind, rng)
    prog = _on_load(graph)
    for call in prog.calls:
        k = call.kernel
        if k.form == "matmul":
            c = simulator.contraction_dims(k)
            work = simulator.row_statistics_work(k, c)
            if work.operand_buffers == 2:
                return k, c, work
    raise AssertionError([c.kernel.form for c in prog.calls])


@pytest.mark.parametrize("kind", NORMS)
def test_nested_statistics_are_priced_per_buffer(kind, monkeypatch):
    """The contraction forming ``N_pre(x + N_post(s))`` on load reads two buffers per operand tile
    and in the nested statistic's pass: the simulator charges three buffer passes (``s``, then
    ``x`` and ``s``) and the operand's column-tile re-reads twice; charged as one buffer the same
    kernel would be priced lower."""
    k, c, work = _nested_matmul(kind)
    assert (c.m, c.k) == (128, 256)
    assert work.prologue == 3, work
    cfg = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "N_TILES": 1,
           "num_warps": 4, "num_stages": 3, "PRECISION": "tf32x3"}
    dev = get_device("h200")
    simulator._STATIC.clear()
    priced = simulator.simulate_kernel_time(k, cfg, dev)
    monkeypatch.setattr(simulator, "row_statistics_work",
                        lambda kernel, c: simulator.RowWork(1, work.prologue_ops))
    simulator._STATIC.clear()
    assert simulator.simulate_kernel_time(k, cfg, dev) < priced
    simulator._STATIC.clear()


def test_a_norm_read_across_rows_by_another_norm_stays_a_kernel():
    """``h = x + N(s)`` read by a norm over the other axis (its rows are ``h``'s columns): the
    statistics of the rows one program holds are not ``h``'s, so ``h`` is written; the program
    still matches float64."""
    rng = np.random.default_rng(5)
    n, m = 12, 20
    g1 = rng.uniform(0.5, 1.5, m).astype(np.float32)
    g2 = rng.uniform(0.5, 1.5, n).astype(np.float32)
    w = (rng.standard_normal((m, m)) / np.sqrt(m)).astype(np.float32)
    x = Tensor(input_node("x", (n, m), dt.f32))
    h = x + norm.rms_norm(x @ Tensor.const(w), Tensor.const(g1))
    y = norm.rms_norm(h.transpose(0, 1), Tensor.const(g2))
    graph = Graph({"x": x.node}, {"y": y.node})
    new, forms, _ = egraph_candidates(graph, "h200", k=1).best.decoded
    prog = greedy_program(new, forms=forms, norm_prologue=True, norm_epilogue=True)
    assert [c.kernel.form for c in prog.calls].count("rmsnorm") == 2, prog.notes
    assert any("not formed on load" in n for n in prog.notes), prog.notes
    xv = rng.standard_normal((n, m)).astype(np.float32)
    x64 = xv.astype(np.float64)
    h64 = x64 + _norm64("rmsnorm", x64 @ w, g1, None)
    ref = _norm64("rmsnorm", h64.T, g2, None)
    got = _run(prog, {"x": xv})[id(prog.outputs["y"])]
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)


def test_gemma3_layers_are_six_kernels_each():
    """transformers' Gemma-3 (2 layers, random weights): per layer QKV (input norm on load, and
    the previous layer's post-FFN norm nested in it), attention (QK-norms, RoPE), o-proj, the
    post-attention norm kernel (the previous post-FFN norm formed in it too), the paired gate/up
    (the post-attention and pre-FFN norms nested), down; plus the gather and the final norm (the
    last post-FFN norm in it): 2 + 2 * 6, was 2 + 2 * 7. Values against torch eager."""
    transformers = pytest.importorskip("transformers")
    import torch
    from lumc.compiler.frontends.torch_frontend.capture import import_torch
    from lumc.compiler.runtime.program import run_program_reference
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(num_hidden_layers=2, hidden_size=128,
                                        intermediate_size=256, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=32, sliding_window=8,
                                        vocab_size=500, attn_implementation="sdpa",
                                        use_cache=False)
    mod = transformers.Gemma3TextModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    g = import_torch(mod, (ids,)).graph
    fewest = _on_load(g)
    assert len(fewest.calls) == 2 + 2 * 6, fewest.form_counts()
    assert fewest.form_counts().get("rmsnorm") == 3, fewest.form_counts()
    with torch.no_grad():
        want = mod(ids).last_hidden_state.numpy()
    got = run_program_reference(fewest, g, {next(iter(g.inputs)): ids.numpy()})
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", NORMS)
def test_a_post_ln_over_a_sandwich_is_three_contractions(kind):
    """``y = N2(x + N1(x @ Wa))`` read by the up-projection (prologue) and as the down-projection's
    residual (epilogue): ``h = x + N1(...)`` nests inside ``y``'s statistics in both, so the block
    is its three contractions and no norm kernel; ragged tiles match float64."""
    rng = np.random.default_rng(3)
    n, w, f = 13, 40, 24

    def nparams():
        return (rng.uniform(0.5, 1.5, w).astype(np.float32),
                (rng.standard_normal(w) * 0.1).astype(np.float32))
    n1, n2 = nparams(), nparams()
    wa = (rng.standard_normal((w, w)) / np.sqrt(w)).astype(np.float32)
    w1 = (rng.standard_normal((w, f)) / np.sqrt(w)).astype(np.float32)
    w2 = (rng.standard_normal((f, w)) / np.sqrt(f)).astype(np.float32)
    x = Tensor(input_node("x", (n, w), dt.f32))
    y = _norm(kind, x + _norm(kind, x @ Tensor.const(wa), *n1), *n2)
    z = (y @ Tensor.const(w1)).maximum(0.0) @ Tensor.const(w2) + y
    prog = _on_load(Graph({"x": x.node}, {"z": z.node}))
    assert [c.kernel.form for c in prog.calls] == ["matmul"] * 3, prog.notes
    xv = _x((n, w), rng)
    x64 = xv.astype(np.float64)
    y64 = _norm64(kind, x64 + _norm64(kind, x64 @ wa, *n1), *n2)
    ref = np.maximum(y64 @ w1, 0) @ w2 + y64
    for cfg in CFGS:
        got = _run(prog, {"x": xv}, cfg)[id(prog.outputs["z"])]
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2e-4,
                                   atol=2e-4 * np.abs(ref).max())


def test_nested_prologue_compiles_for_hopper_without_spills():
    """The GPU check's sandwich case (``benchcases``: ``N_pre(x + N_post(s)) @ W``, bf16, hidden
    4096) compiled ahead of time for cuda:90 at the default config and a 128x128 tile: no spills,
    tensor-core SASS (the two statistics loops before the main loop cost no registers across it)."""
    from triton_cases import assert_compiles_for_hopper
    from lumc.backends.triton.benchcases import bench_cases
    case = next(c for c in bench_cases(dt.bf16) if c.name == "matmul-sandwich-norm")
    tk = TritonKernel(case.kernel)
    assert tk.rendered.config_space == "matmul_rows"
    assert tk.source.count("for s_start in range") == 2      # s's statistic, then h's
    assert_compiles_for_hopper(tk.rendered, tk.default_config())
    assert_compiles_for_hopper(tk.rendered, configs.make(8, 3, BLOCK_M=128, BLOCK_N=128,
                                                         BLOCK_K=64, GROUP_M=8, N_TILES=1))


def test_every_decoding_candidate_renders():
    """At one token (decoding) the projections are GEMVs rendered as row kernels: a norm formed on
    load in several of them is not given to the first to write its row values (a row kernel
    cannot write a statistic of another shape), and two GEMVs spelled over different operand
    shapes are not paired into one row kernel. Every kernel of every candidate renders (they
    failed, and the search dropped those candidates without a word)."""
    transformers = pytest.importorskip("transformers")
    import torch
    from lumc.compiler.frontends.torch_frontend.capture import import_torch
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(num_hidden_layers=2, hidden_size=64,
                                        intermediate_size=96, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, sliding_window=8,
                                        vocab_size=300, attn_implementation="sdpa",
                                        use_cache=False)
    mod = transformers.Gemma3TextModel(cfg).eval()
    g = import_torch(mod, (torch.randint(0, cfg.vocab_size, (1, 1)),)).graph
    res = egraph_candidates(g, "h200", k=32)
    assert any("+norm-on-load" in p.label for p in res.candidates)
    failed = []
    for p in res.candidates:
        for call in p.calls:
            try:
                TritonKernel(call.kernel).rendered
            except Exception as e:   # noqa: BLE001 - collected, asserted below
                failed.append((p.label, call.kernel.form, str(e)[:120]))
    assert not failed, failed
