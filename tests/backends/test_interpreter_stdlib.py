"""Triton imported before lumc (``import torch._inductor``, a ``torch.compile`` call, PyTorch's
OpInfo database) left ``tl.max``, ``tl.sum``, ``tl.argmax`` and the like as ``JITFunction`` objects,
which an interpreted kernel cannot call (``interpreter_stdlib``). Each case runs in a fresh Python
process that imports Triton first, then runs lumc's generated kernels (Triton interpreter, the
greedy program) against numpy."""
import json
import os
import subprocess
import sys

import pytest

CODE = r'''
import json, sys
import triton.language          # before lumc: its library functions are JITFunctions
import numpy as np
import onnx
from onnx import TensorProto, helper
import lumc
from lumc.backends.triton.runner import run_program
from lumc.compiler.core.fusion import greedy_program
from lumc.compiler.frontends.onnx_frontend.importer import import_onnx

def model(op, dtype, **attrs):
    x = helper.make_tensor_value_info("x", dtype, [5, 7])
    out = TensorProto.INT64 if op == "ArgMax" else dtype
    y = helper.make_tensor_value_info("y", out, None)
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])

rng = np.random.default_rng(0)
xi = rng.integers(-2**40, 2**40, size=(5, 7)).astype(np.int64)
xf = rng.standard_normal((5, 7)).astype(np.float32)
cases = [("ReduceMax", TensorProto.INT64, xi, lambda a: a.max(1)),
         ("ReduceSum", TensorProto.INT64, xi, lambda a: a.sum(1)),
         ("ArgMax", TensorProto.FLOAT, xf, lambda a: a.argmax(1)),
         ("ReduceMin", TensorProto.FLOAT, xf, lambda a: a.min(1))]
out = {}
for op, dtype, x, ref in cases:
    attrs = {"keepdims": 0} if op == "ArgMax" else {"keepdims": 0, "axes": [1]}
    if op == "ArgMax":
        attrs["axis"] = 1
    imp = import_onnx(model(op, dtype, **attrs))
    got = run_program(greedy_program(imp.graph), {"x": x})
    got = np.asarray(got["y"] if isinstance(got, dict) else got[0])
    out[op] = bool(np.array_equal(got.reshape(-1), ref(x).reshape(-1)))
import triton.language as tl
out["interpreted"] = type(tl.max).__name__
print(json.dumps(out))
'''


def test_library_functions_run_in_the_interpreter_when_triton_was_imported_first():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)       # as a user's shell: lumc decides it at import
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU machine: kernels are compiled, not interpreted")
    res = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"ReduceMax": True, "ReduceSum": True, "ArgMax": True, "ReduceMin": True,
                   "interpreted": "InterpretedFunction"}, got
