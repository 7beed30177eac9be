"""``--workers``: the spec, its one-line errors, the local pool and the report's ``workers``.

The Ray cluster tests are in ``test_workers_ray.py``.
"""
from __future__ import annotations

import json
import sys

import pytest

from lumc.compiler.core.workers import WorkerSpec, parse_workers
from lumc.ir.errors import InputError


@pytest.mark.parametrize("text,want", [
    (None, None), ("", None),
    ("local:1", WorkerSpec("local", 1, None, "local:1")),
    ("local:3", WorkerSpec("local", 3, None, "local:3")),
    ("local", WorkerSpec("local", None, None, "local")),
    ("ray", WorkerSpec("ray", None, None, "ray")),
    ("ray://10.0.0.5:10001", WorkerSpec("ray", None, "ray://10.0.0.5:10001",
                                        "ray://10.0.0.5:10001")),
])
def test_parse_workers(text, want):
    assert parse_workers(text) == want


@pytest.mark.parametrize("text,needle", [
    ("bogus", "expected local:N"), ("local:0", "at least 1"), ("local:x", "expected local:N"),
    ("ray://nohost", "expected local:N"), ("ray:4", "expected local:N"),
])
def test_parse_workers_refuses(text, needle):
    with pytest.raises(InputError, match=needle):
        parse_workers(text)


def test_local_workers_past_four_per_core_are_refused_before_any_fork(monkeypatch):
    """local:99999 was taken as asked: the pool forks all its workers at once (Python's fork
    ProcessPoolExecutor), 99999 copies of the compile on a 2-core machine."""
    import os
    import lumc
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert parse_workers("local:8") == WorkerSpec("local", 8, None, "local:8")
    for text in ("local:9", "local:99999"):
        with pytest.raises(InputError, match=f"workers='{text}': at most 8 local workers on this "
                                             r"machine \(4 per CPU core\)"):
            parse_workers(text)
    monkeypatch.setattr("lumc.compiler.core.check_pool.ProcessPoolExecutor",
                        lambda *a, **k: pytest.fail("a pool was started"))
    with pytest.raises(InputError, match="at most 8 local workers"):
        lumc.compile(tiny_model(), budget="10s", device="sim:h200", workers="local:99999")


