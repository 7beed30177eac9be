"""Whole programs on the Triton backend: ``run_program`` on a small graph, and the four MODELS.md
models end to end through ``lumc run --backend triton --random --check`` (against onnxruntime) at
their smallest test shapes. Without a GPU this is the Triton interpreter, and the CLI says so."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library.norm import layer_norm, softmax
from lumc.ir.tensor import Tensor
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.launch import interpreter_mode
from lumc.backends.triton.runner import RunStats, run_program


def test_run_program_of_a_small_block_matches_the_reference():
    from lumc.compiler.core.fusion import greedy_program
    x = input_node("x", (2, 9, 16), dt.f32)
    w = input_node("w", (16, 16), dt.f32)
    g = input_node("g", (16,), dt.f32)
    t = Tensor(x)
    h = layer_norm(t, Tensor(g))[0] @ Tensor(w)
    a = softmax(h @ h.transpose(-1, -2) * 0.25, -1) @ h
    y = (a + t).reshape((18, 16)).sigmoid().sum(-1)
    graph = Graph({"x": x, "w": w, "g": g}, {"y": y.node, "h": h.node})
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((2, 9, 16)).astype(np.float32),
            "w": rng.standard_normal((16, 16)).astype(np.float32) * 0.3,
            "g": rng.standard_normal(16).astype(np.float32)}
    program = greedy_program(graph)
    stats = RunStats("test")
    got = run_program(program, feed, stats=stats)
    want = ReferenceExecutor(graph)(feed)
    assert stats.kernels == len(program) and set(stats.per_form) >= {"matmul", "reduction"}
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


MODELS = ["silero-vad", "magika", "minilm-l3", "ppocr-det"]


@pytest.mark.models
@pytest.mark.parametrize("name", MODELS)
def test_model_runs_on_triton_and_matches_onnxruntime(name, model_path):
    from lumc.compiler.frontends import models
    from lumc.compiler.tools.cli import cli
    shapes = models.MODEL_INFO[name].test_shapes[0]
    args = ["run", str(model_path(name)), "--random", "--check", "--backend", "triton"]
    for k, v in shapes.items():
        args += ["--shape", f"{k}={'x'.join(map(str, v))}"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "backend: triton" in res.output
    assert "match onnxruntime" in res.output or "output matches onnxruntime" in res.output
    if interpreter_mode():
        assert "interpreter (TRITON_INTERPRET=1" in res.output
