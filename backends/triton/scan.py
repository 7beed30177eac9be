"""The scan structure of a triangular contraction: re-exported from
:mod:`lumc.backends.scan_structure` (no Triton: the reference executor reads it too)."""
from lumc.backends.scan_structure import ScanSpec, finite_by_construction, scan_of  # noqa: F401

__all__ = ["ScanSpec", "scan_of", "finite_by_construction"]
