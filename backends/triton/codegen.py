"""The source writer and the expression evaluator shared by every kernel form.

:class:`SourceWriter` collects the lines of one ``@triton.jit`` function in nested blocks (the
function body, then ``for`` loops), so a value that does not vary inside a loop can be emitted in an
enclosing block (hoisted) while the loop body is being written.

:class:`Evaluator` renders a primitive node at a tile index: ``value(node, idx, mask, level)`` returns
the name of a Triton value holding ``node[idx]`` for every lane of the tile, where ``idx`` has one
index expression per dim of ``node.shape``. Loads are masked by ``mask`` (the tile's bounds plus the
valid region of every view on the way), views turn into index arithmetic, and a form renderer supplies
a ``resolve`` hook for the nodes it computes itself (reductions, ``tl.dot`` accumulators, row values).
Values are memoized per block, so a tensor read twice in one tile is loaded once.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from lumc.ir.graph import Node
from lumc.ir.ops import ELEMENTWISE, REDUCE
from lumc.backends.triton import exprs
from lumc.backends.triton.indexing import (flat_index, is_pure_reshape, per_axis,
                                           permutation_of, reshape_index, unravel)


class RenderError(Exception):
    """The kernel's meaning does not fit the form being rendered (names the node and the reason)."""


_LITERAL = re.compile(r"[0-9\s+\-*/%()<>=&]+|False|True")


def fold_literal(expr: str | None) -> str | None:
    """An index or bounds expression without names, evaluated here: ``'3'``, ``'True'``,
    ``'False'``; any other expression unchanged. Compiled Triton folds such constexpr arithmetic
    with Python's semantics too, but the interpreter makes ``(2 + 1)`` a 0-d tensor, and a 0-d bool
    and-ed into a load mask gives the mask dtype int32, which its ``tl.load`` refuses."""
    if expr is None or not _LITERAL.fullmatch(expr) or expr.strip().lstrip("-").isdigit():
        return expr
    try:
        v = eval(expr, {"__builtins__": {}})    # noqa: S307 -- digits and operators only
    except (SyntaxError, ZeroDivisionError, TypeError):
        return expr
    return str(v) if isinstance(v, (bool, int)) else expr


def and_masks(*ms: str | None) -> str | None:
    parts = [m for m in ms if m]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return " & ".join(p if p.isidentifier() else f"({p})" for p in parts)


@dataclass
class _Block:
    header: str
    lines: list[str] = field(default_factory=list)
    memo: dict = field(default_factory=dict)


class SourceWriter:
    """Lines of one kernel body in nested blocks, with per-block common-subexpression naming."""

    def __init__(self):
        self.prelude: list[str] = []
        self._prelude_memo: dict = {}
        self.blocks: list[_Block] = [_Block("")]
        self._count: dict[str, int] = {}

    @property
    def level(self) -> int:
        return len(self.blocks) - 1

    def fresh(self, prefix: str) -> str:
        k = self._count.get(prefix, 0)
        self._count[prefix] = k + 1
        return f"{prefix}{k}"

    def line(self, text: str, level: int | None = None) -> None:
        self.blocks[self.level if level is None else level].lines.append(text)

    def bind(self, expr: str, prefix: str = "t", level: int | None = None) -> str:
        """Emit ``name = expr`` once per block (reusing a visible earlier binding) and return name."""
        if expr.isidentifier():
            return expr
        level = self.level if level is None else level
        for b in self.blocks[:level + 1]:
            hit = b.memo.get(("expr", expr))
            if hit is not None:
                return hit
        name = self.fresh(prefix)
        self.blocks[level].lines.append(f"{name} = {expr}")
        self.blocks[level].memo[("expr", expr)] = name
        return name

    def const(self, expr: str, prefix: str = "c") -> str:
        """A constant bound once at the top of the kernel."""
        hit = self._prelude_memo.get(expr)
        if hit is None:
            hit = self.fresh(prefix)
            self.prelude.append(f"{hit} = {expr}")
            self._prelude_memo[expr] = hit
        return hit

    def memo_get(self, key, level: int):
        for b in self.blocks[:level + 1]:
            if key in b.memo:
                return b.memo[key]
        return None

    def memo_put(self, key, value, level: int) -> None:
        self.blocks[level].memo[key] = value

    def open(self, header: str) -> None:
        self.blocks.append(_Block(header))

    def close(self) -> None:
        b = self.blocks.pop()
        parent = self.blocks[-1]
        parent.lines.append(b.header)
        parent.lines.extend("    " + ln for ln in (b.lines or ["pass"]))

    def body(self, indent: str = "    ") -> str:
        assert self.level == 0, "unclosed block"
        return "\n".join(indent + ln for ln in self.prelude + self.blocks[0].lines)


