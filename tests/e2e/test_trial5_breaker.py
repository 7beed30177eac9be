"""Defects a new user found from the outside (trial 5), one test each."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(__file__))    # hostile.py

pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


def _python(*args: str) -> subprocess.CompletedProcess:
    def pre():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=pre, env=os.environ.copy())


def test_python_dash_m_lumc_is_the_cli(tmp_path):
    """``python -m lumc`` failed: "No module named lumc.__main__" (status 1)."""
    res = _python("-m", "lumc", "--help")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("Usage: lumc ") and "compile" in res.stdout
    res = _python("-m", "lumc", "run", str(tmp_path / "missing.lumc"))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [f"lumc: error: {tmp_path / 'missing.lumc'}: no such file"]


# a signal while ``python -m lumc`` imports the CLI: one line, status 2, as the console script
_DURING_IMPORT = textwrap.dedent("""
    import importlib.abc, os, runpy, signal, sys
    SIG = getattr(signal, sys.argv[1])
    class Hit(importlib.abc.MetaPathFinder):
        fired = False
        def find_spec(self, name, path=None, target=None):
            if name in ("click", "numpy") and not Hit.fired:
                Hit.fired = True
                os.kill(os.getpid(), SIG)
            return None
    sys.meta_path.insert(0, Hit())
    sys.argv[1:] = ["cache", "info"]
    runpy.run_module("lumc", run_name="__main__", alter_sys=True)
