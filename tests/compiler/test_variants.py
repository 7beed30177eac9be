"""One artifact, several plans: explicit sizes (``--shape dim=A,B,C``) and an ``If`` on a runtime
value whose branches are not one graph, selected per call by input shapes and the condition."""
from __future__ import annotations

import json
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import lumc
from lumc.compiler.runtime.compiled import load
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.compiler.runtime.variants import VariantModel
from lumc.compiler.tools.cli import cli
from lumc.ir.errors import ArtifactError, InputError


def rate_switch(frames: int = 4) -> onnx.ModelProto:
    """x [1, n] samples: at 16 kHz (``sr == 16000``) ``frames`` frames of 128 samples summed per
    frame and scaled by 2, else ``frames`` frames of 64 summed and scaled by -1. The 16 kHz branch
    imports only at n = 128 * frames, the other only at n = 64 * frames."""
    def branch(frame, scale, name):
        shape = nh.from_array(np.array([frames, frame], np.int64), f"s{frame}")
        k = nh.from_array(np.array(scale, np.float32), f"k{frame}")
        return oh.make_graph([oh.make_node("Reshape", ["x", f"s{frame}"], [f"r{frame}"]),
                              oh.make_node("ReduceSum", [f"r{frame}", f"ax{frame}"], [f"o{frame}"],
                                           keepdims=0),
                              oh.make_node("Mul", [f"o{frame}", f"k{frame}"], [f"p{frame}"])],
                             name, [], [oh.make_tensor_value_info(f"p{frame}", TP.FLOAT, None)],
                             [shape, k, nh.from_array(np.array([1], np.int64), f"ax{frame}")])
    nodes = [oh.make_node("Equal", ["sr", "k16"], ["is16"]),
             oh.make_node("If", ["is16"], ["y"], then_branch=branch(128, 2.0, "at16k"),
                          else_branch=branch(64, -1.0, "at8k"))]
    g = oh.make_graph(nodes, "vad", [oh.make_tensor_value_info("x", TP.FLOAT, [1, "n"]),
                                     oh.make_tensor_value_info("sr", TP.INT64, [])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                      [nh.from_array(np.array(16000, np.int64), "k16")])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def mlp(k: int = 96, h: int = 64) -> onnx.ModelProto:
    """x [batch, k] -> tanh(x @ w1) @ w2, batch dynamic."""
    rng = np.random.default_rng(0)
    w1 = nh.from_array((rng.standard_normal((k, h)) / np.sqrt(k)).astype(np.float32), "w1")
    w2 = nh.from_array((rng.standard_normal((h, 8)) / np.sqrt(h)).astype(np.float32), "w2")
    nodes = [oh.make_node("MatMul", ["x", "w1"], ["a"]), oh.make_node("Tanh", ["a"], ["t"]),
             oh.make_node("MatMul", ["t", "w2"], ["y"])]
    g = oh.make_graph(nodes, "mlp", [oh.make_tensor_value_info("x", TP.FLOAT, ["batch", k])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, ["batch", 8])], [w1, w2])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.fixture()
def db(tmp_path):
    return TuningDatabase(tmp_path / "db.sqlite")


def test_runtime_if_compiles_each_branch_where_it_imports(db, tmp_path):
    m = rate_switch()
    f = lumc.compile(m, budget="40s", device="sim:h200", db=db, shapes={"n": [512, 256]})
    assert isinstance(f, VariantModel)
    served = sorted((k.shapes["x"], k.conditions["y"]) for k, _ in f.variants)
    assert served == [((1, 256), False), ((1, 512), True)]
    assert len(f.skipped) == 2
    rng = np.random.default_rng(1)
    for n, sr in ((512, 16000), (256, 8000), (256, 44100)):
        x = rng.standard_normal((1, n)).astype(np.float32)
        sr = np.array(sr, np.int64)
        np.testing.assert_allclose(f(x, sr), _ort(m, {"x": x, "sr": sr}), rtol=1e-5, atol=1e-5)
    # the inputs take a branch that does not import at their shape: one line, naming why
    with pytest.raises(InputError, match="If 'y' else, which did not compile") as e:
        f(np.zeros((1, 512), np.float32), np.array(8000, np.int64))
    assert "\n" not in str(e.value) and "reshape" in str(e.value)
    with pytest.raises(InputError, match=r"input 'x' has shape \(1, 300\)"):
        f(np.zeros((1, 300), np.float32), np.array(8000, np.int64))
    # one artifact holds both plans and the condition
    path = tmp_path / "vad.lumc"
    f.save(path)
    g = load(path)
    assert isinstance(g, VariantModel) and len(g.variants) == 2
    x = rng.standard_normal((1, 256)).astype(np.float32)
    np.testing.assert_allclose(g(x, np.array(8000, np.int64)),
                               _ort(m, {"x": x, "sr": np.array(8000, np.int64)}),
                               rtol=1e-5, atol=1e-5)


