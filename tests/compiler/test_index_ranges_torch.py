"""A torch module's integer inputs that index a table are range-checked before a run, as an ONNX
model's are: on a GPU the kernel masks an index outside its table (a row of zeros; with 32-bit
indexing, 2**32 + 7 reads row 7), where PyTorch raises. The ranges come from lumc's own graph
(``index_ranges.graph_index_uses``): [0, n) for embedding / index_select / gather, [-n, n) for
advanced indexing, which wraps negatives."""
import pytest
import torch

import lumc
from lumc.compiler.runtime.index_ranges import IndexRangeInputError

V, P, D = 50, 16, 8


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.table = torch.nn.Parameter(torch.randn(P, D))

    def forward(self, ids, rows, pick):
        a = self.emb(ids)                                  # [0, V)
        b = torch.index_select(self.table, 0, rows)        # [0, P)
        c = self.table[pick]                               # [-P, P): wraps negatives
        return a.sum(1) + b.sum(0) + c.sum(0)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    mp = pytest.MonkeyPatch()      # this file's cache, undone after it
    mp.setenv("LUMC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    torch.manual_seed(0)
    m = Lookup().eval()
    args = (torch.randint(0, V, (2, 5)), torch.randint(0, P, (3,)), torch.randint(-P, P, (4,)))
    f = lumc.compile(m, example_inputs=args, budget="20s", device="sim:h200")
    f(*args)
    yield m, f.specializations[0].compiled, args
    mp.undo()


@pytest.mark.parametrize("which,value,ok", [
    (0, V - 1, True), (0, V, False), (0, -1, False), (0, 2 ** 32 + 7, False),
    (1, P - 1, True), (1, P, False), (1, -1, False),
    (2, -P, True), (2, -P - 1, False), (2, P, False)])
def test_torch_index_inputs_checked_against_their_tables(compiled, which, value, ok):
    m, cm, args = compiled
    bad = [a.clone() for a in args]
    bad[which].view(-1)[0] = value
    eager_ok = True
    try:
        m(*bad)
    except (IndexError, RuntimeError):
        eager_ok = False
    assert eager_ok == ok          # the test's own premise: PyTorch's verdict
    if ok:
        cm._bind(tuple(bad), {})
    else:
        with pytest.raises(IndexRangeInputError, match="out of range"):
            cm._bind(tuple(bad), {})


class Wrapped(torch.nn.Module):
    """The user's own negative-index wrap before advanced indexing (which wraps again): PyTorch
    takes [-2P, P); a wrap whose compare is not against 0 is no wrap."""
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(P, D))

    def forward(self, e, f):
        return self.table[torch.where(e < 0, e + P, e)].sum(0) + self.table[
            torch.where(f < 1, f + P, f)].sum(0)


