"""Bad input at the CLI: one line ``lumc: error: ...``, exit status 2, no traceback; nothing
half-written; nothing the user had is lost (the QA report's defects, one test each).

Compiles are real but few: one module-scoped compile of the tiny model; tests that need a compile
to finish reuse it through a patched ``compile_model``, and refusals happen before any work.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
import lumc.compiler.runtime.artifact as artifact_mod
import lumc.compiler.tools.cli as cli_mod
from lumc.compiler.tools.cli_compile import _secs
from lumc.compiler.runtime.tuning_db import TuningDatabase

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli, one_line_error  # noqa: E402



pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


@pytest.fixture
def tiny(tmp_path, tiny_path):
    """A fresh copy of the e2e tiny model (x: f32[n, 3], k: i64[n, 2] -> y, k2)."""
    p = tmp_path / "tiny.onnx"
    p.write_bytes(tiny_path.read_bytes())
    return p


def tiny_model(tiny_path):
    return onnx.load(tiny_path)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, tiny_path):
    """``(CompiledModel, artifact path)`` of the tiny model at n = 3, simulated H200."""
    root = tmp_path_factory.mktemp("robust")
    (root / "tiny.onnx").write_bytes(tiny_path.read_bytes())
    cm = lumc.compile(str(root / "tiny.onnx"), budget="30s", device="sim:h200", shapes={"n": 3},
                      db=TuningDatabase(root / "cache" / "tuning.sqlite"))
    cm.save(root / "tiny.lumc")
    return cm, root / "tiny.lumc"


@pytest.fixture
def fake_compile(compiled, monkeypatch):
    """``lumc compile`` returns the module's compiled model at once (its report may be edited)."""
    cm = compiled[0]
    saved = json.loads(json.dumps(cm._report))
    monkeypatch.setattr("lumc.compiler.core.pipeline.compile_model", lambda *a, **k: cm)
    yield cm
    cm._report = saved


# ---------------------------------------------------------------- 1-3: where outputs go, and how


def test_compile_writes_through_a_symlink_with_umask_mode(tiny, tmp_path, fake_compile):
    link, real = tmp_path / "link.lumc", tmp_path / "real.lumc"
    link.symlink_to(real)
    old = os.umask(0o022)
    try:
        res = lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "-o", link, "--quiet")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and os.readlink(link) == str(real)     # the link is kept...
    assert lumc.load(link).inputs == fake_compile.inputs             # ...and its target written
    assert stat.S_IMODE(real.stat().st_mode) == 0o644                # 0666 & ~umask, not 0600


@pytest.mark.parametrize("kind", ["fifo", "dir", "dangling-dir-link"])
def test_compile_refuses_special_outputs(tiny, tmp_path, kind):
    out = tmp_path / "out.lumc"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "dir":
        out.mkdir()
    else:
        (tmp_path / "d").mkdir()
        out.symlink_to(tmp_path / "d")
    res = lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "-o", out)
    line = one_line_error(res, "out.lumc")
    assert ("not a regular file" if kind == "fifo" else "is a directory") in line
    assert stat.S_ISFIFO(out.stat().st_mode) if kind == "fifo" else out.is_dir()


def test_compile_never_overwrites_the_model(tiny, tmp_path):
    before = tiny.read_bytes()
    one_line_error(lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "-o", tiny),
                   "tiny.onnx", "is the model")
    alias = tmp_path / "alias.onnx"
    alias.symlink_to(tiny)
    one_line_error(lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "-o", alias),
                   "is the model")
    named = tmp_path / "m.lumc"          # an ONNX file named .lumc, default -o = itself
    named.write_bytes(before)
    one_line_error(lumc_cli("compile", named, "--budget", "10s", "--shape", "n=3"), "is the model")
    one_line_error(lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "--report", tiny),
                   "is the model")
    assert tiny.read_bytes() == before and named.read_bytes() == before


def test_compile_refuses_an_artifact_as_model(compiled):
    one_line_error(lumc_cli("compile", compiled[1], "--budget", "10s", "-o", "/tmp/unused.lumc"),
                   "tiny.lumc", "artifact, not an ONNX model")


