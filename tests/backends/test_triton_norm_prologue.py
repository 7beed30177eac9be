"""Pre-LN fusion: a LayerNorm or RMSNorm read only by a contraction is formed on load in the
contraction's kernel (``lumc.backends.triton.norm_prologue``), run in Triton (the interpreter on CPU)
against numpy in float64.

Each case builds its own graph: ragged rows and K (not multiples of the tiles), rank 2 and 3
inputs, a bias and GELU epilogue, two contractions reading one normalization, and rows of
very different scale (the statistics are per row)."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton import configs
from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.launch import TritonKernel, to_numpy
from lumc.backends.triton.norm_prologue import plan_row_prologue
from lumc.backends.triton.contraction import find_contractions
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import activations, norm
from lumc.ir.tensor import Tensor


def _ln64(x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * g
    return y + b if b is not None else y


def _rms64(x, g, eps=1e-5):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def _graph(shape, n, kind, rng, two=False, epilogue=True):
    k = shape[-1]
    x = Tensor(input_node("x", shape, dt.f32))
    g = rng.uniform(0.5, 1.5, k).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32) * 0.1
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    w2 = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    if kind == "layernorm":
        h = norm.layer_norm(x, Tensor.const(g), Tensor.const(b))[0]
    else:
        h = norm.rms_norm(x, Tensor.const(g))
    y = h @ Tensor.const(w)
    if epilogue:
        y = activations.relu(y + Tensor.const(bias))
    outs = {"y": y.node}
    if two:
        outs["z"] = (h @ Tensor.const(w2)).node
    hn = _ln64 if kind == "layernorm" else (lambda v, g_, b_: _rms64(v, g_))

    def want(xv):
        hv = hn(xv, g, b)
        yv = hv @ w
        if epilogue:
            yv = np.maximum(yv + bias, 0)
        res = {"y": yv}
        if two:
            res["z"] = hv @ w2
        return res
    return Graph({"x": x.node}, outs), want


def _fused_program(graph):
    res = egraph_candidates(graph, "h200", k=16)
    progs = [p for p in res.candidates if p.label.endswith("+norm-prologue")]
    assert progs, [p.label for p in res.candidates]
    return progs[0]


def _run_program(prog, feeds: dict) -> dict:
    """Every kernel of ``prog`` through Triton; ``{id(node): array}`` of what they write."""
    env = {}
    for call in prog.calls:
        args = [env[id(n)] if id(n) in env else (feeds[n.arg.name] if n.op == "Input"
                                                 else n.arg.value) for n in call.inputs]
        for node_, o in zip(call.outputs, TritonKernel(call.kernel)(*args)):
            env[id(node_)] = to_numpy(o)
    return env


def _x(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    flat[0] *= 300.0            # rows of very different scale: statistics are per row
    flat[-1] = flat[-1] * 1e-3 + 5.0
    return x


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape,n", [((13, 72), 40), ((1, 9, 48), 24)])
def test_norm_formed_on_load_in_the_matmul_kernel(kind, shape, n):
    rng = np.random.default_rng(len(shape) * 7 + n)
    graph, want = _graph(shape, n, kind, rng)
    prog = _fused_program(graph)
    assert [c.kernel.form for c in prog.calls] == ["matmul"], prog.notes
    call = prog.calls[0]
    tk = TritonKernel(call.kernel)
    # one pass over the rows: a layer norm's mean and variance together (Chan's update)
    assert "tl.dot(" in tk.source and tk.source.count("for s_start in range") == 1
    assert ("mom_m2" in tk.source) == (kind == "layernorm")
    assert tk.rendered.config_space == "matmul_rows"
    xv = _x(shape, rng)
    consts = [c.arg.value for c in call.inputs[1:]]
    ref = want(xv)["y"].reshape(-1, n)
    # one program per row block, then column tiles grouped N_TILES at a time (the last group
    # partly past N: masked), and ragged row blocks
    for cfg in (None, configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8,
                                   N_TILES=2, PRECISION="ieee"),
                configs.make(4, 2, BLOCK_M=8, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, N_TILES=4,
                             PRECISION="ieee")):
        got = to_numpy(tk(xv, *consts, config=cfg)[0]).reshape(-1, n)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # the kernel's meaning (what the reference executor and the checks run) agrees too
    mref = ReferenceExecutor(call.kernel.meaning)(
        {f"in{i}": v for i, v in enumerate([xv] + consts)})["out0"].reshape(-1, n)
    np.testing.assert_allclose(mref, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_one_norm_read_by_two_contractions_is_formed_in_each():
    rng = np.random.default_rng(5)
    graph, want = _graph((11, 40), 24, "layernorm", rng, two=True, epilogue=False)
    prog = _fused_program(graph)
    assert [c.kernel.form for c in prog.calls].count("layernorm") == 0, prog.notes
    xv = _x((11, 40), rng)
    env = _run_program(prog, {"x": xv})
    ref = want(xv)
    for name, node_ in prog.outputs.items():   # the program's nodes (the e-graph's graph)
        base = node_
        while id(base) not in env and base.op == "View":   # an output read through a view
            base = base.srcs[0]
        np.testing.assert_allclose(env[id(base)].reshape(ref[name].shape), ref[name], rtol=1e-4,
                                   atol=1e-4 * np.abs(ref[name]).max())


def test_a_reduction_that_is_not_a_row_statistic_is_refused():
    """sum over the rows (axis 0) feeding the operand is not a statistic of the tile's rows."""
    x = Tensor(input_node("x", (6, 8), dt.f32))
    s = x.sum(axes=(0,), keepdims=True)
    y = (x - s) @ Tensor.const(np.ones((8, 3), np.float32))
    graph = Graph({"x": x.node}, {"y": y.node})
    from lumc.compiler.core.kernel_builder import build_call
    call = build_call([graph.outputs["y"]], lambda n: False, push_views=False)
    c = [c for c in find_contractions(call.kernel.meaning.nodes()) if max(c.M, c.N) > 1][0]
    with pytest.raises(RenderError, match="not a statistic of its rows"):
        plan_row_prologue(c, call.kernel.meaning.nodes())


