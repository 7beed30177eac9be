"""The dynamic dims of a captured module: :class:`DimInfo` per ``torch.export`` symbol, and the
Dims the inputs have only as a multiple (``2 * Dim("h")``: even image sizes), which are size
ranges in steps of that multiple."""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from lumc.ir.errors import InputError
from lumc.ir.symbolic import probing_active


@dataclass
class DimInfo:
    """A named dynamic dim: ``name`` and its inclusive range (``max_value`` None: unbounded).

    ``step`` > 1: a Dim that the inputs have only as a multiple ``step * d`` (``2 * Dim("h")``,
    even image sizes): the dim is that axis size, named by it (``2*h``), its range in axis sizes
    (multiples of ``step``); the graph's symbol ``d`` is the size divided by ``step``."""
    name: str
    min_value: int
    max_value: int | None
    step: int = 1


def finite(v) -> int | None:
    """A range bound as an int; None for PyTorch's symbolic infinity (``int_oo``)."""
    return int(v) if isinstance(v, (int, sympy.Integer)) else None


def multiple_dims(inputs, dims: dict, constraints, names_by_tensor: dict, leaves) -> None:
    """Adds to ``dims`` each Dim the inputs have only as a multiple ``m * d`` (``2 * Dim("h")``),
    as the dim of that axis size in steps of ``m`` (:class:`DimInfo`); another derived form of a
    Dim no input has itself (``2 * h + 1``, or two multiples of it) is refused in one line.

    Args:
        inputs: the capture's ``InputSlot``s; ``dims``: ``{symbol: DimInfo}`` of the Dims the
            inputs have themselves; ``constraints``: ``torch.export``'s ``range_constraints``;
        names_by_tensor: ``{id(example tensor): {axis: Dim name}}``; ``leaves``: the examples.
    """
    found: dict = {}
    for slot, leaf in zip(inputs, leaves):
        for k, d in enumerate(slot.dims or ()):
            if isinstance(d, sympy.Expr) and not d.is_number and \
                    not d.free_symbols <= set(dims):
                label = names_by_tensor.get(id(leaf), {}).get(k, f"{slot.name}_dim{k}")
                found.setdefault(d, label)
    for d, label in found.items():
        sym = next(iter(d.free_symbols - set(dims)))
        m = d.coeff(sym) if len(d.free_symbols) == 1 else None
        if m is None or not (m.is_Integer and m > 1 and d == m * sym) or any(
                o is not d and sym in o.free_symbols for o in found):
            raise InputError(f"input dim {label!r} ({d}): a Dim the inputs have only in a derived "
                             "form is supported as a multiple of it (2 * Dim('h')); give the "
                             "inputs the Dim itself or that multiple")
        vr = constraints.get(sym)
        lo = finite(vr.lower) if vr is not None else None
        hi = finite(vr.upper) if vr is not None else None
        m = int(m)
        head, sep, tail = label.partition("*")        # the Dim's own name: 2*h -> h
        own = tail if sep and head.strip() == str(m) else str(sym)
        dims[sym] = DimInfo(f"{m}*{own}", m * (lo or 0), None if hi is None else m * hi, step=m)


def bind_multiple(dims: dict, env: dict, where: str, d, n: int) -> None:
    """Sets ``env[d's symbol]`` from an input axis of size ``n`` that is ``step * d`` of a
    :func:`multiple_dims` dim (no other form: the caller checks every derived axis after).

    Raises:
        InputError: ``n`` not a multiple of the step, or outside the range (not while probing)."""
    sym = next(iter(d.free_symbols), None) if len(d.free_symbols) == 1 else None
    info = dims.get(sym)
    if info is None or info.step == 1 or sym in env or d != info.step * sym:
        return
    if n % info.step or not probing_active() and (
            n < info.min_value or (info.max_value is not None and n > info.max_value)):
        hi = "inf" if info.max_value is None else info.max_value
        raise InputError(f"dim {info.name!r} of {where!r} is {n}, outside its range "
                         f"[{info.min_value}, {hi}] in steps of {info.step}", node=where)
    env[sym] = n // info.step
