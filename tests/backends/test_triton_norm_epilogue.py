"""Post-LN fusion: a LayerNorm or RMSNorm read by a projection and by a later contraction's residual
add is formed on load in both (``lumc.backends.triton.norm_epilogue``, ``compiler/core/fusion.py``),
run in Triton (the interpreter on CPU) against numpy in float64.

Each case builds its own graph: ragged rows and widths (not multiples of the tiles), rank 2 and 3,
rows of very different scale (the statistics are per row), a residual read only by a contraction's
epilogue (statistics computed in the epilogue's own loops), and one read by a projection too (the
first kernel writes the row values, the later one reads them)."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton import configs
from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.launch import TritonKernel, to_numpy
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.core.kernel_builder import build_call
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import activations, norm
from lumc.ir.tensor import Tensor
from triton_cases import run_calls


def _norm64(kind, x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    if kind == "rmsnorm":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * g + b


def _norm(kind, s, g, b):
    if kind == "rmsnorm":
        return norm.rms_norm(s, Tensor.const(g))
    return norm.layer_norm(s, Tensor.const(g), Tensor.const(b))[0]


def _weights(rng, width, ffn):
    return {"g": rng.uniform(0.5, 1.5, width).astype(np.float32),
            "b": (rng.standard_normal(width) * 0.1).astype(np.float32),
            "wa": (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
            "w1": (rng.standard_normal((width, ffn)) / np.sqrt(width)).astype(np.float32),
            "b1": rng.standard_normal(ffn).astype(np.float32),
            "w2": (rng.standard_normal((ffn, width)) / np.sqrt(ffn)).astype(np.float32),
            "b2": rng.standard_normal(width).astype(np.float32)}


def _post_ln_block(shape, ffn, kind, rng):
    """BERT's feed-forward half: ``y = N(x @ Wa + x)``, ``z = relu(y @ W1 + b1) @ W2 + b2 + y``."""
    width = shape[-1]
    p = _weights(rng, width, ffn)
    x = Tensor(input_node("x", shape, dt.f32))
    y = _norm(kind, x @ Tensor.const(p["wa"]) + x, p["g"], p["b"])
    h = activations.relu(y @ Tensor.const(p["w1"]) + Tensor.const(p["b1"]))
    z = h @ Tensor.const(p["w2"]) + Tensor.const(p["b2"]) + y

    def want(xv):
        yv = _norm64(kind, xv @ p["wa"].astype(np.float64) + xv, p["g"], p["b"])
        return np.maximum(yv @ p["w1"] + p["b1"], 0) @ p["w2"] + p["b2"] + yv
    return Graph({"x": x.node}, {"z": z.node}), want


def _residual_only(shape, ffn, kind, rng):
    """``z = h @ W2 + N(s)``: the norm's one reader is the contraction's epilogue."""
    width = shape[-1]
    p = _weights(rng, width, ffn)
    h = Tensor(input_node("h", shape[:-1] + (ffn,), dt.f32))
    s = Tensor(input_node("s", shape, dt.f32))
    z = h @ Tensor.const(p["w2"]) + Tensor.const(p["b2"]) + _norm(kind, s * 2.0, p["g"], p["b"])

    def want(hv, sv):
        return hv @ p["w2"].astype(np.float64) + p["b2"] + _norm64(kind, 2.0 * sv, p["g"], p["b"])
    return Graph({"h": h.node, "s": s.node}, {"z": z.node}), want


def _on_load_program(graph):
    res = egraph_candidates(graph, "h200", k=16)
    progs = [p for p in res.candidates if p.label.endswith("+norm-on-load")]
    assert progs, [p.label for p in res.candidates]
    return progs[0]


def _x(shape, rng, scale=1.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    flat[0] *= 300.0            # rows of very different scale: statistics are per row
    flat[-1] = flat[-1] * 1e-3 + 5.0
    return x


def _run(prog, feeds: dict, cfg=None) -> dict:
    """Every kernel through Triton; ``cfg`` for those of space ``matmul_rows``."""
    return run_calls(prog, feeds, cfg, "matmul_rows")


def _close(got, want):
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())


