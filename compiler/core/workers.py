"""Where a compile's work units run: ``--workers local:N``, ``--workers ray``, ``ray://HOST:PORT``.

A **work unit** is the measurer's contract for one kernel: on ``sim:*``, "run kernel K at its
interpreter config on these inputs" (the numerics check's expensive half: the generated Triton in
the CPU interpreter); on a GPU, "compile, run and time kernel K at config C on a GPU of kind D".
A unit carries the kernel's serialized meaning (``lumc.ir.serialize``), its config and its input
arrays, never the user's model; it returns the kernel's outputs (and on a GPU its median seconds
and register spills), and the driver judges them against the reference exactly as it judges a
kernel run in-process (:mod:`lumc.compiler.core.measure`).

The search stays one search, in the driver: it asks for units ahead of need (the next candidates
in bound order; on a GPU also the next configs of the kernels furthest from their bound), workers
run them as they become idle, and the search consumes each verdict in its own order, so the verdict
a kernel gets does not depend on which worker ran it or when it finished. The driver alone writes
the tuning database.

Worker kinds:

* default (no ``--workers``): today's behaviour, a local process pool for ``sim:*`` checks when the
  machine has more than one core (:class:`~lumc.compiler.core.check_pool.CheckPool`), in-process
  otherwise and on a GPU;
* ``local:N``: N forked local processes for ``sim:*`` checks (on a GPU target units run in-process:
  a process forked after CUDA started cannot use it);
* ``ray``: the Ray cluster ``RAY_ADDRESS`` names, else a local one started for this compile;
  ``ray://HOST:PORT`` a cluster through Ray Client (:mod:`lumc.compiler.core.ray_workers`).

:func:`use_workers` makes one :class:`Workers` the current one for a whole compile (a compile of
several plans shares it, so a Ray cluster starts once); :func:`search_workers` hands the search its
pool. Ray is optional (``pip install 'lumc[distributed]'``).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from lumc.ir.errors import InputError
from lumc.ir.kernels import Kernel
from lumc.ir.serialize import graph_from_bytes, graph_to_bytes
from lumc.compiler.core.options import option

RAY_INSTALL_HINT = "pip install 'lumc[distributed]'"


class WorkerLost(RuntimeError):
    """A unit whose worker died or hung. ``retry_here``: the pool did not retry it (a local pool
    broken by the death), so the driver runs it once itself; otherwise it was lost twice (first on
    one worker, then on another) and is an error."""

    def __init__(self, message: str, retry_here: bool = False):
        super().__init__(message)
        self.retry_here = retry_here


@dataclass(frozen=True)
class WorkerSpec:
    """A parsed ``--workers``: ``kind`` is ``local`` or ``ray``; ``count`` the local processes
    (None: the default count); ``address`` a ``ray://HOST:PORT`` (None: ``RAY_ADDRESS`` or a new
    local cluster)."""
    kind: str
    count: int | None = None
    address: str | None = None
    text: str = ""


LOCAL_PER_CORE = 4   # local:N above this many per core is refused (local:99999 forked 99999)


def max_local_workers() -> int:
    """The most local worker processes ``local:N`` may ask for on this machine."""
    return LOCAL_PER_CORE * (os.cpu_count() or 1)


def parse_workers(text) -> WorkerSpec | None:
    """``local:N``, ``local``, ``ray`` or ``ray://HOST:PORT`` as a :class:`WorkerSpec`; None or an
    empty string is the default (None).

    Raises:
        InputError: anything else (one line naming the accepted forms), a count below 1 or above
            :func:`max_local_workers`, or ``ray`` when Ray is not installed (the line says how
            to install it).
    """
    if text is None or isinstance(text, WorkerSpec):
        return text
    s = str(text).strip()
    if not s:
        return None
    m = re.fullmatch(r"local(?::(\d+))?", s)
    if m:
        n = int(m.group(1)) if m.group(1) is not None else None
        if n is not None and n < 1:
            raise InputError(f"{option('workers', s)}: the number of local workers must be at "
                             "least 1")
        if n is not None and n > max_local_workers():
            raise InputError(f"{option('workers', s)}: at most {max_local_workers()} local workers on this "
                             f"machine ({LOCAL_PER_CORE} per CPU core): each is a process the size "
                             "of the compile, all started at once, and the checks are CPU-bound")
        return WorkerSpec("local", n, None, s)
    if s == "ray" or re.fullmatch(r"ray://[^\s:/]+:\d+", s):
        import_ray(s)
        return WorkerSpec("ray", None, s if s != "ray" else None, s)
    raise InputError(f"{option('workers', s)}: expected local:N (N worker processes), ray (the cluster "
                     "RAY_ADDRESS names, else a local one) or ray://HOST:PORT")


def import_ray(what: str = "ray"):
    """The ``ray`` module.

    Raises:
        InputError: Ray is not installed (one line: how to install it).
    """
    try:
        import ray
    except ImportError:
        raise InputError(f"{option('workers', what)} needs Ray, which is not installed: "
                         f"{RAY_INSTALL_HINT}") from None
    return ray


class NoBudget(Exception):
    """The deadline passed while a unit's result was awaited (a ``budget`` measurement)."""


