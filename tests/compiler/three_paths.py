"""Run one ONNX model through lumc's three output paths and compare them.

The paths are the reference executor (numpy, the oracle), the Triton backend (the greedy-fused
program launched through generated Triton, the interpreter on CPU: what ``lumc run --backend
triton`` does) and a compiled artifact (``lumc.compile`` on the simulated H200, saved, loaded and
called: its plan runs on the CPU executor). They must agree on shape and dtype exactly, and on
values within the tolerance of the output's dtype.
"""
from __future__ import annotations

import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import import_onnx

# (rtol, atol) per dtype between paths: kernels reassociate sums and use fused multiply-adds
TOL = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-3),
       "bfloat16": (4e-2, 1e-2)}


def run_reference(model, feeds: dict) -> dict:
    imported = import_onnx(model, {k: np.shape(v) for k, v in feeds.items()})
    return ReferenceExecutor(imported.graph)(feeds)


def run_triton(model, feeds: dict) -> dict:
    from lumc.backends.triton.runner import run_program
    from lumc.compiler.core.fusion import greedy_program
    imported = import_onnx(model, {k: np.shape(v) for k, v in feeds.items()})
    return run_program(greedy_program(imported.graph), feeds)


def run_compiled(model, feeds: dict, tmp_path, db=None) -> dict:
    import lumc
    f = lumc.compile(model, budget="60s", device="sim:h200", example_inputs=feeds, db=db,
                     reuse_plan=False)
    path = tmp_path / "m.lumc"
    f.save(path)
    return lumc.load(path).run(feeds)


def assert_same(got: dict, want: dict, path: str) -> None:
    assert set(got) == set(want), (path, sorted(got), sorted(want))
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.shape == w.shape, f"{path} {k}: shape {g.shape} vs reference {w.shape}"
        assert g.dtype == w.dtype, f"{path} {k}: dtype {g.dtype} vs reference {w.dtype}"
        if w.dtype.kind in "fc" or w.dtype.name == "bfloat16":
            rtol, atol = TOL[w.dtype.name]
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol, equal_nan=True, err_msg=f"{path} {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{path} {k}")
