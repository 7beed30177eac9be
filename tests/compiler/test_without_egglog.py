"""lumc without egglog, as on the GPU image (``make gpu-check``): every module imports, a compile
falls back to the greedy program and says so, and the GPU tests collect (a collection error in any
test module would interrupt ``pytest -m gpu`` before it ran one test)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COMPILE = """
import numpy as np
from lumc.compiler.core.pipeline import compile_graph
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import norm
from lumc.ir.tensor import Tensor
x = Tensor(input_node("x", (4, 8), dt.f32))
w = Tensor.const(np.eye(8, dtype=np.float32))
y = norm.layer_norm(x @ w + x, Tensor.const(np.ones(8, np.float32)))[0]
cm = compile_graph(Graph({"x": x.node}, {"y": y.node}), budget="20s", device="sim:h200")
r = cm.report_dict()
xv = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
s = xv @ np.eye(8) + xv
ref = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-5)
assert np.abs(cm.run({"x": xv})["y"] - ref).max() < 1e-4
print("EGRAPH", r["egraph_used"], r["egraph"]["error"])
"""


def _env(tmp_path: Path) -> dict:
    shim = tmp_path / "shim" / "egglog"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'egglog\'")\n')
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "shim"), LUMC_CACHE_DIR=str(tmp_path / "c"))
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def test_a_compile_without_egglog_uses_the_greedy_program_and_says_so(tmp_path):
    p = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True,
                       env=_env(tmp_path), cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("EGRAPH"))
    assert line.startswith("EGRAPH False e-graph stage unavailable") and "egglog" in line


def test_the_gpu_tests_collect_without_egglog(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu",
                        "-p", "no:cacheprovider", "tests"], capture_output=True, text=True,
                       env=_env(tmp_path), cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "error" not in p.stdout.splitlines()[-1].lower(), p.stdout[-2000:]
