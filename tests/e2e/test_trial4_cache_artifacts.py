"""Trial 4: the compile cache, artifacts, bench --compare and the Python API under misuse and
concurrency (one test per defect found; each builds its own inputs).
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.compiler.runtime.tuning_db import TuningDatabase

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli, one_line_error  # noqa: E402, F401

W = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)


@pytest.fixture
def relu_mm(tmp_path):
    """``y = relu(x @ W)`` (x: f32[4, 32]): one matmul kernel whose Triton config beats cuBLAS
    on the simulated H200 (5.2 us against 12.0 us)."""
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "relu_mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(W, "W")])
    p = tmp_path / "relu_mm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def _env(cache):
    env = dict(os.environ, LUMC_CACHE_DIR=str(cache))
    return env


def _compile_api(model, cache):
    """A compile with a fresh tuning database and no stored plan (the kernel files of ``cache``
    are what is under test; the caller points LUMC_CACHE_DIR at ``cache``)."""
    return lumc.compile(str(model), budget="20s", device="sim:h200",
                        db=TuningDatabase(cache / f"tuning-{len(os.listdir(cache))}.sqlite"))


def _impls(cm):
    return [k.get("impl", "triton") for k in cm._report["per_kernel"]]


# ------------------------------------------------- 1: kernel source files in the cache folder


@pytest.mark.parametrize("damage", ["garbled", "directory"])
def test_a_damaged_kernel_cache_file_does_not_change_the_plan(relu_mm, tmp_path, monkeypatch,
                                                              damage):
    """A kernel file in ``<cache>/kernels`` that is not UTF-8 (garbled on disk) or a folder in its
    place made every check of that kernel an 'error', so the search silently chose cuBLAS at
    2.3x the time, in every later compile too."""
    from lumc.backends.triton import cache as kcache
    monkeypatch.setattr(kcache, "_FALLBACK", {})
    monkeypatch.setattr(kcache, "_MODULES", {})
    monkeypatch.setattr(kcache.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("LUMC_CACHE_DIR", str(cache))
    first = _compile_api(relu_mm, cache)
    assert _impls(first) == ["triton"], _impls(first)
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ W.astype(np.float64), 0)
    files = sorted((cache / "kernels").glob("lumc_matmul_*.py"))
    assert files
    for f in files:
        f.unlink()
        if damage == "garbled":
            f.write_bytes(b"\xff\xfe\x00garbage")
        else:
            f.mkdir()
    import shutil
    shutil.rmtree(cache / "plans")      # no stored plan: the search runs again
    kcache._MODULES.clear()
    for mod in [m for m in sys.modules if m.startswith("lumc_kernels.")]:
        del sys.modules[mod]
    if damage == "directory":
        with pytest.warns(RuntimeWarning, match="cannot be written"):
            second = _compile_api(relu_mm, cache)
    else:
        second = _compile_api(relu_mm, cache)
    assert _impls(second) == _impls(first)
    assert second._report["per_kernel"][0]["config"] == first._report["per_kernel"][0]["config"]
    np.testing.assert_allclose(second(x), want, rtol=1e-5, atol=1e-5)
    if damage == "garbled":       # replaced by the kernel's code
        assert all(f.read_text().startswith(("#", "import", '"""')) for f in files)
    assert not list((cache / "kernels").glob(".*.tmp"))


