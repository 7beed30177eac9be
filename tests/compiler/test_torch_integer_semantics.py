"""Integer and index semantics of the PyTorch frontend against eager: exact integer division,
fmod/remainder refusing a zero divisor, embedding / index_select / gather refusing an index
outside its dim (negative ones too), before and after the search, and Python int scalars outside
an integer tensor's dtype (wrapped in arithmetic, refused where eager refuses them)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import lumc
from lumc.ir.errors import DivisionByZeroError, IndexRangeError, ModelError

from tests.compiler.test_torch_frontend import check_close, compile_module

# torch.export deep-copies pytree specs through a deprecated path (PyTorch's own warning)
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class IntDivision(nn.Module):
    def __init__(self, big: int):
        super().__init__()
        self.big = big

    def forward(self, x, y):
        return (x // 7, x // -3, x // y, torch.div(x, y, rounding_mode="floor"),
                torch.div(x, y, rounding_mode="trunc"), torch.floor_divide(x, self.big))


class FloorDiv(nn.Module):
    def forward(self, x, y):
        return x // y


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8])
def test_integer_division_is_exact_against_eager(dtype):
    """Floor and trunc division of integers equal eager for every value, above 2**52 too
    (``2**61 // 7`` was 329406144173384832 through f64; eager says ...850): edge dividends
    (min, max, +-2**62) over negative, positive and exactly dividing divisors, and
    ``MIN // -1 == MIN`` (eager's floor division wraps; its trunc form traps, so it is left out)."""
    info = torch.iinfo(dtype)
    vals = [info.min, info.min + 1, info.max, info.max - 1, 2 ** 62, -2 ** 62, 2 ** 61,
            2 ** 61 + 1, -(2 ** 53 + 1), 3 * 2 ** 40, 255, 42, -42, 1, -1, 0]
    vals = [v for v in vals if info.min <= v <= info.max]
    divs = [v for v in [7, -7, 3, -3, 2, -2, 1, 2 ** 31 - 1, -2 ** 40, 2 ** 62 + 1, info.max,
                        info.min] if info.min <= v <= info.max]
    x = torch.tensor([v for v in vals for _ in divs], dtype=dtype)
    y = torch.tensor([w for _ in vals for w in divs], dtype=dtype)
    m = IntDivision(2 ** 40 if dtype == torch.int64 else 100).eval()
    f = compile_module(m, (x, y))
    got, want = f(x, y), m(x, y)
    check_close(got, want)
    if dtype == torch.int64:
        assert got[0][vals.index(2 ** 61) * len(divs)].item() == 329406144173384850
    lo, minus_one = torch.tensor([info.min], dtype=dtype), torch.tensor([-1], dtype=dtype)
    f1 = compile_module(FloorDiv().eval(), (lo, minus_one))
    assert f1(lo, minus_one).item() == (lo // minus_one).item() == info.min


class IntModulo(nn.Module):
    def forward(self, x, y):
        return torch.fmod(x, y), torch.remainder(x, y), x % 5 - torch.fmod(x, -3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8])
def test_integer_fmod_and_remainder_refuse_a_zero_divisor_as_eager(dtype):
    """``torch.fmod`` and ``torch.remainder`` of integers by 0: eager raises (ZeroDivisionError);
    lumc refuses with one line naming the model node, its op and the reason (it used to return 0). Nonzero
    divisors of either sign equal eager; float ``fmod`` by 0 stays NaN, as in eager."""
    x = torch.tensor([7, -7, 7, -7, 0, 5, -100], dtype=dtype)
    y = torch.tensor([3, 3, -3, -3, 2, 1, -1], dtype=dtype)
    m = IntModulo().eval()
    f = compile_module(m, (x, y))
    check_close(f(x, y), m(x, y))
    name = str(dtype).removeprefix("torch.")
    for zero_at in (0, 4):
        z = y.clone()
        z[zero_at] = 0
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            m(x, z)
        with pytest.raises(DivisionByZeroError,
                           match=rf"^node '(fmod|remainder)', op aten\.(fmod|remainder)\.Tensor "
                                 rf"\(primitive Mod\): integer modulo by zero \({name} divisor 0\)$"):
            f(x, z)
    a, b = torch.tensor([7.0, -7.0, 0.0]), torch.tensor([0.0, 2.0, 0.0])
    fl = compile_module(m, (a, b))
    got, want = fl(a, b), m(a, b)
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g[~g.isnan()], w[~w.isnan()])


