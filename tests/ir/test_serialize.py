import ml_dtypes
import numpy as np
import pytest

from lumc.backends.reference import run_reference
from lumc.ir import dtypes as dt
from lumc.ir.errors import ArtifactError
from lumc.ir.graph import Graph, input_node
from lumc.ir.serialize import graph_from_bytes, graph_to_bytes
from lumc.ir.tensor import Tensor


def test_roundtrip_runs_identically():
    x = Tensor(input_node("x", (3, 4), dt.f32))
    w = Tensor.const(np.arange(20, dtype=np.float32).reshape(4, 5) / 7)
    bw = Tensor.const(np.ones(5, ml_dtypes.bfloat16)).cast(dt.f32)
    y = x.matmul(w).add(bw).pad([(1, 0), (0, 2)], value=-1.0).max(0)
    idx = Tensor.iota((3, 4), 1).cast(dt.f32)
    g = Graph({"x": x.node}, {"y": y.node, "z": x.add(idx).node})
    doc, npz, index = graph_to_bytes(g)
    g2, nodes = graph_from_bytes(doc, npz)
    assert len(nodes) == len(g.nodes()) == len(index)
    assert g2.outputs["y"] is g.outputs["y"]     # hash-consing: the same nodes come back
    xs = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    for k in ("y", "z"):
        np.testing.assert_array_equal(run_reference(g, xs)[k], run_reference(g2, xs)[k])


def test_corrupt_or_foreign_graph_is_one_error():
    x = Tensor(input_node("x", (2,), dt.f32))
    doc, npz, _ = graph_to_bytes(Graph({"x": x.node}, {"y": x.exp().node}))
    with pytest.raises(ArtifactError, match="format"):
        graph_from_bytes(doc.replace(b"lumc-graph/1", b"other/9"), npz)
    with pytest.raises(ArtifactError, match="corrupt"):
        graph_from_bytes(doc[: len(doc) // 2], npz)
    with pytest.raises(ArtifactError, match="corrupt"):
        graph_from_bytes(doc, npz[:10])
