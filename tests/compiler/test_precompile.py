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

    rk = _rk()
    cfgs = configs.config_space(rk.config_space, rk.problem)[:5]

    def fake(jobs):
        batches.append([str(c) for _, c in jobs])
        gate.wait(10)
        return [AotResult(rk.name, rk.form, c, 1024, 0.1, None, 64, 8 if c == cfgs[0] else 0, 0)
                for rk, c in jobs]
    pc = Precompiler(batch=2, compile_fn=fake)
    for c in cfgs:
        pc.submit(rk, c)
    assert pc.result(rk, cfgs[0]) is None        # still compiling: no wait, no result
    gate.set()
    r0 = pc.result(rk, cfgs[0], wait_s=10)
    assert r0 is not None and r0.spills          # the fake spills the first config
    assert not pc.result(rk, cfgs[1], wait_s=10).spills
    pc.close()
    pc.submit(rk, configs.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8))
    done = [c for b in batches for c in b]       # compiled in submission order, <= 2 at a time
    assert done == [str(c) for c in cfgs[:len(done)]] and len(done) >= 2
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


def test_the_gpu_measurer_precompiles_ahead_and_rejects_spills_unlaunched(tmp_path, monkeypatch):
    """On a GPU timed in-process, the search's lookahead queues configs for precompiling; a config
    whose precompile spills is rejected without a launch, the others are checked and timed."""
    import dataclasses
    from lumc.compiler.core.measure import KernelMeasurer
    from lumc.compiler.runtime.targets import resolve_target
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from tests.compiler.test_extern import VERSIONS, _matmul_bias_relu_call
    k, call, ins, values = _matmul_bias_relu_call()
    gpu = dataclasses.replace(resolve_target("sim:h200"), name="cuda:0 fake", simulated=False)
    m = KernelMeasurer(gpu, TuningDatabase(tmp_path / "db.sqlite"), {**VERSIONS}, values)
    key = m.add(call)
    compiled = []
    triton_idx = [i for i, c in enumerate(m.entries[key].configs)
                  if "IMPL" not in c.kwargs()][:2]
    spilling = m.entries[key].configs[triton_idx[0]]

    def fake(jobs):          # the first config spills, however the queue batches the jobs
        compiled.extend(c for _, c in jobs)
        return [AotResult(rk.name, rk.form, c, 1024, 0.1, None, 64, 256 if c == spilling else 0, 0)
                for rk, c in jobs]
    m.precompiler = Precompiler(batch=2, compile_fn=fake)
    m.lookahead([(key, i) for i in triton_idx])
    assert m.precompiler.result(m.entries[key].triton.rendered, m.entries[key].configs[
        triton_idx[1]], wait_s=10) is not None
    launched = []
    monkeypatch.setattr(m, "_check", lambda e, index, cfg: (launched.append(index), (True, "ok"))[1])
    monkeypatch.setattr(m, "_time", lambda e, cfg: 1e-5)
    r0 = m(key, triton_idx[0])
    assert r0.status == "rejected" and "precompiled" in r0.note and triton_idx[0] not in launched
    assert m(key, triton_idx[1]).status == "ok" and launched == [triton_idx[1]]
    assert len(compiled) == 2
    m.precompiler.close()
