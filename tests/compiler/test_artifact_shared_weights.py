"""An ONNX artifact stores each weight once: a constant that is a source initializer byte for byte
is read back from ``source.onnx`` (a MiniLM artifact was 137.7 MB for a 69.1 MB model)."""
import io
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lumc
from lumc.ir.errors import ArtifactError
from tests.compiler.test_artifact import _doctor


def _model(w1: np.ndarray, w2: np.ndarray) -> onnx.ModelProto:
    """``y = relu(x @ w1) @ w2 + b``: w1 and w2 are read as they are; ``b`` (512 bytes) is too
    small to share."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y0"]),
             helper.make_node("Add", ["y0", "b"], ["y"])]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, w1.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, w2.shape[1]])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(w2[0].copy(), "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((128, 256)).astype(np.float32)     # 128 KB
    w2 = rng.standard_normal((256, 128)).astype(np.float32)
    model = _model(w1, w2)
    cm = lumc.compile(model, budget="20s", device="sim:h200")
    path = tmp_path_factory.mktemp("art") / "m.lumc"
    cm.save(path)
    return model, cm, path, (w1, w2)


def test_weights_are_stored_once_and_read_back(saved):
    model, cm, path, (w1, w2) = saved
    src = model.SerializeToString()
    with zipfile.ZipFile(path) as z:
        sizes = {i.filename: i.file_size for i in z.infolist()}
        consts = np.load(io.BytesIO(z.read("consts.npz")))
        named = {str(consts[k][0]) for k in consts.files if k.startswith("s")}
    assert named == {"w1", "w2"}
    # before: the weights twice (source.onnx and consts.npz)
    assert sizes["consts.npz"] < 0.1 * (w1.nbytes + w2.nbytes), sizes
    back = lumc.load(path)
    assert back.source_onnx == src                     # the source is kept byte for byte
    x = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ w1, 0) @ w2 + w2[0]
    np.testing.assert_allclose(back(x), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(back(x), cm(x))


def _load_with_source(saved, tmp_path, edit) -> str:
    """The one-line ArtifactError of loading the saved artifact with ``edit(model)`` applied to
    its ``source.onnx`` (the manifest's hash fixed, so only the content is wrong)."""
    model, _, path, _ = saved
    other = onnx.ModelProto()
    other.CopyFrom(model)
    edit(other)
    bad = tmp_path / "bad.lumc"
    _doctor(path, bad, "source.onnx", other.SerializeToString())
    with pytest.raises(ArtifactError) as e:
        lumc.load(bad)
    msg = str(e.value)
    assert "\n" not in msg and "bad.lumc" in msg, msg
    return msg


def test_a_source_without_the_named_weight_is_a_clear_error(saved, tmp_path):
    msg = _load_with_source(saved, tmp_path,
                            lambda m: setattr(m.graph.initializer[0], "name", "renamed"))
    assert "'w1'" in msg and "source.onnx" in msg


def test_a_weight_of_another_size_in_the_source_is_a_clear_error(saved, tmp_path):
    msg = _load_with_source(saved, tmp_path, lambda m: m.graph.initializer[1].CopyFrom(
        numpy_helper.from_array(np.zeros((2, 2), np.float32), "w2")))
    assert "'w2'" in msg and "not the one compiled" in msg


def test_an_initializer_name_used_twice_is_not_shared():
    """A name that a subgraph's initializer also uses cannot say which it is: stored by value."""
    from lumc.compiler.runtime.source_refs import SharedWeights
    w = np.arange(1 << 15, dtype=np.float32)
    then = helper.make_graph([helper.make_node("Identity", ["w"], ["o"])], "then", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
                             [numpy_helper.from_array(w + 1, "w")])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    src = helper.make_model(g).SerializeToString()
    assert SharedWeights(src)(w) is None
    once = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])).SerializeToString()
    assert SharedWeights(once)(w)[0] == "w"
    assert SharedWeights(once)(w + 0)[0] == "w" and SharedWeights(once)(w * 2) is None


def test_a_source_weight_with_other_values_is_a_clear_error(saved, tmp_path):
    """source.onnx edited: w1 keeps its name, dtype and shape but not its values. Loading ran on
    the edited weight, and ``lumc run --check`` agreed with onnxruntime on the same edited source,
    so wrong outputs went unnoticed."""
    w1 = saved[3][0]
    msg = _load_with_source(saved, tmp_path, lambda m: m.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(w1 * 2, "w1")))
    assert "'w1'" in msg and "not the one compiled" in msg


def test_weights_concatenated_at_compile_time_are_stored_as_their_parts(tmp_path):
    """Q/K/V projections of one input become one contraction over a weight the compile
    concatenated (``rewrites/horizontal.py``); that weight was stored by value, a third copy of
    every projection (5.8 of MiniLM's 74.9 MB). It is now stored as the initializers' names, in
    order, and rebuilt row by row on load; a part whose values changed is refused."""
    rng = np.random.default_rng(3)
    ws = [rng.standard_normal((128, 160)).astype(np.float32) for _ in range(3)]   # 80 KB each
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"]) for i in range(3)]
    nodes.append(helper.make_node("Concat", ["p0", "p1", "p2"], ["y"], axis=0))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [24, 160])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = lumc.compile(model, budget="20s", device="sim:h200")
    path = tmp_path / "m.lumc"
    cm.save(path)
    with zipfile.ZipFile(path) as z:
        consts = np.load(io.BytesIO(z.read("consts.npz")))
        refs = [[str(v) for v in consts[k]] for k in consts.files if k.startswith("s")]
        stored = sum(consts[k].nbytes for k in consts.files if k.startswith("c"))
    assert any(len(r) > 2 for r in refs), refs            # a concatenation stored as its parts
    assert {n for r in refs for n in r[:-1]} <= {"w0", "w1", "w2"}
    assert stored < 0.1 * sum(w.nbytes for w in ws)
    x = rng.standard_normal((8, 128)).astype(np.float32)
    want = np.concatenate([x.astype(np.float64) @ w for w in ws], axis=0)
    back = lumc.load(path)
    np.testing.assert_allclose(back(x), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(back(x), cm(x))
    msg = _load_with_source((model, cm, path, None), tmp_path, lambda m: m.graph.initializer[1]
                            .CopyFrom(numpy_helper.from_array(ws[1] * 2, "w1")))
    assert "w1" in msg and "not the one compiled" in msg


def test_a_concatenation_is_matched_only_when_every_part_is_an_initializer():
    from lumc.compiler.runtime.source_refs import SharedWeights
    a, b = (np.arange(64 * 300, dtype=np.float32).reshape(64, 300) + k for k in (0, 1e6))
    src = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["a"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])).SerializeToString()
    sw = SharedWeights(src)
    assert sw(np.concatenate([b, a, b], axis=1))[:-1] == ("b", "a", "b")
    assert sw(np.concatenate([a, a[:, :7]], axis=1)) is None           # a part no initializer is
    assert sw(np.concatenate([a, b], axis=0)) is None                  # rows, not the last axis
    assert sw(np.concatenate([a, b], axis=1).T.copy()) is None
