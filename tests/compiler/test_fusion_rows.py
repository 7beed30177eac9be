"""Row groups (``lumc.compiler.core.fusion_rows``): a chain of reductions over the same rows and the
values that read them back are one row kernel in the ``+rows`` candidates, whatever the spelling
(no e-graph rule needed); the Triton kernel (one-pass and looped) and the compiled plan agree with
numpy float64 and onnxruntime, special values included; --why-not says why a split stays."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.devices import H200
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton import configs
from lumc.compiler.core.fusion import ROWS_REFUSAL, greedy_program
from lumc.compiler.core.fusion_rows import ROWS_UNPLANNED
from lumc.compiler.runtime.program import program_time_bound, run_program_reference
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library.norm import log_softmax
from lumc.ir.tensor import Tensor

RNG = np.random.default_rng(0)
EPS = 1e-5


def _lse(x):
    m = x.max(-1, keepdims=True)
    return (x - m).exp().sum(-1, keepdims=True).log() + m


def _np_lse(x):
    m = x.max(-1, keepdims=True)
    return np.log(np.exp(x - m).sum(-1, keepdims=True)) + m


# name: (Tensor spelling, numpy float64 spelling, kernels greedy fusion cuts it into)
SPELLINGS = {
    "log_softmax": (lambda x: log_softmax(x, -1),
                    lambda x: x - _np_lse(x), 3),
    "l2_normalize": (lambda x: x / (x * x).sum(-1, keepdims=True).sqrt(),
                     lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True)), 2),
    "x_minus_logsumexp": (lambda x: x - _lse(x),
                          lambda x: x - _np_lse(x), 3),
    "layer_norm_by_moments": (
        lambda x: (x - x.mean(-1, keepdims=True)) / (
            (x * x).mean(-1, keepdims=True) - x.mean(-1, keepdims=True) * x.mean(-1, keepdims=True)
            + EPS).sqrt(),
        lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(
            (x * x).mean(-1, keepdims=True) - x.mean(-1, keepdims=True) ** 2 + EPS), 3),
    "centered_then_scaled": (   # three levels: max, then a sum of x - max, then the output
        lambda x: (x - x.max(-1, keepdims=True)) / (x - x.max(-1, keepdims=True)).sum(
            -1, keepdims=True),
        lambda x: (x - x.max(-1, keepdims=True)) / (x - x.max(-1, keepdims=True)).sum(
            -1, keepdims=True), 3),
}


def _graph(fn, shape):
    x = Tensor(input_node("x", shape, dt.f32))
    return Graph({"x": x.node}, {"y": fn(x).node})


def _run_triton(kernel, x, variant, config=None):
    from lumc.backends.triton import TritonKernel
    from lumc.backends.triton.launch import to_numpy
    tk = TritonKernel(kernel, variant)
    return tk, [to_numpy(o) for o in tk(x, config=config)]


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_a_row_chain_is_one_row_kernel(name):
    """Greedy fusion cuts the chain at every row value read back through a broadcast (and notes
    the +rows candidate); with ``rows`` it is one reduction kernel, whose generated Triton, one
    pass and looped (the loops iterate), matches numpy float64."""
    fn, ref, split = SPELLINGS[name]
    g = _graph(fn, (5, 300))
    p0 = greedy_program(g)
    assert len(p0.calls) == split, p0.dump()
    assert any(ROWS_REFUSAL in n for n in p0.notes), p0.notes
    p1 = greedy_program(g, rows=True)
    p1.validate()
    assert p1.form_counts() == {"reduction": 1}, p1.dump()
    x = RNG.standard_normal((5, 300)).astype(np.float32)
    want = ref(x.astype(np.float64))
    got = run_program_reference(p1, g, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    kernel = p1.calls[0].kernel
    for variant, cfg in (("one-pass", None),
                         ("looped", configs.make(4, 2, BLOCK_M=2, BLOCK_K=64))):
        tk, (out,) = _run_triton(kernel, x, variant, cfg)
        assert tk.rendered.variant == variant
        if variant == "looped":
            assert tk.source.count("for k_start in range") >= 2
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-5, atol=2e-5)


def test_a_row_value_read_elsewhere_is_written_by_the_row_kernel():
    """``lse`` is a model output too and read by a contraction (another shape): the row kernel
    writes it beside ``x - lse`` (two outputs), and the kernel that reads it runs after it even
    where node order puts that reader first."""
    x = Tensor(input_node("x", (6, 40), dt.f32))
    w = Tensor.const(RNG.standard_normal((1, 3)).astype(np.float32))
    lse = _lse(x)
    g = Graph({"x": x.node}, {"z": (lse @ w).node, "lse": lse.node, "y": (x - lse).node})
    p = greedy_program(g, rows=True)
    p.validate()
    rows = [c for c in p.calls if c.kernel.form == "reduction"]
    assert len(rows) == 1 and len(rows[0].outputs) == 2, p.dump()
    assert p.calls.index(rows[0]) < next(i for i, c in enumerate(p.calls)
                                         if c.kernel.form == "matmul")
    xv = RNG.standard_normal((6, 40)).astype(np.float32)
    got = run_program_reference(p, g, {"x": xv})
    lse64 = _np_lse(xv.astype(np.float64))
    np.testing.assert_allclose(got["lse"], lse64, rtol=1e-5)
    np.testing.assert_allclose(got["y"], xv - lse64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["z"], lse64 @ np.asarray(w.node.arg.value, np.float64),
                               rtol=1e-5, atol=1e-5)


def test_a_value_that_leaves_the_group_and_comes_back_is_not_one_kernel():
    """``d = x - max(x)`` is summed over the other axis (another row structure) and that sum read
    back by the group's output: one kernel would need its own output first. The group is refused,
    named in the notes, and the split program computes the graph."""
    x = Tensor(input_node("x", (8, 8), dt.f32))
    d = x - x.max(-1, keepdims=True)
    y = d.exp() + d.sum(0, keepdims=True)
    g = Graph({"x": x.node}, {"y": y.node})
    p = greedy_program(g, rows=True)
    p.validate()
    assert any(ROWS_UNPLANNED in n for n in p.notes), p.notes
    xv = RNG.standard_normal((8, 8)).astype(np.float32)
    want = ReferenceExecutor(g)({"x": xv})["y"]
    np.testing.assert_array_equal(run_program_reference(p, g, {"x": xv})["y"], want)


def test_two_groups_that_read_each_other_are_not_both_one_kernel():
    """Group A (rows of ``x``) reads ``mB``, a row value group B (rows of ``z``) writes; group B
    reads ``g``, computed from ``mA``, which group A writes. No node path leads from either group
    back into itself, but as two kernels each waits on the other: the second group claimed is
    refused (named in the notes, of the split program too, whose why-not would else name a
    '+rows' twin that does not fuse it) instead of the whole ``+rows`` program failing in its
    launch order, and the program computes the graph."""
    x = Tensor(input_node("x", (6, 8), dt.f32))
    z = Tensor(input_node("z", (8, 5), dt.f32))
    m_a, m_b = x.max(1, keepdims=True), z.max(1, keepdims=True)
    b1 = (z - m_b) * m_a.sum()
    a2 = (x - m_a) + m_b.reshape((1, 8))
    g = Graph({"x": x.node, "z": z.node}, {"a2": a2.node, "b1": b1.node})
    p = greedy_program(g, rows=True)
    p.validate()
    assert any(ROWS_UNPLANNED in n and "computed outside the kernel" in n for n in p.notes), p.notes
    split = greedy_program(g)
    assert len(p.calls) == len(split.calls) - 1, p.dump()   # the other: one kernel
    refused = [n for n in p.notes if ROWS_UNPLANNED in n]
    assert refused and refused == [n for n in split.notes if ROWS_UNPLANNED in n], split.notes
    xv = RNG.standard_normal((6, 8)).astype(np.float32)
    zv = RNG.standard_normal((8, 5)).astype(np.float32)
    x64, z64 = xv.astype(np.float64), zv.astype(np.float64)
    ma, mb = x64.max(1, keepdims=True), z64.max(1, keepdims=True)
    got = run_program_reference(p, g, {"x": xv, "z": zv})
    np.testing.assert_allclose(got["a2"], x64 - ma + mb.reshape(1, 8), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["b1"], (z64 - mb) * ma.sum(), rtol=1e-5, atol=1e-5)


def test_a_looped_row_kernel_is_priced_one_pass_per_level():
    """A 1 GiB row kernel of three levels (max, a sum of ``x - max``, the output) reads its rows
    three times: its rows in flight do not fit in L2, so the simulator charges about three reads
    from HBM plus the write, not one read."""
    from lumc.backends.simulator import row_passes, simulate_kernel_time
    fn = SPELLINGS["centered_then_scaled"][0]
    g = _graph(fn, (4096, 65536))
    (call,) = greedy_program(g, rows=True).calls
    k = call.kernel
    assert row_passes(k) == 3
    in_b, out_b = sum(k.read_bytes()), sum(n.nbytes for n in k.outputs)
    t = simulate_kernel_time(k, {"BLOCK_M": 1, "BLOCK_K": 4096, "num_warps": 8, "num_stages": 1},
                             H200)
    assert t >= (2.5 * in_b + out_b) / H200.hbm_bandwidth, t
    # the online pair (LogSoftmax's max and sum) is one loop: two passes
    (ls,) = greedy_program(_graph(SPELLINGS["log_softmax"][0], (64, 32768)), rows=True).calls
    assert row_passes(ls.kernel) == 2


def test_a_split_row_kernel_is_priced_one_pass():
    """Two sums over 16 rows of 2^24 (a variance by moments): the row kernel renders split (both
    partial sums in one loop over the row, ``render_split``), so the simulator charges one read of
    the rows, as for one sum, not one per reduction (it charged about 3x before)."""
    from lumc.backends.simulator import row_passes, simulate_kernel_time
    from lumc.backends.triton import TritonKernel
    x = Tensor(input_node("x", (16, 1 << 24), dt.f32))
    mean = x.mean(-1, keepdims=True)
    times, passes = [], []
    for y in ((x * x).mean(-1, keepdims=True) - mean * mean, x.sum(-1, keepdims=True)):
        (call,) = greedy_program(Graph({"x": x.node}, {"y": y.node}), rows=True).calls
        assert TritonKernel(call.kernel).rendered.variant == "split"
        cfg = {"BLOCK_K": 4096, "BLOCK_M": 1, "SPLIT": 16, "num_warps": 8, "num_stages": 2}
        times.append(simulate_kernel_time(call.kernel, cfg, H200))
        passes.append(row_passes(call.kernel))
    assert passes == [2, 1]     # as looped kernels
    assert times[0] <= 1.2 * times[1], times    # memory-bound at SPLIT 16: one read each


def test_why_not_names_the_rows_candidate_the_split_lost_to():
    """A program that kept the split (the +rows twin lost) says which values a row kernel would
    have kept on chip and that the '+rows' candidate lost; a plan's reader of the row values is
    named once per pair."""
    from lumc.compiler.core.why_not import why_not, why_not_lines
    g = _graph(SPELLINGS["log_softmax"][0], (64, 1000))
    split, fused = greedy_program(g), greedy_program(g, label="greedy+rows", rows=True)
    bounds = [program_time_bound(p, H200) for p in (split, fused)]
    doc = why_not(split, [split, fused], bounds)
    assert len(doc["pairs"]) == 3
    for e in doc["pairs"]:
        assert "'+rows' candidates" in e["rule"] and "lost on bound or time" in e["rule"], e
        assert "'+rows' candidates compute this row value" in e["fusion"], e
    assert [c["label"] for c in doc["candidates"]] == ["greedy+rows"]
    assert any("candidate greedy+rows (1 kernel)" in line for line in why_not_lines(doc))
    # without the twin among the candidates, it says so instead of 'lost'
    doc = why_not(split, [split], bounds[:1])
    assert all("not among the candidates" in e["rule"] for e in doc["pairs"]), doc["pairs"]


def test_why_not_names_the_rows_candidate_only_for_readers_it_joins():
    """``lse`` is read back over its rows (``x - lse``) and by a contraction: the '+rows' twin
    computes the first reader in the row kernel, the contraction still reads ``lse`` from memory.
    So the pair to the contraction names no '+rows' candidate (it said the twin computed it in
    one row kernel and lost), the pairs inside the chain do."""
    from lumc.compiler.core.why_not import why_not
    x = Tensor(input_node("x", (64, 1000), dt.f32))
    w = Tensor.const(RNG.standard_normal((1, 3)).astype(np.float32))
    lse = _lse(x)
    g = Graph({"x": x.node}, {"z": (lse @ w).node, "y": (x - lse).node})
    split, fused = greedy_program(g), greedy_program(g, label="greedy+rows", rows=True)
    doc = why_not(split, [split, fused], [program_time_bound(p, H200) for p in (split, fused)])
    forms = [(e["producer_form"], e["consumer_form"]) for e in doc["pairs"]]
    to_mm = [e for e in doc["pairs"] if e["consumer_form"] == "matmul"]
    inside = [e for e in doc["pairs"] if e["consumer_form"] != "matmul"]
    assert len(to_mm) == 1 and len(inside) >= 2, forms
    assert "+rows" not in to_mm[0]["rule"] + to_mm[0]["fusion"], to_mm[0]
    for e in inside:
        assert "'+rows' candidates" in e["rule"] and "lost on bound or time" in e["rule"], e


def _log_softmax_model(shape, axis, elem):
    from onnx import helper
    n = helper.make_node("LogSoftmax", ["x"], ["y"], axis=axis)
    gr = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", elem, list(shape))],
                           [helper.make_tensor_value_info("y", elem, list(shape))])
    return helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _special(shape, dtype=np.float32):
    x = (RNG.standard_normal(shape) * 4).astype(dtype)
    flat = x.reshape(-1, shape[-1]) if x.size else x
    if x.size and flat.shape[0] >= 6:
        flat[0] = -np.inf            # a row all -inf: NaN (x - max is -inf - -inf)
        last = shape[-1] - 1
        flat[1, min(1, last)] = np.inf          # +inf: NaN row
        flat[2, min(2, last)] = np.nan
        flat[3, : shape[-1] // 2] = -np.inf   # leading -inf: those give -inf, the rest finite
        flat[4] = np.inf
        flat[5, 0] = -0.0
    return x


# (shape, axis, dtype, kernels the compiled plan has)
ORT_CASES = [((6, 1000), -1, np.float32, 1), ((6, 1000), 1, np.float32, 1),
             ((8, 6), 0, np.float32, 1), ((7, 33, 5), -2, np.float32, 1),
             ((6, 1000), -1, np.float16, 1), ((6, 20000), -1, np.float32, 1),
             ((6, 1), -1, np.float32, 1), ((0, 1000), -1, np.float32, None),
             ((6, 0), -1, np.float32, None)]


@pytest.mark.parametrize("shape,axis,dtype,kernels", ORT_CASES,
                         ids=[f"{'x'.join(map(str, s))}-ax{a}-{np.dtype(d).name}"
                              for s, a, d, _ in ORT_CASES])
def test_log_softmax_compiles_to_one_row_kernel_and_matches_onnxruntime(shape, axis, dtype,
                                                                        kernels, tmp_path,
                                                                        monkeypatch):
    """ONNX LogSoftmax through the compile path (sim:h200): one row kernel (an elementwise one
    for rows of one element; numerics checked by the compile on these very inputs: the generated
    kernel, looped for the 20000-long rows, against the reference), the values of onnxruntime
    (rows all -inf, +inf, NaN, half -inf; -0.0; f16; any axis; length-1 and empty rows)."""
    import onnxruntime as ort
    from onnx import TensorProto
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    model = _log_softmax_model(shape, axis, elem)
    x = _special(shape, dtype) if axis in (-1, len(shape) - 1) else \
        (RNG.standard_normal(shape) * 4).astype(dtype)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    f = lumc.compile(model, budget="30s", device="sim:h200", example_inputs={"x": x})
    got = np.asarray(f(x))
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 2e-3 if dtype == np.float16 else 2e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                               atol=tol, equal_nan=True)
    if kernels is not None:
        r = f.report_dict()
        assert r["kernels"] == kernels, (r["candidate_label"], r["per_kernel"])
        assert r["candidate_label"].endswith("+rows")


def test_the_egraph_offers_a_rows_twin_and_carries_its_flag(tmp_path):
    """The e-graph decodes a ``+rows`` twin of its plan (not of single-region flips), one kernel
    for LogSoftmax, and a carried candidate file (for a machine without egglog) rebuilds it with
    its flag."""
    from lumc.compiler.core import carried
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    g = _graph(SPELLINGS["log_softmax"][0], (64, 1000))
    res = egraph_candidates(g, "h200", k=16)
    labels = [p.label for p in res.candidates]
    assert "egraph-argmin+rows" in labels and not any(
        lab.startswith("flip:") and lab.endswith("+rows") for lab in labels), labels
    twin = res.candidates[labels.index("egraph-argmin+rows")]
    assert twin.form_counts() == {"reduction": 1}
    assert len(res.candidates[labels.index("egraph-argmin")].calls) == 3
    path = carried.dump(g, res.candidates, tmp_path, "ls")
    got, _ = carried.load(_graph(SPELLINGS["log_softmax"][0], (64, 1000)), tmp_path)
    back = {p.label: p for p in got}
    assert back["egraph-argmin+rows"].form_counts() == {"reduction": 1}, path
    assert len(back["egraph-argmin"].calls) == 3
