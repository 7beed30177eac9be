"""Numerics checks in a process pool: compilation and checking run beside the search.

On ``sim:*`` a kernel's numerics check runs its generated Triton source in the CPU interpreter, the
most expensive step of a compile. :class:`CheckPool` runs those checks in worker processes (forked,
so they inherit the interpreter setting and the imported modules) while the main process goes on
with the search; the measurer takes the result when it needs the verdict. A kernel travels as its
serialized meaning (``lumc.ir.serialize``), inputs and outputs as numpy arrays.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np

from lumc.ir.kernels import Kernel
from lumc.ir.serialize import graph_from_bytes, graph_to_bytes


def _run_kernel(form: str, attrs: tuple, doc: bytes, npz: bytes, cfg: dict,
                ins: list[np.ndarray]) -> list[np.ndarray]:
    """Worker: rebuild the kernel, run it at ``cfg`` on ``ins``, return its outputs."""
    from lumc.backends.triton.configs import make
    from lumc.backends.triton.launch import TritonKernel, to_numpy
    meaning, _ = graph_from_bytes(doc, npz)
    tk = TritonKernel(Kernel(form, meaning, attrs))
    c = dict(cfg)
    outs = tk(*ins, config=make(c.pop("num_warps", 4), c.pop("num_stages", 2), **c))
    return [to_numpy(o) for o in outs]


class CheckPool:
    """Worker processes running kernels for numerics checks.

    Args:
        workers: processes (default: the CPU count, at most 4).
    """

    def __init__(self, workers: int | None = None):
        n = workers or min(4, os.cpu_count() or 1)
        self._pool = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork"))

    def submit(self, kernel: Kernel, cfg: dict, ins: list[np.ndarray]) -> Future:
        """Run ``kernel`` at ``cfg`` on ``ins`` in a worker; the future gives its output arrays."""
        doc, npz, _ = graph_to_bytes(kernel.meaning)
        return self._pool.submit(_run_kernel, kernel.form, kernel.attrs, doc, npz, cfg,
                                 [np.asarray(x) for x in ins])

    def close(self) -> None:
        """Stop now: queued checks are dropped and running ones killed (the deadline has passed
        or the compile is done; nothing waits for them)."""
        procs = list(getattr(self._pool, "_processes", {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
