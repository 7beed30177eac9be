"""Work units on a Ray cluster: one actor per CPU (``sim:*`` checks) or per GPU (compile, check,
time), fed by a dispatcher thread in the driver.

:class:`RayWorkers` is the pool :mod:`lumc.compiler.core.workers` gives the search for ``--workers
ray`` / ``ray://HOST:PORT``. The driver keeps the search, the budget and the tuning database; the
actors only run units (:func:`~lumc.compiler.core.workers.run_check_unit`,
:func:`~lumc.compiler.core.workers.run_gpu_unit`) and return their results.

* **Cluster.** ``ray://HOST:PORT`` connects through Ray Client; ``ray`` joins the cluster
  ``RAY_ADDRESS`` names, else starts a local one with every core of this machine (no dashboard,
  quiet logs; never the cluster a ``ray start`` recorded in ``/tmp/ray``). A cluster this
  compile started is shut down when the compile ends; a joined one is only disconnected from. A
  driver that already called ``ray.init`` is used as it is. An address that refuses or does not
  take a TCP connection within ``CONNECT_TIMEOUT_S`` is an error at once (Ray itself retries for
  30 s to minutes).
* **Actors.** ``sim:*``: one actor per CPU of the cluster (``num_cpus=1``), started with
  ``TRITON_INTERPRET=1`` in its environment. A GPU target: one per GPU (``num_gpus=1``); an actor
  whose GPU is not of the target's kind (another name than the driver's) is dropped, so timings
  compare only within one device kind (the tuning database key holds the device name too).
* **Data.** A unit carries the kernel's serialized meaning, its config and ObjectRefs of its input
  arrays: each array (a weight, a reference activation) is ``ray.put`` once per compile and the
  same ref reused by every unit that reads it, so it reaches each node once.
* **Dispatch.** Units wait in a queue ordered by urgency (a unit the search is blocked on first),
  then submission order (the search submits in bound order); an idle actor takes the next one. One
  unit runs per actor at a time, so a lost actor costs one unit.
* **Faults.** A unit whose actor dies (or runs past ``unit_timeout_s``: the actor is killed) is
  lost; it is retried once on another actor (a replacement actor is started for the dead one),
  then its future fails with :class:`WorkerLost` and the measurer marks it an error (errors are
  never stored in the database). An exception raised by the unit's own code is its result.
* **Cancel.** :meth:`RayWorkers.cancel_queued` drops the queued units of a finished search;
  :meth:`RayWorkers.close` (the compile ended, the deadline passed, Ctrl-C) kills every actor,
  which cancels running units, and fails every outstanding future.
"""
from __future__ import annotations

import itertools
import logging
import os
import re
import socket
import threading
import time
import warnings
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field

import numpy as np

from lumc.compiler.core.workers import (WorkerLost, WorkerSpec, import_ray, run_check_unit,
                                        run_gpu_unit, unit_args)
from lumc.ir.errors import InputError
from lumc.compiler.core.options import option

UNIT_TIMEOUT_S = 900.0   # a unit running longer is taken as hung (a big interpreter check: minutes)
START_TIMEOUT_S = 120.0  # GPU actors report their device within this
CONNECT_TIMEOUT_S = 5.0  # a cluster's address answers a TCP connect within this
_POLL_S = 0.05


def ray_init_kwargs(address: str | None, num_cpus: int | None = None) -> dict:
    """The keyword arguments of ``ray.init`` for ``address`` (``ray://HOST:PORT``, ``HOST:PORT``,
    ``auto``; None: a new local cluster of ``num_cpus`` CPUs, default this machine's).

    Without an address the call says ``address="local"``: a bare ``ray.init`` joins the cluster
    that ``$RAY_TMPDIR/ray/ray_current_cluster`` (default ``/tmp/ray``) names, which a cluster
    that died leaves behind, and then refuses ``num_cpus``."""
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address:
        return {"address": address, **quiet}
    return {"address": "local", "num_cpus": num_cpus or os.cpu_count() or 1,
            "include_dashboard": False, **quiet}


