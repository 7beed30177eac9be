"""Scatters and scans from PyTorch (``scatter``, ``scatter_add``, ``scatter_reduce``, ``index_put``
with integer and boolean indices, ``index_copy``, ``index_add``, ``cumprod``, ``logcumsumexp``)
against PyTorch eager: ragged shapes, negative and duplicate indices, an index smaller than its
source, leading full slices, 0-d tensors, integer dtypes, infinities and NaN."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn

from lumc.compiler.core.torch_compile import compile_module as _compile_module
from lumc.ir.errors import UnsupportedOpError

compile_module = functools.partial(_compile_module, search=False)
pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
              pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter:UserWarning")]


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)


def _check(f, *xs, exact=False):
    m = Fn(f).eval()
    with torch.no_grad():
        ref = m(*xs)
        got = compile_module(m, xs)(*xs)
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, ref.dtype, got.shape)
    if exact or not ref.dtype.is_floating_point:
        assert torch.equal(got, ref) or torch.allclose(got, ref, rtol=0, atol=0, equal_nan=True), \
            (got, ref)
    else:
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6, equal_nan=True), (got, ref)


G = torch.Generator().manual_seed(0)
X = torch.randn(5, 7, generator=G)
# index 2 wide, 4 tall: smaller than src and than x off dim 1; a negative index; duplicates
IDX = torch.tensor([[0, 6], [3, 3], [6, 1], [2, 2]])
SRC = torch.randn(4, 3, generator=G)


@pytest.mark.parametrize("name,f", [
    ("scatter.src", lambda x, s: x.scatter(1, IDX, s)),
    ("scatter.value", lambda x, s: x.scatter(1, IDX, 2.5)),
    ("scatter.reduce add", lambda x, s: x.scatter(1, IDX, s, reduce="add")),
    ("scatter.reduce multiply", lambda x, s: x.scatter(1, IDX, s, reduce="multiply")),
    ("scatter_add", lambda x, s: x.scatter_add(1, IDX, s)),
    ("scatter dim 0", lambda x, s: x.scatter(0, torch.tensor([[4, 0, 2]]), s)),
])
def test_scatter_family(name, f):
    if name == "scatter.src":          # duplicate targets are unordered in PyTorch: keep them apart
        f = lambda x, s: x.scatter(1, torch.tensor([[0, 6], [3, 5], [6, 1], [2, 4]]), s)  # noqa: E731
    _check(f, X, SRC)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    _check(lambda x, s: x.scatter_reduce(1, IDX, s, reduce, include_self=include_self), X, SRC)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax"])
def test_scatter_reduce_integers(reduce):
    xi = torch.arange(-12, 23).reshape(5, 7)
    si = torch.tensor([[5, -7, 1], [-3, 4, 9], [2, 2, -11], [8, -1, 0]])
    _check(lambda x, s: x.scatter_reduce(1, IDX, s, reduce), xi, si)


def test_scatter_0d_and_empty_index():
    _check(lambda x: x.scatter(1, torch.zeros(5, 0, dtype=torch.long), -3.0), X)
    _check(lambda x: x.scatter(0, torch.tensor(0), torch.tensor(4.0)), torch.tensor(1.5))


def _setitem(x, key, v, accumulate=False):
    y = x.clone()
    if accumulate:
        y[key] += v
    else:
        y[key] = v
    return y


@pytest.mark.parametrize("name,f", [
    ("x[i] = v", lambda x, v: x.index_put((torch.tensor([4, 0, -2]),), v[:3])),
    ("x[i] += v, duplicates", lambda x, v: x.index_put((torch.tensor([1, 1, 3]),), v[:3],
                                                         accumulate=True)),
    ("x[:, j] = v", lambda x, v: _setitem(x, (slice(None), torch.tensor([6, -5])), v[:2, :5].T)),
    ("x[:, j] += v", lambda x, v: _setitem(x, (slice(None), torch.tensor([6, 6])), v[0, :1], True)),
    ("x[i, j] = scalar", lambda x, v: x.index_put((torch.tensor([0, 4]), torch.tensor([[1], [5]])),
                                                  torch.tensor(9.0))),
    ("x[m] = 0", lambda x, v: x.index_put((x > 0.3,), torch.tensor(0.0))),
    ("x[m] += row", lambda x, v: x.index_put((x[:, 0] > 0,), v[0], accumulate=True)),
    ("index_copy", lambda x, v: x.index_copy(0, torch.tensor([3, 1]), v[:2])),
    ("index_add", lambda x, v: x.index_add(1, torch.tensor([0, 0, 6]), v[:5, :3])),
    ("setitem slice", lambda x, v: torch.cat([x[:2], x[2:].clone().index_fill_(1, torch.tensor(
        [1, 3]), -1.0)])),
])
def test_index_put(name, f):
    v = torch.randn(7, 7, generator=G)
    _check(f, X, v)


def test_index_put_with_one_value_per_masked_position_is_refused():
    def f(x):
        y = x.clone()
        y[x > 0] = x[x > 0] * 2          # as many values as the mask selects: known at run time
        return y
    with pytest.raises(UnsupportedOpError) as e:
        compile_module(Fn(f).eval(), (X,))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod(dim):
    x = torch.tensor([[1.5, -2.0, 0.0, 3.0], [0.5, float("inf"), 2.0, -0.0],
                      [-1.0, 2.0, float("nan"), 4.0]])
    _check(lambda t: torch.cumprod(t, dim), x)
    _check(lambda t: torch.cumprod(t, dim), torch.tensor([[2, -3, 5, 7], [1, 0, -4, 2]]))


@pytest.mark.parametrize("op", [torch.cumprod, torch.logcumsumexp,
                                lambda t, d: torch.cummax(t, d)[0]])
def test_a_scan_too_long_for_its_grid_is_refused_in_one_line(op):
    """A running product over 2 x 20000 would be a grid of 8e8 prefixes: the reference run held
    13.8 GB and ran out of budget (40000 ran the machine out of memory). Refused at lowering,
    naming the node and the limit, before any of it is built."""
    from lumc.ir.library.reduce import SCAN_GRID_MAX
    x = torch.rand(2, 20000) + 0.5
    assert x.numel() * 20000 > SCAN_GRID_MAX
    with pytest.raises(UnsupportedOpError) as e:
        compile_module(Fn(lambda t: op(t, 1)).eval(), (x,))
    assert "\n" not in str(e.value) and "grid of prefixes" in str(e.value)
    assert "20000" in str(e.value)


def test_logcumsumexp():
    x = torch.tensor([[0.5, 100.0, -3.0, 88.0], [float("-inf"), float("-inf"), 1.0, 2.0],
                      [float("inf"), 1.0, float("-inf"), 2.0], [1.0, float("nan"), 2.0, 3.0]])
    _check(lambda t: torch.logcumsumexp(t, 1), x)
    _check(lambda t: torch.logcumsumexp(t, 0), torch.randn(6, 3, generator=G) * 30)


class _CacheStep(nn.Module):
    """A decoding step with a fixed-size KV cache: the new key/value rows are written at ``pos``
    (a model input) with ``index_copy``, and the query attends to the rows written so far."""

    def forward(self, q, k_new, v_new, k_cache, v_cache, pos):
        k = k_cache.index_copy(2, pos, k_new)
        v = v_cache.index_copy(2, pos, v_new)
        seen = torch.arange(k.shape[2])[None, None, None, :] <= pos[0]
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen)
        return out, k, v


@pytest.mark.parametrize("at", [0, 5, 11])
def test_kv_cache_write_at_an_input_position_through_the_search(tmp_path, monkeypatch, at):
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(at)
    q, kn, vn = (torch.randn(1, 2, 1, 8, generator=g) for _ in range(3))
    kc, vc = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(2))
    args = (q, kn, vn, kc, vc, torch.tensor([3]))
    f = lumc.compile(_CacheStep().eval(), budget="20s", example_inputs=args, device="sim:h200")
    call = args[:5] + (torch.tensor([at]),)
    with torch.no_grad():
        refs = _CacheStep()(*call)
    for got, ref in zip(f(*call), refs):
        assert torch.allclose(torch.as_tensor(got), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,f,good,bads", [
    # the scatter family takes no negative index (eager: "index -1 is out of bounds")
    ("scatter", lambda x, i: x.scatter(1, i, 2.5), [[6, 0], [1, 1]], ([[-1, 0], [1, 1]],
                                                                      [[7, 0], [1, 1]])),
    ("scatter_add", lambda x, i: x.scatter_add(1, i, torch.ones(i.shape)), [[6, 0], [1, 1]],
     ([[0, -7], [1, 1]], [[0, 1], [9, 1]])),
    ("scatter_reduce amax", lambda x, i: x.scatter_reduce(0, i, torch.ones(i.shape), "amax"),
     [[4, 0], [1, 1]], ([[-1, 0], [1, 1]], [[5, 0], [1, 1]])),
    # index_put counts a negative index from the end: [-n, n)
    ("index_put", lambda x, i: x.index_put((i,), torch.ones(7), accumulate=True), [4, -5, 0],
     ([5, 0, 0], [-6, 0, 0])),
    ("index_copy past the end", lambda x, i: x.index_copy(0, i, torch.ones(3, 7)), [4, 1, 0],
     ([5, 0, 1],)),
    # index_add and index_copy take no negative index either (their decomposition into
    # index_put counted one from the end)
    ("index_copy negative", lambda x, i: x.index_copy(0, i, torch.ones(3, 7)), [4, 1, 0],
     ([-1, 0, 1],)),
    ("index_add negative", lambda x, i: x.index_add(1, i, torch.ones(5, 3), alpha=2), [6, 0, 2],
     ([0, -7, 1], [7, 0, 0])),
])
def test_scatter_index_outside_its_dim_is_refused_as_eager(name, f, good, bads):
    """An index outside its dim is an error in eager; it used to hit no position (an index past
    the end) or count from the end (a negative one in ``scatter``), silently."""
    from lumc.ir.errors import IndexRangeError
    m = Fn(f).eval()
    g = torch.tensor(good)
    c = compile_module(m, (X, g))
    assert torch.equal(c(X, g), m(X, g))
    for bad in bads:
        b = torch.tensor(bad)
        with pytest.raises((RuntimeError, IndexError), match="out of bounds|out of range"):
            m(X, b)
        with pytest.raises(IndexRangeError, match=r"out of range \[0, \d\)") as e:
            c(X, b)
        assert "\n" not in str(e.value)


def test_scatter_index_check_stays_in_the_plan_and_refuses_an_input_after_the_search(
        tmp_path, monkeypatch):
    """Through ``lumc.compile``: the index's ``Gather`` of ``[0, n)`` stays in the graph past
    constant folding (a computed index is refused by the compiled plan too; fusion inlines it, so
    it costs no kernel: ``tests/e2e/test_computed_indices.py``), and the run refuses an index
    input outside its dim before any kernel runs (``index_ranges.graph_index_uses``)."""
    import lumc
    from lumc.compiler.core.constfold import fold_constants
    from lumc.compiler.frontends.torch_frontend import import_torch
    from lumc.compiler.runtime.index_ranges import IndexRangeInputError
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    m = Fn(lambda x, i: x.scatter_add(1, i, torch.ones(i.shape)) * 2).eval()
    i = torch.tensor([[6, 0], [1, 1], [2, 2], [0, 3], [5, 5]])
    graph = import_torch(m, (X, i)).graph
    for g in (graph, fold_constants(graph)):
        assert any(n.op == "Gather" and n.srcs[0].op == "Iota" for n in g.nodes())
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(X, i))
    other = i.flip(0)
    assert torch.allclose(f(X, other), m(X, other), rtol=1e-6, atol=1e-6)
    bad = other.clone()
    bad[2, 1] = -1
    with pytest.raises(IndexRangeInputError, match=r"index -1 in input '\w+' is out of range "
                                                   r"\[0, 7\)"):
        f(X, bad)


def test_one_hot_refuses_a_class_outside_its_range_as_eager():
    """``F.one_hot``'s range check is an ``_assert_async`` that export dropped: a class outside
    ``[0, num_classes)`` gave an all-zero row where eager raises; now it is refused in one line.
    Without ``num_classes`` the class count is known only at run time: refused at compile."""
    from lumc.ir.errors import IndexRangeError
    m = Fn(lambda i: torch.nn.functional.one_hot(i, 5)).eval()
    good = torch.tensor([[0, 4], [2, 2]])
    c = compile_module(m, (good,))
    assert torch.equal(c(good), m(good)) and c(good).dtype == torch.int64
    for bad in ([[0, 5], [1, 1]], [[-1, 0], [1, 1]]):
        b = torch.tensor(bad)
        with pytest.raises(RuntimeError, match="Class values must be"):
            m(b)
        with pytest.raises(IndexRangeError, match=r"out of range \[0, 5\)") as e:
            c(b)
        assert "\n" not in str(e.value)
    from lumc.ir.errors import LumcError
    with pytest.raises(LumcError, match="data-dependent"):   # export cannot trace it either
        compile_module(Fn(lambda i: torch.nn.functional.one_hot(i)).eval(), (good,))