def test_embedding_gather_add_and_layernorm_are_one_kernel():
    """``LN(word[ids] + pos[:T])``: the gathers and the add are the layer norm's prologue (its
    mean and ``x - mean`` read them in the one kernel), not a kernel of their own."""
    rng = np.random.default_rng(11)
    vocab, t, width = 50, 9, 40
    word = rng.standard_normal((vocab, width)).astype(np.float32)
    pos = rng.standard_normal((16, width)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, width).astype(np.float32)
    b = rng.standard_normal(width).astype(np.float32)
    ids = Tensor(input_node("ids", (1, t), dt.i64))
    from lumc.ir.library.indexing import gather
    e = gather(Tensor.const(word), ids, 0) + Tensor.const(pos[:t])
    y = norm.layer_norm(e, Tensor.const(g), Tensor.const(b))[0]
    graph = Graph({"ids": ids.node}, {"y": y.node})
    res = egraph_candidates(graph, "h200", k=8)
    prog = res.best
    assert [c.kernel.form for c in prog.calls] == ["layernorm"], prog.notes
    assert any(n.op == "Gather" for n in prog.calls[0].kernel.meaning.nodes())
    idv = np.array([[0, 49, 3, 3, 17, 1, 48, 25, 0]], np.int64)
    env = _run_program(prog, {"ids": idv})
    got = env[id(prog.calls[0].outputs[0])].reshape(1, t, width)
    want = _ln64(word[idv] + pos[:t], g, b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_size_generic_norm_prologue_serves_every_row_count():
    """A range's plan renders the fused kernel once with the row count a runtime argument
    (``size_generic``): run at several row counts against the reference on the re-sized meaning."""
    from lumc.backends.triton.size_generic import SizedKernel
    from lumc.ir.symbolic import Resizer, probing
    p = 61
    rng = np.random.default_rng(9)
    with probing([p]):
        graph, _ = _graph((1, p, 48), 40, "layernorm", rng)
        prog = _fused_program(graph)
    assert [c.kernel.form for c in prog.calls] == ["matmul"], prog.notes
    k = prog.calls[0].kernel
    sk = SizedKernel(k, {p: "L0"})
    assert sk.rendered.size_args == ("L0",)
    for n in (1, 6, 33, 64):
        m = Resizer({p: n}).graph(k.meaning)
        feed = {name: rng.standard_normal(ph.shape).astype(ph.dtype.np)
                for name, ph in m.inputs.items()}
        ref = ReferenceExecutor(m, "float64")(feed)["out0"]
        got = to_numpy(sk(*[feed[name] for name in m.inputs], sizes={"L0": n})[0])
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4,
                                   atol=1e-4 * np.abs(ref).max())


def test_fused_norm_matmul_compiles_for_hopper_on_tensor_cores_without_spills():
    """GPT-2's QKV shape (128x768 @ 768x2304) with its LayerNorm formed on load, compiled ahead of
    time for cuda:90 (no GPU needed): tensor-core SASS, no spilled bytes."""
    from triton_cases import assert_compiles_for_hopper
    rng = np.random.default_rng(4)
    graph, _ = _graph((1, 128, 768), 2304, "layernorm", rng)
    tk = TritonKernel(_fused_program(graph).calls[0].kernel)
    cfg = configs.make(8, 3, BLOCK_M=64, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, N_TILES=2,
                       PRECISION="tf32x3")
    assert_compiles_for_hopper(tk.rendered, cfg)