CFGS = (None,
        configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8, N_TILES=2,
                     PRECISION="ieee"),
        configs.make(4, 2, BLOCK_M=8, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, N_TILES=4,
                     PRECISION="ieee"))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape,ffn", [((13, 40), 24), ((1, 9, 48), 72)])
def test_residual_normalized_in_the_epilogue(kind, shape, ffn):
    """The statistics of the residual's rows over N, in the contraction kernel, under configs
    whose column tiles are ragged and grouped N_TILES at a time (the last group past N)."""
    rng = np.random.default_rng(len(shape) * 5 + ffn)
    graph, want = _residual_only(shape, ffn, kind, rng)
    prog = _on_load_program(graph)
    assert [c.kernel.form for c in prog.calls] == ["matmul"], prog.notes
    call = prog.calls[0]
    tk = TritonKernel(call.kernel)
    assert tk.rendered.config_space == "matmul_rows"
    # one pass over the residual's rows: a layer norm's mean and variance together
    assert tk.source.count("for s_start in range") == 1
    assert ("mom_m2" in tk.source) == (kind == "layernorm")
    hv = rng.standard_normal(shape[:-1] + (ffn,)).astype(np.float32)
    sv = _x(shape, rng)
    ref = want(hv.astype(np.float64), sv.astype(np.float64))
    args = [{"h": hv, "s": sv}[n.arg.name] if n.op == "Input" else n.arg.value
            for n in call.inputs]
    for cfg in CFGS:
        _close(to_numpy(tk(*args, config=cfg)[0]), ref)
    mref = ReferenceExecutor(call.kernel.meaning, "float64")(
        {f"in{i}": v for i, v in enumerate(args)})["out0"]
    _close(mref, ref)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape,ffn", [((13, 40), 24), ((1, 9, 48), 72)])
def test_post_ln_block_is_three_contractions_and_shares_its_statistics(kind, shape, ffn):
    """BERT's post-LN feed-forward half: the norm is no kernel; the up-projection computes its row
    statistics (prologue) and writes the row values, the down-projection reads them in its
    epilogue instead of recomputing them."""
    rng = np.random.default_rng(len(shape) * 3 + ffn)
    graph, want = _post_ln_block(shape, ffn, kind, rng)
    prog = _on_load_program(graph)
    assert [c.kernel.form for c in prog.calls] == ["matmul"] * 3, prog.notes
    up, down = prog.calls[1], prog.calls[2]
    rows = up.outputs[1:]
    assert rows and all(r.numel == int(np.prod(shape[:-1])) for r in rows)
    assert all(any(r is n for n in down.inputs) for r in rows)
    assert not any(n.op in ("SumReduce", "MaxReduce") for n in down.kernel.meaning.nodes()
                   if n.srcs and n.srcs[0].op != "Mul")
    xv = _x(shape, rng, 0.5)
    ref = want(xv.astype(np.float64))
    for cfg in CFGS:
        env = _run(prog, {"x": xv}, cfg)
        _close(env[id(down.outputs[0])], ref)
    # the row values the up-projection writes are the statistics of its rows
    s64 = xv.astype(np.float64) @ np.asarray(prog.calls[0].inputs[1].arg.value, np.float64) + xv
    s64 = s64.reshape(-1, shape[-1])
    rstd = 1 / np.sqrt(((s64 - s64.mean(-1, keepdims=True)) ** 2 if kind == "layernorm"
                        else s64 * s64).mean(-1) + 1e-5)
    got = [env[id(r)].reshape(-1) for r in rows]
    assert any(np.allclose(g, rstd, rtol=1e-4) for g in got), (got, rstd)
    if kind == "layernorm":
        assert any(np.allclose(g, s64.mean(-1), rtol=1e-4, atol=1e-4) for g in got)


