"""e2e fixtures: a wall-time log printed at the end of the run, and small ONNX models for the CLI."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

_TIMINGS: list[tuple[str, str]] = []

# Weights of the tiny CLI model: y = x @ W + b; k2 = k + k (an exact integer output).
TINY_W = np.array([[1.0, -2.0], [0.5, 0.25], [-1.0, 3.0]], dtype=np.float32)
TINY_B = np.array([0.125, -0.5], dtype=np.float32)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private ``LUMC_CACHE_DIR`` for one test (files that opt in: ``pytestmark =
    pytest.mark.usefixtures("cache_dir")``); its path."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def linear(tmp_path):
    """``y = x @ W`` (x: f32[4, 32], W: 32 x 16 constant, random; int8 weights cost ~1e-2): the
    ONNX file's path."""
    w = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(w, "W")])
    p = tmp_path / "linear.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


@pytest.fixture
def record_time(request):
    """``record_time(what, seconds)``: adds a line to the 'e2e wall times' section of the report."""
    def rec(what: str, seconds: float) -> None:
        _TIMINGS.append((request.node.name, f"{what} {seconds:.3f} s"))
    return rec


def pytest_terminal_summary(terminalreporter):
    if _TIMINGS:
        terminalreporter.section("e2e wall times")
        for test, line in _TIMINGS:
            terminalreporter.write_line(f"{test}: {line}")


def tiny_model() -> onnx.ModelProto:
    """Inputs x: f32[n, 3], k: i64[n, 2] (n dynamic); outputs y = x @ W + b (f32[n, 2]), k2 = 2k."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, ["n", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    k2 = helper.make_tensor_value_info("k2", TensorProto.INT64, ["n", 2])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["y"]),
             helper.make_node("Add", ["k", "k"], ["k2"])]
    graph = helper.make_graph(nodes, "tiny", [x, k], [y, k2],
                              [numpy_helper.from_array(TINY_W, "W"), numpy_helper.from_array(TINY_B, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def unsupported_model() -> onnx.ModelProto:
    """A model whose one node is an op no one implements (custom domain)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], name="frob0",
                                                domain="com.example")], "unsupported", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """Path of :func:`tiny_model` saved to disk (weights ``TINY_W``, ``TINY_B``)."""
    path = tmp_path_factory.mktemp("models") / "tiny.onnx"
    onnx.save(tiny_model(), path)
    return path


@pytest.fixture(scope="session")
def tiny_weights():
    """``(W, b)`` of the tiny model."""
    return TINY_W, TINY_B


@pytest.fixture(scope="session")
def unsupported_path(tmp_path_factory):
    """Path of :func:`unsupported_model` saved to disk."""
    path = tmp_path_factory.mktemp("models") / "unsup.onnx"
    onnx.save(unsupported_model(), path)
    return path
