"""A torch module's artifact returns the module's output structure after ``lumc.load``, as the
callable it was saved from does: a dict of nested tuples, constants beside the tensors, a size
range's plans; a structure that cannot be stored (a namedtuple) is said at save and loads flat; a
damaged ``structure.json`` is a one-line ArtifactError. Values against PyTorch eager."""
from __future__ import annotations

import collections
import dataclasses
import json
import warnings
import zipfile

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import lumc
from lumc.ir.errors import ArtifactError

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)

    def forward(self, x):
        y = self.lin(x)
        return {"logits": y, "extra": (torch.relu(y), x * 2.0, [x.sum(-1)])}


def assert_same(got, want):
    """Same pytree structure, and each tensor leaf close in value, dtype and shape."""
    import torch.utils._pytree as pytree
    gl, gs = pytree.tree_flatten(got)
    wl, ws = pytree.tree_flatten(want)
    assert gs == ws, (gs, ws)
    for g, w in zip(gl, wl):
        if isinstance(w, torch.Tensor):
            g = torch.as_tensor(g)
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            assert g == w and type(g) is type(w), (g, w)


def test_range_artifact_returns_the_module_structure(tmp_path):
    torch.manual_seed(0)
    m = Nested().eval()
    x = torch.randn(2, 5, 8)
    f = lumc.compile(m, budget="20s", example_inputs=(x,), device="sim:h200",
                     dynamic_shapes=({1: Dim("seq", max=16)},))
    f.save(tmp_path / "r.lumc")
    g = lumc.load(tmp_path / "r.lumc")
    # the flat names lumc run prints and -o writes: each path key joined by '_' (was extra___2___0)
    assert [o.name for o in g.outputs] == ["logits", "extra_0", "extra_1", "extra_2_0"]
    with torch.no_grad():
        for n in (3, 11):
            xn = torch.randn(2, n, 8)
            want = m(xn)
            assert_same(f(xn), want)
            assert_same(g(xn), want)
            # numpy in: the same structure, arrays at its leaves
            got = g(xn.numpy())
            assert isinstance(got["extra"][2][0], np.ndarray)
            np.testing.assert_allclose(got["logits"], want["logits"].numpy(), rtol=1e-5, atol=1e-5)


class WithConstants(nn.Module):
    def forward(self, x):
        return (x + 1.0, 3, None, {"n": x.shape[1], "neg": -x})


def test_fixed_artifact_keeps_the_structure_and_its_constants(tmp_path):
    m = WithConstants().eval()
    x = torch.tensor([[0.0, -0.0, 1.5], [float("nan"), 2.0, -3.0]])
    f = lumc.compile(m, budget="10s", example_inputs=(x,), device="sim:h200")
    f.save(tmp_path / "c.lumc")
    g = lumc.load(tmp_path / "c.lumc")
    # inspect and bench name the module (they said 'torch.export', how it was captured)
    assert g.report_dict()["model"] == "WithConstants"
    want = m(x)
    for h in (f, g):
        got = h(x)
        assert_same(got, want)
        # the sign of zero and the NaN's place, as eager (a NaN's own sign is not compared)
        num = ~torch.isnan(want[3]["neg"])
        assert torch.equal(torch.signbit(got[3]["neg"])[num], torch.signbit(want[3]["neg"])[num])
        assert torch.equal(torch.isnan(got[0]), torch.isnan(want[0]))


Pair = collections.namedtuple("Pair", "a b")


class ReturnsNamedTuple(nn.Module):
    def forward(self, x):
        return Pair(x * 3.0, x - 1.0)


@dataclasses.dataclass
class Scores:
    logits: torch.Tensor
    probs: torch.Tensor


torch.export.register_dataclass(Scores)        # no serialized_type_name: torch cannot dump it


class ReturnsDataclass(nn.Module):
    def forward(self, x):
        return {"out": Scores(x * 3.0, torch.softmax(x, -1)), "pair": Pair(x - 1.0, x.sum())}