def test_a_residual_read_through_a_transpose_is_refused():
    """A row value read at a position that is not the output tile's row (the residual is a
    transposed normalized value) cannot resolve to the tile's statistics: one error naming it."""
    n = 8
    x = Tensor(input_node("x", (n, n), dt.f32))
    s = Tensor(input_node("s", (n, n), dt.f32))
    w = Tensor.const(np.eye(n, dtype=np.float32))
    z = x @ w + norm.rms_norm(s, Tensor.const(np.ones(n, np.float32))).transpose(0, 1)
    call = build_call([z.node], lambda node_: False, push_views=False)
    with pytest.raises(RenderError, match="not the tile's row"):
        TritonKernel(call.kernel)


def test_epilogue_statistics_kernel_compiles_for_hopper_without_spills():
    """BERT's down-projection (128x3072 @ 3072x768) with its residual LayerNorm formed on load in
    the epilogue, compiled ahead of time for cuda:90 (no GPU needed): tensor-core SASS, no spills."""
    from triton_cases import assert_compiles_for_hopper
    rng = np.random.default_rng(4)
    graph, _ = _residual_only((1, 128, 768), 3072, "layernorm", rng)
    tk = TritonKernel(_on_load_program(graph).calls[0].kernel)
    cfg = configs.make(4, 3, BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, N_TILES=2,
                       PRECISION="tf32x3")
    assert_compiles_for_hopper(tk.rendered, cfg)


def test_the_epilogue_statistics_are_priced(monkeypatch):
    """The simulator charges the epilogue's statistics loops (their row re-reads and CUDA-core
    work); without them the same kernel would be priced lower."""
    from lumc.backends import simulator
    from lumc.backends.devices import get_device
    rng = np.random.default_rng(2)
    k = _on_load_program(_residual_only((1, 128, 768), 3072, "layernorm", rng)[0]).calls[0].kernel
    c = simulator.contraction_dims(k)
    assert (c.m, c.n, c.k) == (128, 768, 3072)
    work = simulator.row_statistics_work(k, c)
    assert work.prologue == 0 and work.epilogue == 1 and work.epilogue_ops >= 2   # one pass
    cfg = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "N_TILES": 1,
           "num_warps": 4, "num_stages": 3, "PRECISION": "tf32x3"}
    dev = get_device("h200")
    priced = simulator.simulate_kernel_time(k, cfg, dev)
    monkeypatch.setattr(simulator, "row_statistics_work", lambda kernel, c: simulator.RowWork())
    simulator._STATIC.clear()
    assert simulator.simulate_kernel_time(k, cfg, dev) < priced
    simulator._STATIC.clear()


@pytest.mark.parametrize("which", ["residual", "shared"])
def test_size_generic_kernels_serve_every_row_count(which):
    """A range's plan renders each kernel once with the row count a runtime argument
    (``size_generic``): the epilogue's statistics, and the row values the first kernel writes,
    at several row counts against the reference on the re-sized meaning."""
    from lumc.backends.triton.size_generic import SizedKernel
    from lumc.ir.symbolic import Resizer, probing
    p = 61
    rng = np.random.default_rng(13)
    with probing([p]):
        if which == "residual":
            graph, _ = _residual_only((1, p, 40), 24, "layernorm", rng)
        else:
            graph, _ = _post_ln_block((1, p, 40), 24, "layernorm", rng)
        prog = _on_load_program(graph)
    kernels = [c.kernel for c in prog.calls if TritonKernel(c.kernel).rendered.config_space
               == "matmul_rows"]
    assert kernels, [c.kernel.form for c in prog.calls]
    for k in kernels:
        sk = SizedKernel(k, {p: "L0"})
        assert sk.rendered.size_args == ("L0",)
        for n in (1, 6, 33, 64):
            m = Resizer({p: n}).graph(k.meaning)
            feed = {name: rng.standard_normal(ph.shape).astype(ph.dtype.np)
                    for name, ph in m.inputs.items()}
            ref = ReferenceExecutor(m, "float64")(feed)
            got = sk(*[feed[name] for name in m.inputs], sizes={"L0": n})
            for (name, want), g in zip(ref.items(), got):
                _close(to_numpy(g), want)


