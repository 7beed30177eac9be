"""Size ranges and size lists at their edges: a range holding sizes the model does not take (a Split
in halves at odd sizes, a position table shorter than the range) is refused naming such a size, a
listed size likewise; a range in steps given in the API as text serves exactly the sizes it holds.
Values against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import lumc
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.compiler.tools.cli import cli
from lumc.ir.errors import InputError

RNG = np.random.default_rng(11)


def _model(nodes, inputs, outputs, inits=()):
    g = oh.make_graph(nodes, "m", inputs, outputs, list(inits))
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def halves(d: int = 4) -> onnx.ModelProto:
    """x [1, L, d] split in two halves along L, their difference: only even L import."""
    return _model([oh.make_node("Split", ["x"], ["a", "b"], axis=1),
                   oh.make_node("Sub", ["a", "b"], ["y"])],
                  [oh.make_tensor_value_info("x", TP.FLOAT, [1, "L", d])],
                  [oh.make_tensor_value_info("y", TP.FLOAT, None)])


def positions(d: int = 4, rows: int = 20) -> onnx.ModelProto:
    """x [1, L, d] plus rows 0..L-1 of a position table of ``rows`` rows (Range of the size
    read by Shape): L above ``rows`` does not import."""
    table = np.random.default_rng(5).standard_normal((rows, d)).astype(np.float32)
    return _model([oh.make_node("Shape", ["x"], ["sh"]),
                   oh.make_node("Gather", ["sh", "one"], ["L"], axis=0),
                   oh.make_node("Range", ["zero", "L", "one"], ["pos"]),
                   oh.make_node("Gather", ["table", "pos"], ["pe"], axis=0),
                   oh.make_node("Add", ["x", "pe"], ["y"])],
                  [oh.make_tensor_value_info("x", TP.FLOAT, [1, "L", d])],
                  [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                  [nh.from_array(np.int64(0), "zero"), nh.from_array(np.int64(1), "one"),
                   nh.from_array(table, "table")])


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


@pytest.fixture()
def db(tmp_path):
    return TuningDatabase(tmp_path / "db.sqlite")


def test_a_range_with_sizes_the_split_does_not_take_names_one(db, tmp_path):
    """Over 1..64 the halves do not import at odd sizes: the refusal names such a size of the
    range (it said 'cannot split 61 evenly', 61 being a probe the user never gave, with no word
    of the range); the same range in steps of 2, given as text in the API, compiles and serves
    every even size exactly and refuses an odd one."""
    with pytest.raises(InputError) as e:
        lumc.compile(halves(), budget="20s", device="sim:h200", db=db, shapes={"L": (1, 64)})
    msg = str(e.value)
    assert msg.startswith("size range L=1..64: the model does not take L=") and "\n" not in msg
    assert "a size of the range" in msg and "cannot split" in msg and "A..B:STEP" in msg
    p = tmp_path / "halves.onnx"
    onnx.save(halves(), p)
    res = CliRunner().invoke(cli, ["compile", str(p), "--budget", "20s", "--shape", "L=1..64",
                                   "-o", str(tmp_path / "h.lumc")])
    assert res.exit_code == 2 and "does not take L=" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    f = lumc.compile(halves(), budget="20s", device="sim:h200", db=db, shapes={"L": "2..64:2"})
    for n in (2, 4, 34, 62, 64):
        x = RNG.standard_normal((1, n, 4)).astype(np.float32)
        y = f(x)
        assert y.shape == (1, n // 2, 4)
        np.testing.assert_array_equal(y, _ort(halves(), {"x": x}))
    with pytest.raises(InputError, match=r"is 3; compiled for 2..64 in steps of 2"):
        f(np.zeros((1, 3, 4), np.float32))


@pytest.mark.parametrize("text,words", [("2..64:3", "multiples of its step 3"),
                                        ("two..64", "expected A..B"),
                                        ("64", "'A..B', 'A..B:STEP' or 'A..B@AT'")])
def test_a_bad_range_text_in_the_api_is_one_line(text, words, db):
    with pytest.raises(InputError, match=words) as e:
        lumc.compile(halves(), budget="20s", device="sim:h200", db=db, shapes={"L": text})
    assert str(e.value).startswith(f"shapes={{'L': {text!r}}}") and "\n" not in str(e.value)


def test_a_listed_size_the_model_does_not_take_is_named(db, tmp_path):
    with pytest.raises(InputError) as e:
        lumc.compile(halves(), budget="20s", device="sim:h200", db=db, shapes={"L": [2, 3, 8]},
                     use_egraph=False)
    msg = str(e.value)
    assert msg.startswith("--shape L=3: the model does not take this listed size")
    assert "cannot split 3 evenly" in msg and "\n" not in msg


def test_a_range_past_its_position_table_is_refused_naming_a_size(db):
    """A table of 20 positions: over 1..40 the model does not import above L=20, and the refusal
    says so (it said 'the model's sizes are not products of L', which they are); over 1..20 one
    plan serves every L exactly, the table's last row included."""
    with pytest.raises(InputError) as e:
        lumc.compile(positions(), budget="20s", device="sim:h200", db=db, shapes={"L": (1, 40)})
    msg = str(e.value)
    assert msg.startswith("size range L=1..40: the model does not take L=") and "\n" not in msg
    assert "out of range [0, 20)" in msg and "not products" not in msg
    taken = int(msg.split("does not take L=")[1].split(",")[0])
    assert 20 < taken <= 40
    m = positions()
    f = lumc.compile(m, budget="20s", device="sim:h200", db=db, shapes={"L": (1, 20)})
    for n in (1, 2, 7, 19, 20):
        x = RNG.standard_normal((1, n, 4)).astype(np.float32)
        np.testing.assert_allclose(f(x), _ort(m, {"x": x}), rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError, match=r"is 21; compiled for 1..20"):
        f(np.zeros((1, 21, 4), np.float32))


def test_bench_of_a_range_artifact_counts_the_ideal_bytes_at_the_size_timed(db, tmp_path):
    """``lumc bench ART --shape L=9`` of a 1..64 range: the kernels' bytes were L=9's but the
    ideal was the bucket's representative size's (L=64's bucket: '0.48x ideal', less moved than
    the inputs and outputs hold). Both are now the timed size's."""
    import json
    m = _model([oh.make_node("Add", ["x", "y"], ["s"]),
                oh.make_node("ReduceMean", ["s"], ["m"], axes=[1], keepdims=0)],
               [oh.make_tensor_value_info(k, TP.FLOAT, [1, "L", 4]) for k in "xy"],
               [oh.make_tensor_value_info(k, TP.FLOAT, None) for k in "sm"])
    f = lumc.compile(m, budget="20s", device="sim:h200", db=db, shapes={"L": (1, 64)})
    art = tmp_path / "r.lumc"
    f.save(art)
    for n in (9, 64):
        out = tmp_path / f"b{n}.json"
        res = CliRunner().invoke(cli, ["bench", str(art), "--shape", f"L={n}", "--repeats", "1",
                                       "--json", str(out)])
        assert res.exit_code == 0, res.output
        e = json.loads(out.read_text())["end_to_end"]
        assert e["ideal_bytes"] == 4 * (3 * n * 4 + 4), (n, e)     # x, y, s once; m
        assert e["bytes_moved"] >= e["ideal_bytes"], (n, e)


@pytest.mark.parametrize("size", [(1, 48), [2, 4]], ids=["range", "list"])
def test_a_bad_dim_name_beside_a_range_or_list_is_said_as_it_is(size, db):
    """A ``shapes=`` name the model lacks is the user's error, not a size the model does not
    take: 'the model does not take L=47 (... no input or dynamic dim of that name)' misled."""
    with pytest.raises(InputError) as e:
        lumc.compile(halves(), budget="20s", device="sim:h200", db=db,
                     shapes={"B": 1, "L": size})
    assert str(e.value).startswith("shapes={'B': ...}: no input or dynamic dim of that name")


def test_a_dim_two_inputs_share_is_refused_naming_both_when_they_differ(db):
    """x [1, L, 4] + y [1, L, 4] over 1..32: equal L is served exactly; L=7 against L=8 said 'dim
    'L' is 7 in one input and 8 in input 'y'', naming one side only."""
    m = _model([oh.make_node("Add", ["x", "y"], ["s"])],
               [oh.make_tensor_value_info(k, TP.FLOAT, [1, "L", 4]) for k in "xy"],
               [oh.make_tensor_value_info("s", TP.FLOAT, None)])
    f = lumc.compile(m, budget="20s", device="sim:h200", db=db, shapes={"L": (1, 32)})
    x, y = (RNG.standard_normal((1, 7, 4)).astype(np.float32) for _ in "xy")
    np.testing.assert_array_equal(f(x, y), x + y)
    with pytest.raises(InputError) as e:
        f(x, np.zeros((1, 8, 4), np.float32))
    assert str(e.value) == ("dim 'L' is 7 in input 'x' axis 1 and 8 in input 'y' axis 1; they "
                            "must be equal")


def pairs(d: int = 4) -> onnx.ModelProto:
    """x [B, L, d] read as pairs of rows: Reshape to [B, L / 2, 2 d] with L / 2 an integer Div of
    the Shape: an odd L does not import."""
    return _model([oh.make_node("Shape", ["x"], ["sh"]),
                   oh.make_node("Gather", ["sh", "zero"], ["B"], axis=0),
                   oh.make_node("Gather", ["sh", "one"], ["L"], axis=0),
                   oh.make_node("Div", ["L", "two"], ["Lh"]),
                   oh.make_node("Unsqueeze", ["B", "ax0"], ["B1"]),
                   oh.make_node("Unsqueeze", ["Lh", "ax0"], ["Lh1"]),
                   oh.make_node("Concat", ["B1", "Lh1", "d2"], ["tgt"], axis=0),
                   oh.make_node("Reshape", ["x", "tgt"], ["y"])],
                  [oh.make_tensor_value_info("x", TP.FLOAT, ["B", "L", d])],
                  [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                  [nh.from_array(np.int64(0), "zero"), nh.from_array(np.int64(1), "one"),
                   nh.from_array(np.int64(2), "two"), nh.from_array(np.array([0], np.int64), "ax0"),
                   nh.from_array(np.array([2 * d], np.int64), "d2")])


def test_a_narrow_range_beside_one_with_sizes_the_model_does_not_take(db):
    """B=1..4 is too narrow to probe inside (one odd prime), so both dims are probed above their
    ranges, where the odd L probe does not import: it said 'too narrow to probe inside ... and
    the model imports at no size above it', blaming B. The range's own edge sizes are tried then:
    L=1 is refused by name. With L in steps of 2 one plan serves every (B, L) exactly."""
    with pytest.raises(InputError) as e:
        lumc.compile(pairs(), budget="20s", device="sim:h200", db=db,
                     shapes={"B": (1, 4), "L": (1, 64)})
    msg = str(e.value)
    assert msg.startswith("size range B=1..4, L=1..64: the model does not take B=1, L=1, a size "
                          "of the range (node 'y', op Reshape") and "too narrow" not in msg
    m = pairs()
    f = lumc.compile(m, budget="30s", device="sim:h200", db=db,
                     shapes={"B": (1, 4), "L": "2..64:2"})
    for b, n in ((1, 2), (4, 64), (3, 22), (2, 62)):
        x = RNG.standard_normal((b, n, 4)).astype(np.float32)
        y = f(x)
        assert y.shape == (b, n // 2, 8)
        np.testing.assert_array_equal(y, _ort(m, {"x": x}))


def test_a_range_of_one_size_compiles_that_size(tmp_path):
    """``--shape L=6..6`` (a range of one size, too narrow to probe) compiles L=6 as one plan
    ('into 1 plans' it said) and serves it exactly; L=5 is refused in one line."""
    p = tmp_path / "h.onnx"
    onnx.save(halves(), p)
    art = tmp_path / "h.lumc"
    res = CliRunner().invoke(cli, ["compile", str(p), "--budget", "20s", "--shape", "L=6..6",
                                   "-o", str(art)])
    assert res.exit_code == 0, res.output
    assert "into 1 plan in" in res.output, res.output
    x = RNG.standard_normal((1, 6, 4)).astype(np.float32)
    np.testing.assert_array_equal(lumc.load(art)(x), _ort(halves(), {"x": x}))
    res = CliRunner().invoke(cli, ["run", str(art), "--shape", "L=5", "--random"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output


def lstm(hidden: int = 3, d: int = 2) -> onnx.ModelProto:
    """An LSTM over x [L, 1, d] (time major), its last hidden state: lumc unrolls it over L, so
    the graph at each L is another graph."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1, 4 * hidden, d)).astype(np.float32)
    r = rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32)
    return _model([oh.make_node("LSTM", ["x", "w", "r"], ["", "y_h"], hidden_size=hidden,
                                name="rnn")],
                  [oh.make_tensor_value_info("x", TP.FLOAT, ["L", 1, d])],
                  [oh.make_tensor_value_info("y_h", TP.FLOAT, None)],
                  [nh.from_array(w, "w"), nh.from_array(r, "r")])


def test_a_recurrence_over_a_ranged_dim_is_refused_naming_it(db):
    """An LSTM over a ranged L is unrolled, one graph per size: no probe re-sizes it. The
    compile tried every probe above the range, learning tables of sizes over the unrolled
    graphs, and was refused for a view's mask ('sizes are not products ...'), 58 s into a
    --budget 90s compile of Silero VAD over seq_len=1..32 (at 30 s: 'the budget ran out'). The
    refusal names the LSTM, at the first probes above the range; over L=1..4 (too narrow to
    probe inside) the four sizes compile as a list, exact against onnxruntime."""
    with pytest.raises(InputError) as e:
        lumc.compile(lstm(), budget="20s", device="sim:h200", db=db, shapes={"L": (1, 32)})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("size range L=1..32: the model is not one graph at "
                                              "every size (node 'rnn', op LSTM lowers to "), msg
    f = lumc.compile(lstm(), budget="30s", device="sim:h200", db=db, shapes={"L": (1, 4)},
                     use_egraph=False)
    assert len(f.variants) == 4
    for n in (1, 2, 3, 4):
        x = RNG.standard_normal((n, 1, 2)).astype(np.float32)
        np.testing.assert_allclose(f(x), _ort(lstm(), {"x": x}), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_egraph", [True, False])
def test_a_gather_along_a_ranged_non_leading_dim_serves_the_range(db, use_egraph):
    """``GatherElements(x, ArgMax(x, axis=1), axis=1)`` on ``x [2, N]``, N in 4..64: the greedy
    program built from the constant-folded graph (for --no-egraph's empty models) folded the
    rows' base offsets ``[0, N]`` at the probe size, and the bucket-end check failed ('gather index
    75 out of range [0, 66)'). Under a range's probes such an index array stays a computation
    (``symbolic.held_values``), for the greedy program and the e-graph alike. Values against
    onnxruntime at sizes across the range."""
    m = _model([oh.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=1),
                oh.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
               [oh.make_tensor_value_info("x", TP.FLOAT, [2, "N"])],
               [oh.make_tensor_value_info("y", TP.FLOAT, None)])
    cm = lumc.compile(m, budget="30s", device="sim:h200", db=db, shapes={"N": (4, 64)},
                      use_egraph=use_egraph)
    sess = ort.InferenceSession(m.SerializeToString())
    for n in (4, 5, 33, 47, 64):
        x = RNG.standard_normal((2, n)).astype(np.float32)
        np.testing.assert_array_equal(cm(x), sess.run(None, {"x": x})[0])


def test_a_range_compile_is_reused_like_a_fixed_size_one(db, tmp_path):
    """A repeated compile of the same model and range searched again (a fixed-size or listed
    compile reuses its stored plan): the range's plans are stored and reused now, unless a
    bucket's search was cut short by a smaller budget than this compile's."""
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.plan_reuse import _reuse_plan, stamp_plan_key
    path = tmp_path / "h.onnx"
    onnx.save(halves(), path)
    first = lumc.compile(path, budget="30s", device="sim:h200", db=db, shapes={"L": "2..32:2"})
    again = lumc.compile(path, budget="30s", device="sim:h200", db=db, shapes={"L": "2..32:2"})
    r = again.report_dict()
    assert r["stopped_because"].startswith("reused the plan"), r["stopped_because"]
    x = RNG.standard_normal((1, 18, 4)).astype(np.float32)
    np.testing.assert_array_equal(again(x), first(x))
    np.testing.assert_allclose(again(x), x[:, :9] - x[:, 9:], rtol=1e-6)
    first._report["variants"][0]["stopped_because"] = "budget"
    cut = tmp_path / "cut.lumc"
    stamp_plan_key(first, cut)
    first.save(cut)
    assert _reuse_plan(cut, 60.0, Deadline(60.0)) is None
    assert _reuse_plan(cut, first.report_dict()["budget_s"], Deadline(30.0)) is not None