def test_namedtuple_and_dataclass_outputs_load_as_they_were(tmp_path):
    """A dataclass registered without a serialized name (and a namedtuple) came back from
    ``lumc.load`` as a tuple where the compiled callable returned the dataclass: they are stored
    by qualified name and rebuilt from the class this process defines."""
    m = ReturnsDataclass().eval()
    x = torch.randn(3, 5)
    f = lumc.compile(m, budget="10s", example_inputs=(x,), device="sim:h200")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)     # stored: nothing to warn about
        f.save(tmp_path / "d.lumc")
    g = lumc.load(tmp_path / "d.lumc")
    want = m(x)
    for h in (f, g):
        got = h(x)
        assert type(got["out"]) is Scores and type(got["pair"]) is Pair
        assert_same(got, want)
    # a process that does not define the class (never imported for it): flat, with a warning
    with zipfile.ZipFile(tmp_path / "d.lumc") as z:
        text = z.read("structure.json").decode()
    assert f"lumc:class:{__name__}.Scores" in text
    rewrite_part(tmp_path / "d.lumc", tmp_path / "e.lumc", "structure.json",
                 text.replace(f"{__name__}.Scores", "no_such_module.Scores").encode())
    with pytest.warns(UserWarning, match="no_such_module.Scores is not defined in this process"):
        e = lumc.load(tmp_path / "e.lumc")
    flat = e(x)
    assert type(flat) is tuple and len(flat) == 4
    torch.testing.assert_close(flat[0], want["out"].logits)


def test_a_structure_that_cannot_be_stored_is_said_and_loads_flat(tmp_path):
    local_pair = collections.namedtuple("LocalPair", "a b")    # no name to find it by at load

    class ReturnsLocal(nn.Module):
        def forward(self, x):
            return local_pair(x * 3.0, x - 1.0)
    m = ReturnsLocal().eval()
    x = torch.randn(4)
    f = lumc.compile(m, budget="10s", example_inputs=(x,), device="sim:h200")
    assert isinstance(f(x), local_pair)
    with pytest.warns(UserWarning, match="output structure is not stored.*cannot be found by"):
        f.save(tmp_path / "p.lumc")
    got = lumc.load(tmp_path / "p.lumc")(x)
    assert type(got) is tuple and len(got) == 2
    torch.testing.assert_close(got[0], x * 3.0)
    torch.testing.assert_close(got[1], x - 1.0)


def rewrite_part(src, dst, name, data: bytes):
    """A copy of artifact ``src`` with part ``name`` replaced (its manifest hash updated)."""
    import hashlib
    with zipfile.ZipFile(src) as z:
        parts = {i.filename: z.read(i.filename) for i in z.infolist()}
    man = json.loads(parts["manifest.json"])
    parts[name] = data
    man["parts"][name] = hashlib.sha256(data).hexdigest()
    parts["manifest.json"] = json.dumps(man).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for k, v in parts.items():
            z.writestr(k, v)


def test_a_damaged_structure_part_is_one_line(tmp_path):
    m = Nested().eval()
    x = torch.randn(2, 5, 8)
    f = lumc.compile(m, budget="20s", example_inputs=(x,), device="sim:h200")
    f.save(tmp_path / "n.lumc")
    with zipfile.ZipFile(tmp_path / "n.lumc") as z:
        doc = json.loads(z.read("structure.json"))
    bad = dict(doc, leaves=[["output", "nope"]] + doc["leaves"][1:])
    for data, want in [(b"{", "part 'structure.json' is malformed"),
                       (json.dumps(bad).encode(), "names outputs the plan does not compute"),
                       (json.dumps(dict(doc, leaves=doc["leaves"][:-1])).encode(),
                        "has 3 leaves for a structure of 4")]:
        rewrite_part(tmp_path / "n.lumc", tmp_path / "d.lumc", "structure.json", data)
        with pytest.raises(ArtifactError) as e:
            lumc.load(tmp_path / "d.lumc")
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_dataclass_output_is_refused_in_one_line_saying_how_to_register_it(tmp_path,
                                                                              monkeypatch):
    """A module returning a plain dataclass: torch.export refuses a class it has no pytree for,
    and lumc passed its first line on ('Found <class Out> in output, which is not a known type.
    If this type holds tensors, you need to register a pytree for it. See <url>'), which names no
    torch API to call. The refusal now says what to do, and doing it compiles."""
    import dataclasses

    from lumc.ir.errors import ModelError
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))

    @dataclasses.dataclass
    class Out:
        a: torch.Tensor
        b: torch.Tensor

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            return Out(y, y.relu() - 1)

    torch.manual_seed(0)
    m, x = M().eval(), torch.randn(2, 8)
    with pytest.raises(ModelError) as ei:
        lumc.compile(m, budget="20s", example_inputs=(x,), device="sim:h200")
    msg = str(ei.value)
    assert "\n" not in msg and "not a known type" in msg, msg
    assert "torch.export.register_dataclass" in msg, msg
    torch.export.register_dataclass(Out)
    try:
        f = lumc.compile(m, budget="20s", example_inputs=(x,), device="sim:h200")
        got, want = f(x), m(x)
        assert isinstance(got, Out)
        torch.testing.assert_close(got.a, want.a.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.b, want.b.detach(), rtol=1e-5, atol=1e-6)
    finally:
        from torch.utils import _pytree
        _pytree._deregister_pytree_node(Out)     # leave torch's registry as it was
