"""A Dim the inputs have only as a multiple (``2 * Dim("h")``: even image sizes, what a stride-2
net needs) is a size range in steps of that multiple: ``lumc.compile`` serves every even size in
it, equal to eager, and refuses an odd size or one past the range in one line. A derived form that
is not a multiple (``2 * h + 1``) is refused in one line, never a traceback."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import lumc
from lumc.compiler.core.buckets import DimRange
from lumc.compiler.core.torch_compile import dim_ranges
from lumc.compiler.frontends.torch_frontend.capture import capture_module, example_shapes
from lumc.ir.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))


class Down(nn.Module):
    """A stride-2 convolution and a mean over the plane: its sizes re-size only at even H."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, stride=2, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y, y.mean(dim=(2, 3))


def test_multiple_of_a_dim_is_a_range_in_its_steps():
    torch.manual_seed(0)
    m = Down().eval()
    h = Dim("h", min=4, max=16)
    ex = (torch.randn(1, 2, 12, 12),)
    program = capture_module(m, ex, None, ({2: 2 * h, 3: 2 * h},))
    assert dim_ranges(program, example_shapes(program, ex, None)) == {"2*h": DimRange(8, 32, 2)}
    f = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=ex,
                     dynamic_shapes=({2: 2 * h, 3: 2 * h},))
    for n in (8, 10, 14, 22, 30, 32):
        x = torch.randn(1, 2, n, n)
        with torch.no_grad():
            want = m(x)
        got = f(x)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    for shape, what in (((1, 2, 9, 9), "is 9"), ((1, 2, 34, 34), "is 34"),
                        ((1, 2, 8, 10), "must be equal")):
        with pytest.raises(InputError, match=what) as e:
            f(torch.randn(*shape))
        assert "\n" not in str(e.value) and "2*h" in str(e.value)


def test_derived_form_that_is_not_a_multiple_is_refused_in_one_line():
    m = Down().eval()
    h = Dim("h", min=4, max=16)
    with pytest.raises(InputError, match=r"derived form") as e:
        capture_module(m, (torch.randn(1, 2, 13, 13),), None, ({2: 2 * h + 1, 3: 2 * h + 1},))
    assert "\n" not in str(e.value)
