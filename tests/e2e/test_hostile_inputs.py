"""One test per robustness class of issue 15, each building its own hostile input: model files,
graph size, artifacts, tuning databases, signals and processes, command lines. Every refusal is
one line ``lumc: error: ...`` with exit 2; nothing hangs, nothing is left running, memory stays
bounded."""
from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))

from conftest import tiny_model  # noqa: E402
from hostile import (artifact_parts, lumc_cli, nested_json, one_line_error,  # noqa: E402
                     write_artifact, zip_bomb_member)

import lumc  # noqa: E402
from lumc.ir.errors import ArtifactError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]



pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A real artifact of the tiny model (n = 3, simulated H200), compiled in a subprocess."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "tiny.onnx").write_bytes(tiny_model().SerializeToString())
    subprocess.run([sys.executable, "-m", "lumc.compiler.tools.cli", "compile", root / "tiny.onnx",
                    "--budget", "30s", "--device", "sim:h200", "--shape", "n=3",
                    "-o", root / "tiny.lumc", "--quiet"], check=True, capture_output=True,
                   env=dict(os.environ, LUMC_CACHE_DIR=str(root / "cache")), timeout=300)
    return root / "tiny.lumc"


def _graph(nodes, inputs, outputs, inits=(), opset=17, ir=8):
    m = helper.make_model(helper.make_graph(nodes, "h", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


# ---- model files ---------------------------------------------------------------------------------

def _hostile_models():
    x, y = _vi("x", [1, 1, 4, 4]), _vi("y", None)
    m_ir = tiny_model()
    m_ir.ir_version = 999
    m_op0, m_opm = tiny_model(), tiny_model()
    m_op0.opset_import[0].version = 0
    m_opm.opset_import[0].version = -1
    m_extra = tiny_model()
    m_extra.graph.node[1].input.append("b")
    m_neg = tiny_model()
    m_neg.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -3
    w = numpy_helper.from_array(np.ones((1, 16, 3), np.float32), "W")
    r = numpy_helper.from_array(np.ones((1, 16, 4), np.float32), "R")
    return {
        "ir_version 999": (m_ir, "ir_version 999"),
        "opset 0": (m_op0, "domain_version of 0"),
        "opset -1": (m_opm, "domain_version of -1"),
        "extra node input": (m_extra, "input size 3"),
        "negative dim": (m_neg, "-3"),
        "MaxPool without kernel_shape": (_graph([helper.make_node("MaxPool", ["x"], ["y"])],
                                                [x], [y]), "kernel_shape"),
        "LSTM without hidden_size": (_graph([helper.make_node("LSTM", ["x", "W", "R"], ["y"])],
                                            [_vi("x", [2, 1, 3])], [y], [w, r]), "hidden_size"),
    }


@pytest.mark.parametrize("case", list(_hostile_models()))
def test_invalid_models_are_refused_as_onnxruntime_refuses_them(case, tmp_path):
    import onnxruntime as ort
    model, word = _hostile_models()[case]
    p = tmp_path / "bad.onnx"
    p.write_bytes(model.SerializeToString())
    with pytest.raises(Exception):     # the reference: onnxruntime will not load or run it
        sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        sess.run(None, {i.name: np.zeros([d if isinstance(d, int) and d > 0 else 1
                                          for d in i.shape], np.float32 if "float" in i.type
                                         else np.int64) for i in sess.get_inputs()})
    shape = ["--shape", "n=2"] if case in ("ir_version 999", "opset 0", "opset -1",
                                           "extra node input") else []
    one_line_error(lumc_cli("run", p, "--random", *shape), word)
    one_line_error(lumc_cli("compile", p, "--budget", "5s", *shape, "-o", tmp_path / "o.lumc"),
                   word)
    assert not (tmp_path / "o.lumc").exists()


def test_gather_index_out_of_range_is_one_line(tmp_path):
    idx = numpy_helper.from_array(np.array([5], np.int64), "i")
    m = _graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], [_vi("x", [2, 3])],
               [_vi("y", [1, 3])], [idx])
    p = tmp_path / "g.onnx"
    p.write_bytes(m.SerializeToString())
    one_line_error(lumc_cli("run", p, "--random"), "out of range")
    m2 = _graph([helper.make_node("Gather", ["x", "k"], ["y"], axis=0)], [_vi("x", [2, 3]),
                 _vi("k", [1], TensorProto.INT64)], [_vi("y", [1, 3])])
    p2 = tmp_path / "g2.onnx"
    p2.write_bytes(m2.SerializeToString())
    np.save(tmp_path / "k.npy", np.array([7], np.int64))
    one_line_error(lumc_cli("run", p2, "--random", "--input", f"k={tmp_path / 'k.npy'}"),
                   "7", "out of range")


