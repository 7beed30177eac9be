"""The GPU precompile queue: configs compiled for ``cuda:90`` in a background child process while
the search times others, their spills reported before any launch, Triton's cache warmed."""
import threading

from lumc.backends.triton import configs
from lumc.backends.triton.aot import AotResult
from lumc.backends.triton.launch import TritonKernel
from lumc.compiler.runtime.precompile import Precompiler
from lumc.ir import dtypes as dt
from tests.backends.triton_cases import make_kernel


def _rk():
    return TritonKernel(make_kernel("matmul", lambda a, b: a @ b,
                                    [((64, 96), dt.f16), ((96, 80), dt.f16)])).rendered


def test_compiles_ahead_for_sm90_and_reports_spills_and_tensor_cores():
    rk = _rk()
    cfg = configs.default_config(rk.config_space, rk.problem)
    pc = Precompiler()
    try:
        pc.submit(rk, cfg)
        pc.submit(rk, cfg)                       # queued once
        r = pc.result(rk, cfg, wait_s=300)
        assert r is not None and r.error is None, r and r.error
        assert r.registers and not r.spills and r.tensor_core
        assert pc.compiled == 1
    finally:
        pc.close()


def test_batches_in_order_and_close_drops_the_queue():
    gate = threading.Event()
    batches = []

    def fake(jobs):
        batches.append([str(c) for _, c in jobs])
        gate.wait(10)
        return [AotResult(rk.name, rk.form, c, 1024, 0.1, None, 64, 8 if i == 0 else 0, 0)
                for i, (rk, c) in enumerate(jobs)]
    rk = _rk()
    cfgs = configs.config_space(rk.config_space, rk.problem)[:5]
    pc = Precompiler(batch=2, compile_fn=fake)
    for c in cfgs:
        pc.submit(rk, c)
    assert pc.result(rk, cfgs[0]) is None        # still compiling: no wait, no result
    gate.set()
    r0 = pc.result(rk, cfgs[0], wait_s=10)
    assert r0 is not None and r0.spills          # the fake spilled the first of each batch
    assert not pc.result(rk, cfgs[1], wait_s=10).spills
    pc.close()
    pc.submit(rk, configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8))
    assert batches[0] == [str(cfgs[0]), str(cfgs[1])]
    assert all(len(b) <= 2 for b in batches)


def test_a_dead_compile_child_marks_its_configs_failed_not_the_search():
    def boom(jobs):
        raise RuntimeError("AOT compile worker failed (-9)")
    rk = _rk()
    cfg = configs.default_config(rk.config_space, rk.problem)
    pc = Precompiler(compile_fn=boom)
    pc.submit(rk, cfg)
    r = pc.result(rk, cfg, wait_s=10)
    pc.close()
    assert r is not None and "precompile failed" in r.error and not r.spills