""")


@pytest.mark.parametrize("sig,what", [("SIGINT", "interrupted (Ctrl-C)"),
                                      ("SIGTERM", "terminated (SIGTERM)")])
def test_a_signal_while_python_dash_m_lumc_starts_is_one_line(sig, what, cache_dir):
    res = _python("-c", _DURING_IMPORT, sig)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.splitlines() == [f"lumc: error: {what} while starting; nothing was done"]
    assert not cache_dir.exists()


def _onnx(tmp_path, name, nodes, inputs, outputs, inits=()):
    import onnx
    from onnx import helper
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    p = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def test_example_inputs_naming_no_input_are_refused_as_such(tmp_path):
    """``example_inputs={"n": a}`` where ``n`` is a dynamic dim compiled at n = len(a) with the
    values dropped; a name that is nothing was reported as a ``shapes=`` key the user never gave,
    an input with a default value as no input at all."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import lumc
    dyn = _onnx(tmp_path, "dyn", [helper.make_node("Relu", ["x"], ["y"], name="r")],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    dflt = _onnx(tmp_path, "dflt", [helper.make_node("Add", ["x", "b"], ["y"], name="a")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                  helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                 [numpy_helper.from_array(np.ones(3, np.float32), "b")])
    one = np.ones(3, np.float32)
    for model, ex, words in [
            (dyn, {"n": one}, "example_inputs={'n': ...}: no input of that name; inputs: x"),
            (dyn, {"x": np.ones((2, 3), np.float32), "z": one},
             "example_inputs={'z': ...}: no input of that name; inputs: x"),
            (dflt, {"x": one, "b": one}, "example_inputs={'b': ...}: no input of that name; "
             "inputs: x; the model lists it as an input with a default value")]:
        with pytest.raises(lumc.InputError) as e:
            lumc.compile(str(model), budget="10s", device="sim:h200", example_inputs=ex)
        assert str(e.value).startswith(words) and "\n" not in str(e.value), str(e.value)
    for shapes in ({"n": [2, 5]}, {"n": (1, 8)}):     # per-size compiles ignored any name
        with pytest.raises(lumc.InputError, match="example_inputs={'z': ...}: no input"):
            lumc.compile(str(dyn), budget="10s", device="sim:h200", shapes=shapes,
                         example_inputs={"z": one})
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5      # a real name still compiles
    f = lumc.compile(str(dyn), budget="10s", device="sim:h200", example_inputs={"x": x})
    np.testing.assert_array_equal(f(x), np.maximum(x, 0))


class _Nested(__import__("torch").nn.Module):
    """``x * d["a"] - d["b"]``: a dict of tensors as an argument."""
    def forward(self, x, d):
        return x * d["a"] - d["b"]


class _Scaled(__import__("torch").nn.Module):
    """``x * s``: a float argument, which ``torch.export`` traces as a constant."""
    def forward(self, x, s: float):
        return x * s


def test_range_compiles_and_loaded_artifacts_take_the_modules_arguments(tmp_path):
    """A torch module with a dict argument or a float one: its size-range compile failed in its
    own eager check ("input 'd_a' is a dict, not a numeric array"; "takes 1 input (x), got 2"),
    and ``lumc.load`` of its fixed-shape artifact refused the module's own call ``g(x, d)``,
    ``g(x, 2.5)``. Both take the module's arguments now (the flat inputs too), and refuse another
    value of a traced constant."""
    import torch
    from torch.export import Dim
    import lumc
    gen = torch.Generator().manual_seed(0)
    x, a, b = (torch.randn(5, 3, generator=gen) for _ in range(3))
    n = Dim("n", min=1, max=16)
    cases = [(_Nested(), (x, {"a": a, "b": b}), ({0: n}, {"a": {0: n}, "b": {0: n}}),
              (x, a, b)),
             (_Scaled(), (x, 2.5), ({0: n}, None), (x,))]
    for module, args, dyn, flat in cases:
        want = module(*args).double()
        rng = lumc.compile(module, budget="30s", device="sim:h200", example_inputs=args,
                           dynamic_shapes=dyn)
        fixed = lumc.compile(module, budget="30s", device="sim:h200", example_inputs=args)
        fixed.save(tmp_path / "m.lumc")
        rng.save(tmp_path / "r.lumc")
        for f in (rng, lumc.load(tmp_path / "m.lumc"), lumc.load(tmp_path / "r.lumc")):
            for call in (args, flat):
                torch.testing.assert_close(f(*call).double(), want, rtol=1e-6, atol=1e-6)
        short = tuple(t[:2] if isinstance(t, torch.Tensor) else
                      {k: v[:2] for k, v in t.items()} if isinstance(t, dict) else t for t in args)
        for f in (rng, lumc.load(tmp_path / "r.lumc")):      # another size of the range
            torch.testing.assert_close(f(*short).double(), module(*short).double(),
                                       rtol=1e-6, atol=1e-6)
    for f in (rng, lumc.load(tmp_path / "m.lumc")):
        with pytest.raises(lumc.InputError, match=r"'s' was traced as the constant 2\.5; got 3"):
            f(x, 3.0)


# the lumc program (argv[0] is the console script), with a signal at a chosen moment
_PROGRAM = textwrap.dedent("""
    import atexit, os, signal, sys, time
    sys.argv[0] = os.path.join(os.path.dirname(sys.executable), "lumc")
    import lumc.compiler.tools.cli as c
    SIG = getattr(signal, sys.argv[1])

    class Bomb:
        def __del__(self):       # the handler runs in here, where Python swallows what it raises
            os.kill(os.getpid(), SIG)
            for _ in range(10000):
                pass

    @c.cli.command("slow")
    def slow():
        Bomb()
        time.sleep(5)
        print("finished")

    if sys.argv[2] == "at-exit":       # the command is over: a signal while the process exits
        atexit.register(lambda: (os.kill(os.getpid(), SIG), time.sleep(0.3)))
        c.main(["cache", "info"])
    else:
        c.main(["slow"])
""")


@pytest.mark.parametrize("sig,what", [("SIGINT", "interrupted (Ctrl-C)"),
                                      ("SIGTERM", "terminated (SIGTERM)")])
def test_a_signal_at_exit_or_inside_a_garbage_collection_callback(sig, what):
    """After 'wrote X' a compile still takes 0.3 s to exit: a SIGTERM there killed it (status
    -15, no line; Python restores the default handlers as it finalizes), a Ctrl-C said
    'interrupted' (status 2) of a finished compile, and one caught in a garbage-collection
    callback printed an 'Exception ignored' traceback. There the signal was also lost mid-command
    (the command went on to status 0). Now a signal once the command is over is ignored, and one
    swallowed mid-command is delivered again: one line, status 2."""
    res = _python("-c", _PROGRAM, sig, "at-exit")
    assert res.returncode == 0 and res.stderr == "", (res.returncode, res.stderr[-2000:])
    assert "cache" in res.stdout
    res = _python("-c", _PROGRAM, sig, "in-gc")
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.splitlines() == [f"lumc: error: {what}; no output was written half-way"]
    assert "finished" not in res.stdout



def test_a_signal_just_after_the_artifact_is_renamed_into_place_says_it_was_written(
        tmp_path, monkeypatch):
    """SIGTERM at a random moment of ``lumc compile -o out.lumc`` over an older out.lumc: once in
    eight tries out.lumc was the new artifact while the line said "nothing was written" (the signal
    came after the rename, before the compile noted the file)."""
    import numpy as np
    from onnx import TensorProto, helper
    import lumc.compiler.runtime.artifact as artifact_mod
    from hostile import lumc_cli, one_line_error
    model = _onnx(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="r")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    out = tmp_path / "out.lumc"
    out.write_bytes(b"the user's older file")
    real = artifact_mod.os.replace

    def then_interrupted(src, dst):
        real(src, dst)
        if os.fspath(dst) == os.fspath(out):    # not the plan cache's file
            raise KeyboardInterrupt       # the signal's handler, at the next instruction
    monkeypatch.setattr(artifact_mod.os, "replace", then_interrupted)
    res = lumc_cli("compile", model, "--budget", "10s", "-o", out, "--quiet")
    one_line_error(res, "interrupted", f"only {out} was written")
    monkeypatch.undo()
    import lumc
    x = np.array([-1.0, -0.0, 0.5, np.inf], np.float32)
    np.testing.assert_array_equal(lumc.load(out)(x), np.maximum(x, 0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "out.lumc", "relu.onnx"]


@pytest.mark.parametrize("dtype,value,text", [("FLOAT", 1e40, "1e40"),
                                              ("FLOAT16", [1.0, -70000.0], "1,-70000")])
def test_bind_refuses_a_float_its_input_cannot_hold(tmp_path, dtype, value, text):
    """``--bind a=1e40`` on a float32 input printed numpy's two-line RuntimeWarning ('overflow
    encountered in cast', with its source line) and compiled with a = inf."""
    import numpy as np
    from onnx import TensorProto, helper
    import lumc
    from hostile import lumc_cli, one_line_error
    n = len(value) if isinstance(value, list) else None
    t = getattr(TensorProto, dtype)
    model = _onnx(tmp_path, "scale", [helper.make_node("Mul", ["a", "x"], ["y"], name="m")],
                  [helper.make_tensor_value_info("a", t, [n] if n else []),
                   helper.make_tensor_value_info("x", t, [n or 3])],
                  [helper.make_tensor_value_info("y", t, [n or 3])])
    out = tmp_path / "s.lumc"
    res = lumc_cli("compile", model, "--budget", "10s", "--bind", f"a={text}", "-o", out)
    one_line_error(res, "--bind a=", "not a float", "largest finite value")
    assert "overflow" not in res.output and not out.exists()
    with pytest.raises(lumc.InputError, match="largest finite value"):
        lumc.compile(str(model), budget="10s", device="sim:h200", bind={"a": value})
    ok = [2.0, -0.5] if n else float("inf")       # a value the type holds, inf included
    f = lumc.compile(str(model), budget="10s", device="sim:h200", bind={"a": ok})
    np_t = np.float16 if n else np.float32
    x = np.array([1.0, -2.0] if n else [1.0, -2.0, 0.5], np_t)
    np.testing.assert_array_equal(f(x), np.asarray(ok, np_t) * x)


def test_check_judges_an_integer_output_by_float64_where_onnxruntime_is_undefined(tmp_path):
    """A float Cast to int32 of inf and NaN (ONNX leaves it undefined; lumc saturates, and gives 0
    for NaN; onnxruntime on x86 gives INT32_MIN): ``lumc run --check`` failed it (status 1),
    though README says the float64 evaluation judges where the two disagree; it judged float
    outputs only. And that judge printed numpy's 'overflow encountered in cast' warning where
    a float64 value rounds to inf at a float32 output."""
    import warnings
    import numpy as np
    from onnx import TensorProto, helper
    from hostile import lumc_cli
    model = _onnx(tmp_path, "cast", [helper.make_node("Cast", ["x"], ["i"], name="c",
                                                      to=TensorProto.INT32),
                                     helper.make_node("Exp", ["x"], ["e"], name="exp")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                  [helper.make_tensor_value_info("i", TensorProto.INT32, [5]),
                   helper.make_tensor_value_info("e", TensorProto.FLOAT, [5])])
    x = np.array([1.5, -2.5, np.inf, np.nan, 100.0], np.float32)
    np.save(tmp_path / "x.npy", x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = lumc_cli("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--check",
                       "-o", tmp_path / "y.npz")
    assert res.exit_code == 0, res.output
    assert "lumc is closer" in res.output and "Warning" not in res.output
    assert not [w for w in seen if "overflow" in str(w.message)], [str(w.message) for w in seen]
    y = np.load(tmp_path / "y.npz")
    np.testing.assert_array_equal(y["i"], np.array([1, -2, 2**31 - 1, 0, 100], np.int32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(y["e"], np.exp(x.astype(np.float64)).astype(np.float32))


def test_an_output_path_ending_in_a_slash_is_refused(tmp_path):
    """``lumc compile m.onnx -o out/`` wrote the artifact as a file named ``out`` (the slash
    dropped), as did ``f.save("out/")``; a later ``-o out/m.lumc`` then failed ('Not a
    directory'). Every output option and ``save`` refuse it in one line, writing nothing."""
    from onnx import TensorProto, helper
    import lumc
    from hostile import lumc_cli, one_line_error
    model = _onnx(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="r")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    d = f"{tmp_path / 'out'}/"
    for args in (("compile", model, "--budget", "10s", "-o", d),
                 ("compile", model, "--budget", "10s", "--report", d)):
        one_line_error(lumc_cli(*args), "ends in '/', which names a folder")
        assert not (tmp_path / "out").exists()
    f = lumc.compile(str(model), budget="10s", device="sim:h200")
    with pytest.raises(lumc.LumcError, match="ends in '/', which names a folder"):
        f.save(d)
    assert not (tmp_path / "out").exists()
    f.save(tmp_path / "m.lumc")
    for args in (("run", tmp_path / "m.lumc", "--random", "-o", d),
                 ("bench", tmp_path / "m.lumc", "--json", d),
                 ("inspect", tmp_path / "m.lumc", "--plot", d)):
        one_line_error(lumc_cli(*args), "ends in '/', which names a folder")
        assert not (tmp_path / "out").exists()


def test_bench_compare_given_an_artifact_says_so(tmp_path):
    """``lumc bench a.lumc --compare b.lumc`` (the other model's artifact, not its bench JSON)
    said "not a JSON file (UnicodeDecodeError)"."""
    from onnx import TensorProto, helper
    import lumc
    from hostile import lumc_cli, one_line_error
    model = _onnx(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="r")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    lumc.compile(str(model), budget="10s", device="sim:h200").save(tmp_path / "a.lumc")
    res = lumc_cli("bench", tmp_path / "a.lumc", "--compare", tmp_path / "a.lumc")
    one_line_error(res, "is a compiled .lumc artifact, not a bench document",
                   f"lumc bench {tmp_path / 'a.lumc'} --json")