def test_truncated_inputs_npz_and_negative_seed(tmp_path):
    p = tmp_path / "tiny.onnx"
    p.write_bytes(tiny_model().SerializeToString())
    buf = io.BytesIO()
    np.savez(buf, x=np.ones((2, 3), np.float32), k=np.ones((2, 2), np.int64))
    for cut in (10, len(buf.getvalue()) // 2, len(buf.getvalue()) - 5):
        (tmp_path / "in.npz").write_bytes(buf.getvalue()[:cut])
        one_line_error(lumc_cli("run", p, "--inputs", tmp_path / "in.npz"), "--inputs")
    one_line_error(lumc_cli("run", p, "--random", "--shape", "n=2", "--seed", "-1"), "--seed")


# ---- graph size ----------------------------------------------------------------------------------

def test_a_sum_of_1000_inputs_fuses_without_recursion():
    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.core.fusion import greedy_program
    from lumc.compiler.frontends.onnx_frontend import import_onnx
    from lumc.compiler.runtime.program import run_program_reference
    n = 1000
    m = _graph([helper.make_node("Sum", [f"x{i}" for i in range(n)], ["y"])],
               [_vi(f"x{i}", [4]) for i in range(n)], [_vi("y", [4])])
    g = import_onnx(m).graph
    prog = greedy_program(g)          # the kernel builder recursed once per add: RecursionError
    assert len(prog.calls) == 1 and len(prog.calls[0].kernel.covers) == n - 1
    rng = np.random.default_rng(0)
    ins = {f"x{i}": rng.standard_normal(4).astype(np.float32) for i in range(n)}
    want = np.sum(np.stack([ins[f"x{i}"] for i in range(n)]).astype(np.float64), axis=0)
    got = run_program_reference(prog, g, ins)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ReferenceExecutor(g)(ins)["y"], want, rtol=1e-4, atol=1e-4)


def test_hard_deadline_stops_any_work_with_one_budget_error(monkeypatch):
    from lumc.compiler.core import budget
    from lumc.ir.errors import BudgetError
    monkeypatch.setattr(budget, "grace_seconds", lambda b: 0.2)
    t0 = time.monotonic()
    with pytest.raises(BudgetError, match="budget of 0.3 s"):
        with budget.hard_deadline(budget.Deadline(0.3)):
            while True:               # a stage that never looks at the clock
                try:
                    sum(range(1000))
                except Exception:     # and swallows every Exception on the way
                    pass
    assert 0.45 <= time.monotonic() - t0 < 3.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)   # disarmed on the way out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sum10000", "chain20000"])
def test_huge_graphs_end_within_budget_and_grace(kind, tmp_path):
    n = 10000 if kind == "sum10000" else 20000
    if kind == "sum10000":
        m = _graph([helper.make_node("Sum", [f"x{i}" for i in range(n)], ["y"])],
                   [_vi(f"x{i}", [4]) for i in range(n)], [_vi("y", [4])])
    else:
        nodes = [helper.make_node("Neg" if i % 2 else "Abs", ["x" if i == 0 else f"t{i - 1}"],
                                  ["y" if i == n - 1 else f"t{i}"]) for i in range(n)]
        m = _graph(nodes, [_vi("x", [4])], [_vi("y", [4])])
    p = tmp_path / "big.onnx"
    p.write_bytes(m.SerializeToString())
    t0 = time.monotonic()
    res = lumc_cli("compile", p, "--budget", "5s", "-o", tmp_path / "b.lumc", "--quiet")
    assert time.monotonic() - t0 < 5 + 10 + 5     # budget + grace + the alarm's granularity
    assert res.exit_code in (0, 2)
    if res.exit_code == 2:
        one_line_error(res, "budget")


