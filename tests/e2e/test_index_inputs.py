"""Integer inputs that index a table: ``--random`` draws them in the table's range, and a value
outside it is one line ``lumc: error:`` naming the node, the index and the range, on the reference
and Triton backends, for artifacts, and through the Python API."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import lumc
from lumc.compiler.tools.cli import cli
from lumc.compiler.runtime.index_ranges import index_uses, random_int_highs
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir.errors import InputError


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def bert_like() -> onnx.ModelProto:
    """Word and token-type embeddings (30 and 2 rows); token types reach their Gather through
    Cast and Unsqueeze/Squeeze; GatherElements over a 3-wide axis from another input."""
    rng = np.random.default_rng(0)
    word = nh.from_array(rng.standard_normal((30, 4)).astype(np.float32), "word")
    tt = nh.from_array(rng.standard_normal((2, 4)).astype(np.float32), "tt")
    ax = nh.from_array(np.array([0], np.int64), "ax")
    nodes = [oh.make_node("Gather", ["word", "input_ids"], ["w"], name="word_embed"),
             oh.make_node("Cast", ["token_type_ids"], ["t32"], to=TP.INT32),
             oh.make_node("Unsqueeze", ["t32", "ax"], ["t3"]),
             oh.make_node("Squeeze", ["t3", "ax"], ["t2"]),
             oh.make_node("Gather", ["tt", "t2"], ["t"], name="type_embed"),
             oh.make_node("Add", ["w", "t"], ["y"]),
             oh.make_node("GatherElements", ["x", "pick"], ["z"], axis=1, name="pick_cols")]
    ins = [oh.make_tensor_value_info("input_ids", TP.INT64, [2, 7]),
           oh.make_tensor_value_info("token_type_ids", TP.INT64, [2, 7]),
           oh.make_tensor_value_info("x", TP.FLOAT, [2, 3]),
           oh.make_tensor_value_info("pick", TP.INT64, [2, 5]),
           oh.make_tensor_value_info("other", TP.INT64, [2])]
    outs = [oh.make_tensor_value_info("y", TP.FLOAT, None), oh.make_tensor_value_info("z", TP.FLOAT, None),
            oh.make_tensor_value_info("o", TP.INT64, None)]
    nodes.append(oh.make_node("Identity", ["other"], ["o"]))
    g = oh.make_graph(nodes, "bert_like", ins, outs, [word, tt, ax])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("idx") / "bert_like.onnx"
    onnx.save(bert_like(), p)
    return p


def test_index_uses_found_through_value_preserving_ops():
    shapes = {"input_ids": (2, 7), "token_type_ids": (2, 7), "x": (2, 3), "pick": (2, 5)}
    uses = index_uses(bert_like(), shapes)
    assert random_int_highs(uses) == {"input_ids": 30, "token_type_ids": 2, "pick": 3}
    assert [(u.node, u.op) for u in uses["token_type_ids"]] == [("type_embed", "Gather")]


def test_random_draws_in_the_table_range_and_check_passes(bert_path, tmp_path):
    out = tmp_path / "o.npz"
    res = _run("run", bert_path, "--random", "--check", "-o", out, "--seed", "3")
    assert res.exit_code == 0, res.output
    with np.load(out) as f:
        assert f["o"].min() >= 0 and f["o"].max() < 8    # not an index: the generic [0, 8)
    # the drawn ids themselves, through the same rule
    from lumc.compiler.frontends.models import random_inputs
    x = random_inputs({"token_type_ids": (64, 7), "input_ids": (64, 7)},
                      {"token_type_ids": np.int64, "input_ids": np.int64}, 3,
                      int_high={"token_type_ids": 2, "input_ids": 30})
    assert set(np.unique(x["token_type_ids"])) == {0, 1}
    assert x["input_ids"].max() >= 8 and x["input_ids"].max() < 30


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("bad,node,rng", [("token_type_ids", "type_embed", "[-2, 2)"),
                                          ("input_ids", "word_embed", "[-30, 30)"),
                                          ("pick", "pick_cols", "[-3, 3)")])
def test_out_of_range_index_is_one_line(bert_path, tmp_path, backend, bad, node, rng):
    vals = {"input_ids": np.zeros((2, 7), np.int64), "token_type_ids": np.ones((2, 7), np.int64),
            "x": np.ones((2, 3), np.float32), "pick": np.zeros((2, 5), np.int64),
            "other": np.zeros(2, np.int64)}
    vals[bad] = vals[bad].copy()
    vals[bad].flat[3] = -31 if bad == "input_ids" else 3
    np.savez(tmp_path / "in.npz", **vals)
    res = _run("run", bert_path, "--inputs", tmp_path / "in.npz", "--backend", backend)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lumc: error: ") and "Traceback" not in res.output
    want = str(vals[bad].flat[3])
    assert f"node '{node}'" in lines[0] and f"index {want}" in lines[0] and rng in lines[0]


def test_out_of_range_index_through_the_api(tmp_path):
    f = lumc.compile(bert_like(), budget="30s", device="sim:h200",
                     db=TuningDatabase(tmp_path / "db.sqlite"))
    ok = {"input_ids": np.full((2, 7), 29, np.int64), "token_type_ids": np.ones((2, 7), np.int64),
          "x": np.ones((2, 3), np.float32), "pick": np.full((2, 5), -3, np.int64),
          "other": np.zeros(2, np.int64)}
    f(**ok)
    with pytest.raises(InputError, match=r"type_embed.*index 2 .*\[-2, 2\)"):
        f(**(ok | {"token_type_ids": np.full((2, 7), 2, np.int64)}))


def shifted() -> onnx.ModelProto:
    """Ids shifted by a constant before their lookup: ``Gather(word, Add(ids, 2))`` (6 rows, the 2
    an initializer), ``Gather(pos_table, Sub(pos, 1))`` (5 rows, the 1 a ``Constant``) and
    ``Gather(word, Add(3, Cast(ids)))``."""
    rng = np.random.default_rng(1)
    word = nh.from_array(rng.standard_normal((6, 4)).astype(np.float32), "word")
    pos_table = nh.from_array(rng.standard_normal((5, 4)).astype(np.float32), "pos_table")
    two = nh.from_array(np.array(2, np.int64), "two")
    three = nh.from_array(np.array([3], np.int32), "three")
    nodes = [oh.make_node("Add", ["ids", "two"], ["ids2"]),
             oh.make_node("Gather", ["word", "ids2"], ["w"], name="word_embed"),
             oh.make_node("Constant", [], ["one"], value=nh.from_array(np.array(1, np.int64))),
             oh.make_node("Sub", ["pos", "one"], ["pos1"]),
             oh.make_node("Gather", ["pos_table", "pos1"], ["p"], name="pos_embed"),
             oh.make_node("Cast", ["ids"], ["ids32"], to=TP.INT32),
             oh.make_node("Add", ["three", "ids32"], ["ids3"]),
             oh.make_node("Gather", ["word", "ids3"], ["v"], name="word_embed_3")]
    ins = [oh.make_tensor_value_info("ids", TP.INT64, [2, 3]),
           oh.make_tensor_value_info("pos", TP.INT64, [3])]
    outs = [oh.make_tensor_value_info(k, TP.FLOAT, None) for k in ("w", "p", "v")]
    g = oh.make_graph(nodes, "shifted", ins, outs, [word, pos_table, two, three])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def shifted_compiled(tmp_path_factory):
    db = TuningDatabase(tmp_path_factory.mktemp("shifted") / "db.sqlite")
    return lumc.compile(shifted(), budget="30s", device="sim:h200", db=db)


@pytest.mark.parametrize("bad,value,node,rng", [
    ("ids", 3, "word_embed_3", "[-9, 3)"), ("ids", -9, "word_embed", "[-8, 4)"),
    ("pos", 6, "pos_embed", "[-4, 6)"), ("pos", -5, "pos_embed", "[-4, 6)")])
def test_shifted_onnx_indices_are_checked_at_the_shifted_range(shifted_compiled, bad, value, node,
                                                               rng):
    """A Gather index that is a graph input plus or minus a constant was not range-checked on the
    ONNX path (the torch path checks ``emb(ids + 2)``): its valid range is the table's moved by the
    shift (ids + 2 into 6 rows: ids in [-8, 4); pos - 1 into 5 rows: pos in [-4, 6)). In range the
    compiled model equals onnxruntime; out of range both refuse, lumc in one line."""
    import onnxruntime as ort
    m, f = shifted(), shifted_compiled
    uses = index_uses(m, {"ids": (2, 3), "pos": (3,)})
    assert sorted((u.node, u.size, u.offset) for u in uses["ids"]) == [("word_embed", 6, 2),
                                                                        ("word_embed_3", 6, 3)]
    assert [(u.node, u.size, u.offset) for u in uses["pos"]] == [("pos_embed", 5, -1)]
    assert random_int_highs(uses) == {"ids": 3, "pos": 6}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ok = {"ids": np.array([[-8, 0, 2], [-1, 1, -3]], np.int64),
          "pos": np.array([-4, 0, 5], np.int64)}
    got, want = f(**ok), sess.run(None, ok)          # outputs in the graph's order: w, p, v
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
    feeds = {k: v.copy() for k, v in ok.items()}
    feeds[bad].flat[1] = value
    with pytest.raises(Exception):          # the premise: onnxruntime refuses it too
        sess.run(None, feeds)
    with pytest.raises(InputError, match=rf"'{node}'.*index {value} .*{re.escape(rng)}") as e:
        f(**feeds)
    msg = str(e.value)
    assert "\n" not in msg and re.search(r"its value [+-]\d\)$", msg), msg


def scatters() -> onnx.ModelProto:
    """``ScatterElements`` along axis 1 (4 wide) and ``ScatterND`` into a [3, 2] table, both with
    their indices from graph inputs."""
    nodes = [oh.make_node("ScatterElements", ["x", "idx", "upd"], ["y"], axis=1, name="scatter_cols"),
             oh.make_node("ScatterND", ["t", "nd", "vals"], ["z"], name="scatter_nd")]
    ins = [oh.make_tensor_value_info("x", TP.FLOAT, [2, 4]),
           oh.make_tensor_value_info("idx", TP.INT64, [2, 2]),
           oh.make_tensor_value_info("upd", TP.FLOAT, [2, 2]),
           oh.make_tensor_value_info("t", TP.FLOAT, [3, 2]),
           oh.make_tensor_value_info("nd", TP.INT64, [2, 2]),
           oh.make_tensor_value_info("vals", TP.FLOAT, [2])]
    outs = [oh.make_tensor_value_info(k, TP.FLOAT, None) for k in ("y", "z")]
    g = oh.make_graph(nodes, "scatters", ins, outs)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("bad,value,node,rng", [
    ("idx", 4, "scatter_cols", "[-4, 4)"), ("idx", -5, "scatter_cols", "[-4, 4)"),
    ("nd", 3, "scatter_nd", "[-3, 3)"), ("nd", 2, "scatter_nd", "[-2, 2)")])
def test_out_of_range_scatter_index_is_refused_in_one_line(tmp_path, bad, value, node, rng):
    """An out-of-range scatter index is an error (onnxruntime refuses it); lumc wrote nothing for it
    and returned the data unchanged there. A graph input is now checked like a gather's (ScatterND
    per component of the index's last axis: rows in [-3, 3), columns in [-2, 2)); in range the
    compiled model equals onnxruntime."""
    import onnxruntime as ort
    m = scatters()
    f = lumc.compile(m, budget="30s", device="sim:h200", db=TuningDatabase(tmp_path / "db.sqlite"))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng_ = np.random.default_rng(3)
    ok = {"x": rng_.standard_normal((2, 4)).astype(np.float32),
          "idx": np.array([[-4, 3], [0, -1]], np.int64),
          "upd": rng_.standard_normal((2, 2)).astype(np.float32),
          "t": rng_.standard_normal((3, 2)).astype(np.float32),
          "nd": np.array([[-3, 1], [2, -2]], np.int64),
          "vals": np.array([5.0, -7.0], np.float32)}
    for g, w in zip(f(**ok), sess.run(None, ok)):
        np.testing.assert_array_equal(np.asarray(g), w)
    feeds = {k: v.copy() for k, v in ok.items()}
    feeds[bad][1, 1 if bad == "nd" and value == 2 else 0] = value
    with pytest.raises(Exception):          # the premise: onnxruntime refuses it too
        sess.run(None, feeds)
    with pytest.raises(InputError, match=rf"'{node}'.*index {value} .*{re.escape(rng)}") as e:
        f(**feeds)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_out_of_range_constant_scatter_index_is_refused_at_import(op):
    """The same index as a model constant is refused when the model is imported."""
    from lumc.compiler.frontends.onnx_frontend import import_onnx
    from lumc.ir.errors import IndexRangeError
    idx = np.array([[0, 4]], np.int64) if op == "ScatterElements" else np.array([[3]], np.int64)
    upd = np.ones((1, 2), np.float32)
    node = oh.make_node(op, ["x", "idx", "upd"], ["y"], name="sc",
                        **({"axis": 1} if op == "ScatterElements" else {}))
    g = oh.make_graph([node], "g", [oh.make_tensor_value_info("x", TP.FLOAT, [3, 4 if op ==
                                                                              "ScatterElements" else 2])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                      [nh.from_array(idx, "idx"), nh.from_array(upd, "upd")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(IndexRangeError, match=r"'sc'.*scatter index (4|3) .*out of range") as e:
        import_onnx(m)
    assert "\n" not in str(e.value)
