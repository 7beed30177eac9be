"""Calling ``lumc.compile(module)`` the ways the module itself is called: a positional parameter
given by keyword (``f(x=t)``, ``f(input_ids=ids, attention_mask=m)``), in any keyword order;
a wrong dtype is named in torch's words; example inputs that share storage. Values against
PyTorch eager."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import lumc
from lumc.ir.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.lin = nn.Linear(6, 3)

    def forward(self, input_ids, attention_mask=None, scale=1.0):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        return self.lin(h) * scale


def test_positional_parameters_by_keyword():
    torch.manual_seed(1)
    m = Masked().eval()
    ids = torch.tensor([[1, 4, 9, 0], [3, 3, 2, 7]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
    f = lumc.compile(m, budget="15s", example_inputs=(ids,),
                     example_kwargs={"attention_mask": mask}, device="sim:h200")
    with torch.no_grad():
        want = m(ids, attention_mask=mask)
    for got in (f(ids, attention_mask=mask), f(input_ids=ids, attention_mask=mask),
                f(attention_mask=mask, input_ids=ids)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # an unknown keyword is still refused, naming what was captured
    with pytest.raises(InputError, match="expected 1 positional argument and keyword arguments "
                                         "attention_mask"):
        f(ids=ids, attention_mask=mask)


class Two(nn.Module):
    def forward(self, x, y):
        return x * y - x


def test_two_positionals_by_keyword_and_a_wrong_dtype_in_torch_words():
    m = Two().eval()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    f = lumc.compile(m, budget="10s", example_inputs=(x, y), device="sim:h200")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)    # no deprecated pytree API on this path
        for got in (f(x, y=y), f(y=y, x=x)):
            torch.testing.assert_close(got, m(x, y))
        with pytest.raises(InputError) as e:
            f(x, y.double())
        assert str(e.value) == "input 'y' has dtype torch.float64, expected torch.float32"
        with pytest.raises(InputError, match=r"argument 0: expected a leaf"):
            f([x], y)


class _Bmm(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b) + b.sum()


def test_example_inputs_that_share_storage():
    """``f(x.mT, x)``: example inputs that alias each other. PyTorch's ``run_decompositions``
    failed on them ("torch.export failed: AttributeError: 'NoneType' object has no attribute
    'size'"); the capture clones an aliasing input first, and the calls match eager, aliased or
    not."""
    from lumc.compiler.core.torch_compile import compile_module
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 3, generator=g)
    m = _Bmm().eval()
    f = compile_module(m, (x.mT, x), search=False)
    for a, b in ((x.mT, x), (torch.randn(2, 3, 5, generator=g), torch.randn(2, 5, 3, generator=g))):
        assert torch.allclose(f(a, b), m(a, b), rtol=1e-5, atol=1e-5)
