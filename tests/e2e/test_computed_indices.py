"""Indices and divisors a model computes from its inputs: a value out of range is refused in one
line naming the model node that made it (ONNX node name or FX node), not only the primitive op, at
compile (the drawn example inputs: with what to give instead), at run, and from a saved artifact;
``lumc compile --input`` takes example inputs the model accepts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import lumc
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.compiler.tools.cli import cli
from lumc.ir import provenance
from lumc.compiler.runtime.index_ranges import IndexRangeInputError
from lumc.ir.errors import DivisionByZeroError, IndexRangeError
from lumc.ir.tensor import Tensor
from lumc.ir.graph import input_node
from lumc.ir import dtypes as dt

ROWS = 10


def doubled_lookup(rows: int = ROWS, scale: int = 2) -> onnx.ModelProto:
    """``relu(table[ids * scale])``: the index is computed, so no input range covers it."""
    table = np.random.default_rng(0).standard_normal((rows, 4)).astype(np.float32)
    g = oh.make_graph(
        [oh.make_node("Mul", ["ids", "scale"], ["ids2"], name="scale_ids"),
         oh.make_node("Gather", ["table", "ids2"], ["emb"], name="embed_lookup", axis=0),
         oh.make_node("Relu", ["emb"], ["y"], name="act")],
        "g", [oh.make_tensor_value_info("ids", TP.INT64, [3])],
        [oh.make_tensor_value_info("y", TP.FLOAT, [3, 4])],
        [nh.from_array(table, "table"), nh.from_array(np.array(scale, np.int64), "scale")])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _one_line(res, *words):
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lumc: error: "), res.stderr
    assert "Traceback" not in res.output
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.fixture()
def db(tmp_path):
    return TuningDatabase(tmp_path / "tuning.sqlite")


def test_record_labels_new_nodes_only_and_rebuilt_keeps_the_label():
    a = input_node("prov_a", (3,), dt.i64)
    b = input_node("prov_b", (3,), dt.i64)
    old = (Tensor(a) + Tensor(b)).node
    provenance.record([old], [a, b], "first", "Add")
    new = (Tensor(old) * 3).node          # a Mul over the first node's output, and a constant
    provenance.record([new], [old], "second", "Mul")
    assert provenance.origin(old) == ("first", "Add")
    assert provenance.origin(new) == ("second", "Mul")
    const = new.srcs[1].srcs[0]           # the 3, broadcast by a view (labelled: it is new)
    assert const.op == "Constant" and provenance.origin(new.srcs[1]) == ("second", "Mul")
    assert provenance.origin(a) is None and provenance.origin(const) is None   # leaves
    c = input_node("prov_c", (3,), dt.i64)
    moved = provenance.rebuilt(new, [c, new.srcs[1]])
    assert moved is not new and provenance.origin(moved) == ("second", "Mul")
    assert provenance.rebuilt(new, new.srcs) is new
    assert provenance.where(moved) == {"node": "second", "op": "Mul"}
    assert provenance.where(c) == {"op": "Input"}


def test_compile_with_drawn_inputs_names_the_node_and_says_what_to_give(db):
    # lumc draws integers in [0, 8): doubled, up to 14, past the 10 rows
    with pytest.raises(IndexRangeError) as e:
        lumc.compile(doubled_lookup().SerializeToString(), budget="30s", device="sim:h200", db=db)
    msg = str(e.value)
    assert "node 'embed_lookup'" in msg and "op Gather" in msg and "out of range [0, 10)" in msg
    assert "example inputs lumc drew" in msg and "--input NAME=FILE.npy" in msg
    assert "\n" not in msg


def test_run_names_the_node_in_process_and_from_a_loaded_artifact(db, tmp_path):
    ok = np.array([1, 4, 0], np.int64)
    cm = lumc.compile(doubled_lookup().SerializeToString(), budget="30s", device="sim:h200",
                      db=db, example_inputs={"ids": ok})
    table = nh.to_array(doubled_lookup().graph.initializer[0])
    np.testing.assert_array_equal(cm(ids=ok), np.maximum(table[ok * 2], 0))
    bad = {"ids": np.array([1, 7, 2], np.int64)}        # 14: past the table
    with pytest.raises(IndexRangeError, match=r"node 'embed_lookup', op Gather: gather index 14 "
                                              r"out of range \[0, 10\)$"):
        cm(**bad)
    cm.save(tmp_path / "m.lumc")
    loaded = lumc.load(tmp_path / "m.lumc")
    with pytest.raises(IndexRangeError, match="node 'embed_lookup', op Gather"):
        loaded(**bad)
    # a given example input that is out of range is the user's: no hint about drawn inputs
    with pytest.raises(IndexRangeError) as e:
        lumc.compile(doubled_lookup(scale=3).SerializeToString(), budget="30s",
                     device="sim:h200", db=db, example_inputs=bad)
    assert "node 'embed_lookup'" in str(e.value) and "drew" not in str(e.value)


def test_torch_module_errors_name_the_fx_node(db, tmp_path):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(20, 4)

        def forward(self, ids, d):
            return torch.relu(self.emb(ids * 2)), torch.remainder(ids, d - 1)

    m = M().eval()
    ids, d = torch.tensor([1, 3, 5]), torch.tensor([3, 4, 5])
    f = lumc.compile(m, budget="30s", device="sim:h200", example_inputs=(ids, d))
    y, r = f(ids, d)
    ey, er = m(ids, d)
    torch.testing.assert_close(y, ey)
    torch.testing.assert_close(r, er)
    with pytest.raises(IndexRangeError, match=r"node 'embedding', op aten\.embedding\.default "
                                              r"\(primitive Gather\): gather index 24"):
        f(torch.tensor([1, 12, 3]), d)
    with pytest.raises(DivisionByZeroError, match=r"node 'remainder'"):
        f(ids, torch.tensor([3, 1, 5]))
    f.save(tmp_path / "t.lumc")                       # the names travel with the artifact
    loaded = lumc.load(tmp_path / "t.lumc")
    with pytest.raises(IndexRangeError, match=r"node 'embedding', op aten\.embedding\.default"):
        loaded(torch.tensor([1, 12, 3]), d)


def test_cli_compile_takes_example_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    onnx.save(doubled_lookup(), tmp_path / "g.onnx")
    np.save(tmp_path / "ok.npy", np.array([1, 4, 2], np.int64))
    np.save(tmp_path / "bad.npy", np.array([1, 9, 2], np.int64))
    np.save(tmp_path / "f.npy", np.array([1.0, 4.0, 2.0]))
    res = _run("compile", tmp_path / "g.onnx", "--budget", "30s", "-o", tmp_path / "d.lumc")
    _one_line(res, "node 'embed_lookup'", "example inputs lumc drew", "--input NAME=FILE.npy")
    assert not (tmp_path / "d.lumc").exists()
    _one_line(_run("compile", tmp_path / "g.onnx", "--budget", "30s", "--input",
                   f"idz={tmp_path / 'ok.npy'}"), "unknown input 'idz'", "ids")
    _one_line(_run("compile", tmp_path / "g.onnx", "--budget", "30s", "--input",
                   f"ids={tmp_path / 'f.npy'}"), "float64", "int64")
    _one_line(_run("compile", tmp_path / "g.onnx", "--budget", "30s", "-o", tmp_path / "ok.npy",
                   "--input", f"ids={tmp_path / 'ok.npy'}"), "ok.npy")
    assert np.load(tmp_path / "ok.npy").tolist() == [1, 4, 2]      # the input file is intact
    res = _run("compile", tmp_path / "g.onnx", "--budget", "30s", "-o", tmp_path / "g.lumc",
               "--input", f"ids={tmp_path / 'ok.npy'}", "--quiet")
    assert res.exit_code == 0, res.output
    res = _run("run", tmp_path / "g.lumc", "--input", f"ids={tmp_path / 'ok.npy'}", "--check")
    assert res.exit_code == 0 and "matches onnxruntime" in res.output, res.output
    res = _run("run", tmp_path / "g.lumc", "--input", f"ids={tmp_path / 'bad.npy'}")
    _one_line(res, "node 'embed_lookup', op Gather", "gather index 18 out of range [0, 10)")


def test_content_hash_ignores_model_node_names():
    """A kernel's content hash keys the tuning database and render cache: a model node name
    (stored with an artifact's Gather) must not change it."""
    from lumc.ir.graph import Graph, const_node, node
    from lumc.ir.kernels import Kernel
    from lumc.ir.serialize import graph_from_bytes, graph_to_bytes
    ids = input_node("in0", (3,), dt.i64)
    table = const_node(np.arange(40, dtype=np.float32).reshape(10, 4) + 0.5)
    g = node("Gather", (table, ids), 0)
    k = Kernel("gather", Graph({"in0": ids}, {"out0": g}), ())
    before = k.content_hash()
    provenance.set_origin(g, "hash_probe_lookup", "Gather")
    assert k.content_hash() == before
    doc, npz, _ = graph_to_bytes(k.meaning)
    assert b"hash_probe_lookup" in doc and b"hash_probe_lookup" not in \
        graph_to_bytes(k.meaning, origins=False)[0]
    _, nodes = graph_from_bytes(doc, npz)
    assert [provenance.origin(n) for n in nodes if n.op == "Gather"] == \
        [("hash_probe_lookup", "Gather")]


def test_inputs_not_given_are_drawn_beside_those_given(db):
    """``example_inputs`` naming some inputs: the others are drawn (it said "missing input 'x'");
    a refusal at a drawn one still says what to give."""
    m = doubled_lookup()
    m.graph.input.append(oh.make_tensor_value_info("x", TP.FLOAT, [3, 4]))
    m.graph.node[2].CopyFrom(oh.make_node("Add", ["emb", "x"], ["y"], name="add"))
    ok, x = np.array([1, 4, 0], np.int64), np.full((3, 4), 0.5, np.float32)
    cm = lumc.compile(m.SerializeToString(), budget="30s", device="sim:h200", db=db,
                      example_inputs={"ids": ok})
    table = nh.to_array(m.graph.initializer[0])
    np.testing.assert_allclose(cm(ids=ok, x=x), table[ok * 2] + x, rtol=1e-6)
    with pytest.raises(IndexRangeError) as e:        # ids drawn in [0, 8): doubled, past 10 rows
        lumc.compile(m.SerializeToString(), budget="30s", device="sim:h200", db=db,
                     example_inputs={"x": x})
    assert "node 'embed_lookup'" in str(e.value) and "for the inputs not given" in str(e.value)


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_a_computed_scatter_index_outside_its_axis_is_refused(db, op):
    """A scatter index the model computes (no input check sees it) outside its axis hit no
    position, silently (onnxruntime refuses it): it is refused naming the scatter's node."""
    import onnxruntime as ort
    idx_shape = [1, 2] if op == "ScatterElements" else [1, 1]
    attrs = {"axis": 0} if op == "ScatterElements" else {}
    g = oh.make_graph(
        [oh.make_node("Mul", ["idx", "two"], ["idx2"], name="double"),
         oh.make_node(op, ["data", "idx2", "upd"], ["y"], name="scatter_rows", **attrs)],
        "g", [oh.make_tensor_value_info("data", TP.FLOAT, [4, 2]),
              oh.make_tensor_value_info("idx", TP.INT64, idx_shape),
              oh.make_tensor_value_info("upd", TP.FLOAT, [1, 2])],
        [oh.make_tensor_value_info("y", TP.FLOAT, [4, 2])],
        [nh.from_array(np.array(2, np.int64), "two")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    feed = {"data": np.arange(8, dtype=np.float32).reshape(4, 2), "upd": np.full((1, 2), -1.0,
                                                                                   np.float32)}
    first = np.zeros(idx_shape, np.int64)
    cm = lumc.compile(m.SerializeToString(), budget="30s", device="sim:h200", db=db,
                      example_inputs={**feed, "idx": first})
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    good = np.ones(idx_shape, np.int64)                       # row 2
    np.testing.assert_array_equal(cm(**feed, idx=good), sess.run(None, {**feed, "idx": good})[0])
    neg = np.full(idx_shape, -1, np.int64)                    # -2: row 2 from the end
    np.testing.assert_array_equal(cm(**feed, idx=neg), sess.run(None, {**feed, "idx": neg})[0])
    bad = np.full(idx_shape, 3, np.int64)                     # 6: past the 4 rows
    with pytest.raises(Exception):
        sess.run(None, {**feed, "idx": bad})
    with pytest.raises(IndexRangeError, match=rf"^node 'scatter_rows', op {op} \(primitive "
                                              r"Gather\): gather index 6 out of range \[0, 4\)$"):
        cm(**feed, idx=bad)


def test_torch_scatter_refuses_what_eager_refuses(db):
    """PyTorch's scatter refuses a negative index (ONNX counts it from the end: lumc took it) and
    one past the axis, given or computed; in range it equals eager."""
    class M(torch.nn.Module):
        def forward(self, x, i):
            return x.scatter(0, i, torch.ones(2)), x.scatter_add(0, i * 2, torch.ones(2))

    m = M()
    x, i = torch.zeros(4), torch.tensor([0, 1])
    f = lumc.compile(m, budget="30s", device="sim:h200", example_inputs=(x, i))
    for ok in (torch.tensor([1, 0]), torch.tensor([1, 1])):
        for g, w in zip(f(x, ok), m(x, ok)):
            torch.testing.assert_close(g, w)
    for bad, pattern in ((torch.tensor([-1, 1]), r"node 'scatter', op aten\.scatter\.src: index -1"),
                         (torch.tensor([1, 3]), r"node 'scatter_add', op aten\.scatter_add\.default "
                                                r"\(primitive Gather\): gather index 6")):
        with pytest.raises(RuntimeError, match="out of bounds"):
            m(x, bad)
        with pytest.raises((IndexRangeError, IndexRangeInputError), match=pattern):
            f(x, bad)


def test_the_scatter_range_check_adds_no_kernel(tmp_path, monkeypatch):
    """The check's Gather of an iota is its index: it is inlined into the scatter's kernels, read
    through the comparisons' broadcast views, not written by a kernel of its own (a decoding
    step's two cache writes at an input position: 7 kernels with it realized, 6 without)."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "compiler"))
    from test_torch_scatter import _CacheStep
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(0)
    q, kn, vn = (torch.randn(1, 2, 1, 8, generator=g) for _ in range(3))
    kc, vc = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(2))
    args = (q, kn, vn, kc, vc, torch.tensor([3]))
    f = lumc.compile(_CacheStep().eval(), budget="30s", example_inputs=args, device="sim:h200")
    cm = f.specializations[0].compiled
    # realized, the checked position was a kernel of its own: gather [Add (1,)] from the input
    assert len(cm.program.calls) == 6, [c.kernel.form for c in cm.program.calls]
    for got, ref in zip(f(*args[:5], torch.tensor([11])), _CacheStep()(*args[:5], torch.tensor([11]))):
        torch.testing.assert_close(got, ref)
    with pytest.raises((IndexRangeError, IndexRangeInputError), match="out of range"):
        f(*args[:5], torch.tensor([12]))


def test_gather_elements_index_past_its_axis_is_refused_not_read_from_the_next_row(tmp_path):
    """``GatherElements(x, ArgMax(x) + 2)`` along an axis of 4: an index of 5 in the middle of x
    was folded into the flat index of the next row's element 1 and read silently (onnxruntime
    refuses the node); only an index past the whole tensor was caught."""
    g = oh.make_graph(
        [oh.make_node("ArgMax", ["x"], ["am"], name="pick", axis=2, keepdims=1),
         oh.make_node("Add", ["am", "two"], ["idx"], name="shift"),
         oh.make_node("GatherElements", ["x", "idx"], ["y"], name="take_shifted", axis=2)],
        "g", [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3, 4])],
        [oh.make_tensor_value_info("y", TP.FLOAT, [2, 3, 1])],
        [nh.from_array(np.array(2, np.int64), "two")])
    path = tmp_path / "ge.onnx"
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]), path)
    x = np.zeros((2, 3, 4), np.float32)
    x[:, :, 0], x[:, :, 2] = 1.0, 0.5       # argmax 0 -> index 2: in range, reads 0.5
    x[0, 1] = [0, 0, 0, 7]                 # argmax 3 -> index 5: past the axis, inside the tensor
    np.save(tmp_path / "x.npy", x)
    _one_line(_run("run", path, "--input", f"x={tmp_path / 'x.npy'}"),
              "node 'take_shifted'", "GatherElements", "index 5 out of range [0, 4)")
    x[0, 1] = [0, 0, 7, 0]                 # argmax 2 -> index 4: past it too
    np.save(tmp_path / "x.npy", x)
    _one_line(_run("run", path, "--input", f"x={tmp_path / 'x.npy'}"),
              "node 'take_shifted'", "index 4 out of range [0, 4)")
    x[0, 1] = [0, 7, 0, 3]                 # argmax 1 -> index 3: in range, reads 3
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npz"
    res = _run("run", path, "--input", f"x={tmp_path / 'x.npy'}", "-o", out)
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.load(out)["y"][..., 0], [[0.5, 3, 0.5], [0.5, 0.5, 0.5]])


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_component_past_its_dim_is_refused(tmp_path, batch_dims):
    """``GatherND`` folds its index components into one flat index: a computed ``[0, 4]`` into
    a ``[3, 4]`` table read element ``[1, 0]``, silently; each component is now checked against
    its own dim. The index is ``i * i``, which no input range check covers."""
    g = oh.make_graph(
        [oh.make_node("Mul", ["i", "i"], ["idx"], name="square"),
         oh.make_node("GatherND", ["x", "idx"], ["y"], name="pick_cells", batch_dims=batch_dims)],
        "g", [oh.make_tensor_value_info("x", TP.FLOAT, [3, 4]),
              oh.make_tensor_value_info("i", TP.INT64, [3, 1] if batch_dims else [2, 2])],
        [oh.make_tensor_value_info("y", TP.FLOAT, None)])
    path = tmp_path / "gnd.onnx"
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]), path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "x.npy", x)
    i = np.array([[0], [2], [1]] if batch_dims else [[0, 2], [1, 1]], np.int64)   # 2 * 2 = 4
    np.save(tmp_path / "i.npy", i)
    _one_line(_run("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                   f"i={tmp_path / 'i.npy'}"),
              "node 'pick_cells'", "GatherND", "index 4 out of range [0, 4)")
    i[1 if batch_dims else 0, -1] = 1                                               # 1 * 1 = 1
    np.save(tmp_path / "i.npy", i)
    out = tmp_path / "y.npz"
    res = _run("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--input",
               f"i={tmp_path / 'i.npy'}", "-o", out)
    assert res.exit_code == 0, res.output
    want = [0, 5, 9] if batch_dims else [1, 5]
    np.testing.assert_array_equal(np.load(out)["y"].ravel(), want)


def test_nll_loss_class_past_c_is_refused_not_read_from_the_next_row(tmp_path):
    """``NegativeLogLikelihoodLoss`` picks ``-logp[n, target[n]]`` through the flat index: a
    computed class 5 of 4 at row 0 read ``logp[1, 1]`` (a loss of 9 here), silently."""
    g = oh.make_graph(
        [oh.make_node("Add", ["t", "one"], ["t1"], name="shift"),
         oh.make_node("NegativeLogLikelihoodLoss", ["x", "t1"], ["y"], name="nll",
                      reduction="none")],
        "g", [oh.make_tensor_value_info("x", TP.FLOAT, [3, 4]),
              oh.make_tensor_value_info("t", TP.INT64, [3])],
        [oh.make_tensor_value_info("y", TP.FLOAT, None)],
        [nh.from_array(np.array(1, np.int64), "one")])
    path = tmp_path / "nll.onnx"
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]), path)
    x = np.log(np.full((3, 4), 0.25, np.float32))
    x[1, 1] = -9.0
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "t.npy", np.array([4, 0, 0], np.int64))          # row 0: class 5
    _one_line(_run("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                   f"t={tmp_path / 't.npy'}"), "node 'nll'", "index 5 out of range [0, 4)")
    np.save(tmp_path / "t.npy", np.array([2, 0, 1], np.int64))          # classes 3, 1, 2
    out = tmp_path / "y.npz"
    res = _run("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--input",
               f"t={tmp_path / 't.npy'}", "-o", out)
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(out)["y"], [np.log(4), 9.0, np.log(4)], rtol=1e-6)
