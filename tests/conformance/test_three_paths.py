"""The ONNX node conformance cases through all three output paths, not just the reference.

For every node case of ``onnx.backend.test`` that lumc supports, the reference executor, the
Triton backend (greedy-fused kernels, the Triton interpreter on CPU) and a compiled artifact
(``lumc.compile`` on the simulated H200, saved and loaded, run by its plan) must each give the
case's expected outputs within the case's tolerances (as ``onnx.backend.test`` checks them), with
the reference's shape and dtype exactly. The default suite runs a seeded sample of
:data:`SAMPLE` cases; ``slow`` runs them all. Exceptions are listed in :data:`EXCEPTIONS` with
their reason (strict: an exception that passes fails the run).
"""
from __future__ import annotations

import os
import random
import unittest
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir import dtypes as dt
from lumc.ir.errors import UnsupportedOpError

SAMPLE = 16
STORAGE_NP = {d.np for d in dt.STORAGE_DTYPES}
SEED = 14

_BF16 = "bf16 arithmetic is wrong in the Triton interpreter (DESIGN.md); GPU-only"
_F16 = ("fp16: the fused kernel computes in fp32 and rounds once, the ONNX reference rounds every "
        "op; 1 fp16 ulp apart at 2 elements, just over rtol 1e-3")

_BF16_FUSED = ("bf16: the fused attention computes in fp32 and rounds once where a value is "
               "stored, the ONNX reference rounds every op (allowed: no value in between is "
               "stored, compared or fed to a non-monotonic op); 1 bf16 ulp apart at ~12% of the "
               "elements, over the case's rtol 1e-3")

# (case, path) -> why that path cannot give the expected values
EXCEPTIONS: dict[tuple[str, str], str] = {
    **{(c, "triton"): _BF16 for c in (
        "test_attention_3d_causal_bf16", "test_attention_3d_causal_bf16_expanded",
        "test_attention_4d_attn_mask_causal_bf16", "test_attention_4d_attn_mask_causal_bf16_expanded",
        "test_attention_4d_causal_bf16", "test_attention_4d_causal_bf16_expanded",
        "test_attention_4d_causal_padded_kv_bf16", "test_attention_4d_causal_padded_kv_bf16_expanded",
        "test_attention_4d_padded_kv_bf16", "test_attention_4d_padded_kv_bf16_expanded",
        "test_celu_bfloat16", "test_celu_bfloat16_expanded", "test_einsum_batch_matmul_bfloat16",
        # the interpreter's f32 -> bf16 conversion truncates (measured: 0.4805 -> 0.4785 where
        # round-to-nearest-even gives 0.4805); a GPU's cvt.rn.bf16.f32 rounds
        "test_cast_FLOAT_to_BFLOAT16", "test_castlike_FLOAT_to_BFLOAT16",
        "test_castlike_FLOAT_to_BFLOAT16_expanded")},
    **{(c, "compiled"): _BF16_FUSED for c in (
        "test_attention_3d_causal_bf16", "test_attention_3d_causal_bf16_expanded",
        "test_attention_4d_attn_mask_causal_bf16", "test_attention_4d_attn_mask_causal_bf16_expanded",
        "test_attention_4d_causal_bf16", "test_attention_4d_causal_bf16_expanded",
        "test_attention_4d_causal_padded_kv_bf16", "test_attention_4d_causal_padded_kv_bf16_expanded",
        "test_attention_4d_padded_kv_bf16", "test_attention_4d_padded_kv_bf16_expanded")},
    **{(c, "triton"): _F16 for c in (
        "test_causal_conv_with_state_silu_fp16", "test_causal_conv_with_state_silu_fp16_expanded")},
}


def _cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return sorted(load_model_tests(kind="node"), key=lambda c: c.name)


CASES = _cases()
_rng = random.Random(SEED)
SAMPLED = set(c.name for c in _rng.sample(CASES, SAMPLE))


_STORAGE = ("storage-only dtype (float8/float4/int4/int2): the reference executor and the CPU "
            "executor hold and cast it; Triton kernels do not render it (e4m3fn and e5m2 loads and "
            "casts up do render: the cases in _RENDERED pass, so do casts to them without "
            "saturate; the fnuz, 4-bit and 2-bit types have no Triton type)")
# storage cases the Triton path passes since float8 e4m3fn/e5m2 have Triton types (tl.float8e4nv,
# tl.float8e5): loads and casts up from them
_RENDERED = {"test_cast_FLOAT8E5M2_to_FLOAT16", "test_castlike_FLOAT8E5M2_to_FLOAT16",
             "test_castlike_FLOAT8E5M2_to_FLOAT16_expanded", "test_dequantizelinear_e4m3fn",
             "test_dequantizelinear_e4m3fn_float16", "test_dequantizelinear_e4m3fn_zero_point",
             "test_dequantizelinear_e5m2", "test_quantizelinear_e5m2"}
# casts to e4m3fn/e5m2 with saturate=0: a kernel forms the overflow (NaN, inf) that Triton's own
# conversion saturates (lumc.backends.triton.exprs._float8_cast)
_RENDERED |= {f"test_{op}_no_saturate_{src}_to_FLOAT8{to}{x}" for op in ("cast", "castlike")
              for src in ("FLOAT", "FLOAT16") for to in ("E4M3FN", "E5M2")
              for x in ("", "_expanded") if op == "castlike" or not x}
