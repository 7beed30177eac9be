"""A float constant that is an affine count of a ranged dim, or its reciprocal (``1 / (L - 1)``
of an unbiased ``var``/``std``, a ``/ (L - 1)``), re-sizes with the range's learned affine table
like an integer size: one compile for the range, equal to eager at every size, ``L = 1`` included
(``1 / 0`` is inf there and the variance NaN, as eager gives)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import lumc
from lumc.ir.symbolic import Substitution, _resize_float

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning",
                                        "ignore:.*degrees of freedom.*:UserWarning")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))


class Spread(nn.Module):
    """Unbiased variance and standard deviation over the ranged axis, and a sum over L - 1."""

    def forward(self, x):
        return x.var(dim=1), x.std(dim=1), x.sum(dim=1) / (x.shape[1] - 1 + 2)


def test_unbiased_variance_over_a_ranged_dim_compiles_once_and_matches_eager():
    torch.manual_seed(0)
    m = Spread().eval()
    f = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(torch.randn(2, 6, 3),),
                     dynamic_shapes=({1: Dim("L", min=1, max=40)},))
    for n in (1, 2, 3, 7, 19, 20, 39, 40):
        x = torch.randn(2, n, 3)
        with torch.no_grad():
            want = m(x)
        for g, w in zip(f(x), want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_reciprocal_count_resized_to_zero_is_an_ieee_infinity():
    sub = Substitution({41: 1}, {40: (1, ((41, 1, -1),))})    # L - 1 at probe 41, L = 1
    assert _resize_float(1.0 / 40, sub, "float32") == float("inf")
    assert _resize_float(40.0, sub, "float32") == 0.0
    assert _resize_float(1.0 / 40, Substitution({41: 5}, {40: (1, ((41, 1, -1),))}),
                         "float32") == 0.25