@pytest.mark.parametrize("opt", ["-o", "--report"])
def test_compile_unwritable_outputs_fail_before_work(tiny, opt, monkeypatch):
    monkeypatch.setattr("lumc.compiler.core.pipeline.compile_model",
                        lambda *a, **k: pytest.fail("compiled although the output is unwritable"))
    target = "/proc/c.lumc" if opt == "-o" else "/proc/r.json"
    one_line_error(lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", opt, target),
                   target, "cannot")


def test_api_save_to_unwritable_path_is_a_lumc_error(compiled, tmp_path):
    from lumc.compiler.runtime.artifact import OutputError
    from lumc.ir.errors import LumcError
    for bad in ("/proc/x.lumc", tmp_path / "file" / "x.lumc"):
        (tmp_path / "file").write_bytes(b"a file, not a folder")
        with pytest.raises(LumcError) as e:
            compiled[0].save(bad)
        assert isinstance(e.value, OutputError) and "\n" not in str(e.value)


# ---------------------------------------------------------------- 4: tracebacks -> one line


def test_npy_given_to_inputs(tiny, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    one_line_error(lumc_cli("run", tiny, "--inputs", tmp_path / "x.npy", "--random"),
                   "x.npy", "not an .npz archive")


def test_non_npy_given_to_input(tiny, tmp_path):
    line = one_line_error(lumc_cli("run", tiny, "--input", f"x={tiny}", "--random"))
    assert line == f"lumc: error: --input x: {tiny} is not a .npy array (or it is truncated)"


@pytest.mark.parametrize("cmd", ["run", "compile"])
@pytest.mark.parametrize("opt", ["--input", "--inputs"])
def test_fifo_input_is_refused_unread(tiny, tmp_path, cmd, opt):
    """An input path that is a named pipe nobody writes blocked the command forever."""
    import threading
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock():      # without the refusal the reader waits in open(); let it go after 3 s
        while not done.wait(3):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))   # EOF for the reader
            except OSError:      # no reader (yet)
                pass
    threading.Thread(target=unblock, daemon=True).start()
    args = ["--random"] if cmd == "run" else ["--budget", "10s"]
    started = time.monotonic()
    given = f"x={fifo}" if opt == "--input" else fifo
    res = lumc_cli(cmd, tiny, "--shape", "n=2", *args, opt, given)
    took = time.monotonic() - started
    done.set()
    one_line_error(res, str(fifo), "a FIFO", "regular file")
    assert took < 2.5


@pytest.mark.parametrize("cmd", ["run", "compile"])
def test_huge_shape_is_refused_naming_the_input(tiny, cmd):
    args = ["--random"] if cmd == "run" else ["--budget", "10s"]
    res = lumc_cli(cmd, tiny, *args, "--shape", "n=100000000000")
    one_line_error(res, "'x'", "[100000000000, 3]", "memory")


def test_memory_error_anywhere_is_one_line(tiny, monkeypatch):
    def boom(self, inputs):
        raise MemoryError("Unable to allocate 9.1 TiB for an array with shape (10, 10)")
    monkeypatch.setattr("lumc.backends.reference.ReferenceExecutor.__call__", boom)
    one_line_error(lumc_cli("run", tiny, "--random", "--shape", "n=2"), "out of memory", "9.1 TiB")


def test_run_output_folders_are_created_and_unwritable_ones_refused(tiny, tmp_path):
    out = tmp_path / "missing2" / "out.npz"
    res = lumc_cli("run", tiny, "--random", "--shape", "n=2", "-o", out)
    assert res.exit_code == 0, res.output
    with np.load(out) as f:
        assert sorted(f.files) == ["k2", "y"]
    one_line_error(lumc_cli("run", tiny, "--random", "--shape", "n=2", "-o", "/proc/out.npz"),
                   "/proc/out.npz")
    before = tiny.read_bytes()
    one_line_error(lumc_cli("run", tiny, "--random", "--shape", "n=2", "-o", tiny), "is the model")
    assert tiny.read_bytes() == before