# saturating casts to e4m3fn/e5m2 and casts up from them (the interpreter's float8 conversion is
# the GPU's: lumc.backends.triton.interpreter_bf16); these were listed as failing, strictly
_RENDERED |= {
    "test_cast_FLOAT16_to_FLOAT8E4M3FN", "test_cast_FLOAT16_to_FLOAT8E5M2",
    "test_cast_FLOAT8E4M3FN_to_FLOAT", "test_cast_FLOAT8E4M3FN_to_FLOAT16",
    "test_cast_FLOAT8E5M2_to_FLOAT", "test_cast_FLOAT_to_FLOAT8E4M3FN",
    "test_cast_FLOAT_to_FLOAT8E5M2", "test_castlike_FLOAT16_to_FLOAT8E4M3FN",
    "test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded", "test_castlike_FLOAT16_to_FLOAT8E5M2",
    "test_castlike_FLOAT16_to_FLOAT8E5M2_expanded", "test_castlike_FLOAT8E4M3FN_to_FLOAT",
    "test_castlike_FLOAT8E4M3FN_to_FLOAT16", "test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded",
    "test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded", "test_castlike_FLOAT8E5M2_to_FLOAT",
    "test_castlike_FLOAT8E5M2_to_FLOAT_expanded", "test_castlike_FLOAT_to_FLOAT8E4M3FN",
    "test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded", "test_castlike_FLOAT_to_FLOAT8E5M2",
    "test_castlike_FLOAT_to_FLOAT8E5M2_expanded", "test_quantizelinear_e4m3fn",
}
_STORAGE_ONNX = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
                 onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ,
                 onnx.TensorProto.FLOAT4E2M1, onnx.TensorProto.INT4, onnx.TensorProto.UINT4,
                 onnx.TensorProto.INT2, onnx.TensorProto.UINT2}


def _touches_storage(model: onnx.ModelProto) -> bool:
    g = model.graph
    types = [vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.output)]
    types += [t.data_type for t in g.initializer]
    types += [a.i for n in g.node for a in n.attribute if a.name in ("to", "output_dtype")]
    return bool(set(types) & _STORAGE_ONNX)


def _params():
    from test_onnx_backend import XFAIL   # cases the reference itself does not pass, with reasons
    out = []
    for c in CASES:
        if c.name in XFAIL:
            continue
        base = [] if c.name in SAMPLED else [pytest.mark.slow]
        for path in ("triton", "compiled"):
            why = EXCEPTIONS.get((c.name, path)) or (
                _STORAGE if path == "triton" and _touches_storage(c.model)
                and c.name not in _RENDERED else None)
            marks = base + [pytest.mark.xfail(reason=why, strict=True)] if why else base
            out.append(pytest.param(c, path, id=f"{c.name}-{path}", marks=marks))
    return out


def _expected_check(got: dict, want: list, names: list[str], ref: dict, rtol: float, atol: float,
                    path: str):
    for name, w in zip(names, want):
        g, r = np.asarray(got[name]), np.asarray(ref[name])
        assert g.shape == r.shape, f"{path} {name}: shape {g.shape}, reference {r.shape}"
        assert g.dtype == r.dtype, f"{path} {name}: dtype {g.dtype}, reference {r.dtype}"
        if w.dtype == object or w.dtype.kind in "US":
            np.testing.assert_array_equal(g, w)
        elif w.dtype in STORAGE_NP or w.dtype == dt.bf16.np:
            # float8/int4/bf16 (ml_dtypes, not numpy floats): the same values, NaN equal to NaN
            np.testing.assert_array_equal(g.astype(np.float32), w.astype(np.float32),
                                          err_msg=f"{path} {name}")
        elif w.dtype.kind in "fc":
            np.testing.assert_allclose(g.astype(w.dtype), w, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{path} {name}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{path} {name}")


@pytest.mark.parametrize("case,path", _params())
def test_node_case_three_paths(case, path, tmp_path):
    from test_onnx_backend import ConformanceBackend
    from lumc.compiler.tools.onnx_backend import _bind_inputs
    model = case.model
    ins, outs = (list(x) for x in case.data_sets[0])
    ins, outs = ([numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else
                  np.asarray(a) if isinstance(a, np.generic) else a for a in xs] for xs in (ins, outs))
    if any(not isinstance(a, np.ndarray) for a in ins + outs):
        pytest.skip("non-tensor inputs or outputs")
    try:
        rep = ConformanceBackend.prepare(model)
        inits = {i.name for i in model.graph.initializer}
        names_in = [vi.name for vi in model.graph.input if vi.name not in inits]
        feeds = dict(zip(names_in, ins))
        imported, run = rep.rep._prepared(feeds)
    except unittest.SkipTest as e:
        pytest.skip(str(e))
    except UnsupportedOpError as e:   # found at import (a training-mode Dropout): a skip, as there
        pytest.skip(f"unsupported: {e.op}: {e.reason}")
    names_out = [vi.name for vi in model.graph.output]
    graph_feeds = {s.name: feeds[s.name] for s in imported.inputs}
    ref = run(graph_feeds)
    if path == "triton":
        from lumc.backends.triton.runner import run_program
        from lumc.compiler.core.fusion import greedy_program
        got = run_program(greedy_program(imported.graph), graph_feeds)
    else:
        import lumc
        fixed = {n: feeds[n] for n in rep.rep.constant_inputs}
        bound = _bind_inputs(model, fixed) if fixed else model
        f = lumc.compile(bound, budget="60s", device="sim:h200", example_inputs=graph_feeds,
                         db=TuningDatabase(tmp_path / "db.sqlite"), reuse_plan=False)
        f.save(tmp_path / "m.lumc")
        got = lumc.load(tmp_path / "m.lumc").run(graph_feeds)
    _expected_check(got, outs, names_out, ref, case.rtol, case.atol, path)
