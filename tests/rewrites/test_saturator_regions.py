"""One egglog engine saturates every region of a compile (``push``/``pop`` around each): a region's
e-graph must not depend on the regions saturated before it. Every Encoder starts its ``let`` names
at ``$e0``; egglog 13.2 keeps a global ``let`` past ``pop``, and after an integer ``min`` and an
``argmax`` the next ``argmax`` read ``(Where $e31 $e9 $e3)`` as ``(Where $e3 $e9 $e3)``."""
from __future__ import annotations

from lumc.compiler.core.extract import EGraphView
from lumc.ir import dtypes as dt
from lumc.ir.graph import input_node
from lumc.ir.library.reduce import argmax
from lumc.ir.tensor import Tensor
from lumc.rewrites.language import Encoder, Tables, constructors
from lumc.rewrites.schedule import Limits, Saturator


def _lines(t: Tensor) -> list[str]:
    enc = Encoder(Tables())
    enc.encode(t.node)
    return enc.lines


def _terms(data: dict) -> dict[str, str]:
    """``{let name: the term of its e-class}`` (first e-node of each class, recursively)."""
    view = EGraphView.from_json(data, set(constructors()))
    memo: dict[str, str] = {}

    def term(c: str) -> str:
        if c not in view.classes:
            return repr(view.values.get(c, c))
        if c not in memo:
            n = view.classes[c][0]
            memo[c] = f"({n.ctor} {' '.join(term(a) for a in n.args)})"
        return memo[c]
    return {name: term(c) for name, c in view.lets.items()}


def test_a_region_saturates_alike_after_other_regions():
    x2 = Tensor(input_node("x", (2, 2), dt.i64))
    x4 = Tensor(input_node("x", (1, 4), dt.f32))
    earlier = [_lines(x2.min(-1)), _lines(argmax(x4, 1, True, select_last_index=True))]
    region = _lines(argmax(x4, 1, True))
    limits = Limits(iterations=1, expansive=False)
    alone, _ = Saturator(limits, rules=[]).saturate(region, "alone")
    shared = Saturator(limits, rules=[])
    for k, lines in enumerate(earlier):
        shared.saturate(lines, f"earlier{k}")
    after, _ = shared.saturate(region, "after")
    want, got = _terms(alone), _terms(after)
    assert set(got) == set(want)   # the caller's own let names come back
    assert not [k for k in want if got[k] != want[k]], \
        {k: (got[k][:120], want[k][:120]) for k in want if got[k] != want[k]}


def test_string_literals_keep_their_dollar_signs():
    """Only global names are renamed: an input named like one (``in$e0``) keeps its name."""
    x = Tensor(input_node("in$e0", (3,), dt.f32))
    data, _ = Saturator(Limits(iterations=1, expansive=False), rules=[]).saturate(
        _lines(x.exp2()), "names")
    assert '"in$e0"' in {n["op"] for n in data["nodes"].values()}
    assert _terms(data)["$e1"] == "(Exp2 (Input 'in$e0'))"


def test_a_name_that_extends_another_resolves_to_itself():
    """egglog 13.2 can resolve a global name inside a term to another global that is a prefix of
    it, within one region: the encoder's lines of ``a // b`` next to ``a // -2.0`` (a torch
    module's outputs) defined ``(let $e46 (Where $e45 $e31 $e3))``, and the engine held
    ``(Where $e45 $e3 $e3)``: the floor division's sign fix was always false, and the compiled
    program divided truncating, silently. The 36 lines are that region's, reduced to what the
    term reads; every name's term must be its own."""
    import pathlib
    lines = (pathlib.Path(__file__).parent / "prefix_names_region.txt").read_text().splitlines()
    data, _ = Saturator(Limits(iterations=0, expansive=False), rules=[]).saturate(lines, "r")
    view = EGraphView.from_json(data, set(constructors()))
    cls = view.lets
    parent = view.classes[cls["$e46"]]
    assert [n.args for n in parent] == [[cls["$e45"], cls["$e31"], cls["$e3"]]], parent
    assert cls["$e31"] != cls["$e3"]
