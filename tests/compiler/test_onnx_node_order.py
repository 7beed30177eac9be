"""ONNX graphs whose nodes are not in topological order, as onnxruntime accepts them
(``onnx_frontend.loader.sort_nodes``)."""
from __future__ import annotations

import numpy as np
import pytest


def test_nodes_out_of_order_are_sorted_as_onnxruntime_does():
    """onnxruntime runs a graph whose nodes are not in topological order (its float16 converter
    with keep_io_types=True writes its input casts last); lumc refused it with onnx.checker's
    error. It sorts them now (stably, subgraphs' reads of outer values counted) and leaves the
    user's proto as given; a cycle is still refused."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    import lumc
    from lumc.ir.errors import ModelError
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    one = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("Neg", ["h"], ["t"])], "then", [],
                             [one("t", TensorProto.FLOAT, [2, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"])], "else", [],
                              [one("e", TensorProto.FLOAT, [2, 4])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Relu", ["m"], ["h"]),       # read by the If's branches above
             helper.make_node("MatMul", ["x", "w"], ["m"])]
    g = helper.make_graph(nodes, "g", [one("x", TensorProto.FLOAT, [2, 8]),
                                       one("c", TensorProto.BOOL, [])],
                          [one("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 8)).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for c in (True, False):
        want = sess.run(None, {"x": x, "c": np.array(c)})[0]
        f = lumc.compile(m if c else m.SerializeToString(), budget="10s", device="sim:h200",
                         bind={"c": np.array(c)})
        np.testing.assert_allclose(f(x), want, rtol=1e-5, atol=1e-6)
    assert [n.op_type for n in m.graph.node] == ["If", "Relu", "MatMul"]    # the user's proto
    cyc = helper.make_graph([helper.make_node("Relu", ["b"], ["a"]),
                             helper.make_node("Relu", ["a"], ["b"])], "c", [],
                            [one("a", TensorProto.FLOAT, [2])])
    with pytest.raises(ModelError, match="onnx.checker"):
        lumc.compile(helper.make_model(cyc, opset_imports=[helper.make_opsetid("", 17)]),
                     budget="10s", device="sim:h200")
