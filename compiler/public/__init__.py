"""lumc: a tensor-graph compiler for neural-network inference.

The public API lives here; everything else is in the subpackages ``lumc.ir``, ``lumc.rewrites``,
``lumc.backends`` and ``lumc.compiler``.
"""
from __future__ import annotations

__version__ = "0.1.0"

from lumc.ir.errors import LumcError  # noqa: E402

__all__ = ["LumcError", "__version__"]
