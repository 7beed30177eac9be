"""Greedy fusion and programs: the kernel list computes exactly what the graph computes."""
import numpy as np
import pytest

from lumc.backends.devices import DEVICES, H100_SXM, H200, get_device
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.fusion import greedy_program
from lumc.compiler.runtime.program import program_time_bound, run_program_reference
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor, concat

RNG = np.random.default_rng(0)


def inp(name, shape, d=dt.f32):
    return Tensor(input_node(name, shape, d))


def const(shape):
    return Tensor.const(RNG.standard_normal(shape).astype(np.float32))


def graph(outs, ins):
    return Graph({k: v.node for k, v in ins.items()}, {k: v.node for k, v in outs.items()})


def run_both(g, feed=None, exact=True):
    """The greedy program run kernel by kernel through the reference equals the whole graph's
    reference: bit for bit, or (``exact=False``) to rounding where a LayerNorm's mean and variance
    sums land in different kernels, so the whole graph's reference takes the mean on shifted data
    (``lumc.backends.row_moments``) and the kernel holding the product by ``1/L`` cannot."""
    p = greedy_program(g)
    p.validate()
    if feed is None:
        feed = {k: RNG.standard_normal(n.shape).astype(n.dtype.np) for k, n in g.inputs.items()}
    want = ReferenceExecutor(g)(feed)
    got = run_program_reference(p, g, feed)
    assert list(got) == list(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
        if exact:
            np.testing.assert_array_equal(got[k], want[k])
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    return p


def gelu_tanh(h):
    return h * 0.5 * (1.0 + (h * 0.7978845608 * (1.0 + 0.044715 * h * h)).tanh())


def softmax(x, axis=-1):
    e = (x - x.max(axis, keepdims=True)).exp()
    return e / e.sum(axis, keepdims=True)


def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    d = x - mu
    var = (d * d).mean(-1, keepdims=True)
    return d / (var + eps).sqrt() * g + b


def test_matmul_bias_gelu_is_one_matmul_kernel():
    x = inp("x", (7, 16))
    y = gelu_tanh(x @ const((16, 33)) + const((33,)))
    p = run_both(graph({"y": y}, {"x": x}))
    assert p.form_counts() == {"matmul": 1}
    k = p.calls[0].kernel
    assert k.attr("axes") == (1,) and k.attr("lhs") == "in0" and k.attr("rhs") == "in1"
    # 2 FLOP per multiply-add of the contraction, plus the epilogue
    assert k.flops() >= 2 * 7 * 16 * 33


def test_softmax_is_two_reductions_and_a_pointwise():
    x = inp("x", (5, 33))
    p = run_both(graph({"y": softmax(x)}, {"x": x}))
    assert p.form_counts() == {"reduction": 2, "pointwise": 1}
    assert any("broadcast back" in r for r in p.notes)


def test_layernorm_and_special_values():
    x = inp("x", (4, 9))
    g = graph({"y": layernorm(x, const((9,)), const((9,)))}, {"x": x})
    xv = RNG.standard_normal((4, 9)).astype(np.float32)
    xv[0, 0], xv[1, 1], xv[2, 2] = np.inf, np.nan, -0.0
    p = run_both(g, {"x": xv})
    assert len(p) == 3


def test_conv_from_window_is_one_matmul_kernel():
    x = inp("x", (2, 3, 10))
    w = const((5, 3, 3))
    xw = x.window(2, 3)                                   # [2, 3, 8, 3]
    prod = xw.reshape((2, 1, 3, 8, 3)).expand((2, 5, 3, 8, 3)) * \
        w.reshape((1, 5, 3, 1, 3)).expand((2, 5, 3, 8, 3))
    y = prod.sum([2, 4]).maximum(0.0)
    p = run_both(graph({"y": y}, {"x": x}))
    assert p.form_counts() == {"matmul": 1}


def test_views_gather_contiguous_and_outputs():
    ids = inp("ids", (2, 5), dt.i64)
    table = const((11, 8))
    emb = Tensor(table.node)  # table[ids]
    from lumc.ir.graph import node
    e = Tensor(node("Gather", (emb.node, ids.node), 0))          # [2, 5, 8]
    h = e + const((8,))
    t = h.transpose(1, 2).contiguous()                           # copy kernel
    padded = h.pad([(0, 0), (1, 1), (0, 0)])                     # masked view of a computed value
    outs = {"h": h.reshape((10, 8)), "t": t, "p": padded * 2.0, "ids": ids,
            "c": concat([h, h * 3.0], 1)}
    feed = {"ids": RNG.integers(0, 11, (2, 5)).astype(np.int64)}
    p = run_both(graph(outs, {"ids": ids}), feed)
    forms = p.form_counts()
    assert forms.get("gather", 0) >= 1
    # no kernel is a bare view, and no output copies a free reshape
    assert all(c.kernel.meaning.outputs["out0"].op != "View" or c.outputs[0].op == "View"
               for c in p.calls)
    assert p.outputs["h"].op == "View" and not any(c.outputs[0] is p.outputs["h"] for c in p.calls)


def test_attention_block_runs_and_logs_refusals(caplog):
    b, s, d = 2, 6, 8
    x = inp("x", (b, s, d))
    q, k, v = (x @ const((d, d)) for _ in range(3))
    att = softmax(q @ k.transpose(-1, -2) * (1.0 / np.sqrt(d)))
    y = layernorm(att @ v + x, const((d,)), const((d,)))
    with caplog.at_level("DEBUG", logger="lumc.fusion"):
        p = run_both(graph({"y": y}, {"x": x}), exact=False)
    assert p.form_counts()["matmul"] == 5
    assert all("no fusion %" in line for line in p.notes)
    assert any("no fusion" in r.message for r in caplog.records)


def test_zero_size_dims():
    x = inp("x", (0, 4))
    y = softmax(x) + 1.0
    run_both(graph({"y": y, "s": x.sum(0)}, {"x": x}))


def test_time_bound_is_roofline_plus_launch():
    x = inp("x", (1024, 1024), dt.f16)
    w = Tensor.const(np.ones((1024, 1024), np.float16))
    p = greedy_program(graph({"y": x @ w}, {"x": x}))
    (c,) = p.calls
    flops = 2 * 1024 ** 3
    nbytes = 3 * 1024 * 1024 * 2
    for dev in (H100_SXM, H200):
        want = max(flops / dev.tensor_flops["f16"], nbytes / dev.hbm_bandwidth) + dev.launch_overhead_s
        assert program_time_bound(p, dev) == pytest.approx(want)
        assert c.kernel.flops() == flops and c.kernel.min_bytes() == nbytes
    # a memory-bound kernel is faster on H200's HBM3e
    pw = greedy_program(graph({"y": x * x}, {"x": x}))
    assert program_time_bound(pw, "h200") < program_time_bound(pw, "h100")


def test_device_table_is_complete_and_cited():
    assert {"h100-sxm", "h200"} <= set(DEVICES)
    assert get_device("H100") is H100_SXM
    for dev in DEVICES.values():
        for d in ("f32", "f16", "bf16"):
            assert dev.tensor_flops[d] > dev.vector_flops[d] > 0
        assert dev.hbm_bandwidth > 1e12 and dev.sm_count == 132 and dev.smem_per_block > 0
        for key in ("tensor_flops", "vector_flops", "hbm_bandwidth", "sm_count", "smem_per_block",
                    "launch_overhead_s"):
            assert dev.sources.get(key), key
    with pytest.raises(KeyError, match="known"):
        get_device("a100")


def test_a_norm_read_through_a_convolution_window_is_not_formed_on_load():
    """A normalization read by a convolution (a contraction over a sliding window, magika's
    LayerNorm then Conv1d) cannot be its row prologue: the window is not [M, K] rows. The
    pre-LN plan once fused it anyway, and the kernel did not render."""
    import torch
    from lumc.backends.triton import render
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    from lumc.compiler.frontends.torch_frontend.capture import import_torch
    from lumc.compiler.runtime.program import run_program_reference

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(16)
            self.conv = torch.nn.Conv1d(16, 24, 5)

        def forward(self, x):
            return self.conv(self.ln(x).transpose(1, 2))
    torch.manual_seed(0)
    m, x = M().eval(), torch.randn(1, 40, 16)
    g = import_torch(m, (x,)).graph
    res = egraph_candidates(g, "h200", k=8)
    with torch.no_grad():
        want = m(x).numpy()
    for p in res.candidates:
        for c in p.calls:
            if c.kernel.form == "matmul":
                render(c.kernel)
        got = next(iter(run_program_reference(p, g, {next(iter(g.inputs)): x.numpy()}).values()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which", ["neg", "neg+exp"])
@pytest.mark.parametrize("shape", [(3, 5), (2, 7, 9), (1, 0, 4)])
def test_a_computed_value_read_through_a_pad_fuses_into_its_elementwise_reader(shape, which):
    """``pad(f(x))`` read by an elementwise op is one kernel: ``f`` is computed at the view's source
    index and the padding is zero whatever ``f`` gives there (``Neg(0)`` is ``-0.0``, ``Exp(0)`` is
    1); the pad of a sign-carrying zero keeps the sign inside and is ``+0.0`` outside."""
    from lumc.backends.triton import TritonKernel
    from lumc.backends.triton.launch import to_numpy
    x = inp("x", shape)
    pads = [(0, 0)] * (len(shape) - 1) + [(2, 1)]
    neg = (-x).pad(pads)
    y = neg * 1.0 if which == "neg" else neg + x.exp().pad(pads) * 2.0
    g = graph({"y": y}, {"x": x})
    feed = {"x": RNG.standard_normal(shape).astype(np.float32)}
    feed["x"][..., 0] = 0.0
    p = run_both(g, feed)
    assert len(p.calls) == 1, [c.kernel.form for c in p.calls]
    assert not any("masked view" in note for note in p.notes)
    want = ReferenceExecutor(g)(feed)["y"]
    got = to_numpy(TritonKernel(p.calls[0].kernel)(feed["x"])[0])
    np.testing.assert_array_equal(got, want)
    assert (np.signbit(got) == np.signbit(want)).all()
    if which == "neg" and want.size:   # -0.0 where x is 0, +0.0 in the padding
        assert np.signbit(want[..., 2]).all() and not np.signbit(want[..., :2]).any()
    if which == "neg+exp" and want.size:   # the padding is 0, not exp(0) * 2
        assert (want[..., :2] == 0).all() and (want[..., -1] == 0).all()


def _silu(h):
    return h / ((-h).exp() + 1.0)


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("shape", [(1, 13, 32), (2, 5, 24)])
def test_gated_mlp_gate_and_up_are_one_paired_matmul(shape, act):
    """``act(x @ Wg) * (x @ Wu)``: the two products of one left operand are one kernel with two
    accumulators (neither written), then the down-projection; exact against the reference."""
    x = inp("x", shape)
    k, inner = shape[-1], 40
    g, u = x @ const((k, inner)), x @ const((k, inner))
    h = (_silu(g) if act == "silu" else gelu_tanh(g)) * u
    y = h @ const((inner, k)) + x
    p = run_both(graph({"y": y}, {"x": x}))
    assert [c.kernel.form for c in p.calls] == ["matmul", "matmul"], p.form_counts()
    first = p.calls[0].kernel
    assert dict(first.attrs).get("paired") is True
    assert sum(n.op == "SumReduce" for n in first.meaning.nodes()) == 2
    assert any("paired with a contraction" in note for note in p.notes)


def test_a_gate_read_elsewhere_is_not_paired():
    """The gate is also a model output: it must be written, so the products stay two kernels."""
    x = inp("x", (1, 9, 16))
    g, u = x @ const((16, 24)), x @ const((16, 24))
    p = run_both(graph({"y": _silu(g) * u, "g": g}, {"x": x}))
    assert not any(dict(c.kernel.attrs).get("paired") for c in p.calls)
    assert sum(c.kernel.form == "matmul" for c in p.calls) == 2


def test_products_of_different_left_operands_are_not_paired():
    x, z = inp("x", (1, 9, 16)), inp("z", (1, 9, 16))
    p = run_both(graph({"y": _silu(x @ const((16, 24))) * (z @ const((16, 24)))},
                       {"x": x, "z": z}))
    assert not any(dict(c.kernel.attrs).get("paired") for c in p.calls)


def _two_caches(dependent: bool = False, late: bool = False):
    """A decoding step's key and value caches: ``cat(past, new)`` twice, independent copies of one
    element count (``dependent``: the second reads the first; ``late``: the second's new row comes
    from a reduction computed after the first)."""
    pk, pv = (Tensor(input_node(n, (1, 2, 7, 8), dt.f32)) for n in ("pk", "pv"))
    k, v = (Tensor(input_node(n, (1, 2, 1, 8), dt.f32)) for n in ("k", "v"))
    kk = concat([pk, k.mul(k.scalar_like(0.5))], 2)
    if dependent:
        vv = concat([pv, v], 2).add(kk.exp())
    elif late:
        vv = concat([pv, kk.sum(2, keepdims=True)], 2)
    else:
        vv = concat([pv, v.neg()], 2)
    g = Graph({x.node.arg.name: x.node for x in (pk, pv, k, v)}, {"K": kk.node, "V": vv.node})
    rng = np.random.default_rng(0)
    feed = {name: rng.standard_normal(n.shape).astype(np.float32) for name, n in g.inputs.items()}
    return g, feed


@pytest.mark.parametrize("case", ["independent", "dependent", "late"])
def test_independent_pointwise_kernels_of_one_size_are_one_kernel(case):
    """Horizontal fusion of pointwise kernels: the two cache concatenations are one kernel with
    two outputs; a second copy that reads the first (fused into it, recomputed) or waits for a
    later reduction is not joined. Values match the reference, and the joint kernel runs in the
    Triton interpreter."""
    g, feed = _two_caches(dependent=case == "dependent", late=case == "late")
    p = greedy_program(g)
    want = ReferenceExecutor(g)(feed)
    got = run_program_reference(p, g, feed)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    pointwise = [c for c in p.calls if c.kernel.form == "pointwise"]
    if case == "independent":
        assert len(p.calls) == 1 and len(pointwise[0].outputs) == 2
        from tests.backends.triton_cases import check
        check(pointwise[0].kernel)
    else:
        assert all(len(c.outputs) == 1 for c in p.calls)
        p.validate()


@pytest.mark.parametrize("which", ["alone", "beside", "cls"])
def test_an_output_that_is_a_prefix_of_a_computed_value_is_written_by_its_kernel(which, caplog):
    """A model output that is a prefix slice of an elementwise value (``(x + 1)[0:1]``, a batch-1
    CLS row ``h[:, 0]``) is copied out by a kernel, and the program serves it from that kernel's
    buffer: the runners took every contiguous output view from the value it views, which no
    kernel wrote ('output ... is not written by any call', every e-graph candidate refused)."""
    import logging
    import lumc.compiler.core.egraph_pipeline as ep
    from lumc.backends.triton.runner import run_program
    x = inp("x", (6, 8))
    if which == "cls":
        h = (x.reshape((1, 6, 8)) * 2.0).maximum(0.0)
        outs = {"a": h.slice([0], [1], [1]).reshape((1, 8))}
    else:
        outs = {"a": (x + 1.0).slice([0], [1], [0])}
        if which == "beside":
            outs["b"] = x * 2.0
    g = graph(outs, {"x": x})
    p = run_both(g)
    feed = {"x": RNG.standard_normal((6, 8)).astype(np.float32)}
    want = ReferenceExecutor(g)(feed)
    got = run_program(p, feed)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    with caplog.at_level(logging.WARNING, logger=ep.log.name):
        cands = ep.egraph_candidates(g, "h200", k=2).candidates
    assert cands and "failed to decode" not in caplog.text


def test_the_triton_runner_serves_a_prefix_output_no_kernel_writes_from_its_source():
    """A program whose output is a prefix of a value a kernel writes (``y[0:2]``, not written
    itself) is served from that value's buffer by every runner, as ``Program.validate`` and the
    numpy executor accept: the Triton runner took only whole-size reshapes (a KeyError)."""
    from lumc.backends.triton.runner import run_program
    from lumc.compiler.runtime.program import Program
    x = inp("x", (6, 8))
    y = x * 2.0
    p = greedy_program(graph({"y": y}, {"x": x}))
    prefix = y.slice([0], [2], [0]).node
    prog = Program(p.calls, {"y": p.outputs["y"], "p": prefix}, graph=p.graph)
    prog.validate()
    xv = RNG.standard_normal((6, 8)).astype(np.float32)
    got = run_program(prog, {"x": xv})
    np.testing.assert_array_equal(got["p"], xv[:2] * 2.0)
    np.testing.assert_array_equal(run_program_reference(prog, p.graph, {"x": xv})["p"],
                                  xv[:2] * 2.0)
