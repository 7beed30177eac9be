"""Vendor (extern) implementations: numerics through torch CPU, config lists, simulated price, the
CPU executor and artifacts running plans with ``IMPL`` configs."""
import numpy as np
import pytest

from lumc.backends import extern as bx
from lumc.backends.devices import H200
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.benchcases import _attention, _kernel
from lumc.compiler.runtime.extern import ExternConfig, ExternKernel, config_from_dict, run_extern_numpy
from lumc.compiler.core.measure import KernelMeasurer, max_rel_error
from lumc.compiler.runtime.program import KernelCall
from lumc.compiler.runtime.targets import resolve_target
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir import dtypes as dt
from lumc.ir.library.conv import conv

VERSIONS = {"lumc": "t", "triton": "t", "driver": "t"}


def _cases():
    return {
        "matmul-bias-relu": ("matmul", lambda a, b, c: ((a @ b) + c).maximum(0.0),
                             [((37, 61), dt.f32), ((61, 29), dt.f32), ((29,), dt.f32)]),
        "batched": ("matmul", lambda a, b: a @ b, [((3, 17, 23), dt.f32), ((3, 23, 11), dt.f32)]),
        "conv": ("matmul", lambda x, w: conv(x, w, pads=[1, 1, 1, 1]),
                 [((2, 5, 9, 7), dt.f32), ((6, 5, 3, 3), dt.f32)]),
        "attention": ("attention", _attention(0.125), [((2, 3, 17, 16), dt.f32)] * 3),
        "bf16": ("matmul", lambda a, b: a @ b, [((33, 64), dt.bf16), ((64, 40), dt.bf16)]),
    }


def _inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32).astype(d.np) for s, d in specs]


@pytest.mark.parametrize("name", list(_cases()))
def test_extern_matches_float64_meaning(name):
    form, f, specs = _cases()[name]
    k = _kernel(form, f, specs)
    ins = _inputs(specs)
    feed = {f"in{i}": x for i, x in enumerate(ins)}
    ref = ReferenceExecutor(k.meaning, "float64")(feed)["out0"]
    got = run_extern_numpy(k, {"IMPL": "cublas"}, ins)[0]
    assert got.shape == ref.shape and got.dtype == k.outputs[0].dtype.np
    tol = 1e-5 if specs[0][1] == dt.f32 else 1e-2
    assert max_rel_error(got, ref) < tol


def test_extern_precision_bf16_rounds_fp32_operands():
    form, f, specs = _cases()["batched"]
    k = _kernel(form, f, specs)
    ins = _inputs(specs, 1)
    exact = run_extern_numpy(k, {"IMPL": "cublas", "PRECISION": "ieee"}, ins)[0]
    rounded = run_extern_numpy(k, {"IMPL": "cublas", "PRECISION": "bf16"}, ins)[0]
    a = ins[0].astype(dt.bf16.np).astype(np.float64)
    b = ins[1].astype(dt.bf16.np).astype(np.float64)
    want = a @ b
    assert max_rel_error(rounded, want) < 1e-5          # bf16 operands, fp32 accumulation
    assert max_rel_error(exact, want) > 1e-4            # the IEEE run did not round its operands


def test_extern_writes_preallocated_outputs():
    import torch
    form, f, specs = _cases()["matmul-bias-relu"]
    k = _kernel(form, f, specs)
    ins = [torch.from_numpy(x) for x in _inputs(specs)]
    out = torch.full((37, 29), float("nan"))
    ExternKernel(k)(*ins, outputs=[out])
    run = ExternKernel(k).bound_launch(ins, [out2 := torch.zeros(37, 29)], ExternConfig("cublas"))
    run()
    want = np.maximum(ins[0].numpy().astype(np.float64) @ ins[1].numpy() + ins[2].numpy(), 0)
    assert max_rel_error(out.numpy(), want) < 1e-5 and max_rel_error(out2.numpy(), want) < 1e-5


def test_which_kernels_get_externs():
    mm = _kernel(*_cases()["conv"][:2], _cases()["conv"][2])
    pw = _kernel("pointwise", lambda x: x.maximum(0.0), [((64,), dt.f32)])
    assert bx.extern_impls(pw) == [] and bx.extern_configs(pw, H200) == []
    assert bx.extern_configs(mm, H200) == [{"IMPL": "cublas", "PRECISION": "ieee"},    # policy: f32
                                           {"IMPL": "cudnn", "PRECISION": "ieee"}]     # a conv
    bf = _kernel(*_cases()["bf16"][:2], _cases()["bf16"][2])
    assert bx.extern_configs(bf, H200) == [{"IMPL": "cublas", "PRECISION": "bf16"}]
    with pytest.raises(ValueError):
        ExternKernel(pw)


