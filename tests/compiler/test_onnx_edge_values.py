"""ONNX ops at their edges (implicit einsum outputs, the sign of zero of scans and activations,
...), each against onnxruntime or numpy in float64, on the reference executor and the Triton
kernels (interpreted on CPU)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import import_onnx
from lumc.ir.errors import ShapeError

from tests.compiler.three_paths import run_triton

RNG = np.random.default_rng(7)
NP_TO_ONNX = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64,
              np.int32: TensorProto.INT32, np.float16: TensorProto.FLOAT16}


def single_node(op: str, feeds: dict, inits: dict | None = None, opset: int = 18,
                n_out: int = 1, **attrs):
    """A one-node model over ``feeds`` (graph inputs) and ``inits`` (initializers)."""
    inits = inits or {}
    names = list(feeds) + list(inits)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, [n if n is not None else "" for n in names], outs, **attrs)
    vi = [helper.make_tensor_value_info(k, NP_TO_ONNX[v.dtype.type], list(v.shape))
          for k, v in feeds.items()]
    out = [helper.make_empty_tensor_value_info(o) for o in outs]
    g = helper.make_graph([node], "g", vi, out,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.output}
    for o in m.graph.output:         # the output types as onnx infers them
        o.CopyFrom(inferred[o.name])
    return m


def run_both(m, feeds: dict) -> list[tuple[str, list[np.ndarray]]]:
    """The outputs of the reference executor and of the interpreted Triton kernels."""
    imported = import_onnx(m, {k: v.shape for k, v in feeds.items()})
    names = [o.name for o in m.graph.output]
    ref = ReferenceExecutor(imported.graph)(feeds)
    tri = run_triton(m, feeds)
    return [("reference", [ref[n] for n in names]), ("triton", [tri[n] for n in names])]


def onnxruntime_outputs(m, feeds: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_same_bits(got, want, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Same shape and dtype, values within tolerance, NaN where ``want`` has NaN, and the sign bit
    of every zero as in ``want``."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    zero = want == 0
    assert np.signbit(got[zero]).tolist() == np.signbit(want[zero]).tolist(), (what, got, want)


@pytest.mark.parametrize("equation,shapes", [
    ("ii", [(4, 4)]),                 # a trace: numpy and onnxruntime give a scalar
    ("iij", [(3, 3, 2)]),             # i repeated, j once: the output is j
    ("ij,jj", [(2, 3), (3, 3)]),      # j appears three times: summed, the output is i
    ("iji->j", [(2, 3, 2)]),
    ("ba", [(2, 3)]),                 # implicit output in alphabetical order: a transpose
])
def test_einsum_sums_a_label_repeated_inside_one_term(equation, shapes):
    """An implicit einsum output holds the labels that appear exactly once in the whole equation;
    lumc counted them after taking each term's diagonal, so ``ii`` gave the diagonal (shape [4])
    instead of the trace."""
    feeds = {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    m = single_node("Einsum", feeds, equation=equation)
    want = np.einsum(equation, *[v.astype(np.float64) for v in feeds.values()]).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_outputs(m, feeds)[0], want, rtol=1e-5, atol=1e-6)
    for path, (got,) in run_both(m, feeds):
        assert got.shape == want.shape, (path, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=path)


def test_einsum_refuses_a_repeated_output_label_in_one_line():
    """``i->ii`` is invalid (numpy and onnxruntime refuse it); lumc said 'cannot reshape'."""
    m = single_node("Einsum", {"x": np.ones(3, np.float32)}, equation="i->ii")
    with pytest.raises(ShapeError, match="output labels \\['i'\\] are repeated"):
        import_onnx(m)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n", [3, 5])
def test_integer_reduce_prod_over_an_odd_axis_runs_in_triton(dtype, n):
    """An integer ReduceProd over an odd number of elements pads the axis with a 1; the kernel's
    index ``(2 + 1)`` and its bound ``(i0 < 3)`` were written as expressions, which the Triton
    interpreter turns into 0-d tensors, and the load's mask became int32 ('mask has unsupported
    dtype'). They are folded to literals when the kernel is written."""
    x = RNG.integers(-9, 9, (4, n)).astype(dtype)
    m = single_node("ReduceProd", {"x": x}, {"axes": np.array([-1], np.int64)}, keepdims=0)
    want = np.prod(x, axis=-1, dtype=dtype)
    np.testing.assert_array_equal(onnxruntime_outputs(m, {"x": x})[0], want)
    for path, (got,) in run_both(m, {"x": x}):
        assert got.dtype == want.dtype, path
        np.testing.assert_array_equal(got, want, err_msg=path)


