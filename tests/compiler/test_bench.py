"""lumc bench / lumc inspect on a small ONNX model compiled for sim:h200: bench JSON, baseline
comparison (self, scaled, another model, another device, missing/new kernels, noise), rivals,
the torch replay of primitive graphs, and the roofline PNG."""
import hashlib
import json
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import lumc
import lumc.compiler.tools.cli_bench  # noqa: F401  (registers bench and inspect)
from lumc import __version__
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.simulator import simulate_kernel_time
from lumc.backends.devices import get_device
from lumc.compiler.runtime.artifact import artifact_hash, load_artifact
from lumc.compiler.tools.bench import BenchError, bench_target
from lumc.compiler.tools.cli import cli
from lumc.compiler.tools.compare import (BaselineMismatchError, compare_docs, match_kernels,
                                   parse_threshold, scale_times)
from lumc.compiler.runtime.graph_torch import graph_module
from lumc.compiler.frontends.onnx_frontend import import_onnx
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir.errors import LumcError


def mlp_model(m=8, k=24, n=40, seed=0):
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((n,)).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One compiled artifact, its bench JSON, and a cache dir of its own for the CLI."""
    root = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    mp.setenv("LUMC_CACHE_DIR", str(root / "cache"))
    onnx.save(mlp_model(), root / "m.onnx")
    cm = lumc.compile(str(root / "m.onnx"), budget="20s", device="sim:h200",
                      db=TuningDatabase(root / "cache" / "tuning.sqlite"))
    cm.save(root / "m.lumc")
    res = run("bench", str(root / "m.lumc"), "--json", str(root / "b.json"))
    assert res.exit_code == 0, res.output
    yield {"root": root, "cm": cm, "art": root / "m.lumc", "b": root / "b.json",
           "doc": json.loads((root / "b.json").read_text()), "bench_out": res.output}
    mp.undo()


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_bench_json_records_device_versions_hashes_and_simulated_times(env):
    doc, cm = env["doc"], lumc.load(env["art"])
    assert doc["format"] == "lumc-bench/1"
    assert doc["device"] == "sim:h200" and doc["simulated"] is True
    assert set(doc["versions"]) >= {"lumc", "triton", "torch", "driver"}
    manifest, parts = load_artifact(env["art"], __version__)
    assert doc["artifact_hash"] == artifact_hash(manifest)
    assert doc["model"]["sha256"] == hashlib.sha256(parts["source.onnx"]).hexdigest()
    assert doc["model"]["inputs"] == {"x": [[8, 24], "f32"]}
    assert (doc["precision"], doc["weights"]) == ("fp32", "same")
    spec = get_device("h200")
    assert len(doc["kernels"]) == len(cm.program.calls) >= 1
    report_hashes = [k["kernel"] for k in cm.report_dict()["per_kernel"]]
    for row, call, cfg, h in zip(doc["kernels"], cm.program.calls, cm.configs, report_hashes):
        assert row["kernel"] == h and row["form"] == call.kernel.form
        assert row["time_s"] == pytest.approx(simulate_kernel_time(call.kernel, cfg or {}, spec))
        assert row["time_s"] >= row["bound_s"] > 0 and row["spread"] == 0.0
        assert row["bytes"] == call.kernel.min_bytes() and row["flops"] == call.kernel.flops()
    e = doc["end_to_end"]
    assert e["time_s"] == pytest.approx(sum(k["time_s"] for k in doc["kernels"]))
    assert e["time_s"] == pytest.approx(cm.report_dict()["best_time_s"])
    assert e["kernel_count"] == len(cm.program.calls)
    assert e["bytes_moved"] == sum(c.kernel.min_bytes() for c in cm.program.calls)
    assert e["ideal_bytes"] == cm.report_dict()["ideal_bytes"]
    assert doc["wall"]["where"].startswith("cpu") and doc["wall"]["samples"] == 5
    assert doc["wall"]["min_s"] <= doc["wall"]["time_s"] <= doc["wall"]["max_s"]
    assert "simulated" in env["bench_out"] and "CPU executor" in env["bench_out"]


def test_compare_against_itself_exits_0(env):
    res = run("bench", str(env["art"]), "--compare", str(env["b"]))
    assert res.exit_code == 0, res.output
    assert "compare: ok" in res.output and "REGRESSION" not in res.output


def test_compare_against_halved_times_exits_1_with_table(env):
    half = env["root"] / "half.json"
    half.write_text(json.dumps(scale_times(env["doc"], 0.5)))
    res = run("bench", str(env["art"]), "--compare", str(half), "--max-regression", "5%")
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("kernel "))
    assert lines[head].split() == ["kernel", "baseline", "now", "ratio", "status"]
    rows = lines[head + 1:head + 1 + len(env["doc"]["kernels"]) + 3]
    assert all("2.00x" in r and "REGRESSION" in r for r in rows[:-2])   # kernels and end to end
    assert "1.00x" in rows[-2] and "1.00x" in rows[-1]                   # bytes, kernel count
    assert "re-measured" in res.output
    # a threshold above the slowdown passes
    assert run("bench", str(env["art"]), "--compare", str(half), "--max-regression", "150%").exit_code == 0


def test_baseline_of_another_model_is_refused(env):
    onnx.save(mlp_model(8, 24, 48, seed=1), env["root"] / "other.onnx")
    res = run("bench", str(env["root"] / "other.onnx"), "--budget", "3s", "--quiet",
              "--compare", str(env["b"]))
    assert res.exit_code == 2
    msg = res.output.strip().splitlines()[-1]
    assert msg.startswith("lumc: error:") and "another model" in msg


def test_baseline_from_another_device_is_refused(env):
    res = run("bench", str(env["art"]), "--device", "sim:h100", "--compare", str(env["b"]))
    assert res.exit_code == 2
    assert "measured on sim:h200, this run is on sim:h100" in res.output


def test_other_shapes_and_foreign_files_are_refused(env):
    doc = json.loads(json.dumps(env["doc"]))
    doc["model"]["inputs"] = {"x": [[16, 24], "f32"]}
    with pytest.raises(BaselineMismatchError, match="inputs x=16x24"):
        compare_docs(doc, env["doc"], 0.05)
    junk = env["root"] / "junk.json"
    junk.write_text('{"hello": 1}')
    res = run("bench", str(env["art"]), "--compare", str(junk))
    assert res.exit_code == 2 and "not a lumc bench document" in res.output


def test_missing_and_new_kernels_are_reported_not_crashed_on(env):
    doc = json.loads(json.dumps(env["doc"]))
    gone = doc["kernels"][-1]
    doc["kernels"][-1] = dict(gone, kernel="f" * 32, form="attention")     # changed code, other form
    doc["kernels"].append(dict(gone, index=len(doc["kernels"]), kernel="e" * 32))
    path = env["root"] / "mod.json"
    path.write_text(json.dumps(doc))
    res = run("bench", str(env["art"]), "--compare", str(path))
    assert res.exit_code == 0, res.output
    assert res.output.count("missing") >= 2 and " new " in res.output
    assert "only in the baseline" in res.output


def _measured(times, e2e):
    ks = [{"index": i, "form": "pointwise", "kernel": f"{i:032x}", "time_s": t} for i, t in enumerate(times)]
    return {"format": "lumc-bench/1", "device": "cuda:0 NVIDIA H200", "simulated": False,
            "precision": "fp32", "weights": "same",
            "model": {"name": "m", "sha256": "ab", "inputs": {}}, "kernels": ks,
            "end_to_end": {"time_s": e2e, "bytes_moved": 100, "kernel_count": len(ks)}}


def test_suspected_regressions_are_remeasured_before_failing():
    base = _measured([10e-6, 20e-6], 30e-6)
    now = _measured([12e-6, 20.1e-6], 32.1e-6)
    now["device"] = "cuda:1 NVIDIA H200"            # another slot of the same GPU model compares
    calls = []

    def noisy_then_fine(idx, model):
        calls.append((idx, model))
        return {"kernels": {0: 10.2e-6}, "model": 30.5e-6}
    c = compare_docs(base, now, 0.05, noisy_then_fine)
    assert calls == [([0], True)] and c.ok
    assert [r.status for r in c.rows[:3]] == ["noise", "ok", "noise"]

    def still_slow(idx, model):
        return {"kernels": {0: 11.9e-6}, "model": 31.9e-6}
    c = compare_docs(base, now, 0.05, still_slow)
    assert not c.ok and [r.label for r in c.regressions] == [c.rows[0].label, "end to end"]
    assert c.rows[0].now == pytest.approx(11.9e-6)
    # under the noise floor a measured kernel never fails: 0.3 us slower at 1 us is jitter
    tiny = compare_docs(_measured([1e-6], 1e-6), _measured([1.3e-6], 1e-6), 0.05)
    assert tiny.ok


def test_a_baseline_at_another_precision_fails_unless_accepted(env):
    """An fp32 artifact against a bf16 baseline (or one written before bench documents recorded
    precision) is not a like-for-like comparison: exit 1 with the reason, whatever the ratios;
    --allow-precision-change compares anyway, still printing the line."""
    doc = json.loads(json.dumps(env["doc"]))
    doc["precision"] = "bf16"
    other = env["root"] / "bf16-base.json"
    other.write_text(json.dumps(scale_times(doc, 2.0)))     # the baseline reads slower: "improved"
    res = run("bench", str(env["art"]), "--compare", str(other), "--json", str(env["root"] / "o.json"))
    assert res.exit_code == 1, res.output
    assert ("precision differs: baseline bf16 (weights same), this fp32 (weights same): times are "
            "not like for like") in res.output
    assert "compare: FAILED" in res.output and "compare: ok" not in res.output
    assert "--allow-precision-change" in res.output
    written = json.loads((env["root"] / "o.json").read_text())
    assert written["comparison"]["ok"] is False
    assert written["comparison"]["precision_change"].startswith("precision differs")
    res = run("bench", str(env["art"]), "--compare", str(other), "--allow-precision-change")
    assert res.exit_code == 0, res.output
    assert "precision differs" in res.output and "accepted" in res.output
    assert "compare: FAILED" not in res.output
    _one_line(run("bench", str(env["art"]), "--allow-precision-change"), "--compare")
    # a baseline that predates the fields: unknown, and refused the same way
    del doc["precision"], doc["weights"]
    other.write_text(json.dumps(doc))
    res = run("bench", str(env["art"]), "--compare", str(other))
    assert res.exit_code == 1, res.output
    assert "precision unknown: baseline unknown (weights unknown), this fp32 (weights same)" in res.output
    # weights alone
    c = compare_docs(dict(_measured([1e-6], 1e-6), weights="int8"), _measured([1e-6], 1e-6), 0.05)
    assert not c.ok and not c.regressions
    assert c.precision_change.startswith("weights differ: baseline fp32 (weights int8), this fp32 "
                                         "(weights same)")


def test_match_kernels_pairs_repeats_by_hash_then_position():
    def k(i, h, form="matmul"):
        return {"index": i, "kernel": h, "form": form}
    base = [k(0, "a"), k(1, "b"), k(2, "a"), k(3, "c", "row")]
    now = [k(0, "a"), k(1, "a"), k(2, "b"), k(3, "d", "row"), k(4, "z")]
    pairs = [(b and b["index"], n and n["index"], how) for b, n, how in match_kernels(base, now)]
    assert pairs == [(0, 0, "hash"), (2, 1, "hash"), (1, 2, "hash"), (3, 3, "position"),
                     (None, 4, "new")]


def test_parse_threshold():
    assert parse_threshold("5%") == pytest.approx(0.05)
    assert parse_threshold("0.1") == pytest.approx(0.1)
    assert parse_threshold("150%") == pytest.approx(1.5)
    for bad in ("5", "banana", "-2%"):
        with pytest.raises(LumcError):
            parse_threshold(bad)


def test_gpu_artifact_without_gpu_is_one_line_error(env):
    import torch
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    cm = lumc.load(env["art"])
    cm.simulated, cm.device = False, "cuda:0 NVIDIA H200"
    with pytest.raises(BenchError, match="no CUDA GPU.*--device sim:h200"):
        bench_target(cm, None)


def test_vs_onnxruntime_prints_a_ratio_table_on_cpu(env):
    res = run("bench", str(env["art"]), "--vs", "onnxruntime", "--repeats", "3", "--threads", "1")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    lumc_row = next(ln for ln in lines if ln.startswith("lumc (CPU executor)"))
    ort_row = next(ln for ln in lines if ln.startswith("onnxruntime (CPUExecutionProvider)"))
    assert "1.00x" in lumc_row
    ratio = float(ort_row.split()[3].rstrip("x"))
    err = float(ort_row.split()[7])
    assert ratio > 0 and err < 1e-5
    assert "side by side on the CPU" in res.output
    assert run("bench", str(env["art"]), "--vs", "tensorflow").exit_code == 2


def test_inspect_writes_a_real_png(env):
    png = env["root"] / "r.png"
    res = run("inspect", str(env["art"]), "--plot", str(png))
    assert res.exit_code == 0, res.output
    assert "matmul" in res.output and "simulated" in res.output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image as mpimg
    img = mpimg.imread(str(png))
    assert img.shape[0] >= 600 and img.shape[1] >= 1200
    assert img[..., :3].std() > 0.05                    # not a blank canvas
    assert run("inspect", str(env["root"] / "m.onnx")).exit_code == 2


# ---- the torch replay of primitive graphs (the eager / inductor rivals' program) ------------------

def movement_model():
    """Pad, strided and reversed slices, gather, casts, max/sum reductions, where, division."""
    idx = numpy_helper.from_array(np.array([3, 0, 2, 2], np.int64), "idx")
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
        helper.make_node("Slice", ["p", "st", "en", "ax", "sp"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["g"], axis=0),
        helper.make_node("ReduceMax", ["g"], ["mx"], axes=[1], keepdims=1),
        helper.make_node("Sub", ["g", "mx"], ["d"]),
        helper.make_node("Exp", ["d"], ["e"]),
        helper.make_node("ReduceSum", ["e", "one"], ["sm"], keepdims=1),
        helper.make_node("Div", ["e", "sm"], ["y"]),
        helper.make_node("Cast", ["y"], ["yi"], to=TensorProto.INT32),
        helper.make_node("Greater", ["y", "half"], ["gt"]),
        helper.make_node("Where", ["gt", "y", "d"], ["w"]),
    ]
    inits = [numpy_helper.from_array(np.array([1, 2, 0, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array([6, 0], np.int64), "st"),
             numpy_helper.from_array(np.array([-100, 9], np.int64), "en"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "ax"),
             numpy_helper.from_array(np.array([-1, 2], np.int64), "sp"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array(0.3, np.float32), "half"), idx]
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in
            (("w", TensorProto.FLOAT), ("yi", TensorProto.INT32))]
    g = helper.make_graph(nodes, "mv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 7])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("model", [mlp_model(5, 13, 7), movement_model()], ids=["mlp", "movement"])
def test_graph_module_matches_the_reference_executor(model):
    import torch
    graph = import_onnx(model, {}).graph
    x = np.random.default_rng(3).standard_normal((graph.inputs["x"].shape)).astype(np.float32)
    ref = ReferenceExecutor(graph)({"x": x})
    with torch.no_grad():
        got = graph_module(graph)(torch.from_numpy(x))
    for (name, r), g in zip(ref.items(), got):
        assert g.shape == r.shape and g.numpy().dtype == r.dtype, name
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-6, atol=1e-6)


def int_division_model(n=64):
    """``a fmod b``, ``a mod b`` (Python's) and ``a / b`` (truncating) of int32 ``[n]`` inputs: a
    divisor that is a graph input, so random inputs hold zeros."""
    i32 = TensorProto.INT32
    nodes = [helper.make_node("Mod", ["a", "b"], ["f"], fmod=1),
             helper.make_node("Mod", ["a", "b"], ["m"], fmod=0),
             helper.make_node("Div", ["a", "b"], ["q"])]
    g = helper.make_graph(nodes, "intdiv", [helper.make_tensor_value_info(k, i32, [n]) for k in "ab"],
                          [helper.make_tensor_value_info(k, i32, [n]) for k in "fmq"])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_graph_module_integer_division_and_modulo_by_zero(capfd):
    """The torch replay of integer ``Mod`` and ``Div`` with zero divisors gives the reference
    executor's values (ONNX Mod: 0, numpy's and the ONNX reference's; Div: the dtype's max / min,
    0 for 0 / 0); it raised torch's bare ``RuntimeError: ZeroDivisionError``, after ``torch.fx``
    printed the generated code on stderr. A ``Mod`` primitive given a divisor of 0 (torch's
    ``fmod``/``remainder``) is refused with the reference executor's one-line error, nothing on
    stderr."""
    import torch

    from lumc.ir import dtypes as dt
    from lumc.ir.errors import DivisionByZeroError
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.tensor import Tensor
    graph = import_onnx(int_division_model(8), {}).graph
    a = np.array([7, -7, 7, -7, 0, 5, -5, 0], np.int32)
    b = np.array([3, 3, -3, 0, 0, 0, 0, 2], np.int32)
    ref = ReferenceExecutor(graph)({"a": a, "b": b})
    nz = b != 0
    safe = np.where(nz, b, 1)
    big, small = np.iinfo(np.int32).max, np.iinfo(np.int32).min
    want = {"f": np.where(nz, np.fmod(a, safe), 0), "m": np.where(nz, np.mod(a, safe), 0),
            "q": np.where(nz, np.trunc(a / safe), np.sign(a) * big + (a < 0) * (small + big))}
    for k, v in want.items():
        np.testing.assert_array_equal(ref[k], v.astype(np.int32), err_msg=k)
    got = graph_module(graph)(torch.from_numpy(a), torch.from_numpy(b))
    for (k, r), g in zip(ref.items(), got):
        np.testing.assert_array_equal(g.numpy(), r, err_msg=k)
    capfd.readouterr()
    x, y = input_node("a", (8,), dt.i32), input_node("b", (8,), dt.i32)
    raw = Graph({"a": x, "b": y}, {"r": Tensor(x).fmod(Tensor(y), zero_divisors=False).node})
    mod = graph_module(raw)
    np.testing.assert_array_equal(mod(torch.from_numpy(a), torch.from_numpy(safe))[0].numpy(),
                                  np.fmod(a, safe))
    for run_it in (lambda: mod(torch.from_numpy(a), torch.from_numpy(b)),
                   lambda: ReferenceExecutor(raw)({"a": a, "b": b})):
        with pytest.raises(DivisionByZeroError,
                           match=r"^op Mod: integer modulo by zero \(int32 divisor 0\)$"):
            run_it()
    assert capfd.readouterr().err == ""


def test_vs_eager_with_integer_zero_divisors(tmp_path, monkeypatch):
    """``lumc bench ART --vs eager`` of integer Mod and Div whose random divisors hold zeros: the
    eager rival (the torch replay) agrees with lumc; it ended in a traceback."""
    from lumc.compiler.tools.bench import bench_inputs
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    onnx.save(int_division_model(), tmp_path / "intdiv.onnx")
    cm = lumc.compile(str(tmp_path / "intdiv.onnx"), budget="20s", device="sim:h200",
                      db=TuningDatabase(tmp_path / "db.sqlite"))
    cm.save(tmp_path / "intdiv.lumc")
    assert (bench_inputs(lumc.load(tmp_path / "intdiv.lumc"))["b"] == 0).any()
    res = run("bench", str(tmp_path / "intdiv.lumc"), "--vs", "eager", "--repeats", "1",
              "--threads", "1")
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    row = next(ln for ln in res.output.splitlines() if ln.startswith("torch eager"))
    assert float(row.split()[7]) == 0.0                 # max rel error against lumc


@pytest.mark.slow
def test_vs_eager_and_inductor_report_inductor_kernels(env):
    res = run("bench", str(env["art"]), "--vs", "eager,inductor", "--repeats", "3", "--threads", "1")
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.output.splitlines() if ln.startswith("torch.compile (default)"))
    parts = row.split()
    assert int(parts[4]) >= 1 and float(parts[5]) > 0       # Inductor kernels and MB accessed
    assert float(parts[7]) < 1e-5


def test_program_values_feed_every_kernel_and_match_the_outputs(env):
    from lumc.compiler.tools.bench import bench_inputs, program_values
    cm = lumc.load(env["art"])
    x = bench_inputs(cm)
    vals = program_values(cm, x)
    for c in cm.program.calls:
        assert all(id(n) in vals for n in (*c.inputs, *c.outputs))
    out = cm.run(x)
    last = cm.program.calls[-1].outputs[0]
    np.testing.assert_array_equal(vals[id(last)].reshape(out["y"].shape), out["y"])


def test_a_changed_config_is_named_in_the_row():
    base = _measured([10e-6], 10e-6)
    now = _measured([10e-6], 10e-6)
    base["kernels"][0]["config"] = {"BLOCK": 128, "num_warps": 4}
    now["kernels"][0]["config"] = {"BLOCK": 256, "num_warps": 4}
    row = compare_docs(base, now, 0.05).rows[0]
    assert row.status == "ok" and row.note == "config changed: BLOCK 128->256"


def _one_line(res, *words):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lumc: error: "), res.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def _set(path, value):
    def f(doc):
        *head, last = path
        for k in head:
            doc = doc[k]
        if value is _DROP:
            del doc[last]
        else:
            doc[last] = value
    return f


_DROP = object()


@pytest.mark.parametrize("doctor,words", [
    (_set(["device"], None), ["'device' is null"]),
    (_set(["precision"], 16), ["'precision' is 16"]),
    (_set(["end_to_end"], {}), ["'end_to_end' lacks 'time_s'"]),
    (_set(["kernels"], [1, 2]), ["kernel row 0 is 1"]),
    (_set(["model"], "x.onnx"), ["'model' is \"x.onnx\""]),
    (_set(["kernels", 0, "time_s"], _DROP), ["#0 lacks 'time_s'"]),
    (_set(["kernels", 0, "kernel"], _DROP), ["#0 lacks 'kernel'"]),
    (_set(["kernels", 0, "time_s"], "fast"), ["time_s \"fast\""]),
    (_set(["kernels", 0, "time_s"], float("nan")), ["time_s NaN"]),
    (_set(["kernels", 0, "time_s"], -1), ["time_s -1"]),
    (_set(["kernels", 0, "time_s"], True), ["time_s true"]),
    (_set(["end_to_end", "time_s"], float("inf")), ["end_to_end time_s is Infinity"]),
    (lambda d: d["kernels"].append(dict(d["kernels"][0])), ["kernel row #0 appears twice"]),
], ids=["device-null", "precision-int", "e2e-empty", "kernels-ints", "model-str", "no-time", "no-kernel",
        "time-str", "time-nan", "time-negative", "time-bool", "e2e-inf", "duplicate-row"])
def test_malformed_baselines_are_refused_in_one_line(env, doctor, words):
    doc = json.loads(json.dumps(env["doc"]))
    doctor(doc)
    bad = env["root"] / "doctored.json"
    bad.write_text(json.dumps(doc))                 # json writes NaN/Infinity as Python does
    res = run("bench", str(env["art"]), "--compare", str(bad))
    _one_line(res, "baseline", "doctored.json is malformed", *words)


def test_a_baseline_that_is_no_regular_file_is_called_so(env, tmp_path):
    """A FIFO or device given to --compare was called 'no such file' (click refuses a folder)."""
    fifo = tmp_path / "b.fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/null"):
        _one_line(run("bench", str(env["art"]), "--compare", str(path)), f"baseline {path}: "
                  "not a regular file")
    _one_line(run("bench", str(env["art"]), "--compare", str(tmp_path / "none.json")),
              "none.json: no such file")


def test_bench_outputs_are_checked_before_measuring(env, tmp_path):
    art = str(env["art"])
    _one_line(run("bench", art, "--json", "/proc/b.json"), "/proc/b.json", "cannot")
    _one_line(run("bench", art, "--plot", "/proc/b.png"), "/proc/b.png", "cannot")
    _one_line(run("bench", art, "--json", art), "is the target")
    _one_line(run("bench", art, "--compare", str(env["b"]), "--json", str(env["b"])),
              "is the baseline")
    _one_line(run("bench", art, "--json", str(tmp_path / "x"), "--plot", str(tmp_path / "x")),
              "same file")
    _one_line(run("inspect", art, "--plot", "/proc/i.png"), "/proc/i.png")
    assert json.loads(env["b"].read_text()) == env["doc"]


def test_plots_go_into_new_folders_atomically(env, tmp_path):
    out = tmp_path / "missing3" / "b.png"
    res = run("inspect", str(env["art"]), "--plot", str(out))
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["b.png"]


def test_vs_eager_without_onnx2torch_says_it_ran_lumcs_graph(env, tmp_path, monkeypatch):
    """Without onnx2torch the torch rivals replay lumc's own lowered graph, which is not the real
    rival: the row says so and why, the legend says its ratio is not against the real rival, and
    the legend's MB moved describes the number shown (each kernel's inputs once, outputs once)."""
    monkeypatch.setitem(__import__("sys").modules, "onnx2torch", None)   # import fails
    out = tmp_path / "v.json"
    res = run("bench", str(env["art"]), "--vs", "eager", "--repeats", "1", "--threads", "1",
              "--json", str(out))
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.output.splitlines() if ln.startswith("torch eager"))
    assert "ran lumc's lowered graph, not the model's own PyTorch ops: onnx2torch is not " \
           "installed" in row, row
    assert "torch eager: torch ran lumc's lowered primitive graph, not the model's own PyTorch " \
           "ops" in res.output and "not against the real rival" in res.output
    assert "minimum bytes" not in res.output
    assert "each kernel's inputs read once and outputs written once" in res.output
    doc = json.loads(out.read_text())
    assert [r["program"] for r in doc["rivals"]] == [None, "lumc's primitive graph"]
    lumc_row = next(ln for ln in res.output.splitlines() if ln.startswith("lumc (CPU executor)"))
    assert float(lumc_row.split()[6]) == pytest.approx(
        sum(k["bytes"] for k in doc["kernels"]) / 1e6, abs=1e-3)
