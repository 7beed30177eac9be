"""Index expressions (elementwise ops and views over iotas and scalars) are kept as computations at
import, not folded into constant arrays: a causal mask built from ``arange`` reaches the attention
kernel as the causal triangle (SDPA's ``is_causal``, FlashAttention), not as an opaque input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import lumc
from lumc.backends.extern import attention_plan, sdpa_mask_kind
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend.folding import ConstantFolder
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node
from lumc.ir.tensor import Tensor


def _value(t: Tensor) -> np.ndarray:
    return ReferenceExecutor(Graph({}, {"v": t.node}))({})["v"]


@pytest.mark.parametrize("L,S", [(5, 5), (3, 7), (1, 4)])
def test_folder_keeps_index_expressions(L, S):
    folder = ConstantFolder()
    i = folder.fold(Tensor.iota((L,), 0).mul(1).add(0))           # arange(L) + 0, as exported
    j = folder.fold(Tensor.iota((S,), 0).mul(1).add(0))
    mask = folder.fold(j.reshape((1, S)).le(i.reshape((L, 1))).reshape((1, 1, L, S)))
    assert mask.node.op != "Constant"
    np.testing.assert_array_equal(_value(mask)[0, 0], np.tri(L, S, dtype=bool))
    assert np.array_equal(folder.value(mask)[0, 0], np.tri(L, S, dtype=bool))   # handlers see it


def test_folder_still_folds_what_reads_a_constant_array():
    folder = ConstantFolder()
    table = Tensor(const_node(np.arange(6, dtype=np.float32) * 0.5))
    rope = folder.fold(Tensor.iota((6,), 0, dt.f32).mul(table))     # positions x inverse frequencies
    assert rope.node.op == "Constant"
    np.testing.assert_array_equal(rope.node.arg.value, np.arange(6) * np.arange(6) * 0.5)
    s = folder.fold(Tensor(const_node(np.array(3.0, np.float32))).mul(2.0))
    assert s.node.op == "Constant" and float(s.node.arg.value) == 6.0


class _HFCausal(torch.nn.Module):
    """Attention with the mask built as transformers builds it for GPT-2 and Llama (``sdpa_mask``:
    ``arange`` positions compared and expanded), handed to SDPA as a boolean ``attn_mask``."""

    def forward(self, q, k, v):
        L, S = q.shape[-2], k.shape[-2]
        qi = (torch.arange(L) + 0)[None, None, :, None]
        kj = (torch.arange(S) + 0)[None, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(kj <= qi).expand(1, -1, L, S))


@pytest.mark.parametrize("L", [16, 23])
def test_arange_causal_mask_reaches_attention_as_causal(tmp_path, monkeypatch, L):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(1, 2, L, 16, generator=g) for _ in range(3))
    f = lumc.compile(_HFCausal(), budget="20s", example_inputs=(q, k, v), device="sim:h200")
    calls = f.specializations[0].compiled.program.calls
    att = [c for c in calls if attention_plan(c.kernel) is not None]
    assert att, [c.kernel.form for c in calls]
    for c in att:
        assert sdpa_mask_kind(c.kernel) == "causal"
        assert not any(n.op == "Constant" and n.numel > 1 for n in c.inputs)   # no mask array read
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    got = np.asarray(f(q, k, v))
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_onnx_range_mask_is_an_index_expression():
    from lumc.compiler.frontends.onnx_frontend.importer import import_onnx
    c = lambda name, v: helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, TensorProto.INT64, [], [v]))
    nodes = [c("z", 0), c("n", 8), c("one", 1),
             helper.make_node("Range", ["z", "n", "one"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "ax"], ["col"]),
             helper.make_node("LessOrEqual", ["r", "col"], ["tri"]),
             helper.make_node("Where", ["tri", "x", "ninf"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
                          initializer=[helper.make_tensor("ax", TensorProto.INT64, [1], [1]),
                                       helper.make_tensor("ninf", TensorProto.FLOAT, [], [-np.inf])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(m).graph
    assert not [n for n in graph.nodes() if n.op == "Constant" and n.numel > 1]
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    y = ReferenceExecutor(graph)({"x": x})["y"]
    np.testing.assert_array_equal(y, np.where(np.tri(8, dtype=bool), x, -np.inf))


class _Fn(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


@pytest.mark.parametrize("name,f", [
    ("eye operand", lambda x: x @ torch.eye(16)),
    ("tril operand", lambda x: torch.tril(torch.ones(8, 8)) @ x),
])
def test_an_index_expression_a_contraction_reads_is_one_constant_not_a_kernel(tmp_path, monkeypatch,
                                                                               name, f):
    """No kernel forms eye(n) or tril(ones) on load: folded before the e-graph, the matmul reads
    it as it reads a weight (one kernel, as before index expressions were kept)."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    cm = lumc.compile(_Fn(f), budget="20s", example_inputs=(x,), device="sim:h200")
    calls = cm.specializations[0].compiled.program.calls
    assert len(calls) == 1, [c.kernel.form for c in calls]
    assert torch.allclose(torch.as_tensor(cm(x)), _Fn(f)(x), rtol=1e-5, atol=1e-5)


def test_transcendentals_of_positions_fold_at_import():
    folder = ConstantFolder()
    t = folder.fold(Tensor.iota((8,), 0, dt.f32).mul(0.1).sin())
    assert t.node.op == "Constant"
