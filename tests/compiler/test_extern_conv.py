"""The ``cudnn`` extern: convolutions read back from their window views and run as ``F.conv{n}d``.

Each case builds its own convolution through ``lumc.ir.library.conv`` (any spatial rank, pads
symmetric and not, strides, dilations, groups, depthwise), checks that the plan recovers the
parameters, and that the extern run matches the kernel's meaning in float64 and torch's own
``F.conv``. Kernels that are not convolutions get no plan."""
import numpy as np
import pytest

from lumc.backends import extern as bx
from lumc.backends.devices import H200
from lumc.backends.extern_conv import conv_plans
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.benchcases import _kernel
from lumc.backends.triton.contraction import find_contractions
from lumc.compiler.core.measure import max_rel_error
from lumc.compiler.runtime.extern import run_extern_numpy
from lumc.ir import dtypes as dt
from lumc.ir.library.conv import conv

# name: (x shape, w shape, conv keywords, bias)
CASES = {
    "3x3-pad1": ((2, 5, 9, 7), (6, 5, 3, 3), dict(pads=[1, 1, 1, 1]), True),
    "stride2-asym": ((1, 4, 10, 11), (3, 4, 3, 3), dict(pads=[0, 1, 2, 1], strides=[2, 2]), False),
    "dilated": ((1, 3, 12, 12), (4, 3, 3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2]), True),
    "grouped": ((2, 6, 8, 8), (9, 2, 3, 3), dict(pads=[1, 1, 1, 1], group=3), True),
    "depthwise": ((1, 8, 9, 9), (8, 1, 5, 5), dict(pads=[2, 2, 2, 2], group=8, strides=[2, 2]), True),
    "1x1": ((1, 16, 5, 6), (8, 16, 1, 1), dict(), True),
    "conv1d": ((2, 4, 33), (5, 4, 7), dict(pads=[3, 3], strides=[2]), True),
    "conv3d": ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), dict(pads=[1, 0, 1, 1, 0, 1]), False),
    "no-pad-crop": ((1, 3, 10, 10), (2, 3, 3, 3), dict(strides=[3, 3]), False),
}


def _conv_kernel(name, dtype=dt.f32):
    xs, ws, kw, bias = CASES[name]
    specs = [(xs, dtype), (ws, dtype)] + ([((ws[0],), dtype)] if bias else [])
    if bias:
        return _kernel("matmul", lambda x, w, b: conv(x, w, b, **kw), specs), specs
    return _kernel("matmul", lambda x, w: conv(x, w, **kw), specs), specs


def _inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32).astype(d.np) for s, d in specs]


def _torch_conv(name, ins):
    import torch
    import torch.nn.functional as F
    xs, ws, kw, bias = CASES[name]
    nsp = len(xs) - 2
    x = torch.from_numpy(ins[0]).double()
    w = torch.from_numpy(ins[1]).double()
    pads = kw.get("pads", [0] * 2 * nsp)
    pad_arg = []
    for i in reversed(range(nsp)):
        pad_arg += [pads[i], pads[nsp + i]]
    x = F.pad(x, pad_arg)
    y = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1](
        x, w, torch.from_numpy(ins[2]).double() if bias else None, kw.get("strides", 1), 0,
        kw.get("dilations", 1), kw.get("group", 1))
    return y.numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_conv_plan_recovers_the_parameters(name):
    k, _ = _conv_kernel(name)
    xs, ws, kw, _ = CASES[name]
    nsp = len(xs) - 2
    (p,) = conv_plans(find_contractions(k.meaning.nodes()))
    assert p.x_shape == xs and p.w_shape == ws
    assert p.groups == kw.get("group", 1)
    assert p.stride == tuple(kw.get("strides", [1] * nsp))
    assert p.dilation == tuple(kw.get("dilations", [1] * nsp))
    assert p.pad_begin == tuple(kw.get("pads", [0] * 2 * nsp)[:nsp])
    assert p.flops == 2 * xs[0] * ws[0] * np.prod(p.out_spatial) * np.prod(ws[1:])
    assert "cudnn" in bx.extern_impls(k)
    assert {"IMPL": "cudnn", "PRECISION": "ieee"} in bx.extern_configs(k, H200)


@pytest.mark.parametrize("name", list(CASES))
def test_cudnn_matches_float64_meaning_and_torch(name):
    k, specs = _conv_kernel(name)
    ins = _inputs(specs)
    feed = {f"in{i}": x for i, x in enumerate(ins)}
    ref = ReferenceExecutor(k.meaning, "float64")(feed)["out0"]
    got = run_extern_numpy(k, {"IMPL": "cudnn", "PRECISION": "ieee"}, ins)[0]
    assert got.shape == ref.shape and got.dtype == np.float32
    assert max_rel_error(got, ref) < 1e-5
    assert max_rel_error(got, _torch_conv(name, ins)) < 1e-5


