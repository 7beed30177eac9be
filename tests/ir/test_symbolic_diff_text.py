"""The words ``same_graph`` gives for two graphs that differ: the refusal of a size range quotes
them, so two views that differ only in their masks must not read alike."""
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node, node
from lumc.ir.symbolic import same_graph
from lumc.ir.views import View


def test_views_that_differ_only_in_mask_are_told_apart():
    x = input_node("x", (5, 4), dt.f32)
    a = node("View", (x,), View._make((5, 5), (4, 1), 0, ((0, 5), (0, 4))))
    b = node("View", (x,), View._make((5, 5), (4, 1), 0, ((0, 5), (0, 3))))
    text = same_graph(Graph({"x": x}, {"y": a}), Graph({"x": x}, {"y": b}))
    assert text is not None
    left, right = text.split(" vs ")
    assert left.split("View: ")[1] != right.rstrip(")"), text
    assert "mask [[0, 5], [0, 4]]" in text and "mask [[0, 5], [0, 3]]" in text, text