class WorkerUnits:
    """The measurer's side of GPU units (:class:`~lumc.compiler.core.measure.KernelMeasurer`
    derives from it): one unit per config, started ahead (``_pending_gpu``, by
    ``KernelMeasurer.lookahead``) or when asked, whose result serves both the numerics check and
    the timing of that config. Needs ``pool``, ``target``, ``values``, ``deadline``,
    ``_pending_gpu``, ``_gpu_results`` and ``_gpu_asked`` (set by the measurer)."""

    def _gpu_workers(self) -> bool:
        return self.pool is not None and not self.target.simulated and \
            hasattr(self.pool, "submit_gpu")

    def _gpu_inputs(self, e) -> list:
        """A kernel's inputs for timing: reference values, else constants, else zeros."""
        out = []
        for n in e.call.inputs:
            v = self.values.get(id(n))
            if v is None:
                v = n.arg.value if n.op == "Constant" else np.zeros(n.shape, n.dtype.np)
            out.append(v)
        return out

    def _gpu_unit(self, e, index: int, cfg, pin: int | None = None) -> dict:
        """The GPU unit's result for a config (started ahead by :meth:`lookahead`, else now;
        ``pin``: a fresh unit on that worker, the final re-time).

        Raises:
            NoBudget: the deadline passed while waiting.
            WorkerLost, or the unit's own exception.
        """
        k = (e.key, index)
        if pin is None and k in self._gpu_results:
            return self._gpu_results[k]
        fut = None if pin is not None else self._pending_gpu.pop(k, None)
        if fut is None:
            self._gpu_asked.add(k)
            fut = self.pool.submit_gpu(e.kernel, cfg.kwargs() if cfg is not None else {},
                                       self._gpu_inputs(e), pin=pin)
        self.pool.want(fut)
        left = self.deadline.remaining() if self.deadline is not None else None
        try:
            r = fut.result(timeout=max(left, 0.0) if left is not None else None)
        except TimeoutError:
            raise NoBudget("error: no budget left for its GPU unit") from None
        if pin is None:
            self._gpu_results[k] = r
        return r

    def _worker_time(self, e, index: int, cfg, pin: int | None = None) -> float:
        """Seconds of a config timed by its GPU unit on a worker (``pin``: a fresh unit there)."""
        r = self._gpu_unit(e, index, cfg, pin=pin)
        self._gpu_results.pop((e.key, index), None)
        return float(r["seconds"])