def test_a_file_size_limit_fails_the_compile_in_one_line_and_leaves_no_temp_files(relu_mm,
                                                                                   tmp_path):
    """``ulimit -f`` too small for a kernel's source: the kernel was dropped as if it failed its
    check (a cuBLAS plan chosen silently where the artifact could be written) and a half-written
    ``.lumc_matmul_*.tmp`` was left in the kernel cache for each try. Now: one line naming the
    kernel file and the reason, exit 2, the user's previous output kept, no temporary file."""
    cache, tmp = tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out.lumc"
    out.write_bytes(b"previous")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    env = dict(_env(cache), TMPDIR=str(tmp))
    res = subprocess.run([sys.executable, "-c", "from lumc.compiler.tools.cli import main; main()",
                          "compile", str(relu_mm),
                          "--budget", "20s", "-o", str(out), "--workers", "local:1"],
                         env=env, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("lumc: error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "File too large" in errors[0], errors[0]
    assert out.read_bytes() == b"previous"
    left = [p for d in (cache, tmp) for p in d.rglob("*") if p.name.endswith(".tmp")]
    assert not left, left


# ------------------------------------------------- 2: lumc.compile's options, given odd values


@pytest.mark.parametrize("kw", [{"fast_math": "no"}, {"use_egraph": "no"}, {"reuse_plan": "false"},
                                {"quiet": None}])
def test_on_off_options_take_only_bools(relu_mm, kw):
    """``fast_math="no"`` is truthy: it compiled with fast math on (and ``use_egraph="no"`` with
    the e-graph), the opposite of what was written."""
    with pytest.raises(lumc.InputError, match=f"{next(iter(kw))}=.*expected True or False"):
        lumc.compile(str(relu_mm), budget="10s", device="sim:h200", **kw)


def test_on_off_options_of_a_torch_module_take_only_bools():
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(4, 4)
    with pytest.raises(lumc.InputError, match="search='no'.*expected True or False"):
        lumc.compile(m, budget="10s", example_inputs=(torch.randn(2, 4),), search="no")


@pytest.mark.parametrize("shape", [[4, 32], "4x32", np.array([4, 32]).tolist()])
def test_an_inputs_shape_may_be_a_list_or_text(relu_mm, cache_dir, shape):
    """``shapes={"x": [4, 32]}`` (a list, as ``--shape x=4x32`` reads) raised ``TypeError: 'int'
    object is not iterable`` (the list was taken as sizes of a dim); ``"4x32"`` a ValueError."""
    f = lumc.compile(str(relu_mm), budget="20s", device="sim:h200", shapes={"x": shape})
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_allclose(f(x), np.maximum(x.astype(np.float64) @ W, 0), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("shape", [4, "4xq", [True, 32], None])
def test_an_inputs_shape_that_is_no_shape_is_one_line(relu_mm, shape):
    with pytest.raises(lumc.InputError, match=r"shapes=\{'x': .*'x' is an input"):
        lumc.compile(str(relu_mm), budget="10s", device="sim:h200", shapes={"x": shape})


@pytest.mark.parametrize("kw, words", [({"device": 0}, "expected a device name"),
                                       ({"example_inputs": [np.zeros((4, 32), np.float32)]},
                                        "example_inputs= of an ONNX model is a dict")])
def test_api_values_of_the_wrong_type_are_one_line(relu_mm, kw, words):
    """``device=0`` raised ``AttributeError: 'int' object has no attribute 'strip'`` and a list of
    example inputs ``AttributeError: 'list' object has no attribute 'items'``."""
    with pytest.raises(lumc.LumcError, match=words):
        lumc.compile(str(relu_mm), budget="10s", **kw)


def test_a_torch_device_names_the_device():
    torch = pytest.importorskip("torch")
    from lumc.compiler.runtime.targets import resolve_target
    with pytest.raises(lumc.LumcError, match="unknown device 'cpu'"):
        resolve_target(torch.device("cpu"))


# ------------------------------------------------- 3: pickling and copying compiled models


@pytest.fixture
def dyn_relu(tmp_path):
    """``y = relu(x @ W)`` with x: f32[n, 32] (n dynamic)."""
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "dyn_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
        [numpy_helper.from_array(W, "W")])
    p = tmp_path / "dyn_relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def _want(x):
    return np.maximum(x.astype(np.float64) @ W.astype(np.float64), 0)


@pytest.mark.parametrize("shapes", [{"n": 4}, {"n": [2, 4]}])
def test_compiled_models_pickle_and_deepcopy_as_their_artifact(dyn_relu, cache_dir, shapes):
    """``pickle.dumps(f)`` and ``copy.deepcopy(f)`` raised ``AttributeError: Node is immutable``
    (a fixed-size plan, a plan per listed size, a loaded artifact alike): a compiled model could
    not go to a multiprocessing worker."""
    import copy
    import pickle
    f = lumc.compile(str(dyn_relu), budget="20s", device="sim:h200", shapes=shapes)
    for g in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f)):
        assert type(g) is type(f)
        for n in ([4] if shapes["n"] == 4 else [2, 4]):
            x = np.random.default_rng(n).standard_normal((n, 32)).astype(np.float32)
            np.testing.assert_allclose(g(x), _want(x), rtol=1e-5, atol=1e-5)
        assert g.report() == f.report()


