"""The roofline cost model of kernels, on device ceilings given as plain data.

A kernel's time is at least ``max(flops / peak, min_bytes / bandwidth)`` (Williams, Waterman &
Patterson, "Roofline", CACM 2009); a program's bound adds one launch overhead per kernel. The ceilings
come from the compiler (``DeviceSpec.as_ceilings()`` in ``lumc.backends.devices``) as a dict::

    {"name": str, "tensor_flops": {dtype: FLOP/s}, "vector_flops": {dtype: FLOP/s},
     "bandwidth": bytes/s, "launch_s": seconds}

Contractions (``matmul``, ``attention``, ``mlp``) run on tensor cores, every other form on CUDA cores.
"""
from __future__ import annotations

from lumc.ir.kernels import Kernel

TENSOR_FORMS = frozenset({"matmul", "attention", "mlp"})


def kernel_dtype(kernel: Kernel) -> str:
    """The dtype name whose peak bounds the kernel: its widest floating input, else its first output."""
    floats = [n.dtype for n in kernel.inputs if n.dtype.is_float]
    if floats:
        return max(floats, key=lambda d: d.itemsize).name
    return kernel.outputs[0].dtype.name


def peak_flops(ceilings: dict, form: str, dtype: str) -> float:
    """FLOP/s ceiling for a kernel form in a dtype (tensor cores for contractions)."""
    table = ceilings["tensor_flops"] if form in TENSOR_FORMS else ceilings["vector_flops"]
    if dtype in table:
        return table[dtype]
    return min(ceilings["vector_flops"].values())


def roofline_seconds(flops: float, nbytes: float, peak: float, bandwidth: float) -> float:
    """``max(flops / peak, bytes / bandwidth)`` in seconds."""
    return max(flops / peak if peak else 0.0, nbytes / bandwidth if bandwidth else 0.0)


def kernel_time_bound(kernel: Kernel, ceilings: dict, launch: bool = True) -> float:
    """Lower bound on the kernel's time in seconds on the device, plus its launch overhead."""
    t = roofline_seconds(kernel.flops(), kernel.min_bytes(),
                         peak_flops(ceilings, kernel.form, kernel_dtype(kernel)),
                         ceilings["bandwidth"])
    return t + (ceilings["launch_s"] if launch else 0.0)