class PrecompileUnits:
    """The measurer's side of the precompile queue (``lumc.compiler.runtime.precompile``) on a GPU
    timed in this process: configs the search's lookahead names compile in the background; one
    whose compile spills is rejected unlaunched. Needs ``target``, ``entries``, ``db``, ``_db_key``
    and ``precompiler`` (None until first use, False where none runs; set by the measurer)."""

    def _precompile(self, pairs) -> None:
        """On an sm_90 GPU timed in this process: compile the Triton configs of these pairs in the
        background (``lumc.compiler.runtime.precompile``), so their first launch does not wait on
        the JIT and a config that spills is rejected before it is launched."""
        if self.target.simulated or self.precompiler is False:
            return
        if self.precompiler is None:
            self.precompiler = False
            try:
                import torch
                from lumc.backends.triton.aot import TARGET
                dev = torch.device(self.target.torch_device)
                if torch.cuda.is_available() and \
                        torch.cuda.get_device_capability(dev) == (TARGET[1] // 10, TARGET[1] % 10):
                    import atexit
                    from lumc.compiler.runtime.precompile import Precompiler
                    self.precompiler = Precompiler()
                    atexit.register(self.precompiler.close)
            except Exception:          # noqa: BLE001 - no precompiling is only slower
                return
            if self.precompiler is False:
                return
        from lumc.backends.extern import is_extern
        for key, index in dict.fromkeys(pairs):
            e = self.entries[key]
            cfg = e.configs[index] if 0 <= index < len(e.configs) else None
            if cfg is None or e.triton is None or is_extern(cfg.kwargs()) or \
                    self.db.get(self._db_key(key, index)) is not None:
                continue
            self.precompiler.submit(e.triton.rendered, cfg)

    def _precompiled_spills(self, e, cfg) -> int:
        """Bytes per thread the precompiled ``cfg`` spills (0 when not precompiled or none)."""
        if not self.precompiler or cfg is None or e.triton is None:
            return 0
        r = self.precompiler.result(e.triton.rendered, cfg)
        return int((r.spill_stores or 0) + (r.spill_loads or 0)) if r is not None and \
            r.error is None else 0



# ---- the work units (run in a worker: a forked process or a Ray actor) ----------------------------
def _rebuild(form: str, attrs: tuple, doc: bytes, npz: bytes) -> Kernel:
    meaning, _ = graph_from_bytes(doc, npz)
    return Kernel(form, meaning, attrs)


def unit_args(kernel: Kernel, cfg: dict | None) -> tuple:
    """The picklable head of a unit: ``(form, attrs, doc, npz, cfg)`` (the inputs travel apart)."""
    doc, npz, _ = graph_to_bytes(kernel.meaning)
    return kernel.form, kernel.attrs, doc, npz, dict(cfg or {})


def run_check_unit(form: str, attrs: tuple, doc: bytes, npz: bytes, cfg: dict,
                   ins: list[np.ndarray]) -> tuple[list[np.ndarray], list | None, str]:
    """Unit for a ``sim:*`` numerics check: the kernel at Triton config ``cfg`` on ``ins``, in the
    CPU interpreter (a large grid on a sample of its programs); returns its output arrays, the
    elements the sampled programs wrote (None: all ran) and what ran
    (``lumc.backends.triton.sampled.run_sampled``); the driver compares them with the reference."""
    from lumc.compiler.core.check_pool import _run_kernel
    return _run_kernel(form, attrs, doc, npz, cfg, ins)


def run_gpu_unit(form: str, attrs: tuple, doc: bytes, npz: bytes, cfg: dict,
                 ins: list[np.ndarray], repeats: int = 25, warmup: int = 5) -> dict:
    """Unit on a GPU worker: compile the kernel at ``cfg``, run it once on ``ins`` (its outputs,
    for the driver's numerics check; none for an extern ``IMPL`` config, which the driver checks
    through torch on the CPU), then time it (CUDA-graph replays between events, median of
    ``repeats``: :func:`lumc.compiler.runtime.gpu_timing.cuda_event_samples`).

    Returns:
        ``{"outs": [arrays] or None, "seconds": median seconds per launch, "spills": bytes spilled
        per thread or None, "device": the GPU's name}``.
    """
    import statistics

    import torch

    from lumc.backends.extern import is_extern
    from lumc.compiler.runtime.gpu_timing import cuda_event_samples
    kernel = _rebuild(form, attrs, doc, npz)
    outs, spills = None, None
    if is_extern(cfg):
        from lumc.compiler.runtime.extern import ExternConfig, ExternKernel
        config = ExternConfig(cfg["IMPL"], cfg.get("PRECISION"))
        launch = ExternKernel(kernel, config.impl)
    else:
        from lumc.backends.triton.configs import make
        from lumc.backends.triton.launch import TritonKernel, to_numpy
        from lumc.backends.triton.resources import spills_of_launch
        c = dict(cfg)
        config = make(c.pop("num_warps", 4), c.pop("num_stages", 2), **c)
        launch = TritonKernel(kernel)
        spills, got = spills_of_launch(launch.module, launch.rendered.kernel_names,
                                       lambda: launch(*ins, config=config))
        outs = [to_numpy(o) for o in got]
    seconds = float(statistics.median(cuda_event_samples(launch, config, ins, "cuda", repeats,
                                                         warmup)))
    return {"outs": outs, "seconds": seconds, "spills": spills,
            "device": torch.cuda.get_device_name(0)}


def _with_pid(fn, *args):
    """Run ``fn(*args)`` in a local worker; returns ``(worker pid, seconds it took, result)``."""
    t0 = time.perf_counter()
    out = fn(*args)
    return os.getpid(), time.perf_counter() - t0, out


# ---- the local pool -------------------------------------------------------------------------------
class LocalWorkers:
    """``local:N``: N forked processes (a :class:`~lumc.compiler.core.check_pool.CheckPool`) for
    ``sim:*`` checks, counting units per worker. A worker that dies breaks the pool (Python's
    ``ProcessPoolExecutor``): the units it held and those queued fail with :class:`WorkerLost`
    (``retry_here``), which the measurer runs once in-process, and later checks run in-process
    too (:meth:`submit` returns None)."""

    kind = "local"

    def __init__(self, count: int):
        from lumc.compiler.core.check_pool import CheckPool
        self.count = count
        self._pool = CheckPool(workers=count)
        self._lock = threading.Lock()
        self.per_pid: dict[int, list] = {}     # pid -> [units, seconds busy]
        self.in_flight = 0
        self.lost = 0
        self.retried = 0
        self.broken = False
        self.closing = False

    def submit(self, kernel: Kernel, cfg: dict, ins: list) -> Future | None:
        """The sim check of ``kernel`` at ``cfg`` on ``ins``; the future gives its output arrays.
        None once the pool is broken (the check then runs in-process)."""
        from concurrent.futures.process import BrokenProcessPool

        from lumc.compiler.core.check_pool import _interrupts_deferred
        if self.broken:
            return None
        outer: Future = Future()
        head = unit_args(kernel, cfg)
        try:
            with _interrupts_deferred():   # the executor forks its workers on demand, in submit
                inner = self._pool._pool.submit(_with_pid, run_check_unit, *head,
                                                [np.asarray(x) for x in ins])
        except BrokenProcessPool:
            self.broken = True
            return None
        with self._lock:
            self.in_flight += 1

        def done(f: Future) -> None:
            with self._lock:
                self.in_flight -= 1
                if f.cancelled():
                    outer.cancel()
                    return
                err = f.exception()
                if err is None:
                    pid, secs, outs = f.result()
                    tally = self.per_pid.setdefault(pid, [0, 0.0])
                    tally[0] += 1
                    tally[1] += secs
                else:
                    from concurrent.futures.process import BrokenProcessPool
                    if isinstance(err, BrokenProcessPool) and self.closing:
                        # killed by close(): the search is over and dropped it, nothing was lost
                        outer.cancel()
                        return
                    if isinstance(err, BrokenProcessPool):
                        self.lost += 1
                        self.broken = True
                        err = WorkerLost(f"local worker lost ({err})", retry_here=True)
            if not outer.set_running_or_notify_cancel():
                return
            if err is None:
                outer.set_result(outs)
            else:
                outer.set_exception(err)
        inner.add_done_callback(done)
        outer.add_done_callback(lambda o: inner.cancel() if o.cancelled() else None)
        return outer

    def want(self, future: Future) -> None:
        """The search waits for ``future`` now (the local queue is first in, first out)."""

    def status(self) -> dict:
        busy = min(self.in_flight, self.count)
        return {"count": self.count, "busy": busy, "idle": self.count - busy,
                "in_flight": self.in_flight}

    def close(self) -> None:
        with self._lock:
            self.closing = True        # checks still running are killed: dropped, not lost
        self._pool.close()


# ---- the compile's workers ------------------------------------------------------------------------
class Workers:
    """The workers of one compile: the pool is started on first use (:meth:`start`; a compile
    whose plan is reused starts nothing) and stopped by :meth:`close`. ``spec`` None is the
    default (see module docstring)."""

    def __init__(self, spec: WorkerSpec | None):
        self.spec = spec
        self._ray = None
        self._local_units: list[list] = []    # [units, seconds busy] per worker, over pools
        self._local_lost = 0
        self._local_retried = 0
        self._local_count = 0
        self.note: str | None = None
        self.pool = None

    def start(self, target):
        """The pool for a search on ``target`` (None: units run in-process)."""
        from lumc.compiler.runtime.targets import fork_safe
        spec = self.spec
        if spec is None or spec.kind == "local":
            if not target.simulated:
                self.note = ("GPU units run in-process (a forked process cannot use CUDA); "
                             f"{option('workers', 'ray')} runs one worker per GPU"
                             if spec is not None else None)
                return None
            n = spec.count if spec is not None and spec.count else min(4, os.cpu_count() or 1)
            if spec is None and (os.cpu_count() or 1) <= 1:
                return None
            if not fork_safe():
                self.note = "checks run in-process (CUDA is initialized here: no fork)"
                return None
            self._local_count = max(self._local_count, n)
            return LocalWorkers(n)
        if self._ray is None:
            from lumc.compiler.core.ray_workers import RayWorkers
            self._ray = RayWorkers(spec, target)
        return self._ray

    def finish(self, pool) -> None:
        """The search that used ``pool`` ended: a local pool is closed (its running checks
        killed), a Ray pool's queued units are dropped (the next plan of the compile reuses it)."""
        if pool is None:
            return
        if isinstance(pool, LocalWorkers):
            pool.close()
            units = sorted(pool.per_pid.values(), reverse=True)   # one entry per worker
            n = max(pool.count, len(units), len(self._local_units))
            units += [[0, 0.0]] * (n - len(units))
            mine = self._local_units + [[0, 0.0]] * (n - len(self._local_units))
            self._local_units = [[a[0] + b[0], a[1] + b[1]] for a, b in zip(mine, units)]
            self._local_lost += pool.lost
            self._local_retried += pool.retried
        else:
            pool.cancel_queued()

    def close(self) -> None:
        """Stop the Ray pool (and a cluster this compile started; a joined one only loses this
        driver)."""
        if self._ray is not None:
            self._ray.close()

    def status(self) -> dict | None:
        """``{count, busy, idle, in_flight}`` of the current pool for the progress display."""
        return self.pool.status() if self.pool is not None else None

    def report(self) -> dict:
        """The report's ``workers``: ``kind`` (``local``, ``ray`` or ``in-process``), ``count``,
        ``units_per_worker`` (list, one entry per worker), ``busy_s_per_worker`` (seconds spent
        running units, each), ``units``, ``units_lost`` (a worker died or hung while running
        them; a broken local pool counts every unit it dropped, queued ones too), ``retried`` (run
        again elsewhere: another actor, or in the driver for a local pool), ``failed`` (lost and
        not retried: errors), and for Ray the ``address``, ``started_cluster`` and ``workers``
        (per actor: units, busy seconds, alive, host, pid)."""
        if self._ray is not None:
            return self._ray.report()
        kind = "local" if self._local_count else "in-process"
        out = {"kind": kind, "count": self._local_count,
               "units_per_worker": [u for u, _ in self._local_units],
               "busy_s_per_worker": [round(b, 2) for _, b in self._local_units],
               "units": sum(u for u, _ in self._local_units),
               "units_lost": self._local_lost, "retried": self._local_retried,
               "failed": self._local_lost - self._local_retried}
        if self.note:
            out["note"] = self.note
        return out


_ACTIVE: contextvars.ContextVar[Workers | None] = contextvars.ContextVar("lumc_workers",
                                                                         default=None)


@contextlib.contextmanager
def use_workers(spec):
    """Make the workers of ``spec`` (a ``--workers`` string, a :class:`WorkerSpec` or None) the
    current ones for the compile inside; stopped at its end. Inside a compile that already has
    workers, ``spec`` None keeps those (one plan of several)."""
    outer = _ACTIVE.get()
    if outer is not None and spec is None:
        yield outer
        return
    w = Workers(parse_workers(spec))
    token = _ACTIVE.set(w)
    try:
        yield w
    finally:
        _ACTIVE.reset(token)
        w.close()


def with_workers(fn):
    """Decorator: ``fn(..., workers=SPEC)`` runs inside :func:`use_workers` (``SPEC`` parsed
    before any work, so a bad one fails at once)."""
    @functools.wraps(fn)
    def wrapped(*args, workers=None, **kwargs):
        with use_workers(workers):
            return fn(*args, **kwargs)
    import inspect
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind == p.VAR_KEYWORD), len(params))
    params.insert(at, inspect.Parameter("workers", inspect.Parameter.KEYWORD_ONLY, default=None))
    wrapped.__signature__ = sig.replace(parameters=params)   # what it takes, workers= included
    return wrapped


def warm_workers(target) -> None:
    """Start the current compile's Ray workers now (their processes load torch and Triton while
    the driver builds candidates), when ``--workers ray`` asked for them; nothing otherwise."""
    w = _ACTIVE.get()
    if w is not None and w.spec is not None and w.spec.kind == "ray" and w._ray is None:
        w.start(target)


@contextlib.contextmanager
def search_workers(target, deadline):
    """The current compile's :class:`Workers` (a default one when there is none), with
    ``.pool`` set for one search on ``target``; the pool is finished when the search ends (a
    passed deadline or Ctrl-C cancels its outstanding units)."""
    w = _ACTIVE.get()
    temp = w is None
    if temp:
        w = Workers(None)
    w.pool = w.start(target) if not deadline.expired() else None
    try:
        yield w
    finally:
        pool, w.pool = w.pool, None
        try:
            w.finish(pool)
        finally:
            if temp:
                w.close()
