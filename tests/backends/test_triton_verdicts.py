"""The interpreter's numerics verdict does not depend on the config, for the MODELS.md kernels.

On ``sim:*`` the compile checks each kernel's numerics once, at the config with the largest tiles
(``KernelMeasurer``), and then times every config of its space. This test runs every distinct kernel
of every candidate program the compile considers (e-graph extraction and the unfused program) at the
GPU default config and at the largest-tile config, on the compile's own
captured inputs, and requires each to match the reference within the dtype's tolerance, with the
same NaN/inf positions, so a verdict taken at one config holds for the others. Every kernel must
render (MiniLM's attention included).

MiniLM (attention, layer norm, gather, matmul) runs in the default suite; the other three are slow.
"""
from __future__ import annotations

import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.backends.triton import TritonKernel, configs
from lumc.backends.triton.launch import to_numpy


def _largest(tk, space):
    def tiles(c):
        kw = c.kwargs()
        return (int(np.prod([v for k, v in kw.items() if k.startswith("BLOCK")] or [1])),
                -kw.get("num_stages", 1))
    return max(space, key=tiles)


def _verdicts(path, shapes):
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.measure import INTERPRETER_MAX_ELEMENTS, max_rel_error
    from lumc.compiler.core.pipeline import (example_inputs_for, stage_candidates, stage_frontend,
                                        stage_reference)
    from lumc.compiler.runtime.targets import resolve_target
    fe = stage_frontend(path, shapes, None)
    programs, _ = stage_candidates(fe.graph, resolve_target("sim:h200"), Deadline(60.0), True)
    inputs = {k: np.asarray(v) for k, v in example_inputs_for(fe.graph, fe).items()}
    _, values = stage_reference(fe.graph, programs, inputs)
    calls = {}
    for p in programs:
        for c in p.calls:
            calls.setdefault(c.kernel.content_hash(), c)
    forms, bad = {}, []
    for key, c in calls.items():
        tk = TritonKernel(c.kernel)              # RenderError fails the test
        ins = [values.get(id(n), n.arg.value if n.op == "Constant" else None) for n in c.inputs]
        refs = [values.get(id(n)) for n in c.outputs]
        if any(x is None for x in ins + refs) or \
                sum(n.numel for n in c.outputs) > INTERPRETER_MAX_ELEMENTS:
            continue
        rk = tk.rendered
        space = tk.config_space()
        cfgs = {"gpu default": configs.default_config(rk.config_space, rk.problem)}
        if space:
            cfgs["largest tiles"] = _largest(tk, space)
        forms[c.kernel.form] = forms.get(c.kernel.form, 0) + 1
        for label, cfg in cfgs.items():
            outs = tk(*ins, config=cfg)
            for o, r, n in zip(outs, refs, c.outputs):
                got = to_numpy(o)
                if n.dtype.is_float:
                    err, tol = max_rel_error(got, r), dt.rtol_for(n.dtype)
                else:
                    err, tol = (0.0 if np.array_equal(got, r) else float("inf")), 0.0
                if err > tol:
                    bad.append(f"{c.kernel.form} {rk.variant} {key[:12]} at {label} ({cfg}): "
                               f"max rel error {err:.3g} > {tol:g}")
    return forms, bad


def _run(name, model_path, forms_needed):
    from lumc.compiler.frontends import models
    forms, bad = _verdicts(model_path(name), models.MODEL_INFO[name].test_shapes[0])
    assert not bad, "\n".join(bad)
    assert forms_needed <= set(forms), forms


@pytest.mark.models
def test_minilm_kernels_agree_at_default_and_largest_configs(model_path):
    _run("minilm-l3", model_path, {"attention", "matmul", "gather", "pointwise", "reduction"})


@pytest.mark.models
@pytest.mark.slow
@pytest.mark.parametrize("name", ["silero-vad", "magika", "ppocr-det"])
def test_model_kernels_agree_at_default_and_largest_configs(name, model_path):
    _run(name, model_path, {"matmul", "pointwise", "reduction"})