@pytest.mark.parametrize("dtype", [dt.i32, dt.i64])
def test_integer_contractions_have_no_vendor_call(dtype):
    """CUDA's matmul, bmm and conv are not implemented for int32/int64 in torch: an integer
    contraction (an int64 CumSum's triangular mask over 65536 rows of 8, which sim priced as a
    cuBLAS call) offers no extern config; one whose integer operand is widened to f32 in its
    prologue (a weight stored as int8) still does."""
    k = _kernel("matmul", lambda a, b: a @ b, [((64, 32), dtype), ((32, 48), dtype)])
    assert bx.extern_impls(k) == [] and bx.extern_configs(k, H200) == []
    w = _kernel("matmul", lambda a, b: a @ b.cast(dt.f32), [((64, 32), dt.f32), ((32, 48), dt.i8)])
    assert bx.extern_impls(w) == ["cublas"], bx.extern_impls(w)


@pytest.mark.parametrize("impl", ["cublas", "cudnn", "sdpa"])
def test_extern_config_runs_a_contraction_resized_to_k_1(impl):
    """A range plan chose IMPL=cublas for a contraction over the dynamic dim (CumSum over n as a
    matmul); re-sized to the range's low end n = 1 the contraction has K = 1, where no vendor call
    applies. It runs (as the torch replay of the same meaning) instead of raising ValueError
    ('lumc compile --shape n=1..64' of a CumSum model ended in that traceback)."""
    k = _kernel("matmul", lambda a, b: a @ b, [((5, 1), dt.f32), ((1, 7), dt.f32)])
    assert bx.extern_impls(k) == []
    a, b = _inputs([((5, 1), dt.f32), ((1, 7), dt.f32)], 3)
    got = run_extern_numpy(k, {"IMPL": impl, "PRECISION": "ieee"}, [a, b])[0]
    np.testing.assert_allclose(got, a @ b, rtol=1e-6)


