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