def test_the_row_statistics_cost_is_charged_to_norm_prologues_only(monkeypatch):
    """The simulator's statistics-pass charge applies to a matmul with a normalization formed on
    load; an attention kernel's own reductions (max, sum) are not charged again."""
    from lumc.backends import simulator
    from lumc.backends.devices import get_device
    x = Tensor(input_node("x", (2, 16, 32), dt.f32))
    s = x @ x.transpose(-1, -2)
    y = norm.softmax(s.mul(Tensor.const(np.float32(0.17))), -1) @ x
    prog = egraph_candidates(Graph({"x": x.node}, {"y": y.node}), "h200", k=4).best
    att = next(c.kernel for c in prog.calls if c.kernel.form == "attention")
    rng = np.random.default_rng(1)
    fused = _fused_program(_graph((13, 72), 40, "layernorm", rng)[0]).calls[0].kernel
    dev = get_device("h200")
    cfg_a = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "PRECISION": "tf32x3"}
    cfg_m = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 8, "N_TILES": 1,
             "num_warps": 4, "num_stages": 2, "PRECISION": "tf32x3"}
    with_cost = (simulator.simulate_kernel_time(att, cfg_a, dev),
                 simulator.simulate_kernel_time(fused, cfg_m, dev))
    monkeypatch.setattr(simulator, "row_statistics_work", lambda kernel, c: simulator.RowWork())
    simulator._STATIC.clear()          # the per-kernel memo holds the charged work
    assert simulator.simulate_kernel_time(att, cfg_a, dev) == with_cost[0]
    assert simulator.simulate_kernel_time(fused, cfg_m, dev) < with_cost[1]


@pytest.mark.parametrize("p,tol", [("bf16", 1e-4), ("fp16", 2e-5), ("fp8", 1e-4)])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_reduced_precision_rounds_the_dot_operands_not_the_row_statistics(kind, p, tol):
    """At a reduced ``PRECISION`` the kernel rounds the normalized tile and the weight for
    ``tl.dot`` and sums the row statistics (``sum(d * d)``) in fp32. The emulation the checks and
    the CPU executor use (``ReferenceExecutor(dot_operands=...)``) once rounded the statistics'
    operands too, as if they were a contraction: 1e-3 (bf16) to 1e-2 (fp8) of the output apart,
    which rejected correct bf16 kernels and overstated the fp8 quality cost."""
    from lumc.backends.precision import dot_rounding
    rng = np.random.default_rng(3)
    graph, _ = _graph((64, 96), 80, kind, rng)
    call = _fused_program(graph).calls[0]
    tk = TritonKernel(call.kernel)
    xv = _x((64, 96), rng)
    consts = [c.arg.value for c in call.inputs[1:]]
    cfg = configs.make(4, 2, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, N_TILES=2, PRECISION=p)
    got = to_numpy(tk(xv, *consts, config=cfg)[0])
    feed = {f"in{i}": v for i, v in enumerate([xv] + consts)}
    emu = ReferenceExecutor(call.kernel.meaning, dot_operands=dot_rounding(cfg.kwargs()))(feed)
    exact = ReferenceExecutor(call.kernel.meaning, "float64")(feed)["out0"]
    scale = np.abs(exact).max()
    assert np.abs(got - emu["out0"]).max() / scale < tol
    assert np.abs(emu["out0"] - exact).max() / scale > tol      # and the precision is reduced


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_norm_rows_shorter_than_k_are_not_formed_on_load(kind):
    """A norm over the last 16 values read, through a reshape, as rows of K = 64 (four norm rows
    per K row): the prologue's statistics must reduce over exactly K, so the fusion leaves the norm
    its own kernel; every candidate renders (the norm-prologue ones failed to, and were dropped
    at compile) and computes the model."""
    rng = np.random.default_rng(4)
    x = Tensor(input_node("x", (2, 8, 4, 16), dt.f32))
    g = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    h = (norm.layer_norm(x, Tensor.const(g), Tensor.const(b))[0] if kind == "layernorm"
         else norm.rms_norm(x, Tensor.const(g)))
    graph = Graph({"x": x.node}, {"y": (h.reshape((2, 8, 64)) @ Tensor.const(w)).node})
    xv = _x((2, 8, 4, 16), rng)
    hv = _ln64(xv, g, b) if kind == "layernorm" else _rms64(xv, g)
    want = hv.reshape(2, 8, 64) @ w
    res = egraph_candidates(graph, "h200", k=16)
    for prog in res.candidates:
        env = _run_program(prog, {"x": xv})
        got = env[id(prog.calls[-1].outputs[0])].reshape(2, 8, 8)     # the product, last
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), prog.label
