"""lumc: a tensor-graph compiler for neural-network inference.

The public API lives here; everything else is in the subpackages ``lumc.ir``, ``lumc.rewrites``,
``lumc.backends`` and ``lumc.compiler``. Every error lumc raises on purpose derives from
:class:`LumcError`; the subclasses say what kind of input was wrong.
"""
from __future__ import annotations

__version__ = "0.1.0"

from lumc.ir.errors import (  # noqa: E402
    ArtifactError, BudgetError, InputError, LumcError, ModelError, ShapeError, UnsupportedOpError,
)

__all__ = ["LumcError", "ModelError", "UnsupportedOpError", "InputError", "ShapeError",
           "BudgetError", "ArtifactError", "__version__"]


def compile(model, *, budget, device=None, example_inputs=None, shapes=None, **kwargs):
    """Compile ``model`` (an ONNX path, ``onnx.ModelProto`` or bytes; or a ``torch.nn.Module`` with
    ``example_inputs``) into the fastest correct program lumc finds within ``budget``.

    See :func:`lumc.compiler.pipeline.compile_model` for the arguments. Returns a
    :class:`~lumc.compiler.compiled.CompiledModel`.
    """
    from lumc.compiler.pipeline import compile_model
    return compile_model(model, budget=budget, device=device, example_inputs=example_inputs,
                         shapes=shapes, **kwargs)


def load(path, device=None):
    """Load a ``.lumc`` artifact as a :class:`~lumc.compiler.compiled.CompiledModel`."""
    from lumc.compiler.compiled import load as _load
    return _load(path, device)
