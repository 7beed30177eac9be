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
    assert code == 2 and err.startswith("lumc: error: --workers 'bogus': expected local:N")
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
