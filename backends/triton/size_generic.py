"""Size-generic kernels: one Triton module that serves every size of a range bucket.

A kernel of a range's plan is stored at the range's probe sizes (``lumc.ir.symbolic``: each ranged
dim at a prime ``P``). Rendered there, every size that depends on the dim is a literal
``c * P**k``, and because ``P`` is prime no tile divides it, so every access along the dim is
masked for a ragged tail. :func:`render_sized` renders the probe kernel and rewrites exactly those
literals into expressions of runtime int arguments (``L0``, one per ranged dim; ``c * P**k``
becomes ``(c*L0**k)``, a float ``1/(c*P**k)`` becomes ``(1.0 / (c*L0**k))``): the tile sizes stay
``tl.constexpr``, the sizes become arguments, and one compiled module serves the bucket.

The rewrite is sound only for literals that are such products (the same condition the probing
checks for the graph); a kernel is validated by running it at sizes of the bucket against the
reference executor on its meaning re-sized there (``tests/backends/test_size_generic.py``).
:class:`SizedKernel` launches one at given sizes: the pointer shapes are re-sized per call.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re

from lumc.backends.triton.launch import interpreter_mode, to_torch, torch_dtype
from lumc.ir.errors import InputError
from lumc.ir.kernels import Kernel
from lumc.ir.symbolic import count_depends, decompose, family_of, float_count, resize_int

_NUM = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)(?![\w.])")


def _product_expr(v: int, probes: dict[int, str], table: dict | None = None,
                  family=()) -> str | None:
    """``v`` (:func:`lumc.ir.symbolic.decompose`: ``c * P**k``, or with the range's ``table`` of
    affine values and its ``family`` of factors, ``c * (m*P + a) ...``) as an expression of the
    probes' names; None when it does not depend on the ranged dims."""
    if v == 0:
        return None
    c, factors = decompose(v, probes, table, family)
    if not factors:
        return None
    terms = [probes[p] if (m, a) == (1, 0) else f"({m}*{probes[p]}{a:+d})" for p, m, a in factors]
    return "(" + "*".join(([str(c)] if c != 1 else []) + terms) + ")"


def rewrite_sizes(text: str, probes: dict[int, str], table: dict | None = None) -> str:
    """``text`` (kernel or launcher source) with every literal that depends on a probe replaced by
    its expression in the size arguments (see the module docstring)."""
    family = family_of(table or {})

    def sub(m):
        tok = m.group(0)
        if tok.isdigit():
            e = _product_expr(int(tok), probes, table, family)
            return e if e is not None else tok
        got = float_count(float(tok), lambda n, rounded: count_depends(n, probes, table, family,
                                                                        rounded))
        if got is not None:
            n, recip = got
            e = _product_expr(n, probes, table, family)
            return f"(1.0 / {e})" if recip else f"({e} * 1.0)"
        return tok
    return _NUM.sub(sub, text)


# {probe prime: argument name} and the range's table while :func:`render_sized` renders: a
# renderer that bakes a value derived at the probe sizes into the source checks it holds elsewhere
_PROBES: contextvars.ContextVar = contextvars.ContextVar("lumc_sized_probes", default=None)


@contextlib.contextmanager
def _rendering_sized(probes: dict[int, str], table: dict | None):
    token = _PROBES.set((dict(probes), dict(table or {})))
    try:
        yield
    finally:
        _PROBES.reset(token)


def sized_substitution(shift):
    """While :func:`render_sized` renders: the Substitution that moves every probe's size by
    ``shift`` units (an int, or ``"double"``: ``2 p``), None for a size under 1; None outside a
    size-generic render (the kernel serves its probe sizes only)."""
    got = _PROBES.get()
    if got is None:
        return None
    from lumc.ir.symbolic import Substitution
    probes, table = got
    sizes = {p: 2 * p if shift == "double" else p + shift for p in probes}
    return Substitution(sizes, table) if min(sizes.values()) >= 1 else None


def rendering_sized() -> bool:
    """Whether a size-generic render (:func:`render_sized`) is under way."""
    return _PROBES.get() is not None