def test_a_loaded_artifact_pickles_across_processes(dyn_relu, cache_dir, tmp_path):
    import multiprocessing
    import pickle
    f = lumc.compile(str(dyn_relu), budget="20s", device="sim:h200", shapes={"n": 4})
    f.save(tmp_path / "m.lumc")
    g = lumc.load(tmp_path / "m.lumc")
    x = np.random.default_rng(5).standard_normal((4, 32)).astype(np.float32)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        y = pool.apply(_call_pickled, (pickle.dumps(g), x))
    np.testing.assert_allclose(y, _want(x), rtol=1e-5, atol=1e-5)


def _call_pickled(blob, x):
    import pickle
    return pickle.loads(blob)(x)


def test_a_compiled_torch_module_refuses_pickling_in_one_line():
    """It raised ``TypeError: cannot pickle 'weakref.ReferenceType' object`` (deepcopy:
    ``AttributeError: Node is immutable``)."""
    import copy
    import pickle
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(8, 4).eval()
    f = lumc.compile(m, budget="20s", example_inputs=(torch.randn(2, 8),), search=False)
    for fn in (pickle.dumps, copy.deepcopy):
        with pytest.raises(lumc.InputError, match="cannot be pickled.*f.save"):
            fn(f)


# ------------------------------------------------- 4: lumc bench --compare


@pytest.fixture
def relu_art(relu_mm, cache_dir, tmp_path):
    f = lumc.compile(str(relu_mm), budget="20s", device="sim:h200")
    f.save(tmp_path / "m.lumc")
    return tmp_path / "m.lumc"


def test_compare_json_is_strict_json_where_a_ratio_is_infinite(relu_art, tmp_path):
    """A baseline figure of 0 (valid: a finite number >= 0) makes the ratio infinite; the
    --json document held ``"ratio": Infinity``, which is not JSON (``JSON.parse``, jq and
    Python's strict parse refuse it). The compare table also did not say its times were
    simulated."""
    import json
    res = lumc_cli("bench", relu_art, "--json", tmp_path / "base.json")
    assert res.exit_code == 0, res.output
    base = json.loads((tmp_path / "base.json").read_text())
    base["kernels"][0]["time_s"] = 0.0
    base["end_to_end"]["time_s"] = 0.0
    (tmp_path / "zero.json").write_text(json.dumps(base))
    res = lumc_cli("bench", relu_art, "--compare", tmp_path / "zero.json", "--json",
                   tmp_path / "now.json")
    assert res.exit_code == 1, res.output
    assert "compare against" in res.output and "times simulated on sim:h200" in res.output

    def refuse(c):
        raise ValueError(f"not JSON: {c}")
    doc = json.loads((tmp_path / "now.json").read_text(), parse_constant=refuse)
    rows = {r["label"]: r for r in doc["comparison"]["rows"]}
    assert rows["end to end"]["ratio"] is None and rows["end to end"]["status"] == "REGRESSION"
    assert rows["bytes moved"]["ratio"] == 1.0
    assert doc["comparison"]["ok"] is False


# ------------------------------------------------- 5: the torch plan cache, two compiles at once


def test_two_compiles_storing_one_torch_plan_at_once_both_store_it(tmp_path, monkeypatch):
    """Both compiles of one module wrote the interface through the same ``KEY.torch.tmp``: the
    second truncated and rewrote it under the first's rename, the first's rename then failed
    (FileNotFoundError: its report said 'the plan was not stored'), and a compile killed there
    left the temp file behind for good."""
    torch = pytest.importorskip("torch")
    from lumc.compiler.core import torch_plan_cache as plan_cache
    from lumc.compiler.core.torch_compile import compile_module
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    f = compile_module(m, (x,), budget="20s", device="sim:h200")
    plans = tmp_path / "cache" / "plans"
    (torch_file,) = plans.glob("*.torch")
    key = torch_file.name[:-len(".torch")]
    spec = f.specializations[0]
    real = os.replace
    nested = []

    def interleaved(src, dst, *a, **k):
        # the other compile stores the same plan between this one's write and its rename
        if str(dst).endswith(".torch") and not nested:
            nested.append(None)
            nested[0] = plan_cache.store(plans, key, f, spec)
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", interleaved)
    before = list(spec.compiled._report.get("warnings", []))
    assert plan_cache.store(plans, key, f, spec) is True
    assert nested == [True]
    assert spec.compiled._report.get("warnings", []) == before
    monkeypatch.setattr(os, "replace", real)
    assert plan_cache.load_shell(plans, key) is not None
    assert not [p.name for p in plans.iterdir() if p.name.endswith(".tmp")]
    g = compile_module(m, (x,), budget="20s", device="sim:h200")
    assert g.reused
    with torch.no_grad():
        torch.testing.assert_close(g(x), m(x), rtol=1e-4, atol=1e-5)