@pytest.mark.parametrize("residual", ["half", "negated", "relu"])
def test_a_residual_transformed_elementwise_is_formed_on_load(residual):
    """``f(y) + 0.5 y`` (DeepNorm-style), ``f(y) - y`` and ``f(y) + relu(y)``: the elementwise op
    on the norm is inlined into the down-projection's epilogue, so the norm is still no kernel."""
    rng = np.random.default_rng(21)
    shape, ffn = (1, 11, 40), 56
    p = _weights(rng, 40, ffn)
    x = Tensor(input_node("x", shape, dt.f32))
    y = _norm("layernorm", x @ Tensor.const(p["wa"]) + x, p["g"], p["b"])
    h = activations.relu(y @ Tensor.const(p["w1"])) @ Tensor.const(p["w2"])
    tail = {"half": lambda t: t * 0.5, "negated": lambda t: t * -1.0,
            "relu": activations.relu}[residual]
    graph = Graph({"x": x.node}, {"z": (h + tail(y)).node})
    prog = _on_load_program(graph)
    assert [c.kernel.form for c in prog.calls] == ["matmul"] * 3, prog.notes
    xv = _x(shape, rng, 0.5)
    yv = _norm64("layernorm", xv @ p["wa"].astype(np.float64) + xv, p["g"], p["b"])
    tv = {"half": 0.5 * yv, "negated": -yv, "relu": np.maximum(yv, 0)}[residual]
    want = np.maximum(yv @ p["w1"], 0) @ p["w2"] + tv
    _close(_run(prog, {"x": xv})[id(prog.calls[-1].outputs[0])], want)


def test_a_norm_read_by_a_batched_contraction_is_written_and_the_others_still_fuse():
    """A norm read in a batched contraction's epilogue cannot have its statistics there (the
    kernel refuses batch dims): that norm is written, the candidate still renders, and a post-LN
    norm elsewhere in the same model is formed on load."""
    rng = np.random.default_rng(22)
    b, t, d = 3, 9, 24
    x = Tensor(input_node("x", (b, t, d), dt.f32))
    w = [Tensor.const((rng.standard_normal((d, d)) / 5).astype(np.float32)) for _ in range(5)]
    g, bias = Tensor.const(np.ones(d, np.float32)), Tensor.const(np.zeros(d, np.float32))
    y1 = norm.layer_norm(x @ w[0] + x, g, bias)[0]
    att = ((x @ w[1]) @ (x @ w[2]).transpose(-1, -2)) @ (x @ w[3])    # batched over b
    z1 = att + y1                                                      # y1 in a batched epilogue
    y2 = norm.layer_norm(z1 @ w[4] + z1, g, bias)[0]
    z2 = activations.relu(y2 @ w[0]) @ w[1] + y2                       # post-LN: y2 fuses
    graph = Graph({"x": x.node}, {"z": z2.node})
    progs = {p.label: p for p in egraph_candidates(graph, "h200", k=16).candidates}
    prog = progs["egraph-argmin+norm-on-load"]
    assert [c.kernel.form for c in prog.calls].count("layernorm") == 1, prog.notes
    assert any("normalization not formed on load" in n for n in prog.notes)
    assert any(": normalization formed on load in" in n for n in prog.notes)
    xv = rng.standard_normal((b, t, d)).astype(np.float32)
    want = ReferenceExecutor(graph, "float64")({"x": xv})["z"]
    for label, p in progs.items():
        if label.endswith("+norm-on-load"):     # every kernel renders, and computes the model
            _close(_run(p, {"x": xv})[id(p.calls[-1].outputs[0])], want)
