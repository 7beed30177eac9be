"""Two torch modules whose compiled programs silently computed other functions (a breaking
helper's finds): a floor division that divided truncating and a round-half-even that rounded half
up, each only next to certain other outputs. Their e-graph regions defined a term over ``$e31``
after a global ``$e3``, and egglog read the one as the other
(``tests/rewrites/test_saturator_regions.py``). Outputs against eager PyTorch, at inputs that hit
the sign fixes and the ties."""
import pytest
import torch

import lumc

# torch.export deep-copies pytree specs through a deprecated path (PyTorch's own warning)
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class FloorDivs(torch.nn.Module):
    def forward(self, a, b):
        return a // b, torch.atan2(a, b), torch.pow(a, b), torch.hypot(a, b), a // -2.0


class Rounds(torch.nn.Module):
    def forward(self, a, b):
        v4 = torch.frac(torch.minimum(b, a))
        v6 = torch.logical_xor(a < 0, v4 < 0).float()
        return v4, torch.round(b), v6, v4 // v6, torch.floor(v4)


@pytest.mark.parametrize("module,a,b", [
    (FloorDivs, [7.5, -7.5, 7.5, -7.5, -1., -8.], [2., 2., -2., -2., 3., 3.]),
    (Rounds, [7.5, -7.5, 7.5, -7.5, -1., -8., 0., -0., 2.5, -0.5, 1e3, 3.],
     [2., 2., -2., -2., 3., 3., -1., 1., 0.5, -1.5, -7., 0.25])])
def test_outputs_match_eager_next_to_each_other(tmp_path, monkeypatch, module, a, b):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    m, a, b = module().eval(), torch.tensor(a), torch.tensor(b)
    f = lumc.compile(m, example_inputs=(a, b), budget="20s", device="sim:h200")
    for got, want in zip(f(a, b), m(a, b)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
