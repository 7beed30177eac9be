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
