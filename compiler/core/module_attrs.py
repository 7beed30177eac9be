"""A module tree's plain Python attributes, for ``torch_state.ModuleWatch``.

``torch.export`` reads a plain attribute that ``forward`` uses (``self.scale = 2.0``, ``self.eps``,
``self.causal``, a config's ``hidden_act``) once, while tracing, and bakes its value into the
graph: after ``m.scale = 3.0`` the compiled plan still computes ``x * 2.0``. The watch compares
these values at each call with the ones compiled and refuses a call after one changed.

Watched: every entry of each submodule's ``__dict__`` (torch's own bookkeeping aside: hooks,
registries, the training flag, which the watch compares on its own) whose value is plain (``None``,
a bool, number, string, bytes, ``torch.dtype``/``torch.device``, an enum, or a tuple, list, set or
dict of plain values), and the plain entries of a non-module object held there (a config): by
value, a container compared with a copy taken at compile (an in-place ``append`` counts). An
attribute set after the compile counts where it shadows one of the class's (``forward`` reads
it); other new attributes do not (``forward`` never saw them). A class attribute changed on the
class itself (``M.scale = 3.0``) is not watched (the stored-plan key covers it: a compile after it
does not reuse the old plan).
"""
from __future__ import annotations

import copy
import enum
import operator

import torch

# torch's own entries of every module's __dict__ (hooks, registries, ``training``)
_MODULE_OWN = frozenset(torch.nn.Module().__dict__)
_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
            enum.Enum)
_MUTABLE = (list, dict, set, tuple, frozenset)   # compared by value (a list in a tuple)
_MAX_ITEMS = 4096          # a container larger than this is not watched (nor copied per compile)
_MAX_DEPTH = 4


def _plain(v, depth: int = 0) -> bool:
    if isinstance(v, _SCALARS):
        return True
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(v, (tuple, list, set, frozenset)) and len(v) <= _MAX_ITEMS:
        return all(_plain(x, depth + 1) for x in v)
    if isinstance(v, dict) and len(v) <= _MAX_ITEMS:
        return all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    return False


def _holder(v) -> bool:
    """An object whose own plain attributes ``forward`` may read (a config): not a module, tensor,
    class, function or other callable."""
    return (hasattr(v, "__dict__") and not isinstance(v, (torch.nn.Module, torch.Tensor, type))
            and not callable(v) and type(v).__module__ not in ("builtins", "enum"))


def plain_attrs(module: torch.nn.Module) -> tuple[dict, list[dict]]:
    """``({label: (owner's __dict__, key, value, shadows)}, dicts)``: the watched attributes (see
    the module docstring), ``value`` as it is (the caller copies what it keeps), ``shadows``: the
    owner's class has an attribute of that name; ``dicts``: every ``__dict__`` looked at."""
    out: dict = {}
    dicts: list[dict] = []
    held: set[int] = set()
    for n, sub in module.named_modules():
        where = f"submodule {n!r}" if n else "the module"
        d = sub.__dict__
        dicts.append(d)
        for k, v in list(d.items()):
            if k in _MODULE_OWN:
                continue
            if _plain(v):
                out[f"attribute {k!r} of {where}"] = (d, k, v, hasattr(type(sub), k))
            elif _holder(v) and id(v) not in held:
                held.add(id(v))
                inner = vars(v)
                dicts.append(inner)
                for k2, v2 in list(inner.items()):
                    if _plain(v2):
                        out[f"attribute '{k}.{k2}' of {where}"] = (inner, k2, v2,
                                                                   hasattr(type(v), k2))
    return out, dicts


def _same(a, b) -> bool:
    """Equal and of the same types all through (``2`` is not ``2.0``: ``x * 2`` keeps an integer
    tensor's dtype); NaN equals NaN."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


class AttrWatch:
    """The plain attributes of a module tree as compiled: :meth:`unchanged` is the per-call check
    (C-level passes over the watched dicts), :meth:`changed` names the first that differs.
    It holds the module tree's ``__dict__``s: the owner drops it with the module."""

    def __init__(self, module: torch.nn.Module):
        attrs, dicts = plain_attrs(module)
        self.compiled = {label: copy.deepcopy(v) for label, (_, _, v, _) in attrs.items()}
        self._fast(attrs, dicts)

    def _fast(self, attrs: dict, dicts: list[dict]) -> None:
        # the values now (equal to the compiled ones): the same objects at the next call, and the
        # mutable ones (a list) equal to their compiled copies
        self._dicts = [d for d, _, _, _ in attrs.values()]
        self._keys = [k for _, k, _, _ in attrs.values()]
        self._live = [v for _, _, v, _ in attrs.values()]
        self._mutable = [i for i, v in enumerate(self._live) if isinstance(v, _MUTABLE)]
        mutable = set(self._mutable)
        self._copies = [self.compiled[label] for i, label in enumerate(attrs) if i in mutable]
        self._owners = dicts
        self._sizes = list(map(len, dicts))

    def unchanged(self) -> bool:
        """True when every watched attribute is the object it was (a mutable one still equal to
        its compiled copy) and no looked-at dict gained or lost an entry (else :meth:`changed`
        tells)."""
        now = list(map(dict.get, self._dicts, self._keys))
        return (all(map(operator.is_, now, self._live))
                and [now[i] for i in self._mutable] == self._copies
                and list(map(len, self._owners)) == self._sizes)

    def changed(self, module: torch.nn.Module) -> str | None:
        """The first attribute that differs from the compiled value (``"attribute 'scale' of the
        module: 2.0 -> 3.0"``), or None (and the fast check's state is refreshed)."""
        now, dicts = plain_attrs(module)
        for label, was in self.compiled.items():
            if label not in now:
                return f"{label}: {_short(was)} -> removed"
            if not _same(now[label][2], was):
                return f"{label}: {_short(was)} -> {_short(now[label][2])}"
        for label, (_, _, v, shadows) in now.items():
            if label not in self.compiled and shadows:
                return f"{label}: set to {_short(v)} over the class's"
        self._fast({k: a for k, a in now.items() if k in self.compiled}, dicts)
        return None


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