def test_cudnn_bf16_rounds_fp32_operands_and_half_inputs_run():
    k, specs = _conv_kernel("grouped")
    ins = _inputs(specs, 1)
    exact = run_extern_numpy(k, {"IMPL": "cudnn", "PRECISION": "ieee"}, ins)[0]
    rounded = run_extern_numpy(k, {"IMPL": "cudnn", "PRECISION": "bf16"}, ins)[0]
    want = _torch_conv("grouped", [x.astype(dt.bf16.np).astype(np.float32) if i < 2 else x
                                   for i, x in enumerate(ins)])
    assert max_rel_error(rounded, want) < 1e-5 and max_rel_error(exact, want) > 1e-4
    kh, specs_h = _conv_kernel("3x3-pad1", dt.f16)
    ins_h = _inputs(specs_h, 2)
    got = run_extern_numpy(kh, {"IMPL": "cudnn"}, ins_h)[0]
    assert got.dtype == np.float16
    assert max_rel_error(got, _torch_conv("3x3-pad1", [x.astype(np.float32) for x in ins_h])) < 2e-3


def test_not_convolutions_get_no_plan():
    mm = _kernel("matmul", lambda a, b: a @ b, [((8, 16), dt.f32), ((16, 4), dt.f32)])
    bmm = _kernel("matmul", lambda a, b: a @ b, [((3, 8, 16), dt.f32), ((3, 16, 4), dt.f32)])
    for k in (mm, bmm):
        assert conv_plans(find_contractions(k.meaning.nodes())) == []
        assert "cudnn" not in bx.extern_impls(k)


def test_cudnn_priced_above_its_bound_and_below_im2col_for_a_3x3_conv():
    import dataclasses
    k, _ = _conv_kernel("3x3-pad1")
    big = _kernel("matmul", lambda x, w: conv(x, w, pads=[1, 1, 1, 1]),
                  [((8, 64, 56, 56), dt.f32), ((64, 64, 3, 3), dt.f32)])
    for kk in (k, big):
        for prec in ("ieee", "tf32"):
            cfg = {"IMPL": "cudnn", "PRECISION": prec}
            t = bx.simulate_extern_time(kk, cfg, H200)
            assert t >= bx.extern_bound(kk, cfg, H200)
    # the im2col einsum writes 9x the input and reads it back: cuDNN is priced cheaper on a big conv
    ieee = {"PRECISION": "ieee"}
    t_dnn = bx.simulate_extern_time(big, {"IMPL": "cudnn", **ieee}, H200)
    t_blas = bx.simulate_extern_time(big, {"IMPL": "cublas", **ieee}, H200)
    assert t_dnn < t_blas
    assert dataclasses.is_dataclass(conv_plans(find_contractions(big.meaning.nodes()))[0])


def _conv_model():
    """Conv 3x3 (pad 1) + Relu -> depthwise 5x5 stride 2 (asymmetric pads) -> grouped 3x3 dilated."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    b1 = rng.standard_normal(8).astype(np.float32)
    w2 = rng.standard_normal((8, 1, 5, 5)).astype(np.float32) * 0.3
    w3 = rng.standard_normal((6, 4, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=8, strides=[2, 2], pads=[2, 1, 2, 2]),
        helper.make_node("Conv", ["c2", "w3"], ["y"], group=2, dilations=[2, 2], pads=[2, 2, 2, 2]),
    ]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [1, 3, 17, 15])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for a, n in
                           ((w1, "w1"), (b1, "b1"), (w2, "w2"), (w3, "w3"))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_cpu_executor_runs_a_plan_with_cudnn_convolutions(tmp_path, monkeypatch):
    """A compiled conv model whose convolution kernels are switched to ``cudnn`` configs runs on
    the CPU executor through ``F.conv2d``, matches onnxruntime, and survives save/load."""
    import onnxruntime as ort
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    model = _conv_model()
    cm = lumc.compile(model, budget="60s", device="sim:h200")
    n = 0
    for i, c in enumerate(cm.program.calls):
        if "cudnn" in bx.extern_impls(c.kernel):
            cm.configs[i] = {"IMPL": "cudnn", "PRECISION": "ieee"}
            n += 1
    assert n == 3
    x = np.random.default_rng(3).standard_normal((1, 3, 17, 15)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert max_rel_error(cm(x), want) < 1e-5
    cm.save(tmp_path / "m.lumc")
    back = lumc.load(tmp_path / "m.lumc")
    assert [bx.impl_of(c) for c in back.configs].count("cudnn") == n
    assert max_rel_error(back(x), want) < 1e-5
