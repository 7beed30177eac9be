import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import Graph, const_node, input_node, node, toposort
from lumc.ir.tensor import Tensor


def test_hash_consing_shares_equal_nodes():
    x = input_node("x", (4,), dt.f32)
    a = node("Exp2", (x,))
    b = node("Exp2", (x,))
    assert a is b
    c1 = const_node(np.arange(3, dtype=np.float32))
    c2 = const_node(np.arange(3, dtype=np.float32))
    assert c1 is c2
    assert const_node(np.arange(3, dtype=np.int32)) is not c1


def test_cse_by_construction_in_tensor_expressions():
    x = Tensor(input_node("x", (3, 5), dt.f32))
    y = (x.exp() + 1.0) * (x.exp() + 1.0)
    g = Graph({"x": x.node}, {"y": y.node})
    assert g.op_counts()["Exp2"] == 1


def test_nodes_are_immutable():
    x = input_node("x", (2,), dt.f32)
    with pytest.raises(AttributeError):
        x.op = "Add"


def test_shape_and_dtype_rules_raise_naming_the_op():
    x = input_node("x", (2, 3), dt.f32)
    y = input_node("y", (3, 2), dt.f32)
    with pytest.raises(ShapeError, match="op Add"):
        node("Add", (x, y))
    i = input_node("i", (2, 3), dt.i32)
    with pytest.raises(ShapeError, match="float"):
        node("Exp2", (i,))
    with pytest.raises(ShapeError, match="dtypes differ"):
        node("Mul", (x, i))


def test_toposort_operands_first_and_deep_graphs():
    x = Tensor(input_node("x", (2,), dt.f32))
    y = x
    for _ in range(5000):  # deep chains must not hit the recursion limit
        y = y.add(1.0)
    order = toposort([y.node])
    pos = {id(n): k for k, n in enumerate(order)}
    for n in order:
        for s in n.srcs:
            assert pos[id(s)] < pos[id(n)]


def test_dump_is_readable():
    x = Tensor(input_node("x", (2, 3), dt.f32))
    g = Graph({"x": x.node}, {"y": x.sum(1).node})
    text = g.dump()
    assert "Input('x') : f32[2, 3]" in text
    assert "SumReduce" in text and "-> y" in text