def tiny_model():
    """y = tanh(x @ W) for x: f32[n, 8] (n dynamic): two kernels at most, quick to check."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32),
                                "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]),
                           helper.make_node("Tanh", ["h"], ["y"])], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _cli(argv, capsys) -> tuple[int, str]:
    from lumc.compiler.tools.cli import main
    with pytest.raises(SystemExit) as ex:
        main(argv)
    return ex.value.code, capsys.readouterr().err


def test_cli_workers_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import onnx

    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), model)
    out = tmp_path / "t.lumc"
    base = ["compile", str(model), "--budget", "20s", "--device", "sim:h200", "--shape", "n=4",
            "-o", str(out), "--quiet"]
    code, err = _cli(base + ["--workers", "bogus"], capsys)
    assert code == 2 and err.startswith("lumc: error: --workers bogus: expected local:N")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # Ray not importable: the line says how to install it, and nothing is written
    monkeypatch.setitem(sys.modules, "ray", None)
    code, err = _cli(base + ["--workers", "ray"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.strip() == ("lumc: error: --workers ray needs Ray, which is not installed: "
                           "pip install 'lumc[distributed]'")
    code, err = _cli(base + ["--workers", "ray://head:10001"], capsys)
    assert code == 2 and "pip install 'lumc[distributed]'" in err
    assert not out.exists()


def test_api_refuses_bad_workers_before_any_work(tmp_path, monkeypatch):
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InputError, match=r"pip install 'lumc\[distributed\]'"):
        lumc.compile(tiny_model(), budget="10s", device="sim:h200", shapes={"n": 2},
                     workers="ray")
    with pytest.raises(InputError, match="expected local:N"):
        lumc.compile(tiny_model(), budget="10s", device="sim:h200", shapes={"n": 2},
                     workers="gpu:8")


def test_local_workers_report(tmp_path, capsys, monkeypatch):
    """``--workers local:2``: two processes ran the checks; the report counts the units of each,
    and the summary line says so."""
    import onnx

    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), model)
    rep = tmp_path / "r.json"
    from lumc.compiler.tools.cli import main
    with pytest.raises(SystemExit) as ex:
        main(["compile", str(model), "--budget", "30s", "--device", "sim:h200", "--shape", "n=4",
              "-o", str(tmp_path / "t.lumc"), "--report", str(rep), "--quiet",
              "--workers", "local:2"])
    assert ex.value.code in (0, None)
    w = json.loads(rep.read_text())["workers"]
    assert w["kind"] == "local" and w["count"] == 2 and len(w["units_per_worker"]) == 2
    assert w["units"] == sum(w["units_per_worker"]) >= 1
    assert w["units_lost"] == w["retried"] == 0
    assert f"workers: 2 local, units per worker {w['units_per_worker']}" in capsys.readouterr().out


def _die_first(*args):
    """A check unit whose first run (in any worker) kills its process."""
    import os
    flag = os.environ["LUMC_TEST_DIE_FLAG"]
    if not os.path.exists(flag):
        open(flag, "w").close()
        os._exit(1)
    from lumc.compiler.core.workers import run_check_unit
    return run_check_unit(*args)


def test_local_worker_death_is_retried_here(tmp_path, monkeypatch):
    """A local worker that dies mid-check breaks its pool: the lost unit runs once in the driver,
    the later checks run there too, and the compile returns a checked artifact."""
    import lumc
    from lumc.compiler.core import workers
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    monkeypatch.setenv("LUMC_TEST_DIE_FLAG", str(tmp_path / "died"))
    monkeypatch.setattr(workers, "run_check_unit", _die_first)
    cm = lumc.compile(tiny_model(), budget="30s", device="sim:h200", shapes={"n": 4},
                      db=TuningDatabase(tmp_path / "db.sqlite"), workers="local:1")
    r = cm.report_dict()
    assert (tmp_path / "died").exists()
    w = r["workers"]
    assert w["kind"] == "local" and w["units_lost"] == 1 and w["retried"] == 1 and w["failed"] == 0
    assert r["max_rel_error"] is not None and r["max_rel_error"] < 1e-5
    assert r["candidates_rejected"] == 0 and r["best_time_s"] is not None


class FakeGpuWorkers:
    """GPU workers without a GPU: a unit runs its Triton kernel in the interpreter here; its time
    is ``1e-5 * (unit number)``; ``scale`` corrupts the outputs, ``spills`` is reported as is."""

    def __init__(self, scale: float = 1.0, spills: int = 0):
        self.units: list[tuple[dict, int | None]] = []
        self.scale, self.spills = scale, spills

    def submit_gpu(self, kernel, cfg, ins, pin=None):
        from concurrent.futures import Future

        from lumc.backends.extern import is_extern
        from lumc.compiler.core.workers import run_check_unit, unit_args
        self.units.append((dict(cfg), pin))
        outs = None if is_extern(cfg) else [o * self.scale     # (outputs, written, note)
                                            for o in run_check_unit(*unit_args(kernel, cfg), ins)[0]]
        f = Future()
        f.set_result({"outs": outs, "seconds": 1e-5 * len(self.units), "spills": self.spills,
                      "device": "fake"})
        return f

    def want(self, future):
        pass

    def status(self):
        return {"count": 2, "busy": 0, "idle": 2, "in_flight": 0}


def _gpu_measurer(tmp_path, pool):
    """A measurer for a GPU target (named ``cuda:0 fake``) whose units go to ``pool``, and the
    key of a 37x61 @ 61x29 matmul kernel registered in it with its reference values."""
    import dataclasses

    import numpy as np

    from lumc.backends.reference import ReferenceExecutor
    from lumc.backends.triton.benchcases import _kernel
    from lumc.compiler.core.measure import KernelMeasurer
    from lumc.compiler.runtime.program import KernelCall
    from lumc.compiler.runtime.targets import resolve_target
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from lumc.ir import dtypes as dt
    from lumc.ir.graph import input_node
    specs = [((37, 61), dt.f32), ((61, 29), dt.f32)]
    k = _kernel("matmul", lambda a, b: a @ b, specs)
    call = KernelCall(k, [input_node(f"x{i}", s, d) for i, (s, d) in enumerate(specs)],
                      [input_node("y0", k.outputs[0].shape, k.outputs[0].dtype)])
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(s).astype(np.float32) for s, _ in specs]
    values = {id(n): v for n, v in zip(call.inputs, ins)}
    values[id(call.outputs[0])] = ReferenceExecutor(k.meaning)({"in0": ins[0], "in1": ins[1]})["out0"]
    gpu = dataclasses.replace(resolve_target("sim:h200"), name="cuda:0 fake", simulated=False)
    m = KernelMeasurer(gpu, TuningDatabase(tmp_path / "db.sqlite"),
                       {"lumc": "t", "triton": "t", "driver": "t"}, values)
    m.pool = pool
    return m, m.add(call)


def test_gpu_units_check_and_time_on_workers(tmp_path):
    """On a GPU target with workers, one unit per config gives both the outputs the driver checks
    and the time it stores; lookahead starts the next configs ahead; the final re-time is a fresh
    unit on worker 0."""
    from lumc.backends.extern import is_extern
    pool = FakeGpuWorkers()
    m, key = _gpu_measurer(tmp_path, pool)
    m.prefetch([key])
    assert [pin for _, pin in pool.units] == [None] and pool.units[0][0] == m.config_of(key, 0)
    r = m(key, 0)
    assert r.status == "ok" and r.seconds == pytest.approx(1e-5) and len(pool.units) == 1
    assert m.checked[(key, 0)] < 1e-5                  # the unit's outputs were judged here
    m.lookahead([(key, 0), (key, 1), (key, 2)])        # config 0 is stored: not again
    assert [c for c, _ in pool.units[1:]] == [m.config_of(key, 1), m.config_of(key, 2)]
    assert is_extern(m.config_of(key, 1))              # cublas: checked through torch on the CPU
    assert m(key, 1).seconds == pytest.approx(2e-5) and m(key, 2).seconds == pytest.approx(3e-5)
    assert len(pool.units) == 3
    again = m.remeasure(key, 0)
    assert pool.units[-1] == (m.config_of(key, 0), 0) and again.seconds == pytest.approx(4e-5)
    assert m.db.get(m._db_key(key, 0)).seconds == pytest.approx(4e-5)


def test_gpu_unit_wrong_outputs_or_spills_are_rejected(tmp_path):
    m, key = _gpu_measurer(tmp_path, FakeGpuWorkers(scale=2.0))
    r = m(key, 0)
    assert r.status == "rejected" and "max rel error" in r.note
    m, key = _gpu_measurer(tmp_path / "b", FakeGpuWorkers(spills=256))
    r = m(key, 0)
    assert r.status == "rejected" and "spills 256 B" in r.note


def test_torch_entry_points_take_workers(tmp_path, monkeypatch):
    """``lumc.compile(module, workers=...)`` and the torch.compile backend's ``workers`` option
    reach the search (the report's workers), and a bad one is refused at once."""
    import torch

    import lumc
    from lumc.compiler.core.torch_backend import lumc_backend
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()).eval()
    x = torch.randn(4, 8)
    f = lumc.compile(mod, budget="30s", device="sim:h200", example_inputs=(x,),
                     workers="local:2", reuse_plan=False)
    w = f.specializations[0].compiled.report_dict()["workers"]
    assert w["kind"] == "local" and w["count"] == 2 and w["units"] >= 1
    torch.testing.assert_close(f(x), mod(x), rtol=1e-4, atol=1e-5)
    seen = []

    def backend(gm, example_inputs):
        seen.append(lumc_backend(gm, example_inputs, workers="local:1", budget="30s",
                                 device="sim:h200"))
        return seen[-1]
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(mod, backend=backend)(x), mod(x), rtol=1e-4,
                               atol=1e-5)
    w = next(iter(seen[0].specializations.values())).compiled.report_dict()["workers"]
    assert w["kind"] == "local" and w["count"] == 1
    torch._dynamo.reset()
    with pytest.raises(Exception, match="expected local:N"):
        torch.compile(mod, backend="lumc", options={"workers": "bogus"})(x)
    torch._dynamo.reset()


