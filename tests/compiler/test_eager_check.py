"""A compile of a module is compared with the module itself (``eager_check``): lowering bugs that
the kernel checks cannot see (they compare against the same lowering) are reported and warned."""
import math

import numpy as np

import pytest
import torch

from lumc.compiler.core import torch_compile
from lumc.compiler.core.eager_check import LumcNumericsWarning, compare


def test_compare_counts_errors_and_nonfinite_mismatches():
    w = torch.tensor([1.0, -2.0, math.nan, math.inf, -math.inf, 4.0])
    assert compare(w, w.clone(), 1e-4) == {"max_rel_error": 0.0, "nonfinite_mismatch": 0,
                                          "exact_mismatch": 0, "outputs": 1, "near_ties": 0,
                                          "rtol": 1e-4, "passed": True}
    g = w.clone()
    g[0] = 1.0 + 4e-4                     # 1e-4 of max |want| = 4
    r = compare(w, g, 1e-4)
    assert r["max_rel_error"] == pytest.approx(1e-4, rel=1e-3) and r["nonfinite_mismatch"] == 0
    g = w.clone()
    g[2], g[3], g[4] = 0.0, -math.inf, math.nan   # NaN lost, inf flipped, -inf became NaN
    r = compare(w, g, 1e-4)
    assert r["nonfinite_mismatch"] == 3 and not r["passed"]
    # structures: dicts and tuples of tensors, python ints skipped, a shape change is all mismatched
    r = compare({"a": (w, 3)}, {"a": (w[:2], 3)}, 1e-4)
    assert r["nonfinite_mismatch"] == 6 and r["outputs"] == 1
    # integer and bool outputs are exact
    i = torch.tensor([3, 1, 2])
    assert compare((i, i > 1), (i, i > 1), 1e-4)["passed"]
    r = compare((i, i > 1), (torch.tensor([3, 1, 0]), i > 2), 1e-4)
    assert r["exact_mismatch"] == 2 and not r["passed"]
    # a bf16 output is held to its own rounding (8 ulp), an fp32 one to the policy's tolerance
    b = torch.randn(64).to(torch.bfloat16)
    near = (b.double() * (1 + 2 ** -7)).to(torch.bfloat16)      # about 1 ulp off
    assert compare(b, near, 1e-4)["passed"]
    assert not compare(b.float(), near.float(), 1e-4)["passed"]



def test_the_reported_tolerance_is_the_one_the_worst_output_was_held_to():
    """A bf16 module's output is held to 8 ulp of bf16 (0.0625), but the report printed the
    policy's fp32 tolerance beside its error: 'max rel error 0.011 (tolerance 0.0001) ...:
    passed' (a tiny T5 encoder in bf16), an error 100 times the tolerance shown, yet passed."""
    from lumc.compiler.runtime.report_text import eager_text
    w = torch.tensor([1.0, -2.0, 4.0], dtype=torch.bfloat16)
    g = w.clone()
    g[0] = 1.0 + 2 ** -7 * 4                               # 0.03125 / 4: 2 ulp of 4 in bf16
    r = compare(w, g, 1e-4)
    assert r["passed"] and r["max_rel_error"] == pytest.approx(2 ** -7)
    assert r["rtol"] == pytest.approx(8 * 2 ** -7)         # bf16 eps is 2**-7
    assert "(tolerance 0.0625)" in eager_text(r)
    # an fp32 output beside it with the larger error is reported with its own (fp32) tolerance
    f = torch.tensor([1.0, 2.0])
    r = compare((w, f), (g, f * (1 + 0.02)), 1e-4)
    assert not r["passed"] and r["max_rel_error"] == pytest.approx(0.02, rel=1e-5)
    assert r["rtol"] == 1e-4 and "(tolerance 0.0001)" in eager_text(r)
    assert compare(f, f, 1e-4)["rtol"] == 1e-4           # no error at all: the policy's

class _M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(self.lin(x), -1)


def test_a_compile_records_the_check_and_a_mismatch_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m, x = _M().eval(), torch.randn(3, 8)
    f = torch_compile.compile_module(m, (x,), budget="20s", device="sim:h200")
    ec = f.specializations[0].compiled.report_dict()["eager_check"]
    assert ec["passed"] and ec["max_rel_error"] < 1e-5 and ec["outputs"] == 1
    assert "against PyTorch eager on the example inputs" in f.report()
    # a lowering that disagrees with the module (simulated by breaking the call's result)
    call = torch_compile.CompiledTorchModule.__call__
    monkeypatch.setattr(torch_compile.CompiledTorchModule, "__call__",
                        lambda self, *a, **k: call(self, *a, **k) * 2)
    with pytest.warns(LumcNumericsWarning, match="differs from PyTorch eager") as rec:
        g = torch_compile.compile_module(m, (x,), budget="20s", device="sim:h200", reuse_plan=False)
    ours = [r for r in rec if r.category is LumcNumericsWarning]
    assert ours and ours[0].filename == __file__          # the user's line, not lumc's
    assert not g.specializations[0].compiled.report_dict()["eager_check"]["passed"]
    assert "FAILED" in g.report()