Resolver = Callable[["Evaluator", Node, tuple, "str | None", int], "str | None"]


class Evaluator:
    """Renders primitive nodes at tile indices (see module docstring).

    Args:
        writer: where lines go.
        pointers: ``{node: pointer argument name}`` for every tensor the kernel reads from memory.
        resolve: hook for nodes the form computes itself; returns a value name or None.
        index_dtype: ``tl.int32`` or ``tl.int64`` for gather indices.
    """

    def __init__(self, writer: SourceWriter, pointers: dict[Node, str],
                 resolve: Resolver | None = None, index_dtype: str = "tl.int32"):
        self.w = writer
        self.pointers = pointers
        self.resolve = resolve
        self.index_dtype = index_dtype
        # names bound to one value per program (batch indices from the program id): a load whose
        # address is built from these alone is a scalar load, masked after it (Triton refuses a
        # block mask on a scalar pointer)
        self.scalar_names: set[str] = set()
        # (idx, shape) -> a flat position already in hand (e.g. ``offs``), to skip div/mod chains
        self.flat_aliases: dict[tuple, str] = {}

    # ---- entry --------------------------------------------------------------------------------
    def value(self, n: Node, idx, mask: str | None, level: int) -> str:
        idx = tuple(idx)
        key = ("val", n, idx, mask)
        hit = self.w.memo_get(key, level)
        if hit is not None:
            return hit
        out = self.resolve(self, n, idx, mask, level) if self.resolve else None
        if out is None:
            out = self._render(n, idx, mask, level)
        self.w.memo_put(key, out, level)
        return out

    # ---- leaves -------------------------------------------------------------------------------
    def load(self, n: Node, flat: str, mask: str | None, level: int) -> str:
        ptr = self.pointers.get(n)
        if ptr is None:
            raise RenderError(f"node {n!r} is read from memory but is not a kernel input")
        if flat.lstrip("-").isdigit():
            # one element for every lane: a scalar load (in range) selected by the mask
            pos = int(flat)
            if not 0 <= pos < n.numel:
                return self.w.const(exprs.render_constant(0, n.dtype))
            x = self.w.bind(f"tl.load({ptr})" if pos == 0 else f"tl.load({ptr} + {pos})", "x", level)
            return x if mask is None else self.masked(mask, x, n.dtype, level)
        expr = f"tl.load({ptr} + ({flat}))"
        if mask is not None and self._scalar_address(flat):
            x = self.w.bind(expr, "x", level)   # in bounds: the program's own batch element
            return self.masked(mask, x, n.dtype, level)
        if mask is not None:
            expr = f"tl.load({ptr} + ({flat}), mask={mask}, other={exprs.load_other(n.dtype)})"
        return self.w.bind(expr, "x", level)

    def _scalar_address(self, flat: str) -> bool:
        names = re.findall(r"[A-Za-z_]\w*", flat)
        return bool(names) and all(x in self.scalar_names for x in names)

    def scalar_constant(self, n: Node) -> str:
        v = n.arg.value.reshape(-1)[0]
        return self.w.const(exprs.render_constant(v, n.dtype))

    @staticmethod
    def is_scalar_constant(n: Node) -> bool:
        return n.op == "Constant" and n.numel == 1

    # ---- rendering ----------------------------------------------------------------------------
    def _render(self, n: Node, idx: tuple, mask: str | None, level: int) -> str:
        op = n.op
        if self.is_scalar_constant(n):
            return self.scalar_constant(n)
        if op in ("Input", "Constant"):
            flat = self.flat_aliases.get((idx, n.shape)) or flat_index(list(idx), n.shape)
            return self.load(n, flat, mask, level)
        if op == "Iota":
            e = idx[n.arg.axis]
            if e.lstrip("-").isdigit():
                return self.w.const(exprs.render_constant(int(e), n.dtype))
            return self.w.bind(f"({e}).to({exprs.tl_dtype(n.dtype)})", "t", level)
        if op == "View":
            return self._view(n, idx, mask, level)
        if op == "Contiguous":  # inside a kernel, materializing is reading through
            return self.value(n.srcs[0], idx, mask, level)
        if op == "Gather":
            return self._gather(n, idx, mask, level)
        if op in REDUCE and n.srcs[0].shape == n.shape:  # only size-1 axes reduced: identity
            return self.value(n.srcs[0], idx, mask, level)
        if op in ELEMENTWISE:
            srcs = [self.value(s, idx, mask, level) for s in n.srcs]
            return self.w.bind(exprs.render_op(n, srcs), "t", level)
        raise RenderError(f"node {n!r}: op {op} cannot be rendered at this point of the kernel")

    def source_index(self, v, src: Node, idx: tuple, flat: str, level: int) -> list[str]:
        """Indices into ``src`` of the element a view reads at ``idx`` (cheapest form first)."""
        if is_pure_reshape(v, src.shape):
            return reshape_index(list(idx), v.shape, src.shape)
        perm = permutation_of(v, src.shape)
        if perm is not None:
            out = ["0"] * len(src.shape)
            for j, k in enumerate(perm):
                out[k] = idx[j]
            return out
        pa = per_axis(v, src.shape)
        if pa is not None:   # per-axis coordinates straight from the strides (a conv's windows)
            out = []
            for off, terms in pa:
                parts = ([str(off)] if off else []) + [
                    idx[j] if m == 1 else f"({idx[j]}) * {m}" for j, m in terms if idx[j] != "0"]
                e = fold_literal(" + ".join(parts) if parts else "0")
                out.append(e if e.isidentifier() or e.lstrip("-").isdigit()
                           else self.w.bind(f"({e})", "i", level))
            return out
        f = self.w.bind(flat, "f", level)
        return [self.w.bind(e, "i", level) if not e.isdigit() else e for e in unravel(f, src.shape)]

    def _view(self, n: Node, idx: tuple, mask: str | None, level: int) -> str:
        v, src = n.arg, n.srcs[0]
        flat, valid = v.index_expr(list(idx))
        flat, valid = fold_literal(flat), fold_literal(valid)
        if valid == "True":
            valid = None
        elif valid == "False":      # outside the view's valid region at every lane: zero
            return self.w.const(exprs.render_constant(0, n.dtype))
        if valid is not None:
            valid = self.w.bind(valid, "v", level)
        if self.is_scalar_constant(src):
            c = self.scalar_constant(src)
            return c if valid is None else self.masked(valid, c, src.dtype, level)
        lmask = and_masks(mask, valid)
        if src.op in ("Input", "Constant"):
            return self.load(src, flat, lmask, level)
        sidx = self.source_index(v, src, idx, flat, level)
        val = self.value(src, sidx, lmask, level)
        if valid is not None:
            val = self.masked(valid, val, src.dtype, level)
        return val

    def masked(self, valid: str, val: str, d, level: int) -> str:
        """``val`` where ``valid``, else zero of dtype ``d`` (False for bool)."""
        if d.is_bool:
            return self.w.bind(f"({valid}) & {val}", "t", level)
        return self.w.bind(f"tl.where({valid}, {val}, {exprs.render_scalar(0, d)})", "t", level)

    def _gather(self, n: Node, idx: tuple, mask: str | None, level: int) -> str:
        table, index = n.srcs
        a = n.arg
        ni = len(index.shape)
        if self.is_scalar_constant(index) and 0 <= int(index.arg.value.reshape(-1)[0]) < table.shape[a]:
            # a constant in-range index (a Resize's or Slice's pick): a plain read, no bounds test
            # (a 0-d bounds test and-ed into the load mask is refused by the interpreter)
            k = str(int(index.arg.value.reshape(-1)[0]))
            return self.value(table, tuple(idx[:a]) + (k,) + tuple(idx[a + ni:]), mask, level)
        g = self.value(index, idx[a:a + ni], mask, level)
        g = self.w.bind(f"{g}.to({self.index_dtype})", "g", level)
        # an index outside [0, n) reads zero instead of foreign memory (the reference raises)
        inb = self.w.bind(f"({g} >= 0) & ({g} < {table.shape[a]})", "v", level)
        tidx = tuple(idx[:a]) + (g,) + tuple(idx[a + ni:])
        val = self.value(table, tidx, and_masks(mask, inb), level)
        if table.op in ("Input", "Constant") and not self.is_scalar_constant(table):
            return val
        return self.masked(inb, val, n.dtype, level)


def reads_of(nodes) -> list[Node]:
    """Tensors a kernel reads from memory: inputs and non-scalar constants, in first-use order."""
    out, seen = [], set()
    for n in nodes:
        if (n.op == "Input" or (n.op == "Constant" and n.numel > 1)) and n not in seen:
            seen.add(n)
            out.append(n)
    return out
