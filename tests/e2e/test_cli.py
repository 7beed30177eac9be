"""`lumc run` / `lumc models` end to end: summaries, -o contents, --check, and one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from lumc.compiler.tools.cli import cli, compare_output


def lumc(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_one_line_error(res, *words):
    """Exit 2, exactly one stderr line `lumc: error: ...` naming each of `words`, no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("lumc: error: "), lines[0]
    assert "Traceback" not in res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit)
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.fixture
def arrays(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    k = rng.integers(-4, 4, (5, 2)).astype(np.int64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "k.npy", k)
    return x, k


def test_run_prints_outputs_and_writes_npz(tiny_path, tiny_weights, arrays, tmp_path):
    x, k = arrays
    w, b = tiny_weights
    out = tmp_path / "out.npz"
    res = lumc("run", tiny_path, "--input", f"x={tmp_path / 'x.npy'}",
               "--input", f"k={tmp_path / 'k.npy'}", "-o", out)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert any(ln.split()[:4] == ["y", "[5,", "2]", "float32"] for ln in lines), res.stdout
    assert any(ln.split()[:4] == ["k2", "[5,", "2]", "int64"] for ln in lines), res.stdout
    assert any(ln.startswith("time: ") and " s" in ln for ln in lines)
    with np.load(out) as f:
        assert sorted(f.files) == ["k2", "y"]
        np.testing.assert_allclose(f["y"], x @ w + b, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(f["k2"], 2 * k)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


def test_run_random_check_passes(tiny_path):
    res = lumc("run", tiny_path, "--random", "--shape", "n=7", "--check", "--seed", "1")
    assert res.exit_code == 0, res.output
    assert "check: all 2 outputs match onnxruntime" in res.stdout
    assert res.stdout.count(" ok") == 2


def test_check_failure_exits_1(tiny_path, monkeypatch):
    import lumc.compiler.tools.cli as cli_mod
    real = cli_mod._run_onnxruntime

    def off_by_a_little(path, inputs):  # onnxruntime's y, moved by 1e-3 of its max
        ref = real(path, inputs)
        ref["y"] = ref["y"] + np.float32(1e-3) * np.abs(ref["y"]).max()
        return ref
    monkeypatch.setattr(cli_mod, "_run_onnxruntime", off_by_a_little)
    # onnxruntime's unoptimized run (the last judge) off the same way
    monkeypatch.setattr(cli_mod, "_run_onnxruntime_unoptimized", off_by_a_little)
    # onnxruntime off, lumc on the float64 result: lumc passes, and the line says who is closer
    res = lumc("run", tiny_path, "--random", "--shape", "n=3", "--check")
    assert res.exit_code == 0, res.output
    y_line = next(ln for ln in res.stdout.splitlines() if ln.split()[0] == "y")
    assert " ok " in y_line and "max_rel 0.001" in y_line and "lumc is closer" in y_line
    assert "y differ from onnxruntime, and lumc is within tolerance of float64" in res.stdout
    # the float64 judge agreeing with onnxruntime: lumc is the one off, exit 1
    real64 = cli_mod.float64_outputs
    monkeypatch.setattr(cli_mod, "float64_outputs",
                        lambda g, inputs: off_by_a_little(tiny_path, inputs) | {})
    res = lumc("run", tiny_path, "--random", "--shape", "n=3", "--check")
    assert res.exit_code == 1, res.output
    y_line = next(ln for ln in res.stdout.splitlines() if ln.split()[0] == "y")
    assert "FAIL" in y_line and "onnxruntime is closer" in y_line
    assert res.stderr.strip() == "check: FAILED for y (atol 1e-05 + rtol 0.0001 by dtype; ints exact)"
    # a shift of 1e-3 max|y| on every element: inside atol 1e-2, whatever the float64 judge says
    assert lumc("run", tiny_path, "--random", "--shape", "n=3", "--check", "--atol", "1e-2").exit_code == 0
    assert real64 is not None


def test_run_inputs_npz_binds_dynamic_dims(tiny_path, arrays, tmp_path):
    x, k = arrays
    np.savez(tmp_path / "in.npz", x=x, k=k)
    res = lumc("run", tiny_path, "--inputs", tmp_path / "in.npz", "--check", "--rtol", "1e-6")
    assert res.exit_code == 0, res.output
    assert "[5, 2]" in res.stdout


def test_random_generic_rule_is_seeded(tiny_path, tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    assert lumc("run", tiny_path, "--random", "--shape", "x=4x3", "--seed", "5", "-o", a).exit_code == 0
    assert lumc("run", tiny_path, "--random", "--shape", "n=4", "--seed", "5", "-o", b).exit_code == 0
    with np.load(a) as fa, np.load(b) as fb:
        np.testing.assert_array_equal(fa["y"], fb["y"])
        # k is drawn from [0, 8): k2 = 2k lies in [0, 14] and is even
        assert fa["k2"].min() >= 0 and fa["k2"].max() <= 14 and (fa["k2"] % 2 == 0).all()


def test_check_is_atol_plus_rtol_by_dtype():
    """A sigmoid map near 0 (DBNet): 1.1e-7 absolute, 1.9e-3 relative passes; pure rtol would not."""
    ref = np.array([1e-4, 0.5, 0.999], np.float32)
    got = ref + np.array([1.1e-7, 0.0, 0.0], np.float32)
    c = compare_output(got, ref)
    assert c.ok and c.atol == 1e-5 and c.rtol == 1e-4
    assert not compare_output(got, ref, atol=0.0).ok   # the old rule: relative only
    assert not compare_output(ref + np.float32(2e-5), ref).ok   # beyond 1e-5 + 1e-4 * 1e-4
    h = np.array([0.0, 1.0], np.float16)
    assert compare_output(h + np.float16(5e-4), h).ok and compare_output(h, h).atol == 1e-3


def test_compare_output_definition():
    ref = np.array([1.0, -4.0, 2.0], np.float32)
    c = compare_output(np.array([1.0, -4.0004, 2.0], np.float32), ref, rtol=1e-4)
    assert c.max_abs == pytest.approx(4e-4, rel=1e-3)
    assert c.max_rel == pytest.approx(1e-4, rel=1e-3)  # max|a-b| / max|b| = 4e-4 / 4
    nan = np.array([np.nan, np.inf, 0.0], np.float32)
    assert compare_output(nan.copy(), nan, 1e-4).ok
    assert not compare_output(np.array([0.0, np.inf, 0.0], np.float32), nan, 1e-4).ok
    assert compare_output(np.zeros(3, np.float32), np.zeros(3, np.float32), 0.0).max_rel == 0
    assert not compare_output(np.array([1000, 7]), np.array([1000, 8]), 1e-2).ok  # ints: exact
    assert not compare_output(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), 1).ok


# ------------------------------------------------------------------ bad input: one line, exit 2


def test_truncated_file(tiny_path, tmp_path):
    bad = tmp_path / "trunc.onnx"
    bad.write_bytes(tiny_path.read_bytes()[: len(tiny_path.read_bytes()) // 2])
    assert_one_line_error(lumc("run", bad, "--random", "--shape", "n=2"), "trunc.onnx")


def test_random_bytes_file(tmp_path):
    bad = tmp_path / "noise.onnx"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert_one_line_error(lumc("run", bad, "--random"), "noise.onnx")


def test_missing_file(tmp_path):
    assert_one_line_error(lumc("run", tmp_path / "nope.onnx", "--random"), "nope.onnx")


def test_unsupported_op(unsupported_path):
    assert_one_line_error(lumc("run", unsupported_path, "--random"), "Frobnicate")


def test_missing_input(tiny_path, arrays, tmp_path):
    res = lumc("run", tiny_path, "--input", f"x={tmp_path / 'x.npy'}")
    assert_one_line_error(res, "missing input", "'k'")


def test_wrong_shape(tiny_path, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    res = lumc("run", tiny_path, "--input", f"x={tmp_path / 'x.npy'}", "--random")
    assert_one_line_error(res, "'x'", "[2, 5]", "[n, 3]")


def test_wrong_dtype(tiny_path, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float64))
    res = lumc("run", tiny_path, "--input", f"x={tmp_path / 'x.npy'}", "--random")
    assert_one_line_error(res, "'x'", "float64", "float32")


def test_unknown_input_name(tiny_path, arrays, tmp_path):
    res = lumc("run", tiny_path, "--input", f"z={tmp_path / 'x.npy'}", "--random", "--shape", "n=5")
    assert_one_line_error(res, "unknown input", "'z'")


def test_dynamic_dim_unset(tiny_path):
    assert_one_line_error(lumc("run", tiny_path, "--random"), "'x'", "[n, 3]", "n")


@pytest.mark.parametrize("spec", ["x=2by3", "x", "=4", "x=2x", "n=-1"])
def test_bad_shape_syntax(tiny_path, spec):
    assert_one_line_error(lumc("run", tiny_path, "--random", "--shape", spec), "--shape")


def test_shape_disagrees_with_array(tiny_path, arrays, tmp_path):
    res = lumc("run", tiny_path, "--input", f"x={tmp_path / 'x.npy'}", "--random", "--shape", "n=4")
    assert_one_line_error(res, "n is 4", "5")


def test_models_list_names_all_four():
    res = lumc("models", "list")
    assert res.exit_code == 0
    for name in ("silero-vad", "magika", "ppocr-det", "minilm-l3"):
        assert name in res.stdout


def test_models_fetch_unknown_name():
    assert_one_line_error(lumc("models", "fetch", "resnet"), "resnet", "minilm-l3")


def test_console_script_error_has_no_traceback(tmp_path):
    bad = tmp_path / "empty.onnx"
    bad.write_bytes(b"")
    exe = os.path.join(os.path.dirname(sys.executable), "lumc")
    proc = subprocess.run([exe, "run", str(bad), "--random"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("lumc: error: ") and "Traceback" not in proc.stderr


@pytest.mark.models
def test_demo_minilm_check(model_path, record_time):
    path = model_path("minilm-l3")
    exe = os.path.join(os.path.dirname(sys.executable), "lumc")
    proc = subprocess.run([exe, "run", str(path), "--random", "--shape", "batch_size=2",
                           "--shape", "sequence_length=16", "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(minilm-l3)" in proc.stdout and "check: all 4 outputs match onnxruntime" in proc.stdout
    run_line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("time: "))
    record_time("lumc run minilm-l3 2x16", float(run_line.split("run ")[1].split(" s")[0]))


def test_check_passes_a_running_sum_neither_runtime_resolves_where_it_crosses_zero():
    """A float CumSum over 40000 N(0, 1) values: where the running sum crosses 0 no f32
    arithmetic is within atol + rtol * |ref| of float64 (its terms are ~200 in size). lumc's
    blocked scan, closer to float64 than a sequential one, failed --check; it passes now, and a
    wrong element or a worse run still fails."""
    from lumc.compiler.tools.output_check import judge_by_float64
    v = np.random.default_rng(3).standard_normal((1, 40000)).astype(np.float32)
    f64 = np.cumsum(v.astype(np.float64), axis=1)
    ort = np.cumsum(v, axis=1, dtype=np.float32)          # sequential, as onnxruntime's
    blocks = np.cumsum(v.reshape(1, -1, 1000), axis=2, dtype=np.float32)   # a blocked scan
    carry = np.concatenate([np.zeros((1, 1), np.float32),
                            np.cumsum(blocks[:, :, -1], axis=1, dtype=np.float32)[:, :-1]], 1)
    got = (blocks + carry[:, :, None]).reshape(1, -1)
    assert np.abs(got - f64).max() < np.abs(ort - f64).max()
    assert not compare_output(got, f64.astype(np.float32)).ok      # the per-element rule fails
    terms = np.cumsum(np.abs(v.astype(np.float64)), axis=1)   # each element's terms' magnitude
    c = judge_by_float64(got, ort, f64, None, None, terms)
    assert c.ok and "lumc is closer" in c.note and "cancelling near 0" in c.note, c
    assert not judge_by_float64(got, ort, f64, None, None).ok    # no terms: no leniency
    bad = got.copy()
    bad[0, 20000] += np.float32(0.05 * np.abs(f64).max())        # one element 5% off
    assert not judge_by_float64(bad, ort, f64, None, None, terms).ok
    worse = ort + (ort - f64).astype(np.float32)                 # farther from float64 than ort
    assert not judge_by_float64(worse, ort, f64, None, None, terms).ok


def test_check_does_not_lend_a_large_running_sum_its_scale_to_small_rows():
    """An output with a long running sum crossing 0 (neither runtime within tolerance of float64)
    beside a row of small values where lumc is off by half: the row's error is below rtol of the
    output's largest magnitude and below onnxruntime's error in the long row, but far past its
    own terms' magnitude (the sum of its |terms|), so --check fails; it passed, hiding it.
    Through ``lumc run``: a CumSum model whose second row is 1e-5 of the first."""
    from lumc.compiler.tools.output_check import float64_terms, judge_by_float64
    from lumc.compiler.frontends.onnx_frontend import import_onnx
    from tests.compiler.test_cumsum_scan import cumsum_model
    v = np.random.default_rng(4).standard_normal((1, 40000)).astype(np.float32)
    x = np.concatenate([v, v * np.float32(1e-5)])
    f64 = np.cumsum(x.astype(np.float64), axis=1)
    ort = np.cumsum(x, axis=1, dtype=np.float32)
    blocks = np.cumsum(x.reshape(2, -1, 1000), axis=2, dtype=np.float32)   # a blocked scan
    carry = np.concatenate([np.zeros((2, 1), np.float32),
                            np.cumsum(blocks[:, :, -1], axis=1, dtype=np.float32)[:, :-1]], 1)
    got = (blocks + carry[:, :, None]).reshape(2, -1)
    graph = import_onnx(cumsum_model(x.shape, np.float32), {"x": x.shape}).graph
    terms = float64_terms(graph, {"x": x})["y0"]             # the inclusive forward CumSum
    np.testing.assert_allclose(terms, np.cumsum(np.abs(x.astype(np.float64)), axis=1),
                               rtol=1e-6)
    assert judge_by_float64(got, ort, f64, None, None, terms).ok      # the honest blocked scan
    wrong = got.copy()
    wrong[1] *= np.float32(0.5)                     # the small row off by half
    assert np.abs(wrong - f64).max() <= np.abs(ort - f64).max()
    assert np.abs(wrong - f64).max() <= 1e-4 * np.abs(f64).max()
    assert not judge_by_float64(wrong, ort, f64, None, None, terms).ok
    from lumc.compiler.tools.output_check import print_outputs      # as lumc run --check asks
    for y, ok in ((got, True), (wrong, False)):
        checks = print_outputs({"y0": y}, {"y0": ort}, None, None, lambda: {"y0": f64},
                               terms=lambda: float64_terms(graph, {"x": x}))
        assert checks["y0"].ok is ok, checks


def test_check_terms_of_an_index_computed_from_a_float_sum_are_no_error():
    """The terms run (every sum over |terms|) of an index computed from a float sum can fall
    outside its table (sum(1, -1) = 0 selects row 0; sum(|1|, |-1|) = 2 is out of [0, 2)):
    ``float64_terms`` then judges no output by its terms, and --check raises nothing."""
    from lumc.compiler.tools.output_check import float64_terms
    from lumc.ir import dtypes as dt
    from lumc.ir.graph import Graph, const_node, input_node
    from lumc.ir.tensor import Tensor
    x = Tensor(input_node("x", (2,), dt.f32))
    table = Tensor(const_node(np.array([5.0, 7.0], np.float32)))
    idx = x.sum(0, keepdims=True).cast(dt.i64)
    y = table._op("Gather", idx, arg=0)
    g = Graph({"x": x.node}, {"y": y.node})
    assert float64_terms(g, {"x": np.array([1.0, -1.0], np.float32)}) == {}
    np.testing.assert_array_equal(
        float64_terms(g, {"x": np.array([0.25, -0.25], np.float32)})["y"], [5.0])