NEG_ZERO_ROWS = np.array([[-0.0, -0.0, 1.0, -1.0, -0.0], [-0.0, 2.0, -2.0, -0.0, -0.0],
                          [0.0, -0.0, -0.0, 5.0, -5.0], [-0.0, -0.0, -0.0, -0.0, -0.0],
                          [-0.0, -1.0, -0.0, np.inf, -0.0], [-0.0, -0.0, np.nan, 3.0, -0.0]],
                         np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("axis", [1, 0])
def test_cumsum_keeps_the_sign_of_a_zero_as_a_sequential_scan(exclusive, reverse, axis, dtype):
    """CumSum is a contraction with a 0/1 mask, whose masked products ``0 * x`` added +0.0: the
    first element of [-0.0, -0.0, 1.0] scanned to +0.0 (onnxruntime and numpy: -0.0); an
    exclusive scan of [-0.0, -1.0] gave -0.0 at index 1 (onnxruntime: 0 + -0.0 = +0.0)."""
    x = NEG_ZERO_ROWS.astype(dtype)
    m = single_node("CumSum", {"x": x}, {"axis": np.array(axis, np.int64)},
                    exclusive=exclusive, reverse=reverse)
    want = onnxruntime_outputs(m, {"x": x})[0]
    for path, (got,) in run_both(m, {"x": x}):
        assert_same_bits(got, want, path)


@pytest.mark.parametrize("op,attrs", [("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": -1.5}),
                                      ("Celu", {}), ("Celu", {"alpha": 0.5}), ("Elu", {})])
def test_exponential_units_give_the_sign_of_zero_of_the_spec(op, attrs):
    """``Selu``/``Celu`` of -0.0 is ``alpha (exp(-0.0) - 1) = +0.0`` by the spec's formula
    (onnxruntime); lumc's ``expm1(-0.0)`` kept -0.0. ``Elu`` returns ``x`` there (-0.0)."""
    x = np.array([-0.0, 0.0, -1.0, 2.0, -np.inf, np.inf, np.nan], np.float32)
    m = single_node(op, {"x": x}, **attrs)
    want = onnxruntime_outputs(m, {"x": x})[0]
    for path, (got,) in run_both(m, {"x": x}):
        assert_same_bits(got, want, path, rtol=1e-6)


def test_f16_lrn_squares_beyond_f16_range():
    """An f16 LRN over activations of a few hundred: the squares (90000 at 300) overflowed f16,
    so the window sum was inf and every output 0; computed in f32 and rounded once it matches
    the float64 formula (onnxruntime has no f16 LRN)."""
    x = (RNG.standard_normal((1, 6, 3, 3)) * 200 + 300).astype(np.float16)
    m = single_node("LRN", {"x": x}, size=5, alpha=1e-4, beta=0.75, bias=1.0)
    xd = x.astype(np.float64)
    sq = np.pad(xd * xd, ((0, 0), (2, 2), (0, 0), (0, 0)))
    win = sum(sq[:, i:i + 6] for i in range(5))
    want = (xd / (1.0 + 1e-4 / 5 * win) ** 0.75).astype(np.float16)
    for path, (got,) in run_both(m, {"x": x}):
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3,
                                   err_msg=path)


@pytest.mark.parametrize("op", ["Sum", "Mean"])
def test_f16_variadic_sum_and_mean_round_once(op):
    """Variadic f16 ``Sum``/``Mean`` accumulate in f32 and round once, as ``ReduceSum``/
    ``ReduceMean`` and onnxruntime: summed in f16, the mean of three 60000s overflowed to inf and
    ``2048 + 1 + 1`` lost both ones (2048 instead of 2050)."""
    feeds = {"a": np.array([60000.0, 2048.0, 1.0], np.float16),
             "b": np.array([60000.0, 1.0, 2.0], np.float16),
             "c": np.array([-60000.0 if op == "Sum" else 60000.0, 1.0, 2.0], np.float16)}
    m = single_node(op, feeds)
    want = onnxruntime_outputs(m, feeds)[0]
    total = sum(v.astype(np.float32) for v in feeds.values())
    np.testing.assert_array_equal(
        want, (total if op == "Sum" else total / np.float32(3)).astype(np.float16))
    for path, (got,) in run_both(m, feeds):
        assert_same_bits(got, want, path)
