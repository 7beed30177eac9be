"""Constant folding before the e-graph (``lumc.compiler.core.constfold``): results agree with the
reference executor on the unfolded graph, the identity gather disappears, big broadcasts stay."""
import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.constfold import MAX_FOLD_ELEMS, fold_constants
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node, input_node, node
from lumc.ir.tensor import Tensor


def _mask_graph(perm: np.ndarray) -> Graph:
    """BERT's mask preparation as torch.export writes it: an index computed from constants
    (negative indices wrapped), a gather of the cast mask by it, a select."""
    m = input_node("mask", (1, 8), dt.i64)
    ar = Tensor(const_node(perm.astype(np.int64))).reshape((1, 1, 1, 8))
    zero = Tensor(const_node(np.array(0, np.int64)))
    idx = ar.lt(zero).where(ar.add(Tensor(const_node(np.array(8, np.int64)))), ar)
    keep = Tensor(node("Gather", (Tensor(m).cast(dt.bool_).reshape((8,)).node, idx.node), 0))
    y = keep.where(Tensor(const_node(np.float32(1.5))), Tensor(const_node(np.float32(-2.0))))
    return Graph({"mask": m}, {"y": y.node})


def test_identity_gather_of_the_mask_becomes_a_view():
    g = _mask_graph(np.arange(8))
    f = fold_constants(g)
    assert "Gather" in g.op_counts() and "Gather" not in f.op_counts()
    assert f.op_counts().get("LessThan", 0) == 0   # the index computation is folded away
    feed = {"mask": np.array([[1, 1, 0, 1, 0, 0, 1, 1]], np.int64)}
    np.testing.assert_array_equal(ReferenceExecutor(f)(feed)["y"], ReferenceExecutor(g)(feed)["y"])


def test_a_permuting_gather_stays_and_agrees():
    g = _mask_graph(np.array([7, 6, 5, 4, 3, 2, 1, 0]) - 8)   # negative: wrapped by the where
    f = fold_constants(g)
    assert "Gather" in f.op_counts() and f.op_counts().get("LessThan", 0) == 0
    feed = {"mask": np.array([[1, 1, 0, 1, 0, 0, 1, 0]], np.int64)}
    got, want = ReferenceExecutor(f)(feed)["y"], ReferenceExecutor(g)(feed)["y"]
    np.testing.assert_array_equal(got, want)
    assert got[0, 0, 0, 0] == -2.0 and got[0, 0, 0, 7] == 1.5   # reversed order


def test_only_small_index_arithmetic_is_folded():
    table = input_node("t", (1 << 17,), dt.f32)
    two = Tensor(const_node(np.array(2, np.int64))).expand((1 << 17,))
    big = two.add(Tensor(const_node(np.array(3, np.int64))))   # an index too big to fold
    assert big.node.numel > MAX_FOLD_ELEMS
    g = Graph({"t": table}, {"y": node("Gather", (table, big.node), 0)})
    assert fold_constants(g) is g
    x = input_node("x", (4, 8), dt.i64)   # not an index: left to the e-graph's algebra folds
    five = Tensor(const_node(np.array(2, np.int64))).add(Tensor(const_node(np.array(3, np.int64))))
    g2 = Graph({"x": x}, {"y": Tensor(x).mul(five).node})
    assert fold_constants(g2) is g2


def test_a_model_whose_outputs_are_empty_launches_no_kernel():
    """Rows of length 0 (``[3, 0]``) or no rows (``[0, 5]``): a LogSoftmax, a CumSum, a
    LayerNorm and a Softmax over nothing compiled to one kernel per op (7 and 10 kernels, each
    launched over no element); every value of these outputs is empty, so none is computed, with
    or without the e-graph (the greedy program is built from the folded graph too). The
    outputs keep their shapes and dtypes, and onnxruntime's (empty) values."""
    from onnx import TensorProto, helper, numpy_helper
    import lumc
    from tests.compiler.test_onnx_edge_values import onnxruntime_outputs
    for shape in [(3, 0), (0, 5)]:
        f = TensorProto.FLOAT
        d = shape[-1]
        nodes = [helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1),
                 helper.make_node("CumSum", ["y", "ax"], ["z"]),
                 helper.make_node("Softmax", ["x"], ["s"], axis=0)]
        inits = [numpy_helper.from_array(np.array(1, np.int64), "ax")]
        outs = ["y", "z", "s"]
        if d:
            nodes.append(helper.make_node("LayerNormalization", ["x", "w", "b"], ["n"], axis=-1))
            inits += [numpy_helper.from_array(np.ones(d, np.float32), "w"),
                      numpy_helper.from_array(np.zeros(d, np.float32), "b")]
            outs.append("n")
        g = helper.make_graph(nodes, "empty", [helper.make_tensor_value_info("x", f, shape)],
                              [helper.make_tensor_value_info(o, f, shape) for o in outs], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        x = np.zeros(shape, np.float32)
        for egraph in (True, False):     # --no-egraph folds them too (it launched 7 kernels)
            c = lumc.compile(m, budget="20s", device="sim:h200", reuse_plan=False,
                             use_egraph=egraph)
            assert len(c.program.calls) == 0, (shape, [k.kernel.form for k in c.program.calls])
            got = c.run({"x": x})
            for o, ref in zip(outs, onnxruntime_outputs(m, {"x": x})):
                assert got[o].shape == ref.shape == shape and got[o].dtype == np.float32, o