def test_integer_fmod_by_zero_refused_after_the_search(tmp_path, monkeypatch):
    """The same through ``lumc.compile``: refused before the run, as on a GPU (whose kernel would
    mask the row), by the input's range check (``index_ranges.graph_index_uses``)."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    m = IntModulo().eval()
    x = torch.tensor([7, -7, 7, -7, 0, 5], dtype=torch.int32)
    y = torch.tensor([3, 3, -3, -3, 2, 1], dtype=torch.int32)
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(x, y))
    check_close(f(x, y), m(x, y))
    with pytest.raises(DivisionByZeroError,
                       match=r"^node 'fmod', op aten\.fmod\.Tensor \(primitive Mod\): integer "
                             r"modulo by zero \(int32 divisor 0\)$"):
        f(x, torch.tensor([3, 3, -3, 0, 2, 1], dtype=torch.int32))


class Lookups(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, i):
        return self.emb(i), self.emb.weight.index_select(0, i.reshape(-1)), self.emb.weight[i]


def test_embedding_and_index_select_refuse_a_negative_index_as_eager():
    """``embedding`` and ``index_select`` refuse a negative index (eager: IndexError), like one
    past the end: one line naming the op and the range (it used to wrap: -3 read row 7).
    ``x[i]`` counts a negative index from the end, as eager does."""
    torch.manual_seed(11)
    m = Lookups().eval()
    good = torch.tensor([[1, 9, 0]])
    f = compile_module(m, (good,))
    check_close(f(good), m(good))
    neg = torch.tensor([[1, -3, 0]])
    with pytest.raises(IndexError):
        m.emb(neg)
    with pytest.raises(IndexError):
        m.emb.weight.index_select(0, neg.reshape(-1))
    check_close(m.emb.weight[neg], m.emb.weight[torch.tensor([[1, 7, 0]])])   # x[i] wraps
    for ids, bad in (([[1, -3, 0]], -3), ([[1, 10, 0]], 10), ([[-10, 2, 0]], -10)):
        with pytest.raises(IndexRangeError, match=rf"^node '(embedding|index_select)', op aten\.\1\.default "
                                                  rf"\(primitive Gather\): gather index {bad} out of range "
                                                  r"\[0, 10\)"):
            f(torch.tensor(ids))
    only_x = compile_module(IndexOnly(m.emb.weight.detach()).eval(), (good,))
    check_close(only_x(neg), m.emb.weight[neg])


class IndexOnly(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, i):
        return self.table[i]


def test_embedding_negative_index_refused_after_the_search(tmp_path, monkeypatch):
    """The same through ``lumc.compile``: refused before the run, as on a GPU (whose kernel would
    mask the row), by the input's range check (``index_ranges.graph_index_uses``)."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(12)
    m = nn.Embedding(10, 4).eval()
    good = torch.tensor([[1, 9, 0]])
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(good,))
    check_close(f(good), m(good))
    from lumc.compiler.runtime.index_ranges import IndexRangeInputError
    with pytest.raises(IndexRangeInputError, match=r"^node 'embedding', op aten\.embedding\.default: "
                                                   r"index -3 in input '\w+' is out of "
                                                   r"range \[0, 10\)"):
        f(torch.tensor([[1, -3, 0]]))


class GatherAlong(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, i):
        return torch.gather(x, self.dim, i) * 2


def test_gather_refuses_a_negative_index_as_eager():
    """``torch.gather`` refuses an index outside ``[0, n)`` of its dim, a negative one too (eager:
    "index -1 is out of bounds"): one line naming the op and the range. It used to count -1 from
    the end, and an index outside its dim read a neighbouring row of the flattened table."""
    torch.manual_seed(13)
    x = torch.randn(3, 4)
    for dim, good, bads in (
            (1, [[0, 3], [1, 2], [3, 0]], ([[0, 3], [-1, 2], [3, 0]], [[0, 3], [1, 2], [3, -4]],
                                          [[0, 3], [4, 2], [3, 0]], [[0, 3], [1, 2], [-5, 0]])),
            (0, [[0, 2, 1, 0], [2, 2, 0, 1]], ([[0, -1, 1, 0], [2, 2, 0, 1]],
                                               [[0, 2, 1, 0], [2, 3, 0, 1]]))):
        m = GatherAlong(dim).eval()
        f = compile_module(m, (x, torch.tensor(good)))
        check_close(f(x, torch.tensor(good)), m(x, torch.tensor(good)))
        n = x.shape[dim]
        for ids in bads:
            i = torch.tensor(ids)
            bad = i[(i < 0) | (i >= n)][0].item()
            with pytest.raises(RuntimeError, match=rf"index {bad} is out of bounds"):
                m(x, i)
            with pytest.raises(IndexRangeError, match=rf"^node 'gather', op aten\.gather\.default \(primitive "
                                                      rf"Gather\): gather index {bad} out of "
                                                      rf"range \[0, {n}\)"):
                f(x, i)