def test_index_checks_follow_the_wraps_pytorch_applies(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(1)
    m = Wrapped().eval()
    args = (torch.tensor([1, 2]), torch.tensor([3, 4]))
    f = lumc.compile(m, example_inputs=args, budget="20s", device="sim:h200")
    cm = f.specializations[0].compiled
    for e in ([-9, 2], [-16, 0], [7, -1]):             # valid for PyTorch: taken
        x = (torch.tensor(e), args[1])
        m(*x)
        cm._bind(x, {})
        torch.testing.assert_close(f(*x), m(*x))
    for fv in ([-17, 1], [-1, 2]):    # where(f < 1, f + P, f) is no wrap: -17 -> -1, valid
        x = (args[0], torch.tensor(fv))
        m(*x)
        cm._bind(x, {})


class Shifted(torch.nn.Module):
    """Indices shifted by a constant before the lookup (``emb(ids + 2)``, OPT's position offset):
    the input's own range moves by the shift; through advanced indexing's wrap too. A shift of an
    already wrapped value is no single range of the input, and is left unchecked (never refused)."""
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.table = torch.nn.Parameter(torch.randn(P, D))

    def forward(self, ids, pick, rows):
        wrapped = torch.where(rows < 0, rows + P, rows)
        return (self.emb(ids + 2).sum(1) + self.table[pick - 1].sum(0)
                + self.emb(wrapped + 1).sum(0))


@pytest.mark.parametrize("which,value", [
    (0, -2), (0, V - 3), (0, V - 2), (0, -3),          # ids + 2 in [0, V): ids in [-2, V - 2)
    (1, 1 - P), (1, P), (1, -P), (1, P + 1),           # pick - 1 in [-P, P): pick in [1 - P, P]
    (2, -P), (2, P - 1)])                                # wrap(rows) + 1: left unchecked
def test_shifted_indices_are_checked_at_the_shifted_range(tmp_path, monkeypatch, which, value):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(2)
    m = Shifted().eval()
    args = (torch.tensor([[0, 5]]), torch.tensor([1, 3]), torch.tensor([0, 2]))
    cm = _shifted_compiled(m, args)
    bad = [a.clone() for a in args]
    bad[which].view(-1)[0] = value
    try:
        m(*bad)
        eager_ok = True
    except (IndexError, RuntimeError):
        eager_ok = False
    if eager_ok:
        cm._bind(tuple(bad), {})
    elif which == 2:
        cm._bind(tuple(bad), {})       # unchecked: a shifted wrap is no range of the input
    else:
        with pytest.raises(IndexRangeInputError, match=r"out of range .*its value [+-]\d"):
            cm._bind(tuple(bad), {})
    assert eager_ok == (which == 2 or value in (-2, V - 3, 1 - P, P))   # the premise


_SHIFTED: dict = {}


def _shifted_compiled(m, args):
    """One compile for the parametrized cases (the module's weights do not matter to the check)."""
    if "cm" not in _SHIFTED:
        f = lumc.compile(m, example_inputs=args, budget="20s", device="sim:h200")
        _SHIFTED["cm"] = f.specializations[0].compiled
    return _SHIFTED["cm"]


def test_torch_index_inputs_are_read_back_in_one_transfer(compiled, monkeypatch):
    """Every table's range check of a call reads the extremes back at once: on a GPU each read is
    a synchronization, and the check took two per table (``int(x.min())``, ``int(x.max())``)
    before any kernel was launched."""
    m, cm, args = compiled
    calls = []
    real_tolist = torch.Tensor.tolist

    def counted(self):
        calls.append(self.shape)
        return real_tolist(self)

    def refused(self):
        raise AssertionError("a range check read one value back")

    from lumc.compiler.runtime.index_ranges import check_index_inputs
    uses = cm._index_uses()
    names = list(cm.graph.inputs)
    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    monkeypatch.setattr(torch.Tensor, "__int__", refused)
    monkeypatch.setattr(torch.Tensor, "item", refused)
    # torch tensors as a GPU run passes them (the CPU executor reads numpy arrays)
    check_index_inputs(uses, dict(zip(names, args)))
    assert calls == [torch.Size([6])]            # three tables' (min, max), one transfer
    bad = [a.clone() for a in args]
    bad[1].view(-1)[0] = P
    calls.clear()
    with pytest.raises(IndexRangeInputError, match=rf"index {P} in input .* out of range \[0, {P}\)"):
        check_index_inputs(uses, dict(zip(names, bad)))
    assert len(calls) == 1


def test_an_index_outside_its_table_names_the_fx_node_not_an_internal_one(compiled):
    """The refusal said "node '%626', op Gather: index 50 in input 'ids' ...": lumc's node id,
    which a torch user cannot find anywhere. It names the FX node of ``print(exported.graph)``
    that made the gather, its ATen op, the input and the range; a wrong dtype is said in torch's
    words ('compiled for torch.int64', where it said 'int64')."""
    from lumc.ir.errors import InputError
    m, cm, args = compiled
    bad = [a.clone() for a in args]
    bad[0].view(-1)[0] = V
    with pytest.raises(IndexRangeInputError) as e:
        cm(*bad)
    assert str(e.value) == f"node 'embedding', op aten.embedding.default: index {V} in input " \
                           f"'ids' is out of range [0, {V}) of the table it indexes", str(e.value)
    with pytest.raises(InputError) as e:
        cm(args[0].int(), *args[1:])
    assert str(e.value) == "input 'ids' has dtype torch.int32, compiled for torch.int64"
    with pytest.raises(InputError) as e:
        cm(args[0].numpy().astype("int32"), *args[1:])
    assert str(e.value) == "input 'ids' has dtype int32, compiled for int64"