def probe_address(what: str, address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to the ``HOST:PORT`` of ``address`` (``ray://`` or a
    GCS address; ``auto`` and other forms are left to Ray) within ``timeout_s`` seconds.

    Ray retries an unreachable address for 30 s (Ray Client) or minutes (a GCS address), past a
    short budget, which then ran out with no word of the address.

    Raises:
        InputError: the connection is refused, times out, or the host is unknown (one line
            naming ``what`` (the ``--workers`` value), the address and the reason).
    """
    m = re.fullmatch(r"(?:ray://)?\[?([^\s\[\]/]+?)\]?:(\d+)/?", address)
    if m is None:
        return
    host, port = m.group(1), int(m.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = (f"no answer within {timeout_s:g} s" if isinstance(e, TimeoutError)
                  else e.strerror or str(e) or type(e).__name__)
        raise InputError(f"{option('workers', what)}: cannot reach the Ray cluster at {address} "
                         f"({reason})") from None


class UnitActor:
    """A Ray actor running work units (created through ``ray.remote``; see module docstring)."""

    def __init__(self, env: dict):
        import signal
        os.environ.update(env)
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the driver alone
        except ValueError:
            pass
        try:        # warm: torch and Triton load while the driver still builds its candidates
            import lumc.backends.triton.launch  # noqa: F401
        except Exception:
            pass        # the first unit reports why

    def info(self) -> dict:
        import socket
        out = {"pid": os.getpid(), "host": socket.gethostname(), "device": None}
        if os.environ.get("TRITON_INTERPRET") != "1":
            try:
                import torch
                if torch.cuda.is_available():
                    out["device"] = torch.cuda.get_device_name(0)
            except Exception:
                pass
        return out

    def run(self, fn, args: tuple, refs: list | None):
        """``fn(*args, arrays)`` with the arrays of ``refs`` (writable copies where the object
        store hands out read-only views); ``fn(*args)`` when ``refs`` is None. Returns
        ``(seconds it took, result)``."""
        import ray
        t0 = time.perf_counter()
        if refs is None:
            return time.perf_counter() - t0, fn(*args)
        arrays = ray.get(list(refs)) if refs else []
        arrays = [a if not isinstance(a, np.ndarray) or a.flags.writeable else np.array(a)
                  for a in arrays]
        out = fn(*args, arrays)
        return time.perf_counter() - t0, out


@dataclass
class _Unit:
    seq: int
    fn: object
    args: tuple
    refs: list | None
    future: Future
    urgent: bool = False
    pin: int | None = None           # run on this worker (the final re-time), when it lives
    attempts: int = 0
    avoid: set = field(default_factory=set)


def _drop(u: _Unit) -> None:
    """Cancel a unit's future (a retried unit's future is running already: it fails instead)."""
    if not u.future.cancel() and not u.future.done():
        u.future.set_exception(CancelledError("the search no longer needs this unit"))


@dataclass
class _Slot:
    index: int
    actor: object
    info_ref: object = None
    info: dict | None = None
    unit: _Unit | None = None
    ref: object = None
    since: float = 0.0
    units: int = 0
    busy_s: float = 0.0
    alive: bool = True


class RayWorkers:
    """Ray actors running the search's work units (see module docstring).

    Args:
        spec: ``ray`` or ``ray://HOST:PORT``.
        target: the compile target; ``target.simulated`` picks CPU actors (sim checks), else GPU
            actors of the driver's GPU kind.
        unit_timeout_s: a running unit older than this is hung: its actor is killed.
        retries: times a lost unit is run again elsewhere before it fails.
        num_cpus: CPUs of a local cluster started here (default: this machine's).
    Raises:
        InputError: Ray is not installed; the cluster cannot be reached (an address that does
            not take a TCP connection within ``CONNECT_TIMEOUT_S``: at once, not after Ray's own
            retries); it has no CPU (no GPU of the target's kind, for a GPU target).
    """

    kind = "ray"

    def __init__(self, spec: WorkerSpec, target, unit_timeout_s: float = UNIT_TIMEOUT_S,
                 retries: int = 1, num_cpus: int | None = None):
        ray = self.ray = import_ray(spec.text or "ray")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.target = target
        self.gpu = not target.simulated
        self.unit_timeout_s = unit_timeout_s
        self.retries = retries
        self.started_cluster = False
        self._connected = False
        address = spec.address or os.environ.get("RAY_ADDRESS") or None
        self.address = address or ("local" if not ray.is_initialized() else "this process's Ray")
        if not ray.is_initialized():
            if address:
                probe_address(spec.text or "ray", address)
            try:
                with warnings.catch_warnings():     # Ray Client warns before it raises
                    warnings.simplefilter("ignore")
                    ray.init(**ray_init_kwargs(address, num_cpus))
                self.started_cluster = not address
            except Exception as e:
                raise InputError(f"{option('workers', spec.text or 'ray')}: cannot start or reach the Ray "
                                 f"cluster{' at ' + address if address else ''}: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            self._connected = True
        res = ray.cluster_resources()
        key = "GPU" if self.gpu else "CPU"
        self.count = int(res.get(key, 0))
        if self.count < 1:
            self._disconnect()
            raise InputError(f"{option('workers', spec.text or 'ray')}: the Ray cluster has no {key} "
                             f"(resources: {', '.join(sorted(res)) or 'none'})")
        self._env = {} if self.gpu else {"TRITON_INTERPRET": "1"}
        self._actor_cls = ray.remote(UnitActor)
        self._lock = threading.Lock()
        self._queue: list[_Unit] = []
        self._slots: list[_Slot] = []
        self._puts: dict[int, tuple] = {}     # id(array) -> (array, ObjectRef): one put per value
        self._seq = itertools.count()
        self._closed = False
        self.lost = self.retried = self.failed = self.dropped_kind = 0
        self._respawns = self.count
        for _ in range(self.count):
            self._spawn()
        if self.gpu:
            self._check_gpu_kinds()
        self._thread = threading.Thread(target=self._loop, name="lumc-ray-dispatch", daemon=True)
        self._thread.start()

    # ---- actors -----------------------------------------------------------------------------------
    def _spawn(self) -> _Slot:
        opts = {"num_gpus": 1, "num_cpus": 0} if self.gpu else {"num_cpus": 1}
        opts["runtime_env"] = {"env_vars": dict(self._env)} if self._env else None
        opts = {k: v for k, v in opts.items() if v is not None}
        actor = self._actor_cls.options(max_restarts=0, max_task_retries=0, **opts).remote(self._env)
        slot = _Slot(len(self._slots), actor)
        slot.info_ref = actor.info.remote()
        self._slots.append(slot)
        return slot

    def _check_gpu_kinds(self) -> None:
        """Keep the GPU actors whose device is the target's kind (the driver's GPU name)."""
        want = self.target.name.split(" ", 1)[1] if " " in self.target.name else None
        for s in self._slots:
            try:
                s.info = self.ray.get(s.info_ref, timeout=START_TIMEOUT_S)
            except Exception:
                s.alive = False
                continue
            if want is not None and s.info.get("device") != want:
                s.alive = False
                self.dropped_kind += 1
                self.ray.kill(s.actor)
        if not any(s.alive for s in self._slots):
            self.close()
            raise InputError(f"{option('workers', 'ray')}: no GPU of the target's kind ({want}) in the cluster")

    def _lose(self, slot: _Slot, why: str) -> None:
        """``slot``'s actor died or hung: its unit is retried elsewhere once, then fails."""
        unit = slot.unit
        slot.alive, slot.unit, slot.ref = False, None, None
        try:
            self.ray.kill(slot.actor)
        except Exception:
            pass
        if self._respawns > 0 and not self._closed:
            self._respawns -= 1
            self._spawn()
        if unit is None:
            return
        self.lost += 1
        if unit.attempts <= self.retries and not self._closed:
            self.retried += 1
            unit.avoid.add(slot.index)
            unit.urgent = True
            with self._lock:
                self._queue.append(unit)
        else:
            self.failed += 1
            if not unit.future.done():
                unit.future.set_exception(WorkerLost(
                    f"worker lost while running it, {unit.attempts} times ({why})"))

    # ---- units ------------------------------------------------------------------------------------
    def _ref(self, x):
        hit = self._puts.get(id(x))
        if hit is None or hit[0] is not x:
            hit = self._puts[id(x)] = (x, self.ray.put(np.asarray(x)))
        return hit[1]

    def submit_call(self, fn, args: tuple, arrays: list | None = None,
                    pin: int | None = None) -> Future:
        """Run ``fn(*args, arrays)`` on a worker (``fn(*args)`` when ``arrays`` is None;
        ``pin``: on that worker while it lives); the future gives its result, or raises the
        exception ``fn`` raised, or :class:`WorkerLost`. ``fn`` must be importable where the
        actors run (it is pickled by reference)."""
        fut: Future = Future()
        refs = None if arrays is None else [self._ref(x) for x in arrays]
        unit = _Unit(next(self._seq), fn, tuple(args), refs, fut, pin=pin)
        with self._lock:
            if self._closed:
                fut.cancel()
                return fut
            self._queue.append(unit)
        return fut

    def submit(self, kernel, cfg: dict, ins: list) -> Future:
        """The ``sim:*`` check unit of ``kernel`` at ``cfg`` on ``ins`` (its output arrays)."""
        return self.submit_call(run_check_unit, unit_args(kernel, cfg), ins)

    def submit_gpu(self, kernel, cfg: dict | None, ins: list, pin: int | None = None) -> Future:
        """The GPU unit of ``kernel`` at ``cfg``: ``{"outs", "seconds", "spills", "device"}``."""
        return self.submit_call(run_gpu_unit, unit_args(kernel, cfg), ins, pin=pin)

    def want(self, future: Future) -> None:
        """The search is blocked on ``future``: its unit goes first when still queued."""
        with self._lock:
            for u in self._queue:
                if u.future is future:
                    u.urgent = True

    def cancel_queued(self) -> None:
        """Drop every unit not started yet (their futures are cancelled)."""
        with self._lock:
            queued, self._queue = self._queue, []
        for u in queued:
            _drop(u)

    # ---- the dispatcher ---------------------------------------------------------------------------
    def _next_for(self, slot: _Slot) -> _Unit | None:
        alive = {s.index for s in self._slots if s.alive}
        best = None
        for u in self._queue:
            if u.pin is not None and u.pin in alive and u.pin != slot.index:
                continue
            if slot.index in u.avoid and alive - u.avoid:
                continue
            if best is None or (not u.urgent, u.seq) < (not best.urgent, best.seq):
                best = u
        return best

    def _assign(self) -> None:
        with self._lock:
            self._queue = [u for u in self._queue if not u.future.done()]
            for slot in self._slots:
                if not slot.alive or slot.unit is not None:
                    continue
                u = self._next_for(slot)
                if u is None:
                    continue
                self._queue.remove(u)
                if u.attempts == 0 and not u.future.set_running_or_notify_cancel():
                    continue            # cancelled meanwhile
                u.attempts += 1
                slot.unit, slot.since = u, time.monotonic()
                slot.ref = slot.actor.run.remote(u.fn, u.args, u.refs)

    def _loop(self) -> None:
        ray = self.ray
        while not self._closed:
            try:
                self._assign()
                busy = [s for s in self._slots if s.ref is not None]
                if not busy:
                    time.sleep(_POLL_S)
                    continue
                ready, _ = ray.wait([s.ref for s in busy], num_returns=1, timeout=_POLL_S,
                                    fetch_local=False)
                for s in busy:     # refs compare by value (Ray Client hands back new objects)
                    if any(s.ref == r for r in ready):
                        self._finish(s)
                    elif time.monotonic() - s.since > self.unit_timeout_s:
                        self._lose(s, f"no result after {self.unit_timeout_s:g} s: killed")
            except Exception:      # the cluster went away (shutdown at close): stop dispatching
                if self._closed:
                    return
                time.sleep(_POLL_S)

    def _finish(self, slot: _Slot) -> None:
        ex = self.ray.exceptions
        unit = slot.unit
        try:
            secs, out = self.ray.get(slot.ref)
        except ex.RayTaskError as e:          # the unit's own code raised: that is its result
            slot.unit = slot.ref = None
            slot.units += 1
            cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
            if not unit.future.done():
                unit.future.set_exception(cause)
            return
        except (ex.RayActorError, ex.WorkerCrashedError, ex.ObjectLostError,
                getattr(ex, "ActorUnavailableError", ex.RayActorError)) as e:
            self._lose(slot, type(e).__name__)
            return
        slot.unit = slot.ref = None
        slot.units += 1
        slot.busy_s += secs
        if not unit.future.done():
            unit.future.set_result(out)

    # ---- state ------------------------------------------------------------------------------------
    def status(self) -> dict:
        """``{count, busy, idle, in_flight}``: live actors, those running a unit, units running
        or queued."""
        alive = [s for s in self._slots if s.alive]
        busy = sum(1 for s in alive if s.unit is not None)
        return {"count": len(alive), "busy": busy, "idle": len(alive) - busy,
                "in_flight": busy + len(self._queue)}

    def report(self) -> dict:
        """The report's ``workers`` (see :meth:`lumc.compiler.core.workers.Workers.report`)."""
        per = []
        for s in self._slots:
            if s.info is None and s.info_ref is not None:
                try:
                    ready, _ = self.ray.wait([s.info_ref], timeout=0)
                    s.info = self.ray.get(ready[0]) if ready else None
                except Exception:
                    s.info = None
            per.append({"worker": s.index, "units": s.units, "busy_s": round(s.busy_s, 2),
                        "alive": s.alive,
                        "host": (s.info or {}).get("host"), "pid": (s.info or {}).get("pid")})
        out = {"kind": "ray", "address": self.address, "started_cluster": self.started_cluster,
               "device_kind": "gpu" if self.gpu else "cpu", "count": self.count,
               "units_per_worker": [p["units"] for p in per],
               "busy_s_per_worker": [p["busy_s"] for p in per],
               "units": sum(p["units"] for p in per),
               "units_lost": self.lost, "retried": self.retried, "failed": self.failed,
               "workers": per}
        if self.dropped_kind:
            out["dropped_other_kind"] = self.dropped_kind
        return out

    def close(self) -> None:
        """Kill every actor (running units end), fail the outstanding futures, and shut down a
        cluster started here (disconnect from a joined one)."""
        if self._closed:
            return
        self._closed = True
        if getattr(self, "_thread", None) is not None:
            self._thread.join(timeout=5.0)
        with self._lock:
            queued, self._queue = self._queue, []
        running = [s.unit for s in self._slots if s.unit is not None]
        for u in queued + running:
            _drop(u)
        for s in self._slots:
            try:
                self.ray.kill(s.actor)
            except Exception:
                pass
        self._puts.clear()
        self._disconnect()

    def _disconnect(self) -> None:
        if self._connected:
            self._connected = False
            try:
                self.ray.shutdown()
            except Exception:
                pass
