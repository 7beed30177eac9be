"""The sign of zero through clamps and rectifiers, each path against its own reference: the torch
frontend against eager, the ONNX frontend against onnxruntime. Both keep an ``x`` equal to a clamp
bound (``clamp(-0.0, min=0)`` and ``Clip(-0.0, 0)`` are -0.0); eager's ``leaky_relu`` tests
``x > 0`` (a negative slope turns -0.0 into +0.0) where onnxruntime's ``LeakyRelu`` keeps it."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import import_onnx

from tests.compiler.test_torch_frontend import compile_module
from tests.compiler.three_paths import run_triton

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

NAN, INF = float("nan"), float("inf")
X = np.array([-0.0, 0.0, NAN, -1.0, 7.0, 0.5, INF, -INF, -3e-39], np.float32)
# a bound that is an input (not a constant): NaN at the fifth and eighth positions
LO = np.array([0.0, 0.0, 0.0, 0.0, NAN, -0.0, 0.0, NAN, 0.0], np.float32)
# onnxruntime's Clip without a max clips +inf to the largest float (the ONNX spec: no bound), so
# the ONNX cases leave the infinities out; it also ignores a NaN bound where lumc and eager give
# NaN, so the NaN bounds are tested on the torch path only
FINITE = np.isfinite(X) | np.isnan(X)


def assert_same_bits(got, want, what: str) -> None:
    """Equal values, NaN where the reference has NaN, and the same sign bit on every non-NaN."""
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_array_equal(got, want, err_msg=what)
    keep = ~np.isnan(want)
    assert np.signbit(got[keep]).tolist() == np.signbit(want[keep]).tolist(), (what, got, want)


class Clamps(nn.Module):
    def forward(self, x, lo):
        return (F.relu6(x), F.hardtanh(x), F.hardtanh(x, -0.5, 0.0), torch.clamp(x, min=0),
                torch.clamp(x, 0, 6), torch.clamp(x, max=0.0), torch.clamp(x, max=-0.0),
                torch.clamp(x, min=-0.0), torch.clamp(x, min=lo), torch.clamp(x, max=lo),
                torch.clamp_min(x, 0.0), F.relu(x), F.leaky_relu(x, 0.01), F.leaky_relu(x, -0.1),
                F.leaky_relu(x, -2.0), torch.clamp(x, min=NAN))


def test_torch_clamps_and_rectifiers_keep_the_sign_of_zero_as_eager(tmp_path, monkeypatch):
    """relu6, hardtanh and clamp of -0.0 at a bound of 0 are -0.0 in eager (lumc gave +0.0: its
    clamp was maximum, which returns the bound on ties); leaky_relu with a negative slope maps
    -0.0 to +0.0 and +0.0 to -0.0 (lumc kept both). NaN in x or a bound stays NaN."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    x, lo = torch.from_numpy(X), torch.from_numpy(LO)
    want = Clamps()(x, lo)
    lowered = compile_module(Clamps(), (x, lo))(x, lo)              # the reference executor
    searched = lumc.compile(Clamps(), budget="60s", device="sim:h200", example_inputs=(x, lo),
                            reuse_plan=False)(x, lo)
    for path, got in (("lowered", lowered), ("searched", searched)):
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_bits(g.numpy(), w.numpy(), f"{path} output {i}")


def _onnx_single(op: str, inputs: list[str], inits: dict, opset: int = 17, **attrs):
    node = helper.make_node(op, inputs, ["y"], **attrs)
    n = int(FINITE.sum())
    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])]
    g = helper.make_graph([node], "g", vi, out, [numpy_helper.from_array(np.array(v, np.float32), k)
                                                 for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


ONNX_CASES = {
    "Relu": ("Relu", ["x"], {}, 17, {}),
    "Clip(0,6)": ("Clip", ["x", "a", "b"], {"a": 0.0, "b": 6.0}, 17, {}),
    "Clip(0,)": ("Clip", ["x", "a"], {"a": 0.0}, 17, {}),
    "Clip(,0)": ("Clip", ["x", "", "b"], {"b": 0.0}, 17, {}),
    "Clip(-0,)": ("Clip", ["x", "a"], {"a": -0.0}, 17, {}),
    "Clip(,-0)": ("Clip", ["x", "", "b"], {"b": -0.0}, 17, {}),
    "Clip6": ("Clip", ["x"], {}, 6, {"min": 0.0, "max": 6.0}),
    "LeakyRelu(0.01)": ("LeakyRelu", ["x"], {}, 17, {"alpha": 0.01}),
    "LeakyRelu(-0.1)": ("LeakyRelu", ["x"], {}, 17, {"alpha": -0.1}),
    "Max(x,0)": ("Max", ["x", "a"], {"a": 0.0}, 17, {}),
    "Min(x,0)": ("Min", ["x", "a"], {"a": 0.0}, 17, {}),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("case", list(ONNX_CASES))
def test_onnx_clip_and_rectifiers_keep_the_sign_of_zero_as_onnxruntime(case):
    """Clip of -0.0 at a bound of 0 is -0.0 in onnxruntime (lumc gave +0.0); Relu and LeakyRelu
    keep -0.0 for any alpha, and Max/Min give the second operand on ties (both unchanged)."""
    op, inputs, inits, opset, attrs = ONNX_CASES[case]
    m = _onnx_single(op, inputs, inits, opset, **attrs)
    feeds = {"x": X[FINITE]}
    sess = ort.SessionOptions()
    sess.log_severity_level = 3
    want = ort.InferenceSession(m.SerializeToString(), sess,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ReferenceExecutor(import_onnx(m, {k: v.shape for k, v in feeds.items()}).graph)(feeds)
    assert_same_bits(got["y"], want, case)
    assert_same_bits(run_triton(m, feeds)["y"], want, f"{case} (Triton, interpreted)")
