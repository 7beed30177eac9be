"""Numerics checks in a process pool: compilation and checking run beside the search.

On ``sim:*`` a kernel's numerics check runs its generated Triton source in the CPU interpreter, the
most expensive step of a compile. :class:`CheckPool` runs those checks in worker processes (forked,
so they inherit the interpreter setting and the imported modules) while the main process goes on
with the search; the measurer takes the result when it needs the verdict. A kernel travels as its
serialized meaning (``lumc.ir.serialize``), inputs and outputs as numpy arrays.

Workers die with their parent: each watches a pipe whose only write end the parent holds (EOF when
the parent exits, however it exits: ``kill -9`` included) and its parent pid, and ends itself at
once; they ignore SIGINT, so a Ctrl-C at the terminal reaches the parent alone (which closes the
pool) and no worker prints a ``KeyboardInterrupt`` traceback. They run torch on one intra-op thread:
a process forked after its parent used torch's OpenMP pool hangs in its first parallel region.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np

from lumc.ir.kernels import Kernel
from lumc.ir.serialize import graph_from_bytes, graph_to_bytes

_PARENT_POLL_S = 1.0   # how often a worker re-checks its parent pid beside the pipe


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold Ctrl-C while the executor forks: a KeyboardInterrupt raised inside ``os.fork``'s
    at-fork hooks is swallowed by Python (the parent would go on as if nothing happened) and one
    in a just-forked child prints a traceback. A SIGINT that arrives meanwhile is re-sent to this
    process once the fork is done, so the handler in force before (the CLI's) sees it as usual.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s in held:
            signal.signal(s, previous[s])
        for s in dict.fromkeys(caught):
            os.kill(os.getpid(), s)


def _die_with_parent(read_fd: int, write_fd: int, parent: int) -> None:
    """Worker initializer: ignore SIGINT, and exit at once when the parent goes away (EOF on the
    pipe, or a new parent pid when another forked process still holds the write end)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # not the CLI's handler, inherited by the fork
    os.close(write_fd)
    torch = sys.modules.get("torch")
    if torch is not None:
        # torch's intra-op pool is GNU OpenMP, which is not fork-safe: a child forked after the
        # parent ran a parallel region (a large fill or copy) hangs in its first one, waiting on
        # threads it does not have. One intra-op thread never enters a region (``parallel_for``
        # runs inline); a worker is one of N processes on N cores anyway.
        torch.set_num_threads(1)

    def watch():
        while True:
            ready, _, _ = select.select([read_fd], [], [], _PARENT_POLL_S)
            if (ready and not os.read(read_fd, 1)) or os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="lumc-parent-watch", daemon=True).start()
    if os.getppid() != parent:     # the parent died before the thread started
        os._exit(0)


def _run_kernel(form: str, attrs: tuple, doc: bytes, npz: bytes, cfg: dict,
                ins: list[np.ndarray]) -> tuple[list[np.ndarray], list | None, str]:
    """Worker: rebuild the kernel, run it at ``cfg`` on ``ins`` (in the interpreter: a large
    grid on a sample of its programs, ``lumc.backends.triton.sampled``); returns its outputs,
    the elements the sampled programs wrote (None: all ran) and what ran."""
    from lumc.backends.triton.configs import make
    from lumc.backends.triton.launch import TritonKernel
    from lumc.backends.triton.sampled import run_sampled
    meaning, _ = graph_from_bytes(doc, npz)
    tk = TritonKernel(Kernel(form, meaning, attrs))
    c = dict(cfg)
    return run_sampled(tk, ins, make(c.pop("num_warps", 4), c.pop("num_stages", 2), **c))


class CheckPool:
    """Worker processes running kernels for numerics checks.

    Args:
        workers: processes (default: the CPU count, at most 4).
    """

    def __init__(self, workers: int | None = None):
        n = workers or min(4, os.cpu_count() or 1)
        self._read_fd, self._write_fd = os.pipe()   # both close-on-exec; workers close the write end
        self._pool = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork"),
                                         initializer=_die_with_parent,
                                         initargs=(self._read_fd, self._write_fd, os.getpid()))

    def submit(self, kernel: Kernel, cfg: dict, ins: list[np.ndarray]) -> Future:
        """Run ``kernel`` at ``cfg`` on ``ins`` in a worker; the future gives its output arrays."""
        doc, npz, _ = graph_to_bytes(kernel.meaning)
        with _interrupts_deferred():    # the executor forks its workers on demand, inside submit
            return self._pool.submit(_run_kernel, kernel.form, kernel.attrs, doc, npz, cfg,
                                     [np.asarray(x) for x in ins])

    def close(self) -> None:
        """Stop now: queued checks are dropped and running ones killed (the deadline has passed
        or the compile is done; nothing waits for them)."""
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:    # reap them now, so nothing of the pool is left running at exit
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        manager = getattr(self._pool, "_executor_manager_thread", None)
        if manager is not None:   # it sees the workers gone and ends; joined so exit finds it done
            manager.join(timeout=5.0)
        for fd in (self._write_fd, self._read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._write_fd = self._read_fd = -1