def test_compare_accepts_an_index_at_a_near_tie_of_its_fp32_scores():
    scores = np.array([[1.0, 0.99, -1.0], [1.0, 0.5, -1.0]])
    want = torch.tensor([0, 0])
    tie = (scores, 1, True, False)
    r = compare((want,), (torch.tensor([1, 0]),), 0.1, [tie])     # 0.99 is within 0.1 of 1.0
    assert r["passed"] and r["exact_mismatch"] == 0 and r["near_ties"] == 1
    r = compare((want,), (torch.tensor([0, 1]),), 0.1, [tie])     # 0.5 is not
    assert not r["passed"] and r["exact_mismatch"] == 1 and r["near_ties"] == 0
    assert not compare((want,), (torch.tensor([1, 0]),), 0.1)["passed"]   # no scores: exact


class _Argmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))).argmax(-1)


def test_reduced_weights_argmax_near_ties_pass_the_eager_check_as_the_gate(tmp_path, monkeypatch):
    # nvfp4 weights move 4 of 64 argmax indices to a class whose fp32 score is within the
    # tolerance: the quality gate accepted them, the eager check warned 'FAILED' with max rel error 0
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    import warnings
    import lumc
    torch.manual_seed(0)
    m, x = _Argmax().eval(), torch.randn(64, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LumcNumericsWarning)
        f = lumc.compile(m, budget="20s", example_inputs=(x,), weights="nvfp4")
    want, got = m(x), f(x)
    with torch.no_grad():
        s = m.b(torch.tanh(m.a(x))).double()          # the fp32 scores
    differ = got != want
    assert differ.any()                      # the case this test is about
    best = s.gather(1, want[:, None])[:, 0]
    picked = s.gather(1, got[:, None])[:, 0]
    scale = s.abs().max(1).values
    assert bool(((best - picked).abs() <= 0.4 * scale)[differ].all())   # each a near-tie
    text = f.report()
    assert f"0 integer/bool unequal ({int(differ.sum())} more at near-ties): passed" in text, text


class _Pool(torch.nn.Module):
    """``x [B, L, 8] -> [B, 8]``: softmax over L of a projection, pooled by it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        return (torch.softmax(h, dim=1) * h).sum(1)


def test_a_range_compile_is_checked_at_the_example_and_each_buckets_ends(tmp_path, monkeypatch):
    from torch.export import Dim

    from lumc.compiler.runtime.variants import VariantModel
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m, x = _Pool().eval(), torch.randn(2, 5, 8)
    seq = Dim("seq", min=1, max=64)
    f = torch_compile.compile_module(m, (x,), budget="12s", device="sim:h200",
                                     dynamic_shapes=({1: seq},))
    assert isinstance(f, VariantModel)
    ec = f.report_dict()["eager_check"]
    sizes = [s["seq"] for s in ec["sizes"]]
    ends = sorted({int(e) for k, _ in f.variants for e in k.ranges["seq"][:2]})
    assert sizes[0] == 5 and sorted(set(sizes[1:]) | {5}) == sorted(set(ends) | {5})
    assert 1 in sizes and 64 in sizes
    assert ec["passed"] and ec["max_rel_error"] < 1e-5 and ec["outputs"] == 1
    assert f.report().splitlines()[-1].startswith("against PyTorch eager at seq = 5, ")
    # every plan's report holds it too (what `lumc run` of the artifact says)
    assert all(cm.report_dict()["eager_check"] == ec for _, cm in f.variants)

    # a plan that is wrong only above seq = 8 (the example's size is right): found at the ends
    call = VariantModel.__call__

    def wrong_above_8(self, x):
        y = call(self, x)
        return y * 2 if x.shape[1] > 8 else y
    monkeypatch.setattr(VariantModel, "__call__", wrong_above_8)
    with pytest.warns(LumcNumericsWarning, match="differs from PyTorch eager") as rec:
        g = torch_compile.compile_module(m, (x,), budget="12s", device="sim:h200",
                                         dynamic_shapes=({1: seq},))
    assert [r for r in rec if r.category is LumcNumericsWarning][0].filename == __file__
    ec = g.report_dict()["eager_check"]
    assert not ec["passed"] and ec["max_rel_error"] > 0.5
    msg = str([r for r in rec if r.category is LumcNumericsWarning][0].message)
    assert f"at seq={min(e for e in ends if e > 8)} (" in msg and "; seq=64 (" in msg
    assert "seq=5 " not in msg and "seq=8 " not in msg
    assert g.report().splitlines()[-1].endswith("FAILED")
