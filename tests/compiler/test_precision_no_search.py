"""A precision policy without the kernel search: refused, not silently ignored."""
from __future__ import annotations

import pytest

import lumc
from lumc.ir.errors import InputError


def test_a_reduced_precision_without_the_search_is_refused():
    """lumc.compile(module, search=False, precision="auto") ran the reference executor at fp32
    and said nothing: the option did nothing. Refused in one line, as --tolerance at fp32 is;
    the same from torch.compile's options; an fp32 policy without the search still runs."""
    torch = pytest.importorskip("torch")
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU()).eval()
    x = torch.randn(4, 64)
    for kw in ({"precision": "auto"}, {"precision": "bf16"}, {"weights": "int8"}):
        with pytest.raises(InputError, match="search=False runs the reference executor"):
            lumc.compile(m, example_inputs=(x,), budget="10s", search=False, **kw)
    from lumc.compiler.core.torch_backend import lumc_backend
    gm = torch.fx.symbolic_trace(m)
    with pytest.raises(InputError, match=r"options\['search'\]=False"):
        lumc_backend(gm, [x], {"search": False, "precision": "bf16"})
    f = lumc.compile(m, example_inputs=(x,), budget="10s", search=False)
    assert torch.allclose(f(x), m(x), atol=1e-5)