def test_missing_external_data_names_tensor_and_file(tmp_path, tiny_path):
    d = tmp_path / "ext"
    d.mkdir()
    onnx.save_model(tiny_model(tiny_path), d / "e.onnx", save_as_external_data=True, location="e.data",
                    size_threshold=0)
    (d / "e.data").unlink()
    one_line_error(lumc_cli("run", d / "e.onnx", "--random", "--shape", "n=2"),
                   "'W'", "'e.data'", "missing")


def test_ctrl_c_during_the_artifact_write(tiny, tmp_path, fake_compile, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(artifact_mod.os, "fsync", interrupted)
    out = tmp_path / "out" / "m.lumc"
    res = lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "-o", out, "--quiet")
    one_line_error(res, "interrupted", "nothing was written")
    assert not out.exists() and not [p for p in out.parent.iterdir()]   # no temporary file either


def test_ctrl_c_wrapped_by_an_import_is_still_an_interrupt(tiny, tmp_path, monkeypatch):
    def wrapped(*a, **k):   # what Python makes of Ctrl-C inside a class body's __set_name__
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__") from e
    monkeypatch.setattr("lumc.compiler.core.pipeline.compile_model", wrapped)
    res = lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "-o", tmp_path / "m.lumc")
    one_line_error(res, "interrupted", "nothing was written")


def test_real_sigint_during_a_compile(tiny, tmp_path):
    import signal
    import time
    cache = tmp_path / "sigcache"
    out = tmp_path / "m.lumc"
    p = subprocess.Popen([sys.executable, "-c", "from lumc.compiler.tools.cli import main; main()",
                          "compile", str(tiny), "--budget", "30s", "--shape", "n=3", "-o", str(out),
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "LUMC_CACHE_DIR": str(cache)})
    t0 = time.monotonic()
    while not (cache / "tuning.sqlite").exists() and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.01)     # the database opens inside compile_model: past the argument checks
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("the compile finished before the signal arrived")
    assert p.returncode == 2, err
    assert err.strip().splitlines() == [err.strip()] and err.startswith("lumc: error: interrupted")
    assert not out.exists() and not [f for f in tmp_path.iterdir() if f.name.startswith(".m.lumc")]


def test_sigterm_while_the_artifact_is_written_leaves_nothing(tiny, tmp_path):
    """SIGTERM (kill PID, a scheduler's time limit) arriving while -o is written: one line, exit 2,
    no temporary file beside -o and the file already there untouched (it was killed by the default
    action: status -15, a half-written '.m.lumc.*.tmp' left behind)."""
    out = tmp_path / "m.lumc"
    out.write_bytes(b"the user's previous artifact")
    script = ("import os, signal\n"
              "import lumc.compiler.runtime.artifact as a\n"
              "real = os.fsync\n"
              "def fsync(fd):\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    real(fd)\n"
              "a.os = type('os', (), {n: getattr(os, n) for n in dir(os) if not n.startswith('__')})\n"
              "a.os.fsync = staticmethod(fsync)\n"
              "from lumc.compiler.tools.cli import main; main()\n")
    p = subprocess.run([sys.executable, "-c", script, "compile", str(tiny), "--budget", "30s",
                        "--shape", "n=3", "-o", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.splitlines() == ["lumc: error: terminated (SIGTERM): nothing was written; "
                                     "timings measured so far are kept in the tuning database"]
    assert out.read_bytes() == b"the user's previous artifact"
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".m.lumc")] == []


