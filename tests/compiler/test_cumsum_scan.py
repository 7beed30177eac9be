"""ONNX CumSum through the compile path: the e-graph offers a ``scan`` kernel (a prefix sum) beside
the triangular contraction the library writes, and the search takes it where it is faster (long
rows). Values against onnxruntime and numpy (float64 for floats, exact for integers), through
the compiled plan on the CPU executor and through its kernels in the Triton interpreter."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.backends.triton.runner import run_program
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.frontends.onnx_frontend import import_onnx

from tests.compiler.test_onnx_edge_values import onnxruntime_outputs

# (exclusive, reverse, axis) of the model's four CumSum nodes over x [2, L]
NODES = [(0, 0, 1), (1, 0, -1), (0, 1, -1), (1, 1, 1)]
ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}


def cumsum_model(shape, dtype):
    """x [shape] -> y0..y3, one CumSum per (exclusive, reverse, axis) of :data:`NODES`."""
    nodes, inits = [], []
    for k, (exclusive, reverse, axis) in enumerate(NODES):
        inits.append(numpy_helper.from_array(np.array(axis, np.int64), f"a{k}"))
        nodes.append(helper.make_node("CumSum", ["x", f"a{k}"], [f"y{k}"], exclusive=exclusive,
                                      reverse=reverse))
    t = ONNX_TYPE[np.dtype(dtype)]
    g = helper.make_graph(nodes, "cumsum", [helper.make_tensor_value_info("x", t, list(shape))],
                          [helper.make_tensor_value_info(f"y{k}", t, list(shape))
                           for k in range(len(NODES))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m


def numpy_cumsum(x: np.ndarray, axis: int, exclusive: int, reverse: int) -> np.ndarray:
    """ONNX CumSum in numpy: float64 for floats (cast back), exact for integers."""
    v = x.astype(np.float64) if x.dtype.kind == "f" else x
    v = np.flip(v, axis) if reverse else v
    s = np.cumsum(v, axis=axis)
    if exclusive:
        s = np.concatenate([np.zeros_like(np.take(s, [0], axis=axis)),
                            np.delete(s, -1, axis=axis)], axis=axis)
    s = np.flip(s, axis) if reverse else s
    return s.astype(x.dtype)


def inputs(length: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(length)
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal((2, length)).astype(np.float32)
        x[0, length // 2] = np.inf             # the infinity's side of row 0 is inf
        x[1, : min(3, length)] = -0.0         # a run of -0.0 keeps its sign (onnxruntime's)
        return x
    return rng.integers(-2 ** 40, 2 ** 40, (2, length)).astype(np.int64)


def assert_values(got: np.ndarray, x: np.ndarray, k: int, ort: np.ndarray, path: str) -> None:
    exclusive, reverse, axis = NODES[k]
    want = numpy_cumsum(x, axis, exclusive, reverse)
    assert got.shape == want.shape and got.dtype == want.dtype, (path, k)
    if x.dtype.kind == "f":
        scale = float(np.abs(x[np.isfinite(x)].astype(np.float64)).sum())
        for ref in (want, ort):
            np.testing.assert_allclose(got, ref, rtol=0, atol=4e-7 * scale + 1e-6,
                                       err_msg=f"{path} y{k}")
        zero = want == 0
        assert np.signbit(got[zero]).tolist() == np.signbit(ort[zero]).tolist(), (path, k)
    else:
        np.testing.assert_array_equal(got, want, err_msg=f"{path} y{k}")
        np.testing.assert_array_equal(got, ort, err_msg=f"{path} y{k}")


def _plan_and_triton_match(f, m, x) -> None:
    """The compiled plan's run and its Triton kernels' (interpreter) both match onnxruntime on
    every output of model ``m``."""
    ort = onnxruntime_outputs(m, {"x": x})
    plan = f.run({"x": x})
    triton = run_program(f.program, {"x": x})
    for k in range(len(NODES)):
        assert_values(np.asarray(plan[f"y{k}"]), x, k, ort[k], "plan")
        assert_values(np.asarray(triton[f"y{k}"]), x, k, ort[k], "triton")


@pytest.mark.parametrize("length", [1000, 4097])
@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_compiled_cumsum_is_a_scan_with_the_values_of_onnxruntime(length, dtype):
    """Every CumSum of the chosen plan is a scan kernel (the contraction reads an L x L mask and
    does L^2 multiply-adds per row); values of the plan on the CPU executor and of its kernels in
    the Triton interpreter against numpy and onnxruntime."""
    x = inputs(length, dtype)
    m = cumsum_model(x.shape, dtype)
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs={"x": x},
                     reuse_plan=False)
    forms = [c.kernel.form for c in f.program.calls]
    assert forms.count("scan") >= len(NODES) and "matmul" not in forms, forms
    _plan_and_triton_match(f, m, x)


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_short_cumsum_offers_the_scan_and_its_values_hold(dtype):
    """At L = 7 the contraction may win the search (it does on the simulated H200 for int64),
    but the e-graph offers the scan too; both programs give onnxruntime's values."""
    x = inputs(7, dtype)
    m = cumsum_model(x.shape, dtype)
    res = egraph_candidates(import_onnx(m, {"x": x.shape}).graph, device="h200")
    with_scan = [p for p in res.candidates if any(c.kernel.form == "scan" for c in p.calls)]
    assert with_scan, [[c.kernel.form for c in p.calls] for p in res.candidates]
    ort = onnxruntime_outputs(m, {"x": x})
    for p in (with_scan[0], res.candidates[0]):
        got = run_program(p, {"x": x})
        for k in range(len(NODES)):
            assert_values(np.asarray(got[f"y{k}"]), x, k, ort[k], p.label)