# ------------------------------------------------- 6: compiles in threads


_THREADS_SCRIPT = r"""
import json, sys, threading
import numpy as np
import lumc
paths = sys.argv[1:]
first = lumc.compile(paths[0], budget="30s", device="sim:h200", reuse_plan=False)
out, errors = {}, []
def go(i, p):
    try:
        out[i] = lumc.compile(p, budget="30s", device="sim:h200", reuse_plan=False)
    except BaseException as e:   # egglog's PanicException is a BaseException
        errors.append(f"{type(e).__name__}: {e}")
ts = [threading.Thread(target=go, args=(i, p)) for i, p in enumerate(paths)]
[t.start() for t in ts]
[t.join() for t in ts]
x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
print(json.dumps({"errors": errors,
                  "egraph": [out[i].report_dict()["egraph"]["error"] for i in sorted(out)],
                  "used": [out[i].report_dict()["egraph"]["used"] for i in sorted(out)],
                  "y": [np.asarray(out[i](x)).tolist() for i in sorted(out)]}))
"""


def test_compiles_in_other_threads_use_the_egraph(relu_mm, tmp_path):
    """``lumc.compile`` in a thread after one in the main thread, or in two threads at once,
    shared the process's one egglog engine, which is bound to the thread that built it: a
    ``pyo3_runtime.PanicException`` ('EGraph is unsendable, but sent to another thread') escaped
    as a traceback, and 'EGraph ... is being dropped on another thread' was printed at exit and
    in forked workers."""
    import json
    res = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(relu_mm), str(relu_mm)],
                         env=_env(tmp_path / "cache"), capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "unsendable" not in res.stderr, res.stderr[-3000:]
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["errors"] == [] and doc["egraph"] == [None, None] and doc["used"] == [True, True]
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    for y in doc["y"]:
        np.testing.assert_allclose(np.array(y), _want(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------- 7: lumc.load's arguments


@pytest.mark.parametrize("device, words", [
    ("bogus", "runs on 'cpu' or 'cuda"), ("sim:h200", "compile target"), (0, "runs on 'cpu'"),
    pytest.param("cuda", "no CUDA GPU", marks=pytest.mark.skipif(
        __import__("torch").cuda.is_available(), reason="a GPU is present"))])
def test_load_refuses_a_device_it_cannot_run_on(relu_art, device, words):
    """``lumc.load(path, device="bogus")`` ran on the CPU, silently; ``device="cuda"`` on a
    machine without a GPU failed at the first call with torch's ``ValueError: Expected a
    torch.device with a specified index``; ``device=0`` an AttributeError."""
    with pytest.raises(lumc.LumcError, match=words):
        lumc.load(relu_art, device=device)


def test_load_takes_cpu_and_paths_only(relu_art):
    import pathlib
    x = np.random.default_rng(3).standard_normal((4, 32)).astype(np.float32)
    for f in (lumc.load(relu_art, device="CPU"), lumc.load(pathlib.Path(relu_art), "cpu")):
        np.testing.assert_allclose(f(x), _want(x), rtol=1e-5, atol=1e-5)
    for bad in (None, relu_art.read_bytes(), 3):
        with pytest.raises(lumc.ArtifactError, match="expected the path of a .lumc artifact"):
            lumc.load(bad)


# ------------------------------------------------- 8: plan cache eviction beside a live write


def test_eviction_spares_the_temp_file_another_compile_is_writing(tmp_path, relu_mm,
                                                                  monkeypatch):
    """Eviction grouped every ``.KEY.lumc.XXXX.tmp`` under the empty stem and deleted it like a
    plan: with a small LUMC_PLAN_CACHE_MB, a compile finishing beside another one that was
    writing its plan deleted that file under it, and the other's store failed ('the plan was
    not stored'). A temp file a killed write left long ago still goes."""
    import time
    from lumc.compiler.runtime.tuning_db import evict_plans
    d = tmp_path / "plans"
    d.mkdir()
    old = d / "old.lumc"
    old.write_bytes(b"x" * 1000)
    os.utime(old, (1000, 1000))
    live = d / ".k2.lumc.1a2b3c4d.tmp"          # another compile's plan, half written
    live.write_bytes(b"y" * 5000)
    stale = d / ".k3.lumc.5e6f7a8b.tmp"         # a compile killed long ago
    stale.write_bytes(b"z" * 100)
    os.utime(stale, (time.time() - 7200,) * 2)
    mine = d / "k1.lumc"
    mine.write_bytes(b"w" * 1000)
    evict_plans(d, mine, limit_bytes=0)
    assert sorted(p.name for p in d.iterdir()) == [live.name, mine.name]
    # end to end: a compile storing its plan at LUMC_PLAN_CACHE_MB=0 keeps the live temp file
    cache = tmp_path / "cache"
    monkeypatch.setenv("LUMC_CACHE_DIR", str(cache))
    monkeypatch.setenv("LUMC_PLAN_CACHE_MB", "0")
    (cache / "plans").mkdir(parents=True)
    other = cache / "plans" / ".0123abcd.lumc.deadbeef.tmp"
    other.write_bytes(b"being written")
    f = lumc.compile(str(relu_mm), budget="20s", device="sim:h200")
    assert not [w for w in f._report.get("warnings", []) if "plan cache" in w]
    assert other.read_bytes() == b"being written"
    assert len(list((cache / "plans").glob("*.lumc"))) == 1


def test_save_to_something_that_is_not_a_path_is_one_line(relu_art, tmp_path):
    """``f.save(None)`` / ``f.save(3)`` / ``f.save(b"x.lumc")`` raised Python's TypeError from
    deep in the atomic write; ``f.save("")`` said 'cannot write : it is a directory'."""
    f = lumc.load(relu_art)
    for bad in (None, 3, b"x.lumc"):
        with pytest.raises(lumc.LumcError, match="expected a file path"):
            f.save(bad)
    with pytest.raises(lumc.LumcError, match="empty path"):
        f.save("")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_example_kwargs_that_are_not_a_dict_are_one_line():
    """``example_kwargs=[x]`` raised ``TypeError: cannot convert dictionary update sequence``."""
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(8, 4).eval()
    x = torch.randn(2, 8)
    with pytest.raises(lumc.InputError, match="example_kwargs= is a dict"):
        lumc.compile(m, budget="10s", example_inputs=(x,), example_kwargs=[x])


def test_torch_compile_backend_search_option_takes_only_bools():
    """``torch.compile(m, backend="lumc", options={"search": "no"})`` ran the kernel search."""
    torch = pytest.importorskip("torch")
    from lumc.compiler.core.torch_backend import lumc_backend
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    with pytest.raises(lumc.InputError, match=r"options\['search'\]='no': expected True or False"):
        lumc_backend(gm, [torch.randn(2, 4)], options={"search": "no", "budget": "10s"})


def test_a_model_pickled_on_a_gpu_unpickles_on_a_cpu_host(dyn_relu, cache_dir):
    """The pickle names the device the model ran on; read where there is no GPU (a model
    pickled on a GPU host, read on a CPU one), it loads where ``lumc.load`` would put it."""
    import pickle

    from lumc.compiler.runtime.targets import _cuda_available
    if _cuda_available():
        pytest.skip("needs a machine without a CUDA GPU")
    f = lumc.compile(str(dyn_relu), budget="20s", device="sim:h200", shapes={"n": 4})
    f.torch_device = "cuda:0"                 # as pickled on a GPU host
    g = pickle.loads(pickle.dumps(f))
    assert g.torch_device == "cpu"
    x = np.random.default_rng(7).standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_allclose(g(x), _want(x), rtol=1e-5, atol=1e-5)
