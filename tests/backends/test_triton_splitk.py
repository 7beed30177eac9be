"""Split-K contractions: skinny GEMMs whose output tiles cannot fill the GPU split their K range
over ``SPLIT_K`` programs per tile, and a finish kernel sums the fp32 partial tiles in a fixed
order before the epilogue. Checked in the Triton interpreter against float64 at every split
(ragged M, N and K, batched, fp16, epilogues), for determinism, for the config space and the
simulator's price, and compiled ahead of time for Hopper."""
import numpy as np
import pytest

from lumc.backends.devices import H200
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.simulator import DRAM_LATENCY_S, config_bound, simulate_kernel_time
from lumc.backends.triton import configs
from lumc.backends.triton.launch import TritonKernel, to_numpy
from lumc.ir import dtypes as dt
from triton_cases import make_kernel


def _bias_relu(m, k, n, d=dt.f32):
    return make_kernel("matmul", lambda a, b, c: ((a @ b) + c).maximum(0.0),
                       [((m, k), d), ((k, n), d), ((n,), d)])


def _run(kern, cfg, seed=0):
    rng = np.random.default_rng(seed)
    ins = [rng.standard_normal(n.shape).astype(np.float32).astype(n.dtype.np) for n in kern.inputs]
    ref = ReferenceExecutor(kern.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    return to_numpy(TritonKernel(kern)(*ins, config=cfg)[0]), ref


def _cfg(sk, bk=32, prec="ieee"):
    return configs.make(4, 2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=bk, GROUP_M=8, SPLIT_K=sk,
                        PRECISION=prec)


@pytest.mark.parametrize("sk", [1, 2, 3, 4, 8])
def test_every_split_matches_float64(sk):
    k = _bias_relu(37, 600, 45)            # ragged M, N; K not a multiple of BLOCK_K * SPLIT_K
    assert TritonKernel(k).rendered.config_space == "matmul_splitk"
    got, ref = _run(k, _cfg(sk))
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_batched_and_half_and_vector_products_split():
    bmm = make_kernel("matmul", lambda a, b: a @ b, [((3, 20, 300), dt.f32), ((3, 300, 24), dt.f32)])
    got, ref = _run(bmm, _cfg(4))
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-4)
    gemv = make_kernel("matmul", lambda a, b: a @ b, [((1, 1024), dt.f16), ((1024, 40), dt.f16)])
    got, ref = _run(gemv, _cfg(8, prec="fp16"))
    assert got.dtype == np.float16
    assert np.allclose(got.astype(np.float64), ref, rtol=2e-2, atol=2e-2)


def test_split_results_are_the_same_bits_every_run():
    k = _bias_relu(24, 512, 40)
    a, _ = _run(k, _cfg(4), seed=3)
    b, _ = _run(k, _cfg(4), seed=3)
    assert a.tobytes() == b.tobytes()


def test_only_skinny_contractions_get_the_split_space_and_its_rules():
    wide = TritonKernel(make_kernel("matmul", lambda a, b: a @ b,
                                    [((1024, 512), dt.f32), ((512, 1024), dt.f32)]))
    short = TritonKernel(make_kernel("matmul", lambda a, b: a @ b,
                                     [((16, 128), dt.f32), ((128, 16), dt.f32)]))
    assert wide.rendered.config_space == "matmul" and short.rendered.config_space == "matmul"
    assert "SPLIT_K" not in wide.rendered.source
    sk = TritonKernel(_bias_relu(128, 1536, 384))     # MiniLM's down-projection
    space = sk.config_space()
    splits = {dict(c.blocks)["SPLIT_K"] for c in space}
    assert splits == {1, 2, 4, 8, 16}
    for c in space:                                   # every share walks >= 2 BLOCK_K steps
        b = dict(c.blocks)
        assert b["SPLIT_K"] == 1 or b["SPLIT_K"] * 2 * b["BLOCK_K"] <= 1536
    # a nearly full grid keeps one kernel by default; a GEMV splits until the grid fills
    assert dict(sk.default_config().blocks)["SPLIT_K"] == 1
    gemv = TritonKernel(make_kernel("matmul", lambda a, b: a @ b,
                                    [((1, 2048), dt.f32), ((2048, 256), dt.f32)]))
    d = dict(gemv.default_config().blocks)
    assert d["SPLIT_K"] > 1 and 8 * d["SPLIT_K"] >= configs.SM_COUNT // 2
    # the interpreter (a compile's numerics check) runs the split path
    assert dict(sk.run_config().blocks)["SPLIT_K"] == 2


def test_simulator_prices_the_split():
    gemv = make_kernel("matmul", lambda a, b: a @ b, [((1, 2048), dt.f32), ((2048, 256), dt.f32)])
    one = simulate_kernel_time(gemv, _cfg(1).kwargs(), H200)
    split = simulate_kernel_time(gemv, _cfg(16).kwargs(), H200)
    assert split < one                     # 8 tiles on 132 SMs: splitting K fills the GPU
    big = make_kernel("matmul", lambda a, b: a @ b, [((128, 1536), dt.f32), ((1536, 384), dt.f32)])
    deep = [configs.make(4, 4, BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=8, SPLIT_K=s,
                         PRECISION="ieee").kwargs() for s in (1, 2, 4)]
    t = [simulate_kernel_time(big, kw, H200) for kw in deep]
    # 96 tiles on 132 SMs, a deep pipeline: the finish kernel's launch costs more than the
    # fuller grid gains
    assert t[1] > t[0] and t[2] >= t[1] - 1e-9
    # a two-stage pipeline waits a DRAM round trip per K step: 48 of them at one share, 24 at two
    shallow = [simulate_kernel_time(big, _cfg(s).kwargs(), H200) for s in (1, 2)]
    assert shallow[0] >= 48 * DRAM_LATENCY_S and shallow[1] < shallow[0]
    for s in (1, 2, 4, 8):
        kw = _cfg(s).kwargs()
        assert config_bound(big, kw, H200) <= simulate_kernel_time(big, kw, H200)
    assert config_bound(big, _cfg(2).kwargs(), H200) > config_bound(big, _cfg(1).kwargs(), H200)


def test_split_kernel_compiles_for_sm90_without_spills():
    from lumc.backends.triton.aot import compile_many
    rk = TritonKernel(_bias_relu(128, 1536, 384)).rendered
    jobs = [(rk, configs.make(4, 3, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, SPLIT_K=s,
                              PRECISION="tf32x3")) for s in (1, 4)]
    for r in compile_many(jobs):
        assert r.error is None, r.error
        assert not r.spills
        assert r.tensor_core


def test_workspace_bytes_count_the_partial_tiles_bytes_moved_leaves_out():
    """``workspace_bytes``: each of SPLIT_K shares writes its fp32 partial of every output element
    and the finish kernel reads it back; nothing without a split, nothing for a row kernel."""
    from lumc.backends.simulator import workspace_bytes
    k = _bias_relu(37, 600, 45)
    assert workspace_bytes(k, _cfg(1).kwargs()) == 0
    assert workspace_bytes(k, _cfg(4).kwargs()) == 2 * 4 * 37 * 45 * 4
    bmm = make_kernel("matmul", lambda a, b: a @ b, [((3, 20, 300), dt.f32), ((3, 300, 24), dt.f32)])
    assert workspace_bytes(bmm, _cfg(8).kwargs()) == 2 * 8 * 3 * 20 * 24 * 4
    relu = make_kernel("pointwise", lambda a: a.maximum(0.0), [((8, 8), dt.f32)])
    assert workspace_bytes(relu, {"SPLIT_K": 4}) == 0
