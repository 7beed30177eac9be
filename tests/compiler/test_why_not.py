"""``lumc inspect ART --why-not``: every producer -> consumer pair of the chosen program is named
with the fusion decision and the rule that would be needed; the artifact carries it."""
import re

import numpy as np
from click.testing import CliRunner

from lumc.compiler.tools.cli import cli
from lumc.compiler.core.pipeline import compile_graph
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, const_node, input_node
from lumc.ir.library import activations
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
    assert "whole-row" in e["rule"] and "+norm-on-load" in e["rule"]
    assert e["value"] == "f32[1, 8, 32]"
    assert e["fusion"]
    assert len(doc["pairs"]) == len(cm.program.calls) - 1   # a chain: one pair per edge
    art = tmp_path / "m.lumc"
    cm.save(art)
    res = CliRunner().invoke(cli, ["inspect", str(art), "--why-not"])
    assert res.exit_code == 0, res.output
    assert "#0 matmul -> #1 layernorm (f32[1, 8, 32]): not one kernel" in res.output
    assert "rule:   no kernels rule offers residual add + LayerNorm as a whole-row" in res.output


def test_a_post_ln_norm_read_by_a_projection_and_its_residual_is_formed_on_load(
        tmp_path, monkeypatch):
    """Post-LN: the layer norm's output feeds a projection and that projection's residual add;
    the '+norm-on-load' candidate forms it in both places of the one contraction kernel."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    x, w = _x_w(2, 32)
    ln = _ln(x)
    y = (ln @ w).add(ln)
    cm = compile_graph(Graph({"x": x.node}, {"y": y.node}), budget="30s", device="sim:h200")
    assert cm.program.label.endswith("+norm-on-load")
    assert [c.kernel.form for c in cm.program.calls] == ["matmul"]
    assert cm.report_dict()["why_not"]["pairs"] == []
    xv = np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32)
    got = cm.run({"x": xv})["y"]
    x64 = xv.astype(np.float64)
    d = x64 - x64.mean(-1, keepdims=True)
    ln64 = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
    want = ln64 @ np.asarray(w.node.arg.value, np.float64) + ln64
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_norm_with_a_reader_no_contraction_forms_it_in_is_named(tmp_path, monkeypatch):
    """A layer norm read by a projection and by a softmax cannot be formed on load (the softmax is
    no contraction): it is written, and --why-not names the softmax kernel as the reason."""
    from lumc.ir.library import norm
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    x, w = _x_w(2, 32)
    ln = _ln(x)
    y = (ln @ w).add(norm.softmax(ln, -1))
    cm = compile_graph(Graph({"x": x.node}, {"y": y.node}), budget="30s", device="sim:h200")
    doc = cm.report_dict()["why_not"]
    pairs = [e for e in doc["pairs"] if (e["producer_form"], e["consumer_form"])
             == ("layernorm", "matmul")]
    assert pairs, doc["pairs"]
    # the softmax's kernel: its form, or (the +rows candidates) a row kernel that also adds the
    # projection, which then writes no epilogue input (faster on sim:h200)
    assert re.search(r"#\d \((softmax|reduction)\) also reads it, so it is written",
                     pairs[0]["rule"]), pairs[0]["rule"]


def test_post_ln_ffn_pairs_name_the_sum_and_the_row_values(tmp_path, monkeypatch):
    """BERT's post-LN feed-forward half as three contractions: --why-not says the sum is written
    because its row statistics need whole rows, and names the row values the up-projection
    writes for the down-projection."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(3)
    x = Tensor(input_node("x", (1, 8, 32), dt.f32))
    wa, w1, w2 = (Tensor(const_node((rng.standard_normal(s) / 6).astype(np.float32)))
                  for s in ((32, 32), (32, 64), (64, 32)))
    y = _ln((x @ wa).add(x))
    z = activations.relu(y @ w1) @ w2
    cm = compile_graph(Graph({"x": x.node}, {"z": z.add(y).node}), budget="30s",
                       device="sim:h200")
    assert "+norm-on-load" in cm.program.label
    rules = [e["rule"] for e in cm.report_dict()["why_not"]["pairs"]]
    if cm.program.label.endswith("+mlp"):
        # the up- and down-projection one mlp kernel (at this size the launch it saves wins):
        # the sum is read once, by it, and it computes the row statistics itself
        assert [c.kernel.form for c in cm.program.calls] == ["matmul", "mlp"]
        assert sum("the sum a normalization reads (post-LN)" in r for r in rules) == 1, rules
        assert not any(r.startswith("row values of a normalization") for r in rules), rules
    else:
        assert [c.kernel.form for c in cm.program.calls] == ["matmul"] * 3
        assert sum("the sum a normalization reads (post-LN)" in r for r in rules) == 2, rules
        assert sum(r.startswith("row values of a normalization formed on load")
                   for r in rules) == 1