def test_gather_negative_index_refused_after_the_search(tmp_path, monkeypatch):
    """The same through ``lumc.compile``: refused before the run, as on a GPU (whose kernel would
    mask the row), by the input's range check (``index_ranges.graph_index_uses``)."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(14)
    m = GatherAlong(1).eval()
    x, good = torch.randn(3, 4), torch.tensor([[0, 3], [1, 2], [3, 0]])
    f = lumc.compile(m, budget="20s", device="sim:h200", example_inputs=(x, good))
    check_close(f(x, good), m(x, good))
    other = torch.tensor([[3, 3], [0, 2], [1, 1]])
    check_close(f(x, other), m(x, other))
    from lumc.compiler.runtime.index_ranges import IndexRangeInputError
    with pytest.raises(IndexRangeInputError, match=r"^node 'gather', op aten\.gather\.default: "
                                                   r"index -1 in input '\w+' is out of "
                                                   r"range \[0, 4\)"):
        f(x, torch.tensor([[0, 3], [-1, 2], [3, 0]]))


class _Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


I8 = torch.tensor([1, 100, -100, 127, -128], dtype=torch.int8)
U8 = torch.tensor([0, 3, 255, 128, 7], dtype=torch.uint8)


@pytest.mark.parametrize("name,f,x", [
    ("int8 + 1000", lambda x: x + 1000, I8), ("int8 * 300", lambda x: x * 300, I8),
    ("int8 == 356", lambda x: x == 356, I8), ("int8 < 300", lambda x: x < 300, I8),
    ("uint8 >= -1", lambda x: x >= -1, U8), ("uint8 - 300", lambda x: x - 300, U8),
    ("int8 % 1000", lambda x: x % 1000, I8), ("1000 - int8", lambda x: 1000 - x, I8),
    ("int32 + 2**32 + 5", lambda x: x.int() + (2 ** 32 + 5), I8),
    ("full(-1, uint8)", lambda x: torch.full((5,), -1, dtype=torch.uint8) + x, U8),
    ("uint8 clamp(-3, 5)", lambda x: x.clamp(-3, 5), U8),
    ("uint8 masked_fill(-3)", lambda x: x.masked_fill(x > 1, -3), U8),
])
def test_an_integer_scalar_outside_the_dtype_converts_as_eager(name, f, x):
    """Eager wraps a Python int outside an integer tensor's dtype around in arithmetic and
    comparisons (``int8 + 1000`` adds -24), and takes a negative fill down to ``-255`` for uint8;
    these were refused with 'cannot lower: OverflowError'."""
    m = _Fn(f).eval()
    ref = m(x)
    got = compile_module(m, (x,))(x)
    assert got.dtype == ref.dtype and torch.equal(got, ref), (got, ref)


@pytest.mark.parametrize("name,f,x", [
    ("clamp", lambda x: x.clamp(-200, 100), I8), ("masked_fill", lambda x: x.masked_fill(x > 0, 300), I8),
    ("full", lambda x: torch.full((5,), 300, dtype=torch.int8) + x, I8),
    ("where", lambda x: torch.where(x > 0, x, 1000), I8),
    ("full uint8", lambda x: torch.full((5,), -256, dtype=torch.uint8) + x, U8),
])
def test_an_integer_scalar_eager_cannot_convert_is_refused_in_one_line(name, f, x):
    m = _Fn(f).eval()
    with pytest.raises(RuntimeError, match="without overflow"):
        m(x)
    with pytest.raises(ModelError, match=r"value -?\d+ cannot be converted to u?int8 without "
                                         r"overflow") as e:
        compile_module(m, (x,))
    assert "\n" not in str(e.value)