def test_position_ids_at_4096_use_the_scan():
    """RoBERTa's position ids, ``cumsum(mask, 1) * mask + pad``, at L = 4096: the chosen program
    is one scan kernel with the mask product and the offset fused as its epilogue."""
    nodes = [helper.make_node("Cast", ["mask"], ["mi"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["mi", "one"], ["c"]),
             helper.make_node("Mul", ["c", "mi"], ["cm"]),
             helper.make_node("Add", ["cm", "one"], ["pos"])]
    g = helper.make_graph(
        nodes, "pos", [helper.make_tensor_value_info("mask", TensorProto.INT32, [2, 4096])],
        [helper.make_tensor_value_info("pos", TensorProto.INT64, [2, 4096])],
        [numpy_helper.from_array(np.array(1, np.int64), "one")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    mask = np.ones((2, 4096), np.int32)
    mask[1, 3000:] = 0
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs={"mask": mask},
                     reuse_plan=False)
    assert [c.kernel.form for c in f.program.calls] == ["scan"], f.report()
    want = np.cumsum(mask, 1) * mask + 1
    np.testing.assert_array_equal(f.run({"mask": mask})["pos"], want)
    np.testing.assert_array_equal(onnxruntime_outputs(m, {"mask": mask})[0], want)


def test_float_cumsum_scans_its_row_once():
    """The library's float CumSum contracts three operands of one row (the finite part and the
    counts of +inf and -inf seen); their scans are one kernel, one carried sum each, with the
    combination as its epilogue (and a row reduction before it for the sign of zero), not three
    kernels writing and re-reading two intermediates."""
    x = inputs(4096, np.float32)
    m = cumsum_model(x.shape, np.float32)
    del m.graph.node[1:]
    del m.graph.output[1:]
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs={"x": x},
                     reuse_plan=False)
    forms = sorted(c.kernel.form for c in f.program.calls)
    assert forms == ["reduction", "scan"], f.report()
    scan = next(c.kernel for c in f.program.calls if c.kernel.form == "scan")
    assert sum(n.op == "SumReduce" for n in scan.meaning.nodes()) == 3
    got = run_program(f.program, {"x": x})["y0"]
    assert_values(np.asarray(got), x, 0, onnxruntime_outputs(m, {"x": x})[0], "triton")


def test_a_contraction_of_signed_zeros_keeps_its_sign_as_a_scan():
    """``y[i] = sum_j tril[i, j] * v[j]`` written out (Mul + ReduceSum) with ``v`` finite by
    construction but holding -0.0 (``where(x == 0, -0.0, x)``): the sum of a row starts from +0.0
    (onnxruntime's, the reference's), so a zero row sum is +0.0 (``-0.0 + 0.0 * 5``). The scan
    form computes that contraction, so it gives +0.0 too, not a sequential scan's -0.0."""
    n = 6
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("Equal", ["x", "zi"], ["isz"]),
             helper.make_node("Where", ["isz", "nz", "xf"], ["v"]),
             helper.make_node("Unsqueeze", ["v", "ax1"], ["vu"]),
             helper.make_node("Mul", ["U", "vu"], ["p"]),
             helper.make_node("ReduceSum", ["p", "ax2"], ["y"], keepdims=1)]
    inits = [numpy_helper.from_array(np.tril(np.ones((n, n), np.float32)), "U"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array(np.array([2], np.int64), "ax2"),
             numpy_helper.from_array(np.array(0, np.int32), "zi"),
             numpy_helper.from_array(np.array(-0.0, np.float32), "nz")]
    g = helper.make_graph(nodes, "tri", [helper.make_tensor_value_info("x", TensorProto.INT32, [2, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n, 1])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    x = np.array([[0, 5, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], np.int32)
    ort = onnxruntime_outputs(m, {"x": x})[0]
    res = egraph_candidates(import_onnx(m, {"x": x.shape}).graph, device="h200")
    assert any(c.kernel.form == "scan" for p in res.candidates for c in p.calls)
    for p in res.candidates:
        got = np.asarray(run_program(p, {"x": x})["y"])
        np.testing.assert_array_equal(got, ort)
        assert np.signbit(got).tolist() == np.signbit(ort).tolist(), p.label


def test_a_long_cumsum_never_forms_its_mask(monkeypatch):
    """At L = 70000 a CumSum's triangular mask is ``[L, L]`` (36 GiB of int64 iota, a
    MemoryError or the OOM killer): the reference run, the compile's oracle and ``--check``'s
    float64 evaluation, reads the operand as ``numpy.cumsum`` and never evaluates the mask."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.ir import ops
    full = ops.iota_array

    def small_iota(shape, axis, dtype):
        assert np.prod(shape) < 10 ** 6, f"a {list(shape)} iota evaluated"
        return full(shape, axis, dtype)
    monkeypatch.setattr(ops, "iota_array", small_iota)
    x = inputs(70000, np.float32)
    m = cumsum_model(x.shape, np.float32)
    graph = import_onnx(m, {"x": x.shape}).graph
    ort = onnxruntime_outputs(m, {"x": x})
    for precision in ("native", "float64"):
        got = ReferenceExecutor(graph, precision)({"x": x})
        for k in range(len(NODES)):
            assert_values(np.asarray(got[f"y{k}"]).astype(np.float32), x, k, ort[k], precision)


def test_an_artifact_of_a_cumsum_larger_than_memory_by_its_mask_loads(monkeypatch, tmp_path):
    """Loading refuses a graph whose values do not fit in memory, but a CumSum's ``[L, L]``
    mask, its ``[2, L, L]`` broadcast views and product are never allocated: an artifact whose
    only values past memory are those loads and runs (at L = 70000 the compile wrote an
    artifact that ``lumc run`` refused)."""
    from lumc.compiler.runtime import compiled
    x = inputs(2048, np.float32)
    m = cumsum_model(x.shape, np.float32)
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs={"x": x})
    assert "matmul" not in [c.kernel.form for c in f.program.calls], f.report()
    f.save(tmp_path / "c.lumc")
    monkeypatch.setattr(compiled, "memory_bytes", lambda: 10 ** 6)   # under 2048 * 2048 * 8
    g = lumc.load(tmp_path / "c.lumc")
    _plan_and_triton_match(g, m, x)


def test_a_cumsum_range_is_not_refused_for_a_mask_no_run_forms():
    """A size range is refused when the reference run would hold a value past half the machine's
    memory (``refuse_too_large``); a CumSum's ``[L, L]`` mask is never evaluated (``Where``
    ``[69999, 69999]``, 18 GiB, refused ``--shape L=1..70000``), so the largest value it holds
    is a row of the result."""
    from lumc.backends.reference import largest_value
    x = inputs(70000, np.float32)
    graph = import_onnx(cumsum_model(x.shape, np.float32), {"x": x.shape}).graph
    n = largest_value(graph)
    assert n.nbytes <= 8 * x.size, (n.op, n.shape)


@pytest.mark.parametrize("length, dtype", [(7, np.float32), (70000, np.float32), (300, np.int64)])
def test_the_torch_replay_of_a_cumsum_is_a_prefix_sum(length, dtype):
    """The torch replay of a graph (an extern candidate's kernel, the bench rivals) computes a
    CumSum as ``torch.cumsum``, forming no ``[L, L]`` mask (19.6 GB of f32 at L = 70000: the
    replay failed for memory and torch printed its traceback during the compile), with the
    reference's values: infinities, a run of -0.0, exclusive and reversed scans."""
    import torch
    from lumc.compiler.runtime import graph_torch
    x = inputs(length, dtype)
    m = cumsum_model(x.shape, dtype)
    graph = import_onnx(m, {"x": x.shape}).graph
    mod = graph_torch.graph_module(graph)
    assert not any(n.target is graph_torch.iota_op and n.args[0] == (length, length)
                   for n in mod.graph.nodes)
    got = mod(torch.from_numpy(x))
    ort = onnxruntime_outputs(m, {"x": x})
    for k, name in enumerate(graph.outputs):
        assert_values(got[k].numpy(), x, k, ort[k], f"torch replay {name}")


def test_a_kept_prefix_sum_product_is_evaluated_with_its_mask():
    """A candidate whose kernel boundary is a prefix sum's product ``mask * v`` asks the reference
    run to keep it (``run_keeping``): its mask, which the run skips otherwise, is evaluated for
    it (a KeyError on the skipped mask), and the kept product is the naive ``mask * v``."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.ir.ops import OPS
    x = inputs(6, np.float32)
    graph = import_onnx(cumsum_model(x.shape, np.float32), {"x": x.shape}).graph
    naive = {}
    for n in graph.nodes():
        naive[id(n)] = x if n.op == "Input" else OPS[n.op].reference(
            [naive[id(s)] for s in n.srcs], n.arg)
    ex = ReferenceExecutor(graph)
    assert ex._mask_only and ex._fused_mul
    ort = onnxruntime_outputs(cumsum_model(x.shape, np.float32), {"x": x})
    for k in ex._fused_mul:       # every product of this graph is a prefix sum's
        got, kept = ex.run_keeping({"x": x}, {k})
        np.testing.assert_array_equal(kept[k], naive[k])
        for j in range(len(NODES)):
            assert_values(got[f"y{j}"], x, j, ort[j], "kept product")


def test_an_artifact_whose_output_view_is_larger_than_memory_is_refused(monkeypatch, tmp_path):
    """The memory check at load skips views (numpy views of a counted value), but not an output:
    each output is an array of its own, so an Expand of 8 floats to [4096, 8] (128 KiB) is
    refused on a machine of 100 kB in one line, not run into the OOM killer."""
    from onnx import numpy_helper
    from lumc.compiler.runtime import compiled
    from lumc.ir.errors import ArtifactError
    f = TensorProto.FLOAT
    g = helper.make_graph([helper.make_node("Expand", ["x", "s"], ["y"])], "expand",
                          [helper.make_tensor_value_info("x", f, [1, 8])],
                          [helper.make_tensor_value_info("y", f, [4096, 8])],
                          [numpy_helper.from_array(np.array([4096, 8], np.int64), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    lumc.compile(m, budget="20s", device="sim:h200").save(tmp_path / "e.lumc")
    assert lumc.load(tmp_path / "e.lumc").run({"x": np.ones((1, 8), np.float32)})["y"].shape == \
        (4096, 8)
    monkeypatch.setattr(compiled, "memory_bytes", lambda: 10 ** 5)   # under 4096 * 8 * 4
    with pytest.raises(ArtifactError, match=r"declares a View value of shape \[4096, 8\]"):
        lumc.load(tmp_path / "e.lumc")