def test_a_sandwich_norm_written_for_nesting_names_the_norm_reader(tmp_path, monkeypatch):
    """Sandwich norms (``h = x + N(s)`` read by the next norms): a norm read by a norm kernel is
    written because on-load normalizations nest one deep, not because a norm reader is never
    allowed (the rule said so before sandwich nesting); an RMSNorm read inside a LayerNorm kernel
    has the nesting rule too, not 'no kernels rule'."""
    from lumc.ir.library import norm
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(7)
    x = Tensor(input_node("x", (1, 8, 32), dt.f32))

    def w(n, m):
        return Tensor(const_node((rng.standard_normal((n, m)) / np.sqrt(n)).astype(np.float32)))

    def g():
        return Tensor(const_node(rng.uniform(0.5, 1.5, 32).astype(np.float32)))
    h = x
    for _ in range(2):
        h = h + norm.rms_norm(norm.rms_norm(h, g()) @ w(32, 32), g())
        u = (norm.rms_norm(h, g()) @ w(32, 48)).maximum(0.0)
        h = h + norm.rms_norm(u @ w(48, 32), g())
    y = norm.layer_norm(h, g())[0]
    cm = compile_graph(Graph({"x": x.node}, {"y": y.node}), budget="30s", device="sim:h200")
    pairs = cm.report_dict()["why_not"]["pairs"]
    rules = {(e["producer_form"], e["consumer_form"]): e["rule"] for e in pairs}
    assert all("every reader is a contraction's operand" not in e["rule"] for e in pairs), pairs
    for key, rule in rules.items():
        if key[0] in ("rmsnorm", "layernorm") and key[1] in ("rmsnorm", "layernorm"):
            assert "one deep" in rule, (key, rule)


def test_a_fewer_kernel_candidate_names_the_time_it_lost_by(tmp_path, monkeypatch):
    """A candidate with fewer kernels that the search timed says its time against the chosen
    program's (simulated on a sim: device, measured on a GPU), beside the bounds; one it never
    timed says so; a document stored before times were kept still reads as before."""
    from lumc.backends.devices import H200
    from lumc.compiler.core.fusion import greedy_program
    from lumc.compiler.core.why_not import why_not, why_not_lines
    from lumc.compiler.runtime.program import program_time_bound
    from lumc.ir.library.norm import log_softmax
    x = Tensor(input_node("x", (64, 1000), dt.f32))
    g = Graph({"x": x.node}, {"y": log_softmax(x, -1).node})
    split, fused = greedy_program(g), greedy_program(g, label="greedy+rows", rows=True)
    assert len(fused.calls) < len(split.calls)
    bounds = [program_time_bound(p, H200) for p in (split, fused)]
    assert bounds[1] < bounds[0]
    doc = why_not(split, [split, fused], bounds, [15.8e-6, 16.4e-6], 15.8e-6)
    (line,) = [s for s in why_not_lines(doc) if s.startswith("candidate ")]
    assert line == (f"candidate greedy+rows (1 kernel) lost on time: 16.4 us simulated against the "
                    f"chosen 15.8 us (bound {bounds[1] * 1e6:.1f} us against the chosen "
                    f"{bounds[0] * 1e6:.1f} us)")
    doc = why_not(split, [split, fused], bounds, [15.8e-6, None], 15.8e-6)
    (line,) = [s for s in why_not_lines(doc) if s.startswith("candidate ")]
    assert line.startswith("candidate greedy+rows (1 kernel) not timed before the search stopped: "
                           f"bound {bounds[1] * 1e6:.1f} us"), line
    legacy = {"pairs": [], "compared": 2, "candidates": [
        {"label": "c", "kernels": 2, "bound_s": 1e-6, "chosen_bound_s": 2e-6}]}
    assert why_not_lines(legacy) == [
        "candidate c (2 kernels) lost on time: bound 1.0 us against the chosen 2.0 us"]
    # a compile stores the times it measured: BERT-base's feed-forward shape (ReLU), where the mlp
    # form (one kernel) loses to the two contractions (simulated: 31.8 against 27.9 us)
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    x = Tensor(input_node("x", (128, 768), dt.f32))
    w1, w2 = (Tensor(const_node(rng.standard_normal(s).astype(np.float32)))
              for s in ((768, 3072), (3072, 768)))
    cm = compile_graph(Graph({"x": x.node}, {"y": ((x @ w1).maximum(0.0) @ w2).node}),
                       budget="30s", device="sim:h200")
    r = cm.report_dict()
    timed = [c for c in r["why_not"]["candidates"] if c["time_s"] is not None]
    assert len(cm.program.calls) == 2 and timed, r["why_not"]["candidates"]
    for c in timed:
        assert c["chosen_time_s"] == r["best_time_s"] and c["time_s"] > c["chosen_time_s"], c
        assert any(line.startswith(f"candidate {c['label']} (1 kernel) lost on time: "
                                   f"{c['time_s'] * 1e6:.1f} us simulated")
                   for line in why_not_lines(r["why_not"]))
    gpu = why_not(split, [split, fused], bounds, [15.8e-6, 16.4e-6], 15.8e-6, simulated=False)
    assert "16.4 us measured against the chosen 15.8 us" in "\n".join(why_not_lines(gpu))
    # on a GPU the top 3 programs are re-timed and the others keep their last time: one may read
    # below the chosen program's re-timed time, which the line says rather than 'lost on time'
    noisy = why_not(split, [split, fused], bounds, [17.0e-6, 16.4e-6], 17.0e-6, simulated=False)
    (line,) = [s for s in why_not_lines(noisy) if s.startswith("candidate ")]
    assert line.startswith("candidate greedy+rows (1 kernel) not chosen: 16.4 us measured at its "
                           "last timing, against the chosen 17.0 us when the top 3 were re-timed")