def test_runtime_if_cli_run_selects_by_the_condition(tmp_path):
    p = tmp_path / "vad.onnx"
    onnx.save(rate_switch(), p)
    out = tmp_path / "vad.lumc"
    res = CliRunner().invoke(cli, ["compile", str(p), "--budget", "40s", "--device", "sim:h200",
                                   "--shape", "n=512,256", "-o", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "into 2 plans" in res.output and "not compiled" in res.output
    for n, sr in ((512, 16000), (256, 8000)):
        np.save(tmp_path / "sr.npy", np.array(sr, np.int64))
        res = CliRunner().invoke(cli, ["run", str(out), "--shape", f"n={n}", "--random",
                                       "--input", f"sr={tmp_path / 'sr.npy'}", "--check"])
        assert res.exit_code == 0, res.output
    np.save(tmp_path / "sr.npy", np.array(8000, np.int64))
    res = CliRunner().invoke(cli, ["run", str(out), "--shape", "n=512", "--random",
                                   "--input", f"sr={tmp_path / 'sr.npy'}"])
    assert res.exit_code == 2 and "did not compile" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("sizes", [[1, 5, 16]])
def test_explicit_sizes_give_one_plan_each(db, tmp_path, sizes):
    m = mlp()
    f = lumc.compile(m, budget="45s", device="sim:h200", db=db, shapes={"batch": sizes},
                     use_egraph=False)
    assert sorted(k.dims["batch"] for k, _ in f.variants) == sizes
    rng = np.random.default_rng(2)
    for b in sizes:
        x = rng.standard_normal((b, 96)).astype(np.float32)
        y = f(x)
        assert y.shape == (b, 8)
        np.testing.assert_allclose(y, _ort(m, {"x": x}), rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match=r"compiled for \(1, 96\) or \(5, 96\) or \(16, 96\)"):
        f(np.zeros((7, 96), np.float32))
    r = f.report_dict()
    assert [v["key"]["dims"]["batch"] for v in r["variants"]] == sizes
    assert all(v["best_time_s"] > 0 for v in r["variants"])
    path = tmp_path / "m.lumc"
    f.save(path)
    res = CliRunner().invoke(cli, ["run", str(path), "--shape", "batch=5", "--random", "--check"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["run", str(path), "--shape", "batch=7", "--random"])
    assert res.exit_code == 2 and "outside what" in res.stderr


def test_corrupt_variant_table_is_one_line(db, tmp_path):
    f = lumc.compile(mlp(), budget="30s", device="sim:h200", db=db, shapes={"batch": [1, 2]},
                     use_egraph=False)
    path = tmp_path / "m.lumc"
    f.save(path)
    bad = tmp_path / "bad.lumc"
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    doc = json.loads(parts["variants.json"])
    doc["variants"][0]["dims"] = "batch"
    parts["variants.json"] = json.dumps(doc).encode()
    from lumc import __version__
    from lumc.compiler.runtime.artifact import save_artifact
    parts.pop("manifest.json")
    save_artifact(bad, parts, __version__)
    with pytest.raises(ArtifactError, match="variant key") as e:
        load(bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("sizes", [[2, 4], (2, 16)], ids=["list", "range"])
def test_a_note_every_plan_makes_is_said_once(sizes, tmp_path, monkeypatch):
    """Each size's (or bucket's) plan made the same note (here: --weights nvfp4 stores no weight
    of a model whose one weight has K = 24, not a multiple of 16), and the compile's warnings
    listed it once per plan."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    w = np.random.default_rng(1).standard_normal((24, 8)).astype(np.float32)
    g = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [oh.make_tensor_value_info("x", TP.FLOAT, ["b", 24])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, ["b", 8])],
                      [nh.from_array(w, "w")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    cm = lumc.compile(m, budget="30s", device="sim:h200", shapes={"b": sizes}, weights="nvfp4")
    notes = cm.report_dict()["warnings"]
    assert sum("weights nvfp4" in w for w in notes) == 1, notes
    assert len(cm.variants) >= 2
    x = np.random.default_rng(0).standard_normal((4, 24)).astype(np.float32)
    np.testing.assert_allclose(cm(x), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


def test_a_one_size_bucket_is_named_by_its_size():
    """``--shape H=32..128:32`` has four sizes, so four one-size buckets: the compile summary, the
    report and the variant list named them 'H=32..32:32'; a bucket of one size reads 'H=32'."""
    from lumc.compiler.runtime.variants import VariantKey
    one = VariantKey(dims={"H": 32}, ranges={"H": (32, 32, 32)}, probes={"H": 1009})
    assert one.describe() == "H=32"
    wide = VariantKey(dims={"H": 64}, ranges={"H": (32, 64, 32)}, probes={"H": 1009})
    assert wide.describe() == "H=32..64:32"


def test_a_list_and_a_range_in_one_compile_are_refused_in_the_users_words(db, tmp_path):
    """``--shape N=1,2 --shape H=32..64:32`` failed with "shapes={'H': DimRange(lo=32, hi=64,
    step=32, at=None)}: a dynamic dim's size is an integer ...": the range reached a per-size
    compile as if it were one size. Both kinds in one compile are refused up front, named as given
    (the API's (lo, hi) too)."""
    x = oh.make_tensor_value_info("x", TP.FLOAT, ["N", "H"])
    y = oh.make_tensor_value_info("y", TP.FLOAT, ["N", "H"])
    p = tmp_path / "neg.onnx"
    onnx.save(oh.make_model(oh.make_graph([oh.make_node("Neg", ["x"], ["y"])], "g", [x], [y]),
                            opset_imports=[oh.make_opsetid("", 17)]), p)
    res = CliRunner().invoke(cli, ["compile", str(p), "--budget", "10s", "--device", "sim:h200",
                                   "--shape", "N=1,2", "--shape", "H=32..64:32", "-o",
                                   str(tmp_path / "a.lumc"), "--quiet"])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and "DimRange" not in line, line
    assert "N=1,2" in line and "H=32..64:32" in line, line
    with pytest.raises(InputError, match=r"N=1,2 .*H=1\.\.8"):
        lumc.compile(str(p), budget="10s", device="sim:h200", shapes={"N": [1, 2], "H": (1, 8)},
                     db=db)
