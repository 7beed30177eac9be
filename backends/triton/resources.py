"""What a config compiled to on the GPU: register spills read from Triton's compiled kernels.

A config that spills registers to local memory is slow in a way no tile model predicts, so the
measurer prunes it before timing (``lumc.compiler.core.measure``). On a GPU the first launch of a config
JIT-compiles it; Triton keeps the result per ``@triton.jit`` function (``device_caches`` in
Triton 3, ``cache`` before), and each ``CompiledKernel`` carries ``n_spills`` and ``n_regs`` once
loaded. :func:`spills_of_launch` diffs those caches around one launch, so the kernels it adds are
the ones that launch compiled. Ahead of time (no GPU), ``aot.py`` reads the same figures from
``ptxas -v`` (``lumc inspect --aot cuda:90``).
"""
from __future__ import annotations


def _compiled(jitfn) -> list:
    """The compiled kernels a ``@triton.jit`` function holds (empty where the API differs)."""
    out = []
    caches = getattr(jitfn, "device_caches", None)
    if caches:
        for entry in list(caches.values()):
            cache = entry[0] if isinstance(entry, tuple) else entry
            if isinstance(cache, dict):
                out += list(cache.values())
    old = getattr(jitfn, "cache", None)
    if isinstance(old, dict):
        for per_device in old.values():
            if isinstance(per_device, dict):
                out += list(per_device.values())
    return out


def spills_of_launch(module, kernel_names, launch) -> tuple[int | None, object]:
    """Run ``launch()``; return ``(spills, its result)``: the largest ``n_spills`` of the kernels it
    compiled, or None when it compiled nothing new (already compiled, or the interpreter)."""
    fns = [getattr(module, n) for n in kernel_names if hasattr(module, n)]
    before = {id(k) for f in fns for k in _compiled(f)}
    result = launch()
    new = [k for f in fns for k in _compiled(f) if id(k) not in before]
    if not new:
        return None, result
    spills = []
    for k in new:
        if hasattr(k, "_init_handles"):
            try:
                k._init_handles()          # loads the binary: n_spills/n_regs are set there
            except Exception:  # noqa: BLE001 - no figure rather than no kernel
                pass
        spills.append(int(getattr(k, "n_spills", 0) or 0))
    return max(spills), result
