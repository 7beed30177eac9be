"""``lumc inspect ART --why-not``: every producer -> consumer pair of the chosen program is named
with the fusion decision and the rule that would be needed; the artifact carries it."""
import numpy as np
from click.testing import CliRunner

from lumc.compiler.tools.cli import cli
from lumc.compiler.core.pipeline import compile_graph
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node, input_node
from lumc.ir.tensor import Tensor


def _ln(x: Tensor) -> Tensor:
    """A layer norm over the last dim as the library's primitives spell it (no scale, no bias)."""
    d = x.sub(x.mean((2,), keepdims=True))
    return d.mul(d.mul(d).mean((2,), keepdims=True).add(
        Tensor(const_node(np.float32(1e-5)))).sqrt().recip())


def _x_w(seed: int, n: int) -> tuple[Tensor, Tensor]:
    w = np.random.default_rng(seed).standard_normal((32, n)).astype(np.float32)
    return Tensor(input_node("x", (1, 8, 32), dt.f32)), Tensor(const_node(w))


def _pre_ln_block() -> Graph:
    x, w = _x_w(0, 48)
    return Graph({"x": x.node}, {"y": (_ln(x) @ w).node})


def _post_ln_block() -> Graph:
    x, w = _x_w(1, 32)
    return Graph({"x": x.node}, {"y": _ln((x @ w).add(x)).node})


def test_pre_ln_block_is_one_kernel_with_nothing_to_explain(tmp_path, monkeypatch):
    """The normalization is formed on load in the contraction (pre-LN fusion)."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    cm = compile_graph(_pre_ln_block(), budget="30s", device="sim:h200")
    assert [c.kernel.form for c in cm.program.calls] == ["matmul"]
    assert cm.program.label.endswith("+norm-prologue")
    assert cm.report_dict()["why_not"]["pairs"] == []


def test_why_not_names_both_kernels_and_the_missing_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    cm = compile_graph(_post_ln_block(), budget="30s", device="sim:h200")
    doc = cm.report_dict()["why_not"]
    forms = [(e["producer_form"], e["consumer_form"]) for e in doc["pairs"]]
    assert ("matmul", "layernorm") in forms
    e = doc["pairs"][forms.index(("matmul", "layernorm"))]
    assert "whole-row epilogue" in e["rule"] and e["value"] == "f32[1, 8, 32]"
    assert e["fusion"]
    assert len(doc["pairs"]) == len(cm.program.calls) - 1   # a chain: one pair per edge
    art = tmp_path / "m.lumc"
    cm.save(art)
    res = CliRunner().invoke(cli, ["inspect", str(art), "--why-not"])
    assert res.exit_code == 0, res.output
    assert "#0 matmul -> #1 layernorm (f32[1, 8, 32]): not one kernel" in res.output
    assert "rule:   no kernels rule offers residual add + LayerNorm as a whole-row" in res.output


def test_a_norm_also_read_as_a_residual_is_named_with_that_reader(tmp_path, monkeypatch):
    """Post-LN: the layer norm's output feeds the next projection and that block's residual add,
    so it is written; --why-not names the kernel that reads it as a residual."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    x, w = _x_w(2, 32)
    ln = _ln(x)
    y = (ln @ w).add(ln)
    cm = compile_graph(Graph({"x": x.node}, {"y": y.node}), budget="30s", device="sim:h200")
    doc = cm.report_dict()["why_not"]
    pairs = [e for e in doc["pairs"] if (e["producer_form"], e["consumer_form"])
             == ("layernorm", "matmul")]
    assert pairs, doc["pairs"]
    assert "also reads it (a residual, post-LN)" in pairs[0]["rule"]
