"""A ``torch.export.Dim`` whose ``min`` is 0 (``Dim("b", max=8)``'s default too) was compiled from
1 without a word, and a call at size 0 refused: the smallest bucket now serves size 0, checked
against the module lowered there (and eager), with eager's empty results. Values against eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import lumc

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))


class Reductions(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        # over the zero dim: an empty sum is 0, an empty mean NaN; along it: empty
        return torch.softmax(self.lin(x), -1) * 2.0, x.sum(0), x.amax(-1), x.mean(0)


def assert_eager(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dim", [Dim("b", min=0, max=8), Dim("b", max=8)])
def test_size_zero_of_a_dim_from_zero_is_served(dim, tmp_path):
    torch.manual_seed(0)
    m = Reductions().eval()
    x = torch.randn(3, 4)
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(x,),
                     dynamic_shapes=({0: dim},))
    assert f.spans() == {"b": "0..8"}
    assert {"b": 0} in f.report_dict()["eager_check"]["sizes"]     # eager ran there too
    f.save(tmp_path / "z.lumc")
    g = lumc.load(tmp_path / "z.lumc")
    with torch.no_grad():
        for n in (0, 1, 5):
            xn = torch.randn(n, 4)
            want = m(xn)
            assert_eager(f(xn), want)
            assert_eager(g(xn), want)
        assert torch.isnan(f(torch.zeros(0, 4))[3]).all()


def test_size_zero_that_does_not_check_is_said_and_refused(monkeypatch):
    import lumc.compiler.core.torch_zero_size as tz

    def fails(*args, **kwargs):
        raise ValueError("output 'output_0' differs from the module lowered there")
    monkeypatch.setattr(tz, "_check_at_zero", fails)
    m = Reductions().eval()
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match=r"dim 'b': size 0 \(the Dim's min\) is not compiled "
                                         r"\(.*output 'output_0' differs"):
        f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(x,),
                         dynamic_shapes=({0: Dim("b", min=0, max=8)},))
    assert f.spans() == {"b": "1..8"}
    with pytest.raises(lumc.InputError, match=r"dim 'b' \(input 'x' axis 0\) is 0; compiled for "
                                              r"1\.\.8"):
        f(torch.zeros(0, 4))


class SeqProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        # (2, L, 8) -> (2 L, 8) @ W -> (2, L, 4): the output is a reshape of a kernel's
        return self.lin(x), self.lin(x).argmax(-1)


def test_size_zero_inside_a_reshape_is_served(recwarn):
    # a row-major view re-sized from the probe to L = 0 kept its affine strides (0 for L = 0),
    # was no longer read as a reshape, and the plan at 0 failed ('%N (View) has no value yet'):
    # size 0 was refused with a warning
    torch.manual_seed(0)
    m = SeqProjection().eval()
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(torch.randn(2, 5, 8),),
                     dynamic_shapes=({1: Dim("seq", max=16)},))
    assert not [w for w in recwarn if "size 0" in str(w.message)]
    assert f.spans() == {"seq": "0..16"}
    with torch.no_grad():
        for n in (0, 1, 2, 16):
            xn = torch.randn(2, n, 8)
            assert_eager(f(xn), m(xn))


class Extremes(nn.Module):
    def forward(self, x):
        return x.amax(0), x.amin(-1)


class LogSumExp(nn.Module):
    def forward(self, x):
        return x.logsumexp(0)                     # decomposed with an amax: eager gives -inf


class InfNorms(nn.Module):
    def forward(self, x):
        return (torch.linalg.vector_norm(x, ord=float("inf"), dim=0),
                torch.linalg.vector_norm(x, ord=float("-inf"), dim=0))


@pytest.mark.parametrize("module,eager,ours", [
    # 'Expected reduction dim 0 to have non-zero size'; the lowering gave ONNX's -inf
    (Extremes, "non-zero size", "cannot take the max over empty dim 0"),
    # 'linalg.vector_norm cannot compute the inf norm on the dimension 0 ...'
    (InfNorms, "cannot compute the inf norm", "cannot compute the inf norm over empty dim 0"),
])
def test_a_max_or_min_over_the_zero_dim_is_not_served_where_eager_raises(module, eager, ours):
    """A max or min has no identity: eager raises over an empty dim, and a call at a Dim's size
    0 returned ONNX's -inf/+inf silently; now size 0 is not compiled (one warning) and a call
    there is refused naming the range."""
    x = torch.randn(3, 4)
    with pytest.raises((IndexError, RuntimeError), match=eager):
        module()(torch.zeros(0, 4))
    with pytest.warns(UserWarning, match=r"dim 'b': size 0 \(the Dim's min\) is not compiled "
                                         rf"\(.*{ours}"):
        f = lumc.compile(module(), budget="20s", device="sim:h200", example_inputs=(x,),
                         dynamic_shapes=({0: Dim("b", max=8)},))
    with pytest.raises(lumc.InputError, match=r"dim 'b' \(input 'x' axis 0\) is 0"):
        f(torch.zeros(0, 4))
    for n in (1, 5):
        xn = torch.randn(n, 4)
        assert_eager(f(xn), module()(xn))


def test_logsumexps_own_amax_serves_the_zero_dim_as_eager():
    x = torch.randn(3, 4)
    # logsumexp's own amax (its decomposition's) still serves size 0, with eager's -inf
    g = lumc.compile(LogSumExp(), budget="20s", device="sim:h200", example_inputs=(x,),
                     dynamic_shapes=({0: Dim("b", max=8)},))
    assert g.spans() == {"b": "0..8"}
    for n in (0, 1, 5):
        xn = torch.randn(n, 4)
        assert_eager((g(xn),), (LogSumExp()(xn),))
    assert torch.isneginf(g(torch.zeros(0, 4))).all()
