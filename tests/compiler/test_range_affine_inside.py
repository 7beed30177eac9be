"""A size range whose sizes need affine values (``L - 1``: the last row ``h[:, -1]``) in a model
that imports at no size above the range (a position buffer sliced to ``L``, as BERT and
DistilBERT slice ``position_ids``/``token_type_ids``): the affine values are learned at probes
inside the range (``range_probing._affine_inside``), where before the range was refused. A
LayerNorm's ``1e-12`` stays a constant: its float's neighbours that the small factors ``L - 1``,
``B - 1`` take apart are not read as a count (``symbolic.learn_table``)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import lumc

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))


class LastRow(nn.Module):
    """``x [B, L, 8] -> (h[:, -1], h[-1])`` of ``LayerNorm(Linear(x) + pos[:, :L])``, ``pos`` a
    48-row buffer: no sequence above 48 imports."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8, eps=1e-12)
        self.register_buffer("pos", torch.randn(1, 48, 8))

    def forward(self, x):
        h = self.ln(self.lin(x) + self.pos[:, :x.shape[1]])
        return h[:, -1], h[-1]


def test_last_row_over_a_range_a_position_buffer_bounds():
    torch.manual_seed(0)
    m = LastRow().eval()
    f = lumc.compile(m, budget="30s", device="sim:h200", example_inputs=(torch.randn(2, 16, 8),),
                     dynamic_shapes=({0: Dim("b", min=1, max=3), 1: Dim("seq", min=3, max=48)},))
    for b, s in [(1, 3), (3, 48), (2, 4), (1, 47), (3, 17), (2, 30)]:
        x = torch.randn(b, s, 8)
        with torch.no_grad():
            ref = m(x)
        for y, r in zip(f(x), ref):
            assert y.shape == r.shape
            assert (y - r).abs().max().item() <= 1e-5 * r.abs().max().item(), (b, s)


class Strided(nn.Module):
    """``x [1, 3, H, 8] -> conv stride 2 -> max pool 2``: ``H`` floor-divided by 4."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        return nn.functional.max_pool2d(self.conv(x), 2)


def test_a_strided_model_over_a_range_of_step_1_is_told_of_steps():
    """The refusal said only 'give explicit sizes (a list)'; a range in steps of the stride (a
    derived Dim, ``4 * Dim``) compiles such a model whole."""
    with pytest.raises(lumc.InputError, match=r"A\.\.B:STEP; torch\.export: a derived dim"):
        lumc.compile(Strided().eval(), budget="20s", device="sim:h200",
                     example_inputs=(torch.randn(1, 3, 16, 8),),
                     dynamic_shapes=({2: Dim("h", min=8, max=40)},))
    m = Strided().eval()
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(torch.randn(1, 3, 16, 8),),
                     dynamic_shapes=({2: 4 * Dim("hq", min=2, max=10)},))
    for h in (8, 12, 40):
        x = torch.randn(1, 3, h, 8)
        with torch.no_grad():
            assert (f(x) - m(x)).abs().max().item() <= 1e-5