def test_a_model_with_external_data_loads_from_any_directory(tmp_path, monkeypatch):
    """onnx's checker, given the proto in memory, looked for the external data file in the current
    directory: every model saved with external data was refused ('should be stored in w.bin, but
    it is not regular file') unless lumc ran in the model's folder."""
    w = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (tmp_path / "model").mkdir()
    onnx.save(m, str(tmp_path / "model" / "m.onnx"), save_as_external_data=True,
              location="w.bin", size_threshold=0)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    x = np.ones((2, 4), np.float32)
    np.save(tmp_path / "x.npy", x)
    res = lumc_cli("run", tmp_path / "model" / "m.onnx", "--input", f"x={tmp_path / 'x.npy'}",
                   "-o", tmp_path / "y.npz", "--check")
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], x @ w, rtol=1e-6)
    # a location outside the model's folder is still refused, in one line
    m2 = onnx.load(str(tmp_path / "model" / "m.onnx"), load_external_data=False)
    for e in m2.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../model/w.bin"
    (tmp_path / "other").mkdir()
    onnx.save(m2, str(tmp_path / "other" / "up.onnx"))
    one_line_error(lumc_cli("run", tmp_path / "other" / "up.onnx", "--random"),
                   "'../model/w.bin' points outside the directory")


def test_inspect_plot_of_a_several_plan_artifact_is_refused_not_skipped(tiny, tmp_path):
    """'lumc inspect ART --plot OUT.png' of an artifact with one plan per size printed 'not drawn'
    on stdout and exited 0 without writing OUT.png; it is refused in one line (exit 2)."""
    art = tmp_path / "r.lumc"
    res = lumc_cli("compile", tiny, "--budget", "30s", "--shape", "n=2,5", "-o", art, "--quiet")
    assert res.exit_code == 0, res.output
    png = tmp_path / "roof.png"
    one_line_error(lumc_cli("inspect", art, "--plot", png), "--plot draws one plan",
                   "holds 2", f"lumc bench {art} --shape DIM=N --plot {png}")
    assert not png.exists()
    res = lumc_cli("bench", art, "--shape", "n=5", "--repeats", "1", "--plot", png)
    assert res.exit_code == 0 and png.stat().st_size > 0, res.output
    res = lumc_cli("inspect", art)          # without --plot: every plan's table
    assert res.exit_code == 0 and res.stdout.count("== plan") == 2, res.output


def test_usage_errors_are_one_line(tiny, tmp_path):
    one_line_error(lumc_cli("compile", tiny), "Missing option '--budget'", "--help")
    one_line_error(lumc_cli("run", tiny, "--frobnicate"), "No such option", "--frobnicate")
    one_line_error(lumc_cli("run", tmp_path), "is a directory")
    # an option missing its value points at the subcommand's help, not the group's
    one_line_error(lumc_cli("compile", tiny, "--budget", "5s", "--logits"), "requires an argument",
                   "compile --help")


def test_ctrl_c_in_any_command_is_one_line(tiny, monkeypatch):
    def interrupted(self, inputs):
        raise KeyboardInterrupt
    monkeypatch.setattr("lumc.backends.reference.ReferenceExecutor.__call__", interrupted)
    one_line_error(lumc_cli("run", tiny, "--random", "--shape", "n=2"), "interrupted")


# ---------------------------------------------------------------- 7-9: options on artifacts, --shape, --rtol


def test_shape_on_an_artifact_is_refused(compiled):
    one_line_error(lumc_cli("run", compiled[1], "--shape", "n=3", "--random"),
                   "--shape", "compiled artifact")


