"""Conv / ConvTranspose of lumc.ir.library.conv against torch eager and onnxruntime."""
import time

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st
from onnx import TensorProto, helper

from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import Graph, input_node
from lumc.ir.library.conv import auto_pad_pads, conv, conv_transpose
from lumc.ir.tensor import Tensor

ort.set_default_logger_severity(3)
RNG = np.random.default_rng(1234)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def build(fn, *arrays):
    ins = {f"x{k}": input_node(f"x{k}", a.shape, dt.from_numpy(a.dtype)) for k, a in enumerate(arrays)}
    y = fn(*[Tensor(n) for n in ins.values()])
    return Graph(ins, {"y": y.node})


def run(fn, *arrays):
    g = build(fn, *arrays)
    return ReferenceExecutor(g)({f"x{k}": a for k, a in enumerate(arrays)})["y"]


def ort_run(op, inputs: dict, opset=19, **attrs):
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    vi = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()]
    g = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, inputs)[0]


def torch_conv(x, w, b, strides, pads, dilations, group):
    """torch conv with ONNX-order (possibly asymmetric) pads applied by np.pad first."""
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i]) for i in range(nsp)])
    f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    bt = None if b is None else torch.tensor(b)
    return f(torch.tensor(xp), torch.tensor(w), bt, stride=strides, dilation=dilations,
             groups=group).numpy()


def close(a, b, tol=1e-4):
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