# ---- artifacts -----------------------------------------------------------------------------------

_HWM = """
import atexit as _atexit, sys as _sys
def _lumc_test_hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                _sys.stderr.write("\\n__VmHWM__ %d\\n" % (int(line.split()[1]) * 1024))
_atexit.register(_lumc_test_hwm)
"""


def _peak_rss_of(code: str, timeout=120, args=()) -> tuple[int, str, int]:
    """Run ``code`` in a fresh Python; returns (peak RSS bytes, stderr, exit status).

    The peak is the child's own ``VmHWM`` (its address space's high-water mark, new at exec):
    ``wait4``'s ``ru_maxrss`` is kept across exec, so a child forked from a large test process
    would report at least that process's size (the fallback when the child is killed)."""
    import threading
    p = subprocess.Popen([sys.executable, "-c", _HWM + code, *map(str, args)],
                         stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(timeout, p.kill)    # a hang fails the test instead of stalling it
    killer.start()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    killer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    peak = ru.ru_maxrss * 1024
    lines = err.splitlines()
    hwm = [ln for ln in lines if ln.startswith("__VmHWM__ ")]
    if hwm:
        peak = int(hwm[-1].split()[1])
        err = "\n".join(ln for ln in lines if not ln.startswith("__VmHWM__ ")).strip() + "\n"
    return peak, err, p.returncode


def test_zip_bomb_member_is_refused_before_inflating(artifact, tmp_path, record_time):
    manifest, parts = artifact_parts(artifact)
    manifest["lumc_version"] = lumc.__version__
    load = textwrap.dedent("""
        import sys, lumc
        from lumc.ir.errors import ArtifactError
        try:
            lumc.load(sys.argv[1])
        except ArtifactError as e:
            assert "zip bomb" in str(e), e
            raise SystemExit(3)
        """)
    base, err, rc = _peak_rss_of(load, args=[artifact])      # a good artifact: the baseline
    assert rc == 0, err
    worst = 0
    for member, size in (("report.json", 512 << 20), ("consts.npz", 128 << 20)):
        bomb = tmp_path / f"bomb-{member}.lumc"
        zip_bomb_member(bomb, member, size, manifest=manifest, parts=parts)   # zeros, hash right
        assert bomb.stat().st_size < size // 500
        peak, err, rc = _peak_rss_of(load, args=[bomb])
        assert rc == 3, err
        worst = max(worst, peak)
    record_time(f"zip bomb (512 MiB member) peak RSS {worst / 1e6:.0f} MB, a good artifact's "
                f"load {base / 1e6:.0f} MB; wall", 0.0)
    assert worst < base + 64e6   # was 4.25 GB: the member was inflated before its hash was checked


@pytest.mark.parametrize("part,doc,word", [
    ("report.json", nested_json(100000), "deeper than 64"),
    ("plan.json", nested_json(70), "deeper than 64"),
    ("report.json", json.dumps({"best_time_s": "fast"}).encode(), "'best_time_s' is a JSON string"),
    ("report.json", json.dumps({"per_kernel": [{"form": "x", "bound_s": [1], "flops": 1,
                                                "bytes": 1}]}).encode(), "'bound_s'"),
    ("plan.json", b"[1, 2]", "JSON list, expected an object"),
    ("graph.json", b"\xff\xfe", "not valid JSON"),
])
def test_json_parts_are_schema_checked(artifact, tmp_path, part, doc, word):
    manifest, parts = artifact_parts(artifact)
    manifest["lumc_version"] = lumc.__version__
    parts[part] = doc
    bad = tmp_path / "bad.lumc"
    write_artifact(bad, manifest, parts)
    with pytest.raises(ArtifactError, match=word):
        lumc.load(bad)
    for cmd in (["run", bad, "--random"], ["inspect", bad]):
        one_line_error(lumc_cli(*cmd), part)


def test_wrong_types_in_plan_and_manifest(artifact, tmp_path):
    manifest, parts = artifact_parts(artifact)
    manifest["lumc_version"] = lumc.__version__
    plan = json.loads(parts["plan.json"])
    plan["calls"][0]["config"] = [1]
    p = dict(parts, **{"plan.json": json.dumps(plan).encode()})
    write_artifact(tmp_path / "a.lumc", manifest, p)
    one_line_error(lumc_cli("run", tmp_path / "a.lumc", "--random"), "'config' is a JSON list")
    write_artifact(tmp_path / "b.lumc", dict(manifest, lumc_version=5), parts)
    one_line_error(lumc_cli("inspect", tmp_path / "b.lumc"), "'lumc_version' is a JSON number")


def test_fifo_and_device_links_are_refused_unread(artifact, tmp_path):
    fifo = tmp_path / "pipe.lumc"
    os.mkfifo(fifo)
    (tmp_path / "zero.lumc").symlink_to("/dev/zero")
    for p, word in ((fifo, "a FIFO"), (tmp_path / "zero.lumc", "a device")):
        peak, err, rc = _peak_rss_of(textwrap.dedent(f"""
            import sys, lumc
            from lumc.ir.errors import ArtifactError
            try:
                lumc.load({str(p)!r})
            except ArtifactError as e:
                print(e, file=sys.stderr)
                raise SystemExit(3)
            """), timeout=30)
        assert rc == 3 and word in err, err
        assert peak < 400e6       # /dev/zero was read to 7.5 GB
        one_line_error(lumc_cli("run", p, "--random"), "regular file")


# ---- tuning database -----------------------------------------------------------------------------

@pytest.mark.parametrize("seconds", ["fast", None, -8e9, float("nan")])
def test_bad_rows_are_ignored_with_one_warning(tmp_path, seconds):
    from lumc.compiler.runtime.tuning_db import Timing, TimingKey, TuningDatabase
    db = TuningDatabase(tmp_path / "t.sqlite")
    key = TimingKey("k" * 32, "{}", "sim:h200", "v", "t", "d")
    db.put(key, Timing(4.6e-6, True, True))
    assert db.get(key).seconds == pytest.approx(4.6e-6)
    conn = sqlite3.connect(tmp_path / "t.sqlite")
    conn.execute("UPDATE timings SET seconds = ?", (seconds,))
    conn.commit()
    conn.close()
    with pytest.warns(RuntimeWarning, match="invalid rows"):
        assert db.get(key) is None
    assert db.bad_rows == 1 and db.recovered_from is None   # not a damaged file: not set aside
    db.put(key, Timing(5e-6, True, True))                   # re-measured, replaced
    assert db.get(key).seconds == pytest.approx(5e-6)


# ---- signals and processes -----------------------------------------------------------------------

_POOL_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from lumc.compiler.core.check_pool import CheckPool
    pool = CheckPool(workers=2)
    futs = [pool._pool.submit(time.sleep, 600) for _ in range(2)]
    while len(pool._pool._processes) < 2:
        time.sleep(0.01)
    print(" ".join(str(p) for p in pool._pool._processes), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ignores_sigint(pid: int) -> bool:
    """The worker's initializer has run: SIGINT is in its ignored set (``/proc/PID/status``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_check_pool_workers_die_with_their_parent(sig):
    orphans = 0
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", _POOL_CHILD, str(ROOT)], stdout=subprocess.PIPE,
                             text=True)
        workers = [int(w) for w in p.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(w) for w in workers)
        t0 = time.monotonic()     # a worker is listed once forked, before its initializer ran
        while not all(_ignores_sigint(w) for w in workers) and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        os.kill(workers[0], signal.SIGINT)      # a Ctrl-C reaching a worker: ignored, silently
        time.sleep(0.2)
        assert _alive(workers[0])
        p.send_signal(sig)
        p.wait(timeout=10)
        t0 = time.monotonic()
        while any(_alive(w) for w in workers) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        orphans += sum(_alive(w) for w in workers)
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    assert orphans == 0


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError):
                pass
    return out


def _compile_until_pool(tmp_path, i):
    (tmp_path / "tiny.onnx").write_bytes(tiny_model().SerializeToString())
    p = subprocess.Popen([sys.executable, "-m", "lumc.compiler.tools.cli", "compile", tmp_path / "tiny.onnx",
                          "--shape", "n=3", "--budget", "60s", "-o", tmp_path / f"t{i}.lumc"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,
                         env=dict(os.environ, LUMC_CACHE_DIR=str(tmp_path / f"c{i}")))
    t0 = time.monotonic()
    while p.poll() is None and not _children(p.pid) and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    return p


@pytest.mark.parametrize("gap", [0.02, pytest.param(0.3, marks=pytest.mark.slow)])
def test_double_ctrl_c_is_one_line_and_ends(tmp_path, gap):
    p = _compile_until_pool(tmp_path, 0)
    kids = _children(p.pid)
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGINT)      # as a terminal does: the parent and its workers
        time.sleep(gap)
        try:
            os.killpg(p.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    out, err = p.communicate(timeout=40)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "interrupted" in lines[0], (p.returncode, err)
    time.sleep(1.0)
    assert not any(_alive(k) for k in kids)
    assert not (tmp_path / "t0.lumc").exists()


@pytest.mark.slow
def test_ten_kill_9s_of_a_compile_leave_no_orphans(tmp_path, record_time):
    orphans = workers = 0
    for i in range(10):
        p = _compile_until_pool(tmp_path, i)
        time.sleep(0.3)
        kids = _children(p.pid)
        if p.poll() is not None:
            continue
        workers += len(kids)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        time.sleep(2.5)
        orphans += sum(_alive(k) for k in kids)
        for k in kids:
            if _alive(k):
                os.kill(k, signal.SIGKILL)
    record_time(f"kill -9 x10: {workers} workers running at the kills, {orphans} orphans; wall", 0)
    assert workers > 0 and orphans == 0


# ---- command lines -------------------------------------------------------------------------------

def test_empty_output_paths_are_refused(tmp_path, artifact):
    p = tmp_path / "tiny.onnx"
    p.write_bytes(tiny_model().SerializeToString())
    one_line_error(lumc_cli("run", p, "--random", "--shape", "n=2", "-o", ""), "empty path")
    one_line_error(lumc_cli("compile", p, "--budget", "5s", "--shape", "n=2", "-o", ""),
                   "empty path")
    one_line_error(lumc_cli("compile", p, "--budget", "5s", "--shape", "n=2", "--report", " "),
                   "empty path")
    one_line_error(lumc_cli("inspect", artifact, "--plot", ""), "empty path")
    one_line_error(lumc_cli("bench", artifact, "--json", ""), "empty path")
    assert not (tmp_path / "tiny.lumc").exists() and not (tmp_path / "tiny.npz").exists()


@pytest.mark.parametrize("budget", ["١٠s", "１０s", "²s", "1٠m"])
def test_non_ascii_digits_are_not_a_budget(tmp_path, budget):
    p = tmp_path / "tiny.onnx"
    p.write_bytes(tiny_model().SerializeToString())
    one_line_error(lumc_cli("compile", p, "--budget", budget, "--shape", "n=2"), "not a duration")
    one_line_error(lumc_cli("run", p, "--random", "--shape", "n=٢"), "bad --shape")


@pytest.mark.parametrize("kind", ["file", "under-a-file", "unwritable"])
def test_unusable_cache_dir_is_one_line(tmp_path, monkeypatch, kind):
    if kind == "file":
        target = tmp_path / "f"
        target.write_text("not a folder")
    elif kind == "under-a-file":
        (tmp_path / "f").write_text("x")
        target = tmp_path / "f" / "cache"
    else:
        target = Path("/proc/no/cache")
    monkeypatch.setenv("LUMC_CACHE_DIR", str(target))
    p = tmp_path / "tiny.onnx"
    p.write_bytes(tiny_model().SerializeToString())
    one_line_error(lumc_cli("cache", "info"), "LUMC_CACHE_DIR")
    one_line_error(lumc_cli("cache", "clear"), "LUMC_CACHE_DIR")
    one_line_error(lumc_cli("compile", p, "--budget", "5s", "--shape", "n=2", "-o",
                            tmp_path / "o.lumc"), "LUMC_CACHE_DIR")
