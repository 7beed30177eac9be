"""The tensors of an ONNX model and the external data files they name.

Shared by the ONNX loader (``frontends/onnx_frontend/loader.py``: it checks the files exist) and the
runtime's output guards (``artifact.model_files``: an output must never replace one of them), which
may not import the frontends (imports point one way: tools -> core -> frontends -> runtime).
"""
from __future__ import annotations

import onnx
from onnx import TensorProto


def graph_tensors(graph: onnx.GraphProto):
    """Every initializer and attribute tensor of ``graph`` and its subgraphs."""
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from graph_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from graph_tensors(g)


def external_data_locations(model: onnx.ModelProto) -> list[str]:
    """The file names (``location``, relative to the model's folder) that the model's tensors keep
    their data in, sorted, each once; ``[]`` for a model with none."""
    return sorted({e.value for t in graph_tensors(model.graph)
                   if t.data_location == TensorProto.EXTERNAL
                   for e in t.external_data if e.key == "location" and e.value})
