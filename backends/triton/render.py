"""One entry point from a :class:`~lumc.ir.kernels.Kernel` to its generated Triton module.

The kernel form picks the renderer; the renderer derives the structure it needs (reduction axes,
the matmul's operands and dims, the attention's softmax) from the meaning graph itself, and raises
:class:`~lumc.backends.triton.codegen.RenderError` when the meaning does not have that structure.
"""
from __future__ import annotations

import weakref

from lumc.ir.kernels import Kernel
from lumc.backends.triton.source import RenderedKernel, assemble

_RENDERED: "weakref.WeakKeyDictionary[Kernel, dict]" = weakref.WeakKeyDictionary()


def render(kernel: Kernel, variant: str | None = None) -> RenderedKernel:
    """Render ``kernel`` to Triton source.

    Args:
        kernel: the kernel (form + meaning).
        variant: force a variant where a form has several: ``"one-pass"`` or ``"looped"`` for row
            kernels (reduction, softmax, layernorm, rmsnorm), ``"generic"`` to render a matmul or
            attention through the row engine. None picks by problem size.
    Raises:
        RenderError: when the meaning does not fit the form.
    """
    hit = _RENDERED.get(kernel, {}).get(variant)
    if hit is not None:
        return hit
    rk = assemble(kernel, render_parts(kernel, variant))
    _RENDERED.setdefault(kernel, {})[variant] = rk
    return rk


def render_parts(kernel: Kernel, variant: str | None = None):
    """The form renderer's :class:`~lumc.backends.triton.source.KernelParts` for ``kernel`` (what
    :func:`render` assembles; ``lumc.backends.triton.size_generic`` rewrites them first)."""
    from lumc.backends.triton.render_attention import render_attention
    from lumc.backends.triton.render_matmul import render_matmul
    from lumc.backends.triton.render_pointwise import render_pointwise
    from lumc.backends.triton.render_reduction import render_row

    form = kernel.form
    if form in ("pointwise", "gather"):
        parts = render_pointwise(kernel)
    elif form in ("reduction", "softmax", "layernorm", "rmsnorm"):
        parts = render_row(kernel, variant)
    elif form == "matmul":
        parts = render_row(kernel, variant) if variant == "generic" else render_matmul(kernel)
    elif form == "mlp":
        from lumc.backends.triton.render_mlp import render_mlp
        parts = render_mlp(kernel)
    elif form == "scan":
        from lumc.backends.triton.render_scan import render_scan
        parts = render_scan(kernel)
    elif form == "attention":
        parts = render_row(kernel, variant) if variant == "generic" else render_attention(kernel)
    else:
        raise ValueError(f"unknown kernel form {form!r}")
    return parts