CONV_CASES = [
    # x shape, w shape, strides, pads, dilations, group
    ((1, 3, 17), (4, 3, 3), [1], [1, 1], [1], 1),
    ((2, 4, 23), (6, 2, 5), [3], [2, 0], [2], 2),
    ((2, 3, 11, 13), (5, 3, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),
    ((1, 6, 13, 7), (9, 2, 3, 2), [2, 3], [1, 0, 2, 1], [2, 1], 3),
    ((2, 8, 9, 10), (8, 1, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 8),         # depthwise
    ((1, 4, 7, 7), (8, 1, 3, 3), [1, 1], [0, 0, 0, 0], [3, 3], 4),           # channel multiplier 2
    ((1, 3, 5, 5), (2, 3, 1, 1), [2, 2], [0, 0, 0, 0], [1, 1], 1),           # 1x1, strided
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), [1, 2, 1], [0, 1, 1, 1, 0, 0], [1, 1, 2], 1),
    ((1, 1, 1, 1), (1, 1, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1),
    ((0, 3, 5, 5), (2, 3, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),           # empty batch
    ((2, 3, 8, 8), (4, 3, 3, 3), [1, 1], [-1, 0, 0, -1], [1, 1], 1),         # negative pads crop
]


@pytest.mark.parametrize("xs,ws,strides,pads,dil,group", CONV_CASES)
def test_conv_matches_torch(xs, ws, strides, pads, dil, group):
    x, w, b = randn(*xs), randn(*ws), randn(ws[0])
    got = run(lambda x, w, b: conv(x, w, b, strides=strides, pads=pads, dilations=dil, group=group),
              x, w, b)
    nsp = len(xs) - 2
    xc = x
    if any(p < 0 for p in pads):         # torch cannot crop: slice first, then pad the rest
        sl = [slice(None)] * 2 + [slice(max(-pads[i], 0), xs[2 + i] - max(-pads[nsp + i], 0))
                                  for i in range(nsp)]
        xc = x[tuple(sl)]
        pads = [max(p, 0) for p in pads]
    close(got, torch_conv(xc, w, b, strides, pads, dil, group))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_conv2d_random_shapes(data):
    d = data.draw
    group = d(st.sampled_from([1, 2, 3]))
    cg, mg = d(st.integers(1, 3)), d(st.integers(1, 3))
    k = [d(st.integers(1, 4)), d(st.integers(1, 4))]
    s = [d(st.integers(1, 3)), d(st.integers(1, 3))]
    dl = [d(st.integers(1, 2)), d(st.integers(1, 2))]
    p = [d(st.integers(0, 2)) for _ in range(4)]
    spans = [(k[i] - 1) * dl[i] + 1 for i in range(2)]
    hw = [d(st.integers(max(1, spans[i] - p[i] - p[2 + i]), 13)) for i in range(2)]
    x, w = randn(d(st.integers(1, 2)), cg * group, *hw), randn(mg * group, cg, *k)
    got = run(lambda x, w: conv(x, w, strides=s, pads=p, dilations=dl, group=group), x, w)
    close(got, torch_conv(x, w, None, s, p, dl, group))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("shape,k,s,dl", [((1, 2, 7, 8), (3, 2), (2, 3), (1, 1)),
                                          ((1, 2, 10, 5), (4, 3), (1, 2), (1, 1))])
def test_conv_auto_pad_matches_onnxruntime(auto_pad, shape, k, s, dl):
    x, w = randn(*shape), randn(3, shape[1], *k)
    got = run(lambda x, w: conv(x, w, strides=s, dilations=dl, auto_pad=auto_pad), x, w)
    want = ort_run("Conv", {"x": x, "w": w}, strides=s, dilations=dl, auto_pad=auto_pad)
    close(got, want)
    # the helper alone gives the same pads (what the ONNX frontend passes on)
    pads = auto_pad_pads(shape[2:], k, s, dl, auto_pad)
    close(run(lambda x, w: conv(x, w, strides=s, dilations=dl, pads=pads), x, w), want)


def test_auto_pad_pads_values():
    assert auto_pad_pads([7], [3], [2], [1], "SAME_UPPER") == [1, 1]
    assert auto_pad_pads([8], [4], [1], [1], "SAME_UPPER") == [1, 2]
    assert auto_pad_pads([8], [4], [1], [1], "SAME_LOWER") == [2, 1]
    assert auto_pad_pads([5], [1], [3], [1], "SAME_UPPER") == [0, 0]
    assert auto_pad_pads([5, 5], [3, 3], None, None, "VALID") == [0, 0, 0, 0]
    with pytest.raises(ShapeError):
        auto_pad_pads([5], [3], [1], [1], "SAME")


def test_conv_f16_keeps_dtype_and_accumulates_wide():
    x, w = randn(1, 64, 6, 6, dtype=np.float16), randn(4, 64, 3, 3, dtype=np.float16)
    got = run(lambda x, w: conv(x, w, pads=[1, 1, 1, 1]), x, w)
    assert got.dtype == np.float16
    want = torch_conv(x.astype(np.float32), w.astype(np.float32), None, [1, 1], [1, 1, 1, 1],
                      [1, 1], 1)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=5e-2)


def test_conv_inf_and_nan_propagate():
    x = randn(1, 1, 5, 5)
    x[0, 0, 0, 0] = np.inf
    x[0, 0, 4, 4] = np.nan
    w = np.ones((1, 1, 2, 2), np.float32)
    got = run(lambda x, w: conv(x, w), x, w)
    close(np.nan_to_num(got, nan=7.0, posinf=9.0),
          np.nan_to_num(torch_conv(x, w, None, [1, 1], [0] * 4, [1, 1], 1), nan=7.0, posinf=9.0))


def test_conv_zero_size_channels():
    """C = 0: an empty sum gives the bias; M = 0: an empty output."""
    x, w, b = np.zeros((1, 0, 5, 5), np.float32), np.zeros((2, 0, 3, 3), np.float32), randn(2)
    got = run(lambda x, w, b: conv(x, w, b, pads=[1, 1, 1, 1]), x, w, b)
    close(got, np.broadcast_to(b.reshape(1, 2, 1, 1), (1, 2, 5, 5)))
    got = run(lambda x, w: conv(x, w), randn(1, 3, 5, 5), np.zeros((0, 3, 3, 3), np.float32))
    assert got.shape == (1, 0, 3, 3)
    got = run(lambda x, w: conv_transpose(x, w, strides=[2, 2]), np.zeros((0, 3, 5, 5), np.float32),
              randn(3, 2, 3, 3))
    assert got.shape == (0, 2, 11, 11)


def test_conv_errors():
    x, w = randn(1, 4, 5, 5), randn(2, 3, 3, 3)
    with pytest.raises(ShapeError):
        run(lambda x, w: conv(x, w, group=2), x, w)          # 4 / 2 != 3 channels per group
    with pytest.raises(ShapeError):
        run(lambda x, w: conv(x, w), randn(1, 3, 2, 2), w)   # kernel larger than input
    with pytest.raises(ShapeError):
        run(lambda x, w: conv(x, w, strides=[1]), randn(1, 3, 5, 5), w)


def test_conv_640_is_one_contraction_and_fast():
    """YOLO stem shape: the product is never materialized (einsum path), well under a second."""
    x, w, b = randn(1, 3, 640, 640), randn(16, 3, 3, 3), randn(16)
    g = build(lambda x, w, b: conv(x, w, b, pads=[1, 1, 1, 1]), x, w, b)
    ops = g.op_counts()
    assert ops.get("SumReduce") == 1 and ops.get("Mul") == 1 and "Contiguous" not in ops
    s = next(n for n in g.nodes() if n.op == "SumReduce")
    assert s.srcs[0].op == "Mul" and all(o.op == "View" for o in s.srcs[0].srcs)
    ex = ReferenceExecutor(g)
    inputs = {"x0": x, "x1": w, "x2": b}
    elapsed = float("inf")
    for _ in range(2):                           # best of two: the CPU is shared
        t0 = time.perf_counter()
        got = ex(inputs)["y"]
        elapsed = min(elapsed, time.perf_counter() - t0)
    close(got, torch_conv(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1), tol=1e-3)
    assert elapsed < 1.5, f"640x640 conv took {elapsed:.2f} s in the reference executor"


CT_CASES = [
    # x shape, w shape [C, M/g, *k], strides, pads (torch symmetric), dilations, output_padding, group
    ((1, 3, 7), (3, 2, 3), [2], [1], [1], [1], 1),
    ((2, 4, 6), (4, 3, 4), [3], [0], [2], [2], 2),
    ((2, 6, 7, 5), (6, 2, 3, 2), [1, 1], [0, 0], [1, 1], [0, 0], 1),
    ((2, 6, 7, 5), (6, 2, 3, 2), [2, 3], [1, 0], [1, 2], [1, 2], 3),
    ((1, 4, 5, 5), (4, 1, 4, 4), [2, 2], [1, 1], [1, 1], [0, 0], 4),       # depthwise upsampler
    ((1, 2, 3, 4, 3), (2, 3, 2, 3, 2), [2, 1, 2], [0, 1, 0], [1, 1, 2], [1, 0, 0], 1),
    ((1, 2, 5, 4), (2, 2, 2, 2), [1, 1], [2, 2], [1, 1], [0, 0], 1),       # pads larger than k - 1
]


@pytest.mark.parametrize("xs,ws,strides,pads,dil,opad,group", CT_CASES)
def test_conv_transpose_matches_torch(xs, ws, strides, pads, dil, opad, group):
    x, w = randn(*xs), randn(*ws)
    b = randn(ws[1] * group)
    got = run(lambda x, w, b: conv_transpose(x, w, b, strides=strides, pads=pads + pads,
                                             dilations=dil, output_padding=opad, group=group),
              x, w, b)
    f = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(xs) - 2]
    want = f(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=strides, padding=pads,
             output_padding=opad, groups=group, dilation=dil).numpy()
    close(got, want)