def render_sized(kernel: Kernel, probes: dict[int, str], variant: str | None = None,
                 table: dict | None = None, largest: dict[int, int] | None = None):
    """The :class:`~lumc.backends.triton.source.RenderedKernel` of ``kernel`` (at probe sizes) whose
    sizes are the runtime arguments named in ``probes`` (``{prime: "L0"}``; ``table``: the range's
    affine values; ``largest``: ``{prime: units}`` of the largest sizes it serves, where its
    int32/int64 indexing is decided, else at the probe sizes)."""
    from lumc.backends.triton.indexing import served_at
    from lumc.backends.triton.render import render_parts
    from lumc.backends.triton.source import assemble
    from lumc.ir.symbolic import Substitution
    with served_at(Substitution(largest, table) if largest else None), \
            _rendering_sized(probes, table):
        parts = render_parts(kernel, variant)
    rw = lambda t: rewrite_sizes(t, probes, table) if t else t     # noqa: E731
    parts = dataclasses.replace(
        parts, body=rw(parts.body), grid=rw(parts.grid), launcher=rw(parts.launcher),
        extra_kernels={k: rw(v) for k, v in parts.extra_kernels.items()},
        workspaces=[dataclasses.replace(w, shape=rw(w.shape)) for w in parts.workspaces])
    return assemble(kernel, parts, size_args=tuple(dict.fromkeys(probes.values())))


class SizedKernel:
    """A size-generic kernel and its launcher.

    Args:
        kernel: the kernel at probe sizes.
        probes: ``{prime: argument name}`` of the ranged dims.
        table: the range's affine values (``lumc.ir.symbolic.learn_table``), or None.
        largest: ``{prime: units}`` of the largest sizes it serves (its bucket's top), or None.
    """

    def __init__(self, kernel: Kernel, probes: dict[int, str], table: dict | None = None,
                 largest: dict[int, int] | None = None):
        from lumc.backends.triton import cache
        self.kernel = kernel
        self.probes = dict(probes)
        self.table = dict(table or {})
        self.rendered = render_sized(kernel, self.probes, table=self.table, largest=largest)
        self.module = cache.load_module(self.rendered)
        self._consts: dict[tuple, object] = {}

    def __call__(self, *inputs, sizes: dict[str, int], outputs=None, config=None):
        """Run at ``sizes`` (``{argument name: size}``) on tensors of the re-sized shapes; returns
        the output tensors (``outputs`` when given, filled in place).

        Raises:
            InputError: an input whose shape is not the re-sized one, or a wrong dtype.
        """
        import torch
        from lumc.backends.triton import configs
        rk = self.rendered
        from lumc.ir.symbolic import Substitution
        sub = Substitution({p: sizes[name] for p, name in self.probes.items()}, self.table)
        device = "cpu" if interpreter_mode() else next(
            (str(x.device) for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda), "cuda")
        args = []
        for p, x in zip(rk.inputs, inputs):
            t = to_torch(x, device)
            want = tuple(resize_int(d, sub) for d in p.shape)
            if tuple(t.shape) != want or t.dtype != torch_dtype(p.dtype):
                raise InputError(f"input {p.key} is {t.dtype}{list(t.shape)}, expected "
                                 f"{p.dtype}{list(want)}", node=p.key)
            args.append(t.contiguous())
        for p in rk.params:
            if p.role == "const":     # uploaded once per device (no copies inside a CUDA graph)
                key = (p.name, str(args[0].device) if args else device)
                if key not in self._consts:
                    self._consts[key] = to_torch(rk.constants[p.name], key[1]).contiguous()
                args.append(self._consts[key])
        if outputs is None:
            outputs = [torch.empty(tuple(resize_int(d, sub) for d in p.shape),
                                   dtype=torch_dtype(p.dtype), device=device) for p in rk.outputs]
        if config is None:
            config = (configs.interpreter_config if interpreter_mode() else configs.default_config)(
                rk.config_space, rk.problem)
        cfg = configs.with_precision(config, rk.problem)
        self.module.launch(*args, *outputs, **{n: int(v) for n, v in sizes.items()},
                           **cfg.kwargs())
        return list(outputs)
