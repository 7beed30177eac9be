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