def test_progress_shows_workers_busy_idle_and_in_flight():
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.progress import Progress
    from lumc.compiler.core.search import SearchStats
    from lumc.compiler.runtime.targets import resolve_target
    p = Progress(10.0, resolve_target("sim:h200"), quiet=True)
    shown: dict = {}

    class Bar:
        def update(self, task, **fields):
            shown.update(fields)
    p._p = Bar()
    p.search(Deadline(10.0), SearchStats(), 1e-5, 5e-6)
    assert "workers" not in shown["info"] and "best 10.0us (sim)" in shown["info"]
    p.workers = lambda: {"count": 2, "busy": 1, "idle": 1, "in_flight": 5}
    p.search(Deadline(10.0), SearchStats(), 1e-5, 5e-6)
    assert shown["info"].endswith("| workers 1 busy 1 idle, 5 units in flight")


def test_search_lookahead_names_what_tuning_measures_next():
    """The depth phase's lookahead lists next configs in gap order without the ones the bound
    prunes; what the search measures and chooses is the same with or without it."""
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.search import Measurement, run_search
    times = {"a": [4.0, 3.0, 2.5, 2.4, 2.3], "b": [2.0, 1.9, 1.8]}
    bounds = {"a": 1.0, "b": 1.0}
    cfg_bound = {("a", 3): 9.0}                 # config 3 of a cannot beat its best: pruned

    def run(with_lookahead):
        seen, measured = [], []

        def measure(k, ci):
            measured.append((k, ci))
            return Measurement(times[k][ci])
        r = run_search([["a", "b"]], bounds, {"a": 5, "b": 3}, measure, Deadline(100.0),
                       config_bounds=lambda k, ci: cfg_bound.get((k, ci), 0.0),
                       lookahead=(lambda pairs: seen.append((len(measured), pairs)))
                       if with_lookahead else None)
        return r, measured, seen
    r0, m0, _ = run(False)
    r1, m1, seen = run(True)
    assert (r1.candidate, r1.configs, r1.time_s, m1) == (r0.candidate, r0.configs, r0.time_s, m0)
    assert seen[0] == (2, [("a", 1), ("a", 2), ("a", 4), ("b", 1), ("b", 2)])  # a: gap 4x, b: 2x
    assert all(("a", 3) not in pairs for _, pairs in seen) and ("a", 3) not in m1
    for n, pairs in seen:                       # what tuning measured next was named first
        assert m1[n] == pairs[0]


def test_several_plans_share_one_pool_and_report_it(tmp_path, monkeypatch):
    """``--shape n=2,4``: two plans, one ``Workers`` for the compile; the top report's workers
    count the units of both searches."""
    import lumc
    from lumc.compiler.core import workers
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    made = []
    init = workers.Workers.__init__

    def counting_init(self, spec):
        made.append(spec)
        init(self, spec)
    monkeypatch.setattr(workers.Workers, "__init__", counting_init)
    cm = lumc.compile(tiny_model(), budget="60s", device="sim:h200", shapes={"n": [2, 4]},
                      db=TuningDatabase(tmp_path / "db.sqlite"), workers="local:1")
    r = cm.report_dict()
    assert len(r["variants"]) == 2 and len(made) == 1
    per_plan = [cm.variants[i][1].report_dict()["workers"]["units"] for i in range(2)]
    assert r["workers"]["kind"] == "local" and r["workers"]["units"] == per_plan[1] > per_plan[0] > 0
