"""The dynamic dims of a Dynamo graph (``torch_backend.DynamoGraph``): which ``SymInt`` sizes of its
inputs are one ranged dim each, Dynamo's value range of each, and the ranges a compile takes from
the backend's options (``max_size``, ``shapes``). See ``lumc.compiler.core.torch_backend`` for how
a range compile uses them.
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from lumc.ir.errors import InputError

DEFAULT_MAX_SIZE = 1024   # the top of a dynamic dim's range where Dynamo leaves it unbounded


def _finite(v) -> int | None:
    """A value-range bound as an int; None for an infinite one (``int_oo``, ``oo``)."""
    return int(v) if isinstance(v, (int, sympy.Integer)) else None


@dataclasses.dataclass
class DynamicDim:
    """One dynamic dim of a Dynamo graph.

    Attributes:
        name: its ``ShapeEnv`` symbol (``s27``), the dim's name in the ranged compile.
        symbol: the sympy symbol.
        uses: ``[(argument index, axis)]`` of the tensor inputs whose size it is.
        lo, hi: Dynamo's value range (``hi`` None: unbounded).
        range: the :class:`~lumc.compiler.core.buckets.DimRange` compiled (None: not chosen yet).
    """
    name: str
    symbol: object
    uses: list
    lo: int
    hi: int | None
    range: object = None


def dynamic_dims(placeholders: list, examples: list) -> tuple[dict[str, DynamicDim], str | None,
                                                               object]:
    """``(dims, why, shape_env)``: a Dynamo graph's dynamic dims (``{name: DynamicDim}``, from its
    placeholder nodes and example inputs), why they cannot be compiled as a range (None when they
    can), and the ``ShapeEnv`` their sizes came from (None: none)."""
    dims: dict = {}
    scalars, derived = set(), []
    shape_env = None

    def canon(d):
        nonlocal shape_env
        e = d.node.expr
        env = getattr(d.node, "shape_env", None)
        if env is not None:
            shape_env = env
            e = env.replace(e)
        return e
    for i, (p, ex) in enumerate(zip(placeholders, examples)):
        ev = p.meta.get("example_value", ex)
        if isinstance(ev, torch.SymInt):
            e = canon(ev)
            if not e.is_number:
                scalars |= e.free_symbols
        elif isinstance(ev, torch.Tensor):
            for ax, d in enumerate(ev.shape):
                if not isinstance(d, torch.SymInt):
                    continue
                e = canon(d)
                if e.is_number:
                    continue
                if isinstance(e, sympy.Symbol):
                    dims.setdefault(e, []).append((i, ax))
                else:
                    derived.append((p.target, ax, e))
        elif isinstance(ev, (torch.SymFloat, torch.SymBool)):
            return {}, f"input {p.target!r} is a symbolic {type(ev).__name__}", shape_env
    out = {}
    for sym, uses in sorted(dims.items(), key=lambda kv: str(kv[0])):
        lo, hi = 1, None
        vr = shape_env.var_to_range.get(sym) if shape_env is not None else None
        if vr is not None:
            lo = max(1, _finite(vr.lower) or 1)
            hi = _finite(vr.upper)
        out[str(sym)] = DynamicDim(str(sym), sym, uses, lo, hi)
    why = None
    lone = sorted(map(str, (scalars | {s for _, _, e in derived for s in e.free_symbols})
                      - set(dims)))
    if derived:
        name, ax, e = derived[0]
        why = f"input {name!r} axis {ax} is {e}, not one dim"
    elif lone:
        why = f"size {lone[0]} is not the size of any tensor input"
    return out, why, shape_env


def dim_ranges(dims: dict, names: list, max_size, shapes) -> dict:
    """``{dim name: DimRange}`` of ``dims`` (:func:`dynamic_dims`; each ``DynamicDim.range`` is
    set too): Dynamo's ranges, unbounded ends at ``max_size`` (default :data:`DEFAULT_MAX_SIZE`),
    narrowed by ``shapes`` (``{symbol or INPUT.AXIS: (lo, hi) or "lo..hi"}``; ``names``: the
    graph's placeholder names).

    Raises:
        InputError: a ``shapes`` key that is no dynamic dim, a value that is no range, or a range
            that leaves a dim empty."""
    from lumc.compiler.core.buckets import DimRange, parse_range
    top = DEFAULT_MAX_SIZE if max_size is None else int(max_size)
    alias = {}
    for d in dims.values():
        alias[d.name] = d
        for i, ax in d.uses:
            name = names[i]
            for n in {name, name.removeprefix("L_").removesuffix("_")}:
                alias[f"{n}.{ax}"] = d
    given = {}
    for k, v in (shapes or {}).items():
        if k not in alias:
            raise InputError(f"options['shapes'] names {k!r}, which is not a dynamic dim of the "
                             f"graph (dims: {', '.join(sorted(alias))})")
        if isinstance(v, str):
            r = parse_range(v)
        elif isinstance(v, DimRange):
            r = v
        elif isinstance(v, (tuple, list)) and len(v) == 2:
            r = DimRange(int(v[0]), int(v[1]))
        else:
            r = None
        if r is None:
            raise InputError(f"options['shapes'][{k!r}] is {v!r}; expected a range (lo, hi) "
                             "or 'lo..hi'")
        given[alias[k].name] = r
    out = {}
    for d in dims.values():
        r = given.get(d.name)
        lo = max(d.lo, r.lo if r is not None else 1)
        hi = r.hi if r is not None else (d.hi if d.hi is not None else top)
        if d.hi is not None:
            hi = min(hi, d.hi)
        if hi < lo:
            raise InputError(f"dim {d.name} ({where_used(d, names)}): range {lo}..{hi} is empty "
                             f"(Dynamo's is {d.lo}..{d.hi if d.hi is not None else 'inf'})")
        d.range = DimRange(lo, hi)
        out[d.name] = d.range
    return out


def where_used(d: DynamicDim, names: list) -> str:
    """``x axis 1, mask axis 1``: the inputs (by placeholder name) whose size dim ``d`` is."""
    return ", ".join(f"{names[i]} axis {ax}" for i, ax in d.uses)
