"""E-graph candidates carried to a machine without egglog (``lumc.compiler.core.carried``): written
after an e-graph run, rebuilt on another graph object of the same model with no weights in the
file, refused for another model, and used by a compile in a process where egglog does not import."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core import carried
from lumc.compiler.core.egraph_pipeline import egraph_candidates
from lumc.compiler.runtime.program import run_program_reference

ROOT = Path(__file__).resolve().parents[2]

# a post-LN block with separate q/k/v projections (horizontal fusion concatenates their weights at
# compile time) and attention; built the same way in this process and in the subprocess
MODEL = """
import numpy as np
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import activations, norm
from lumc.ir.tensor import Tensor


def model(seed=0):
    rng = np.random.default_rng(seed)
    t, d, h = 12, 160, 4
    w = lambda *s: Tensor.const((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32))
    x = Tensor(input_node("x", (1, t, d), dt.f32))
    q, k, v = (x @ w(d, d) + w(d) for _ in range(3))
    q, k, v = (z.reshape((1, t, h, d // h)).transpose(1, 2) for z in (q, k, v))
    a = norm.softmax((q @ k.transpose(-1, -2)).mul(Tensor.const(np.float32(0.35))), -1) @ v
    a = a.transpose(1, 2).reshape((1, t, d)) @ w(d, d)
    y = norm.layer_norm(a + x, Tensor.const(np.ones(d, np.float32)))[0]
    z = activations.relu(y @ w(d, 2 * d)) @ w(2 * d, d) + y
    return Graph({"x": x.node}, {"z": z.node})
"""


def _model(seed=0):
    ns: dict = {}
    exec(MODEL, ns)
    return ns["model"](seed)


def test_candidates_round_trip_without_weights(tmp_path):
    g = _model()
    res = egraph_candidates(g, "h200", k=16)
    path = carried.dump(g, res.candidates, tmp_path, "block")
    assert path is not None
    body = json.loads(path.read_text())
    assert any(how[0] == "h" for how in body["leaves"].values())     # a concatenated weight
    assert path.with_suffix(".npz").stat().st_size < 50_000           # no weights inside
    g2 = _model()                                                     # another graph object
    got, why = carried.load(g2, tmp_path)
    assert got and "carried from" in why, why
    want = {p.label: p.form_counts() for p in res.candidates}
    assert {p.label: p.form_counts() for p in got} == want
    assert any(p.label.endswith("+norm-on-load") for p in got)
    feed = {"x": np.random.default_rng(1).standard_normal((1, 12, 160)).astype(np.float32)}
    ref = ReferenceExecutor(g2, "float64")(feed)["z"]
    for p in got:
        out = run_program_reference(p, g2, feed)["z"]
        assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max(), p.label


def test_another_model_gets_no_candidates(tmp_path):
    g = _model()
    carried.dump(g, egraph_candidates(g, "h200", k=4).candidates, tmp_path, "block")
    got, why = carried.load(_model(seed=1), tmp_path)     # other weights, same shapes
    assert got == [] and "match" in why
    got, why = carried.load(_model(), tmp_path / "missing")
    assert got == [] and "0 files" in why


def test_a_compile_without_egglog_searches_the_carried_candidates(tmp_path):
    g = _model()
    carried.dump(g, egraph_candidates(g, "h200", k=16).candidates, tmp_path / "carry", "block")
    shim = tmp_path / "shim" / "egglog"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'egglog\'")\n')
    script = MODEL + """
from lumc.compiler.core.pipeline import compile_graph
g = model()
cm = compile_graph(g, budget="30s", device="sim:h200")
r = cm.report_dict()
xv = np.random.default_rng(1).standard_normal((1, 12, 160)).astype(np.float32)
from lumc.backends.reference import ReferenceExecutor
ref = ReferenceExecutor(g, "float64")({"x": xv})["z"]
err = float(np.abs(cm.run({"x": xv})["z"] - ref).max() / np.abs(ref).max())
print("RESULT", r["egraph_used"], r["candidate_label"], r["kernels"], err)
print("CARRIED", r["egraph"]["carried"])
"""
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "shim"), LUMC_CACHE_DIR=str(tmp_path / "c"),
               LUMC_CARRIED_CANDIDATES=str(tmp_path / "carry"))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = dict(ln.split(" ", 1) for ln in p.stdout.splitlines() if ln.startswith(("RESULT", "CARRIED")))
    used, label, kernels, err = res["RESULT"].split()
    assert used == "True" and label.startswith("egraph-") and float(err) <= 1e-4, res
    assert "e-graph candidates carried from" in res["CARRIED"]