@pytest.mark.parametrize("attrs", [
    dict(strides=[2, 2], output_shape=[10, 9]),
    dict(strides=[2, 3], output_shape=[9, 13], dilations=[1, 2]),
    dict(strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(strides=[2, 2], auto_pad="SAME_LOWER"),
    dict(strides=[3, 1], auto_pad="VALID", output_padding=[1, 0]),
    dict(strides=[1, 2], pads=[1, 0, 0, 2]),                        # asymmetric pads
])
def test_conv_transpose_matches_onnxruntime(attrs):
    x, w = randn(1, 4, 5, 4), randn(4, 3, 3, 4)
    got = run(lambda x, w: conv_transpose(x, w, **attrs), x, w)
    close(got, ort_run("ConvTranspose", {"x": x, "w": w}, **attrs))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_conv_transpose_phases_random_against_torch(data):
    """The undilated (phase) form over random kernels, strides, pads, output padding and groups,
    1-D and 2-D, against torch in float64."""
    nsp = data.draw(st.integers(1, 2))
    group = data.draw(st.sampled_from([1, 2]))
    cg, mg = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    ks = [data.draw(st.integers(1, 5)) for _ in range(nsp)]
    ss = [data.draw(st.integers(1, 4)) for _ in range(nsp)]
    ins = [data.draw(st.integers(1, 6)) for _ in range(nsp)]
    pads = [data.draw(st.integers(0, k - 1)) for k in ks]
    opad = [data.draw(st.integers(0, s - 1)) for s in ss]
    assume(all(s * (n - 1) + k - 2 * p + o >= 1 for s, n, k, p, o in zip(ss, ins, ks, pads, opad)))
    x = RNG.standard_normal((2, group * cg, *ins))
    w = RNG.standard_normal((group * cg, mg, *ks))
    b = RNG.standard_normal(group * mg)
    got = run(lambda x, w, b: conv_transpose(x, w, b, strides=ss, pads=pads + pads,
                                             output_padding=opad, group=group), x, w, b)
    f = {1: F.conv_transpose1d, 2: F.conv_transpose2d}[nsp]
    want = f(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=ss, padding=pads,
             output_padding=opad, groups=group).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv_transpose_forms_no_product_with_an_inserted_zero():
    """An infinite weight tap: the ONNX definition gives +-inf where the tap lands and finite
    values elsewhere; a zero-inserted form would give 0 * inf = NaN at every output."""
    x = np.ones((1, 1, 3, 3), np.float32)
    w = randn(1, 1, 2, 2)
    w[0, 0, 0, 0] = np.inf
    got = run(lambda x, w: conv_transpose(x, w, strides=[2, 2]), x, w)
    want = F.conv_transpose2d(torch.tensor(x), torch.tensor(w), stride=2).numpy()
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    close(np.where(np.isinf(got), 0, got), np.where(np.isinf(want), 0, want))


def test_conv_transpose_inf_input_where_the_stride_does_not_divide_the_kernel():
    x = np.array([[[np.inf, 1.0]]], np.float32)
    w = np.array([[[1.0, 2.0, 3.0]]], np.float32)
    got = run(lambda x, w: conv_transpose(x, w, strides=[2]), x, w)
    want = F.conv_transpose1d(torch.tensor(x), torch.tensor(w), stride=2).numpy()  # inf inf inf 2 3
    np.testing.assert_array_equal(got, want)


def test_conv_transpose_upsampler_is_one_contraction_without_padding():
    """kernel == stride (a DB-head / U-Net upsampler): one Mul + SumReduce over [C] per output,
    s**2 times fewer products than the zero-inserted conv, and no padded buffer (its sizes are
    products of the input's, as size ranges need)."""
    x, w = randn(1, 8, 6, 5), randn(8, 4, 2, 2)
    g = build(lambda x, w: conv_transpose(x, w, strides=[2, 2]), x, w)
    s = next(n for n in g.nodes() if n.op == "SumReduce")
    prod = s.srcs[0]
    assert prod.op == "Mul" and int(np.prod(prod.shape)) == 1 * 4 * 8 * 6 * 5 * 2 * 2
    for n in g.nodes():
        if n.op == "View":
            assert n.arg.mask is None, n.arg
    got = ReferenceExecutor(g)({"x0": x, "x1": w})["y"]
    close(got, F.conv_transpose2d(torch.tensor(x), torch.tensor(w), stride=2).numpy())