def test_range_compile_of_a_cumsum_runs_at_every_size(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import lumc
    g = helper.make_graph([helper.make_node("CumSum", ["x", "ax"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n"])],
                          [numpy_helper.from_array(np.array(1, np.int64), "ax")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    f = lumc.compile(m.SerializeToString(), budget="30s", device="sim:h200",
                     shapes={"n": (1, 16)}, db=TuningDatabase(tmp_path / "t.sqlite"))
    for n in (1, 2, 3, 7, 16):
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        np.testing.assert_allclose(f(x), np.cumsum(x, axis=1), rtol=1e-5, atol=1e-6)


def test_simulated_extern_price():
    n = 8192
    k = _kernel("matmul", lambda a, b: a @ b, [((n, n), dt.bf16), ((n, n), dt.bf16)])
    cfg = {"IMPL": "cublas", "PRECISION": "bf16"}
    t = bx.simulate_extern_time(k, cfg, H200)
    want = 2 * n ** 3 / (989.4e12 * bx.CUBLAS_EFFICIENCY) + H200.launch_overhead_s
    assert t == pytest.approx(want, rel=1e-9)
    assert t >= bx.extern_bound(k, cfg, H200) >= 2 * n ** 3 / 989.4e12
    # fp32 without TF32 runs on CUDA cores: far slower than the bf16 tensor-core GEMM
    k32 = _kernel("matmul", lambda a, b: a @ b, [((n, n), dt.f32), ((n, n), dt.f32)])
    t32 = bx.simulate_extern_time(k32, {"IMPL": "cublas", "PRECISION": "ieee"}, H200)
    assert t32 == pytest.approx(2 * n ** 3 / (66.9e12 * bx.CUBLAS_FP32_EFFICIENCY) + 4e-6, rel=1e-9)
    # an epilogue is one more eager kernel: a launch plus its bytes
    kb = _kernel("matmul", lambda a, b, c: (a @ b) + c, [((n, n), dt.bf16), ((n, n), dt.bf16),
                                                          ((n,), dt.bf16)])
    assert bx.simulate_extern_time(kb, cfg, H200) > t + H200.launch_overhead_s


def _call(kernel):
    from lumc.ir.graph import input_node
    ins = [input_node(f"x{i}", ph.shape, ph.dtype) for i, ph in enumerate(kernel.inputs)]
    outs = [input_node(f"y{i}", o.shape, o.dtype) for i, o in enumerate(kernel.outputs)]
    return KernelCall(kernel, ins, outs)


def _matmul_bias_relu_call():
    """The matmul-bias-relu case as a bound call: ``(kernel, call, inputs, reference values)``."""
    form, f, specs = _cases()["matmul-bias-relu"]
    k = _kernel(form, f, specs)
    call = _call(k)
    ins = _inputs(specs)
    ref = ReferenceExecutor(k.meaning)({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    values = {id(n): v for n, v in zip(call.inputs, ins)}
    values[id(call.outputs[0])] = ref
    return k, call, ins, values


def test_measurer_lists_times_and_checks_externs(tmp_path, monkeypatch):
    k, call, ins, values = _matmul_bias_relu_call()
    m = KernelMeasurer(resolve_target("sim:h200"), TuningDatabase(tmp_path / "db.sqlite"), VERSIONS, values)
    key = m.add(call)
    cfgs = [m.config_of(key, i) for i in range(m.n_configs(key))]
    assert bx.impl_of(cfgs[0]) == "triton" and cfgs[1] == {"IMPL": "cublas", "PRECISION": "ieee"}
    assert sum(bx.is_extern(c) for c in cfgs) == 1
    res = m(key, 1)
    assert res.status == "ok"
    assert res.seconds == pytest.approx(bx.simulate_extern_time(k, cfgs[1], H200))
    assert m.bound(key, 1) <= res.seconds
    assert m.checked[(key, 1)] < 1e-6           # checked on torch CPU against the reference
    # a wrong extern result is rejected and stored as such
    import lumc.compiler.runtime.extern as ce
    monkeypatch.setattr(ce, "run_extern_numpy", lambda kernel, cfg, xs: [values[id(call.outputs[0])] + 1.0])
    m2 = KernelMeasurer(resolve_target("sim:h200"), TuningDatabase(tmp_path / "db2.sqlite"), VERSIONS,
                        values)
    key2 = m2.add(call)
    assert m2(key2, 1).status == "rejected"
    assert not m2.db.get(m2._db_key(key2, 1)).ok


def test_config_dicts_round_trip():
    assert config_from_dict({"IMPL": "cublas", "PRECISION": "ieee"}) == ExternConfig("cublas", "ieee")
    c = config_from_dict({"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 8, "num_stages": 3})
    assert c.kwargs() == {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 8, "num_stages": 3}
    assert config_from_dict(None) is None


def test_cpu_executor_runs_a_plan_with_extern_kernels(tmp_path, monkeypatch):
    """A compiled plan whose contraction kernels are switched to cuBLAS configs runs on the CPU
    executor through torch, matches onnxruntime, and survives save/load."""
    import onnxruntime as ort
    import lumc
    from tests.compiler.test_compile import small_model
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    model = small_model(m=13, k=24, n=40)
    cm = lumc.compile(model, budget="60s", device="sim:h200")
    n_ext = 0
    for i, c in enumerate(cm.program.calls):
        ext = bx.extern_configs(c.kernel, H200)
        if ext:
            cm.configs[i] = ext[0]
            n_ext += 1
    assert n_ext >= 1
    x = np.random.default_rng(3).standard_normal((13, 24)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert max_rel_error(cm(x), want) < 1e-5
    cm.save(tmp_path / "m.lumc")
    back = lumc.load(tmp_path / "m.lumc")
    assert [bx.impl_of(c) for c in back.configs].count("cublas") == n_ext
    assert max_rel_error(back(x), want) < 1e-5


@pytest.mark.gpu
def test_gpu_plan_runs_extern_kernels_through_cuda_graphs(tmp_path, monkeypatch):
    import onnxruntime as ort
    import lumc
    from tests.compiler.test_compile import small_model
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    model = small_model(m=13, k=24, n=40)
    cm = lumc.compile(model, budget="60s", device="sim:h200")
    for i, c in enumerate(cm.program.calls):
        ext = bx.extern_configs(c.kernel, H200)
        if ext:
            cm.configs[i] = ext[0]
    cm.torch_device = "cuda:0"
    x = np.random.default_rng(3).standard_normal((13, 24)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert max_rel_error(cm(x), want) < 1e-5
    assert cm._gpu_plan.graph                      # replayed through a CUDA graph


def test_gpu_configs_that_spill_are_pruned_before_timing(tmp_path, monkeypatch):
    import dataclasses
    import lumc.backends.triton.resources as res
    k, call, ins, values = _matmul_bias_relu_call()
    gpu = dataclasses.replace(resolve_target("sim:h200"), name="cuda:0 fake", simulated=False)
    m = KernelMeasurer(gpu, TuningDatabase(tmp_path / "db.sqlite"), VERSIONS, values)
    key = m.add(call)
    monkeypatch.setattr(res, "spills_of_launch", lambda mod, names, launch: (512, launch()))
    monkeypatch.setattr(m, "_time", lambda e, cfg: 1e-5)
    r = m(key, 0)
    assert r.status == "rejected" and "spills 512 B" in r.note
    monkeypatch.setattr(res, "spills_of_launch", lambda mod, names, launch: (0, launch()))
    assert m(key, 2).status == "ok"


def _fp8_rowwise_reference(a, b):
    """numpy: A quantized to e4m3 per row, B per column (amax/448, RNE, clamped), products summed
    in float64, times both scales (torch._scaled_mm's row-wise scaling)."""
    import ml_dtypes
    sa = np.abs(a).max(axis=1, keepdims=True) / 448.0
    sb = np.abs(b).max(axis=0, keepdims=True) / 448.0
    sa, sb = np.where(sa > 0, sa, 1.0).astype(np.float32), np.where(sb > 0, sb, 1.0).astype(np.float32)
    qa = np.clip(a / sa, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    qb = np.clip(b / sb, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return (qa @ qb) * sa * sb


def test_fp8_vendor_gemm_is_a_rowwise_scaled_mm():
    from dataclasses import replace
    specs = [((48, 64), dt.f32), ((64, 32), dt.f32)]
    k = _kernel("matmul", lambda a, b: a @ b, specs)
    dev = replace(H200, dot_precisions={"f32": ("fp8", "bf16")})
    assert {"IMPL": "cublas", "PRECISION": "fp8"} in bx.extern_configs(k, dev)
    a, b = _inputs(specs, 3)
    a[5] = 0.0                                   # an all-zero row keeps scale 1
    got = run_extern_numpy(k, {"IMPL": "cublas", "PRECISION": "fp8"}, [a, b])[0]
    want = _fp8_rowwise_reference(a.astype(np.float64), b.astype(np.float64))
    assert max_rel_error(got, want) < 1e-5       # the same quantized operands, fp32 sums
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert 1e-3 < max_rel_error(got, exact) < 0.1   # fp8 really rounded the operands
    assert np.all(got[5] == 0)
    # torch._scaled_mm takes K and N multiples of 16 and one batch: not offered otherwise
    for bad in ([((48, 24), dt.f32), ((24, 32), dt.f32)],
                [((2, 16, 32), dt.f32), ((2, 32, 16), dt.f32)]):
        kb = _kernel("matmul", lambda a, b: a @ b, bad)
        assert not any(c.get("PRECISION") == "fp8" for c in bx.extern_configs(kb, dev))
    # priced at the fp8 peak plus the quantization passes: faster than bf16 on a big GEMM only
    n = 8192
    kn = _kernel("matmul", lambda a, b: a @ b, [((n, n), dt.f32), ((n, n), dt.f32)])
    t8 = bx.simulate_extern_time(kn, {"IMPL": "cublas", "PRECISION": "fp8"}, H200)
    t16 = bx.simulate_extern_time(kn, {"IMPL": "cublas", "PRECISION": "bf16"}, H200)
    assert t8 < t16
    assert t8 > 2 * n ** 3 / (H200.dot_peak("fp8") * bx.CUBLAS_EFFICIENCY)


@pytest.mark.parametrize("chain", [False, True])
def test_workspace_bytes_of_a_vendor_call_count_the_intermediates_it_writes(chain):
    """An extern config moves what its torch path reads and writes (``extern_bytes``): the GEMM
    writes its product, the eager bias add reads it back and writes its own result, and a second
    GEMM (an mlp's) reads that. ``workspace_bytes`` is what this moves beyond ``min_bytes`` (the
    report's bytes moved): each intermediate written once and read once, 2 of ``C`` for
    GEMM -> +bias, 4 of ``h`` for GEMM -> +bias -> GEMM. A Triton config without split-K or
    partial tiles moves none."""
    from lumc.backends.simulator import workspace_bytes
    M, K, F, N = 37, 61, 45, 29
    if chain:
        k = _kernel("mlp", lambda x, w1, b1, w2: (x @ w1 + b1) @ w2,
                    [((M, K), dt.f32), ((K, F), dt.f32), ((F,), dt.f32), ((F, N), dt.f32)])
        inter = 4 * M * F * 4
    else:
        k = _kernel("matmul", lambda a, b, c: a @ b + c,
                    [((M, K), dt.f32), ((K, F), dt.f32), ((F,), dt.f32)])
        inter = 2 * M * F * 4
        assert workspace_bytes(k, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}) == 0
    cfg = {"IMPL": "cublas"}
    assert bx.extern_bytes(k, cfg, H200) == k.min_bytes() + inter
    assert workspace_bytes(k, cfg) == inter