def test_triton_backend_runs_the_artifacts_kernels(compiled, tmp_path):
    a, b = tmp_path / "ref.npz", tmp_path / "tri.npz"
    res = lumc_cli("run", compiled[1], "--random", "-o", a)
    assert res.exit_code == 0, res.output
    res = lumc_cli("run", compiled[1], "--random", "--backend", "triton", "-o", b, "--check")
    assert res.exit_code == 0, res.output
    assert "Triton kernels" in res.stdout and "match onnxruntime" in res.stdout
    with np.load(a) as fa, np.load(b) as fb:
        np.testing.assert_allclose(fb["y"], fa["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(fb["k2"], fa["k2"])


@pytest.mark.parametrize("shapes,words", [
    (["Q=2"], ["--shape Q", "no input or dynamic dim"]),
    (["n=2", "n=3"], ["--shape n", "given twice"]),
    (["x=2x3", "n=5"], ["dynamic dim n", "5", "2"]),
    (["x=2x4"], ["[2, 4]", "[n, 3]"]),
])
@pytest.mark.parametrize("cmd", ["run", "compile", "bench"])
def test_shape_validation_is_the_same_for_run_compile_and_bench(tiny, cmd, shapes, words):
    args = ["--random"] if cmd == "run" else ["--budget", "10s"]
    res = lumc_cli(cmd, tiny, *args, *[a for s in shapes for a in ("--shape", s)])
    one_line_error(res, *words)


@pytest.mark.parametrize("rtol", ["-1", "nan", "inf"])
def test_bad_rtol_is_refused(tiny, rtol):
    one_line_error(lumc_cli("run", tiny, "--random", "--shape", "n=2", "--check", "--rtol", rtol),
                   "--rtol")


def f16_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4])
    c = numpy_helper.from_array(np.array([0.5, 1.0, -2.0, 3.0], np.float16), "c")
    g = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["y"])], "f16", [x], [y], [c])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_check_tolerance_is_per_dtype_unless_rtol_is_given(tmp_path, monkeypatch):
    p = tmp_path / "f16.onnx"
    onnx.save(f16_model(), p)
    real = cli_mod._run_onnxruntime

    def off_by_1e3(path, inputs):   # 1e-3 of max|y|: inside f16's 1e-2, outside f32's 1e-4
        ref = real(path, inputs)
        ref["y"] = (ref["y"].astype(np.float32) * (1 + 1e-3)).astype(np.float16)
        return ref
    monkeypatch.setattr(cli_mod, "_run_onnxruntime", off_by_1e3)
    monkeypatch.setattr(cli_mod, "_run_onnxruntime_unoptimized", off_by_1e3)
    res = lumc_cli("run", p, "--random", "--check")
    assert res.exit_code == 0, res.output
    assert "rtol 0.01 by dtype" in res.stdout
    assert "atol 0.001 + rtol 0.01 by dtype" in res.stdout
    # given tolerances apply; with the float64 judge siding with onnxruntime, lumc fails
    monkeypatch.setattr(cli_mod, "float64_outputs", lambda g, inputs: off_by_1e3(p, inputs))
    res = lumc_cli("run", p, "--random", "--check", "--rtol", "1e-4", "--atol", "0")
    assert res.exit_code == 1 and "FAILED for y (atol 0 + rtol 0.0001; ints exact)" in res.stderr
    assert cli_mod.output_rtol(np.dtype(np.float64), None) == 1e-10
    assert cli_mod.output_rtol(np.dtype(np.int64), 0.5) == 0.0


# ---------------------------------------------------------------- 10-13: opset, messages, warnings, seconds


@pytest.mark.parametrize("cmd", ["run", "compile"])
def test_opset_newer_than_onnx_knows_is_refused(tmp_path, tiny_path, cmd):
    m = tiny_model(tiny_path)
    m.opset_import[0].version = 99
    p = tmp_path / "o99.onnx"
    onnx.save(m, p)
    args = ["--random"] if cmd == "run" else ["--budget", "10s"]
    one_line_error(lumc_cli(cmd, p, *args, "--shape", "n=2"), "opset 99", "up to")


def test_truncated_artifact_is_called_a_damaged_artifact(compiled, tmp_path):
    bad = tmp_path / "t.lumc"
    bad.write_bytes(compiled[1].read_bytes()[:3000])
    for cmd in (["run", bad, "--random"], ["bench", bad], ["inspect", bad]):
        one_line_error(lumc_cli(*cmd), "t.lumc", "damaged .lumc artifact")


