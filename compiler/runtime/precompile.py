"""Kernels compiled for the GPU ahead of their timing, so the GPU never waits on a JIT compile.

On a GPU a config's first launch compiles it (Triton's JIT: TTIR to cubin, 0.3-3 s), and while it
compiles the GPU idles. :class:`Precompiler` takes the configs the search will time next (the next
configs of the kernel being timed, the default config of each kernel of the next candidate) and
compiles them in a background child process (``lumc.backends.triton.aot``: ``triton.compile`` of
the same module, signature, constexprs, 16-byte pointer alignment and ``num_warps``/``num_stages``
the JIT's launch specializes on) while the main process times others. The child writes Triton's
on-disk cache, which the JIT's launch reads: a precompiled config's first launch loads a cubin
instead of compiling one (Inductor's ``async_compile`` warms the same cache the same way).

Each compile also reports the config's register spills (``ptxas -v``): the measurer rejects a
spilling config before it is launched or timed. Inductor and Luminal compile autotuning candidates
in parallel pools for the same reason.

Compiles target ``cuda:90`` (H100/H200, ``aot.TARGET``); on another architecture the cache entries
do not match the JIT's key and the pool only costs CPU time (it is not started there).
"""
from __future__ import annotations

import threading
from collections import deque

from lumc.backends.triton.aot import AotResult, compile_many
from lumc.backends.triton.configs import Config
from lumc.backends.triton.source import RenderedKernel


class Precompiler:
    """A background compile queue (see module docstring).

    Args:
        batch: jobs one child process compiles at once (its start, ~2 s of imports, is shared).
        compile_fn: ``compile_many``'s signature; tests inject a fake.
    """

    def __init__(self, batch: int = 8, compile_fn=compile_many):
        self._batch = batch
        self._compile = compile_fn
        self._queue: deque = deque()
        self._done: dict[tuple, AotResult] = {}
        self._queued: set[tuple] = set()
        self._cv = threading.Condition()
        self._closed = False
        self.compiled = 0
        self._thread = threading.Thread(target=self._run, name="lumc-precompile", daemon=True)
        self._thread.start()

    @staticmethod
    def _key(rk: RenderedKernel, cfg: Config) -> tuple:
        return (rk.name, cfg)

    def submit(self, rk: RenderedKernel, cfg: Config) -> None:
        """Queue ``rk`` at ``cfg`` unless it is queued or compiled already."""
        k = self._key(rk, cfg)
        with self._cv:
            if self._closed or k in self._queued:
                return
            self._queued.add(k)
            self._queue.append((rk, cfg))
            self._cv.notify()

    def result(self, rk: RenderedKernel, cfg: Config, wait_s: float = 0.0) -> AotResult | None:
        """The compile of ``rk`` at ``cfg`` if it finished (waiting up to ``wait_s`` seconds for
        one that is queued), else None."""
        k = self._key(rk, cfg)
        with self._cv:
            if k not in self._done and k in self._queued and wait_s > 0:
                self._cv.wait_for(lambda: k in self._done or self._closed, timeout=wait_s)
            return self._done.get(k)

    def close(self) -> None:
        """Drop queued compiles; a batch already compiling finishes in its child and is discarded."""
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                jobs = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
            try:
                results = self._compile(jobs)
            except Exception as e:  # noqa: BLE001 - the child died: these configs compile at launch
                results = [AotResult(rk.name, rk.form, cfg, None, 0.0, f"precompile failed: {e}")
                           for rk, cfg in jobs]
            with self._cv:
                for (rk, cfg), r in zip(jobs, results):
                    self._done[self._key(rk, cfg)] = r
                    self.compiled += 1
                self._cv.notify_all()