def test_lumc_warnings_print_as_one_line(cache_dir, monkeypatch):
    cache_dir.mkdir(parents=True)
    (cache_dir / "tuning.sqlite").write_bytes(b"not a database" * 300)
    proc = subprocess.run([sys.executable, "-c", "from lumc.compiler.tools.cli import main; main()",
                           "cache", "info"], capture_output=True, text=True,
                          env={**os.environ, "LUMC_CACHE_DIR": str(cache_dir)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("lumc: warning: tuning database ")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # other warnings go to Python's own printer, untouched
    seen = []
    monkeypatch.setattr(cli_mod, "_show_warning_default", lambda *a: seen.append(a))
    cli_mod._show_warning(UserWarning("plain"), UserWarning, "f.py", 3)
    cli_mod._show_warning(RuntimeWarning("overflow in exp"), RuntimeWarning, "f.py", 4)
    assert [str(a[0]) for a in seen] == ["plain", "overflow in exp"]


def test_seconds_are_shown_with_enough_digits(tiny, tmp_path, fake_compile):
    assert [_secs(x) for x in (0.5, 1.5, 0.0123, 59.94, 1800.0)] == ["0.5", "1.5", "0.0123",
                                                                     "59.9", "1800"]
    fake_compile._report.update(budget_s=0.5, compile_s=0.4567)
    res = lumc_cli("compile", tiny, "--budget", "0.5s", "--shape", "n=3", "-o",
                   tmp_path / "m.lumc", "--quiet")
    assert res.exit_code == 0, res.output
    assert " in 0.457 s of 0.5 s: " in res.stdout


# ---------------------------------------------------------------- 6: the cache


def test_cache_info_and_clear_cover_plans_and_set_aside_databases(cache_dir, compiled):
    db = TuningDatabase()
    db.plans_dir.mkdir(parents=True, exist_ok=True)
    (db.plans_dir / "abc.lumc").write_bytes(compiled[1].read_bytes())
    (cache_dir / "tuning.sqlite.corrupt-123").write_bytes(b"x" * 10)
    (cache_dir / "tuning.sqlite.corrupt-123-wal").write_bytes(b"x")
    db.close()
    res = lumc_cli("cache", "info")
    assert res.exit_code == 0, res.output
    assert "stored plans: " in res.stdout and "(1 plan," in res.stdout
    assert "set-aside corrupt databases: 2 files" in res.stdout
    res = lumc_cli("cache", "clear")
    assert res.exit_code == 0, res.output
    assert "1 stored plan, 2 set-aside database files" in res.stdout
    assert not list((cache_dir / "plans").iterdir())
    assert not list(cache_dir.glob("tuning.sqlite.corrupt-*"))


def test_an_output_listed_twice_is_said_in_the_summary_and_inspect(tmp_path):
    """onnxruntime returns a graph output listed twice twice; lumc returns it once. The compile
    summary and ``lumc inspect`` say so (``--check`` then compares the one output it has)."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])] * 2)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src, out = tmp_path / "dup.onnx", tmp_path / "dup.lumc"
    onnx.save(m, src)
    r = lumc_cli("compile", src, "--budget", "10s", "-o", out)
    assert r.exit_code == 0, r.output
    note = "graph output 'y' is listed 2 times: lumc returns it once (onnxruntime returns it 2 times)"
    assert note in r.output
    r = lumc_cli("inspect", out)
    assert r.exit_code == 0 and note in r.output


def test_plan_cache_sheds_its_least_recently_used_plans(cache_dir, monkeypatch):
    """Every compile stored a full artifact under plans/ and nothing was ever evicted (three
    MiniLM compiles: 378 MB). Past LUMC_PLAN_CACHE_MB the least recently used plans go (a
    torch module's interface file with its plan); the plan just written, and one a compile
    reused (touched), stay."""
    import os
    from lumc.compiler.runtime.tuning_db import evict_plans, plan_cache_limit
    d = cache_dir / "plans"
    d.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(("a", "b", "c", "d")):
        (d / f"{name}.lumc").write_bytes(b"x" * 400_000)
        os.utime(d / f"{name}.lumc", (1000 + i, 1000 + i))
    (d / "a.torch").write_bytes(b"{}")
    os.utime(d / "a.torch", (1000, 1000))
    os.utime(d / "b.lumc", (5000, 5000))                 # reused lately
    gone = evict_plans(d, d / "d.lumc", limit_bytes=1_000_000)
    assert sorted(p.name.split(".")[0] for p in gone) == ["a", "c"]
    assert sorted(p.name for p in d.iterdir()) == ["b.lumc", "d.lumc"]
    monkeypatch.setenv("LUMC_PLAN_CACHE_MB", "0")
    assert [p.name for p in evict_plans(d, d / "d.lumc")] == ["b.lumc"]
    assert [p.name for p in d.iterdir()] == ["d.lumc"]
    monkeypatch.delenv("LUMC_PLAN_CACHE_MB")
    assert plan_cache_limit() == 4096 * 10 ** 6
    # a bad value was ignored without a word (the 4 GB default kept): one line, before any work
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from lumc.ir.errors import InputError
    for bad in ("-1", "nan", "x", ""):
        monkeypatch.setenv("LUMC_PLAN_CACHE_MB", bad)
        with pytest.raises(InputError, match=f"LUMC_PLAN_CACHE_MB={bad!r}: .* MB >= 0"):
            TuningDatabase()


def test_report_json_is_strict_where_a_figure_is_not_finite(tiny, tmp_path, fake_compile):
    """``--report`` is RFC 8259 JSON: an infinite or NaN figure (an error no plan bounds, a
    sensitivity) is written as null, not ``Infinity``/``NaN``, which ``JSON.parse`` and ``jq``
    refuse. Python's reader would accept those, so the file is read with them refused."""
    fake_compile._report["max_rel_error"] = float("inf")
    fake_compile._report["extra_figures"] = [float("nan"), 1.5, {"x": float("-inf")}]
    rep = tmp_path / "r.json"
    res = lumc_cli("compile", tiny, "--budget", "10s", "--shape", "n=3", "-o", tmp_path / "a.lumc",
                   "--report", rep, "--quiet")
    assert res.exit_code == 0, res.output

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    doc = json.loads(rep.read_text(), parse_constant=refuse)
    assert doc["max_rel_error"] is None
    assert doc["extra_figures"] == [None, 1.5, {"x": None}]
def test_an_input_with_an_initializer_is_said_to_be_a_constant(tmp_path, monkeypatch):
    """An input the model also lists as an initializer (its default value, ONNX IR >= 4) is
    compiled as that constant; giving it was refused as an 'unknown input', though the model
    lists it as an input."""
    w = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "dflt",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", 2 * w)
    res = lumc_cli("run", tmp_path / "m.onnx", "--input", f"x={tmp_path / 'x.npy'}",
                   "-o", tmp_path / "y.npz")
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], x.astype(np.float64) @ w,
                               rtol=1e-6)
    monkeypatch.setattr("lumc.compiler.core.pipeline.compile_model",
                        lambda *a, **k: pytest.fail("compiled although an input is refused"))
    for cmd in (("run",), ("compile", "--budget", "10s", "-o", tmp_path / "m.lumc")):
        one_line_error(lumc_cli(cmd[0], tmp_path / "m.onnx", *cmd[1:], "--input",
                                f"x={tmp_path / 'x.npy'}", "--input", f"w={tmp_path / 'w.npy'}"),
                       "'w'", "input with a default value (an initializer)",
                       "compiles as a constant")
    # the Python API says so too, for a compiled model and for one loaded from its artifact
    monkeypatch.undo()
    f = lumc.compile(str(tmp_path / "m.onnx"), budget="20s", device="sim:h200")
    f.save(tmp_path / "m.lumc")
    for g in (f, lumc.load(tmp_path / "m.lumc")):
        np.testing.assert_allclose(g(x=x), x.astype(np.float64) @ w, rtol=1e-6)
        with pytest.raises(lumc.InputError, match="default value .an initializer.*constant"):
            g(x=x, w=2 * w)


@pytest.mark.parametrize("n", ["100000000000000000000", "100001", "0"])
def test_bench_refuses_a_repeat_count_it_could_not_finish(compiled, n):
    """``--repeats 1e20`` was accepted and ran for ever; counts past 100,000 (or under 1) are one
    line, exit 2, before any work."""
    res = lumc_cli("bench", compiled[1], "--repeats", n)
    line = one_line_error(res, "--repeats")
    assert "100000" in line
