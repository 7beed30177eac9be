"""Measuring kernel configs: compile, check numerics against the reference, time, memoize.

:class:`KernelMeasurer` is the ``measure`` callback of the search loop. For one kernel config it:

1. looks the timing up in the tuning database (keyed by kernel hash, config, device and versions);
2. renders the kernel to Triton (a kernel that cannot be rendered is an ``error``);
3. checks its outputs against the reference executor's values of the same model nodes (captured
   from one reference run of the whole model on the example inputs), by the dtype tolerance table;
   a mismatch is ``rejected`` and never chosen. On a GPU every config is checked the first time it
   runs. On ``sim:*`` the check runs in Triton's CPU interpreter, where a small-tile config can take
   a minute, so each kernel is checked once, at the interpreter's big-tile config (the same
   generated source; tiles are compile-time constants; ``tests/backends/test_triton_verdicts.py``
   checks that the GPU default and the largest-tile configs agree), and that verdict stands for its
   configs;
4. times it: CUDA-graph replays between CUDA events on a GPU (``lumc.compiler.runtime.gpu_timing``: a
   pre-bound launcher, L2 flush, rotating inputs, median of repeats), or the analytical model of
   ``lumc.backends.simulator`` (``lumc.backends.extern`` for vendor configs) on ``sim:*``;
5. stores the result, committed at once.

A kernel's config list holds its Triton configs (the default first) and then its extern
implementations (``{"IMPL": "cublas"}``, ``lumc.backends.extern``), checked (torch on the CPU, every
extern config), timed and stored the same way; a kernel Triton cannot render keeps only those.

On a machine without a GPU the numerics check runs the generated source in Triton's interpreter
(``TRITON_INTERPRET=1``) on CPU tensors.

With workers (``self.pool``, :mod:`lumc.compiler.core.workers`) the expensive half runs there, ahead
of need: on ``sim:*`` the interpreter run of each kernel of the next candidate (:meth:`prefetch`);
on a GPU, with Ray workers, one unit per config compiles, runs and times it on a worker GPU
(:meth:`lookahead`: the next candidate's default configs, the depth phase's next configs). The
verdict is still made here, from the unit's outputs, when the search asks for that config, so it
does not depend on which worker ran the unit or when it finished; only the driver writes the
database.
"""
from __future__ import annotations

import contextlib
import contextvars
import re
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from lumc.backends.extern import extern_bound, extern_configs, is_extern, simulate_extern_time
from lumc.backends.precision import dot_rounding, emulation
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.simulator import config_bound, simulate_kernel_time
from lumc.compiler.runtime.gpu_timing import cuda_event_samples  # noqa: F401  (re-exported for bench)
from lumc.compiler.runtime.program import KernelCall
from lumc.compiler.core.check_inputs import drawn_check_inputs, vacuous
from lumc.compiler.core.errors import exactly_equal, max_rel_error  # noqa: F401 (re-exported)
from lumc.compiler.core.config_order import ordered_configs, precision_variants
from lumc.compiler.core.search import Measurement
from lumc.compiler.core.workers import NoBudget, PrecompileUnits, WorkerLost, WorkerUnits
from lumc.compiler.runtime.targets import Target
from lumc.compiler.runtime.tuning_db import Timing, TimingKey, TuningDatabase, config_key
from lumc.ir import dtypes as dt
from lumc.ir.errors import KernelWriteError
from lumc.ir.kernels import Kernel

INTERPRETER_MAX_ELEMENTS = 1 << 23   # largest kernel output checked in the CPU interpreter

# a range compile's numerics verdicts by kernel structure, shared by its size buckets' searches
_SHARED_CHECKS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "lumc_shared_checks", default=None)


@contextlib.contextmanager
def sharing_checks():
    """Within this block (a range compile, ``lumc.compiler.core.buckets``), a kernel re-sized from
    the range's probe program takes the interpreter verdict of the same structure (its probe-size
    kernel, rendered variant, config space and precision) from the bucket that checked it first,
    instead of checking it again at each bucket's size: on ``sim:*`` the interpreter checks are
    most of a bucket's search. What the verdict vouches for is the generated code of that
    structure at the size it was checked; the bucket's own concrete module is not what the
    artifact runs anyway (a range's plan runs size-generic modules, ``size_generic.py``, validated
    at several sizes by its tests). Each bucket's chosen plan is still run (its kernels' meanings
    and vendor configs) at its smallest and largest size against the reference, and the report
    counts the shared verdicts (``shared_checks``)."""
    token = _SHARED_CHECKS.set({})
    try:
        yield
    finally:
        _SHARED_CHECKS.reset(token)


def n_index(call: KernelCall, n) -> int:
    """Position of model node ``n`` among the call's outputs."""
    return next(i for i, o in enumerate(call.outputs) if o is n)


# dots the Triton interpreter computes as a GPU would (its tf32 is exact fp32, within tolerance;
# bf16 and fp8 through ``backends/triton/interpreter_bf16``, which rounds bf16 and converts to
# float8 as the GPU does: their products are exact in fp32 and accumulate in fp32)
INTERPRETER_EXACT_DOTS = ("ieee", "tf32x3", "tf32", "fp16", "bf16", "fp8")
# how far a reduced-precision kernel may be from its numpy emulation (lumc.backends.precision):
# the summation order, plus for tf32 the hardware's own operand rounding (1 tf32 ulp, 2^-10) and
# for fp8 Hopper's reduced-precision accumulation inside one MMA (DeepSeek-V3, arXiv:2412.19437
# section 3.3.2: about 14 bits)
PRECISION_CHECK_RTOL = {"tf32": 2e-3, "bf16": 1e-3, "fp16": 1e-3, "fp8": 2e-2}
# and the added slack for SDPA at bf16/fp16 on fp32 operands, which returns its output in the half
# type and places its roundings itself (FlashAttention-2 rounds P per 64/128-key block, torch's CPU
# kernel pre-scales q): two ulps of the type relative to the output's largest value (a value
# rounded on both sides can land one ulp apart, and an ulp is up to 2^-7 of a bf16 value)
STORED_HALF_RTOL = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10}


@dataclass
class KernelEntry:
    """What the measurer knows about one distinct kernel."""
    kernel: Kernel
    call: KernelCall
    key: str
    configs: list = field(default_factory=list)
    render_error: str | None = None
    triton: object = None
    max_error: float = 0.0        # the worst of every check of this kernel, any config
    check_errors: dict = field(default_factory=dict)   # sim:* check precision -> its max rel error
    externs: dict = field(default_factory=dict)    # impl -> ExternKernel (GPU timing)
    magnitudes: object = None     # the meaning with |terms| summed (_term_scale), when needed


class KernelMeasurer(WorkerUnits, PrecompileUnits):
    """The search loop's ``measure`` callback (see module docstring).

    Args:
        target: where to time.
        db: the tuning database.
        versions: ``{"lumc", "triton", "driver"}`` for the database key.
        values: ``{id(model node): array}`` from one reference run (inputs of every kernel call
            and their reference outputs), for the numerics check; None skips checks that need data.
        log: list receiving one line per rejected or failed config.
    """

    def __init__(self, target: Target, db: TuningDatabase, versions: dict, values: dict | None,
                 log: list[str] | None = None):
        self.target = target
        self.db = db
        self.versions = versions
        self.values = values if values is not None else {}
        self.log = log if log is not None else []
        self.entries: dict[str, KernelEntry] = {}
        self.checked: dict[tuple[str, int], float] = {}
        # kernel key -> "on K of N programs": checked in the interpreter on a sample of its grid
        self.sampled: dict[str, str] = {}
        self._verdicts: dict[str, tuple[bool, str]] = {}
        self.deadline = None             # set by the pipeline: checks are not started past it
        self._check_s = 1.0              # running estimate of one numerics check, seconds
        self.pool = None                 # workers (lumc.compiler.core.workers): units run there
        self._pending: dict[str, object] = {}   # kernel key -> Future of its check's outputs
        self._pending_gpu: dict[tuple[str, int], object] = {}   # (key, config) -> Future of a unit
        self._gpu_results: dict[tuple[str, int], dict] = {}     # a unit's result until timed
        self._gpu_asked: set[tuple[str, int]] = set()            # units started (once each)
        self.db_hits = 0
        self.measured = 0
        self.shared_checks = 0          # verdicts taken from another size bucket (sharing_checks)
        self.precompiler = None         # GPU: a Precompiler once started; False where none runs
        self.spills: dict[tuple[str, int], int] = {}   # GPU: bytes spilled per thread, by config

    # ---- kernels ---------------------------------------------------------------------------------
    def add(self, call: KernelCall) -> str:
        """Register a kernel call; returns its kernel key (shared by identical kernels)."""
        key = call.kernel.content_hash()
        if key not in self.entries:
            e = KernelEntry(call.kernel, call, key)
            triton_cfgs = []
            try:
                from lumc.backends.triton.launch import TritonKernel
                e.triton = TritonKernel(call.kernel)
                triton_cfgs = ordered_configs(call.kernel, e.triton, self.target.spec)
            except Exception as err:  # not renderable: the search must choose another candidate
                e.render_error = f"{type(err).__name__}: {err}"
            # the Triton default first, then the vendor implementations through torch
            # (lumc.backends.extern; Inductor's max-autotune always times cuBLAS too), then the rest
            from lumc.compiler.runtime.extern import ExternConfig
            ext = [ExternConfig(c["IMPL"], c.get("PRECISION"))
                   for c in extern_configs(call.kernel, self.target.spec)]
            triton_cfgs = precision_variants(triton_cfgs, e.triton, self.target.spec)
            e.configs = triton_cfgs[:1] + ext + triton_cfgs[1:] or [None]
            self.entries[key] = e
        return key

    def prefetch(self, keys) -> None:
        """Start the numerics checks of these kernels in the pool (sim targets), so they run while
        the search measures others; a kernel already judged or pending is skipped. With GPU
        workers, the kernels' default configs start as GPU units (:meth:`lookahead`)."""
        if not self.target.simulated:
            self.lookahead([(k, 0) for k in keys])
            return
        if self.pool is None:
            return
        for key in dict.fromkeys(keys):
            e = self.entries[key]
            if key in self._verdicts or key in self._pending or e.render_error is not None:
                continue
            shared, fkey = self._family(e, None)
            if fkey in shared:            # judged at another size of the range already
                continue
            if self.db.get(self._verdict_key(key, "numerics-check")) is not None:
                continue
            ins = self._inputs(e)
            if ins is None or sum(int(np.prod(n.shape)) for n in e.call.outputs) > INTERPRETER_MAX_ELEMENTS:
                continue
            fut = self.pool.submit(e.kernel, e.triton.check_config().kwargs(), ins)
            if fut is not None:           # None: the pool is broken, the check runs here
                self._pending[key] = fut

    def lookahead(self, pairs) -> None:
        """Start GPU units (compile, run, time on a worker) for these ``(kernel key, config
        index)`` pairs, in order, while fewer than two per worker are outstanding; a config
        already stored, started or without a runnable config is skipped. Nothing without GPU
        workers (on ``sim:*`` times are simulated here; checks start in :meth:`prefetch`)."""
        if not self._gpu_workers():
            self._precompile(pairs)
            return
        for key, index in dict.fromkeys(pairs):
            st = self.pool.status()
            if st["in_flight"] >= 2 * max(st["count"], 1):
                break
            e = self.entries[key]
            cfg = e.configs[index]
            if (key, index) in self._gpu_asked or cfg is None or \
                    (e.render_error is not None and not is_extern(cfg.kwargs())) or \
                    self.db.get(self._db_key(key, index)) is not None:
                continue
            self._gpu_asked.add((key, index))
            self._pending_gpu[(key, index)] = self.pool.submit_gpu(e.kernel, cfg.kwargs(),
                                                                   self._gpu_inputs(e))

    def _inputs(self, e: KernelEntry) -> list | None:
        ins = [self.values.get(id(n)) for n in e.call.inputs]
        ins = [x if x is not None else (n.arg.value if n.op == "Constant" else None)
               for x, n in zip(ins, e.call.inputs)]
        return None if any(x is None for x in ins) else ins

    def runnable(self, key: str) -> bool:
        """False when the kernel has no config that can run (not renderable, no extern)."""
        return self.entries[key].configs != [None]

    def n_configs(self, key: str) -> int:
        return len(self.entries[key].configs)

    def config_of(self, key: str, index: int) -> dict | None:
        c = self.entries[key].configs[index]
        return None if c is None else c.kwargs()

    def bound(self, key: str, index: int) -> float:
        """Lower bound of one kernel config (its padded tiles' roofline); see ``config_bound``."""
        cfg = self.config_of(key, index)
        if is_extern(cfg):
            return extern_bound(self.entries[key].kernel, cfg, self.target.spec)
        return config_bound(self.entries[key].kernel, cfg or {}, self.target.spec)

    def _db_key(self, key: str, index: int) -> TimingKey:
        cfg = self.config_of(key, index)
        return TimingKey(key, config_key(cfg or {}), self.target.name, self.versions["lumc"],
                         self.versions["triton"], self.versions["driver"])

    # ---- the callback ----------------------------------------------------------------------------
    def __call__(self, key: str, index: int) -> Measurement:
        e = self.entries[key]
        dbk = self._db_key(key, index)
        hit = self.db.get(dbk)
        if hit is not None:
            self.db_hits += 1
            if not hit.ok:
                return Measurement(None, "rejected" if hit.note.startswith("rejected") else "error",
                                   hit.note, from_db=True)
            if self.target.simulated:    # its stored check's verdict: was it on a sample?
                verdict = self.db.get(self._verdict_key(key, "numerics-check"))
                if verdict is not None:
                    self._note_sampled(key, verdict.note)
            return Measurement(hit.seconds, from_db=True)
        cfg_obj = e.configs[index]
        extern = cfg_obj is not None and is_extern(cfg_obj.kwargs())
        if e.render_error is not None and not extern:
            note = f"error: cannot render {e.kernel.form} kernel ({e.render_error})"
            self.log.append(f"kernel {key[:12]} ({e.kernel.form}): {note}")
            return Measurement(None, "error", note)
        spilled = 0 if extern or self.target.simulated else self._precompiled_spills(e, cfg_obj)
        if spilled:                  # known from its precompile: never launched, never timed
            ok, note = False, f"rejected: spills {spilled} B per thread (ptxas, precompiled)"
        elif extern:
            ok, note = self._check(e, index, cfg_obj)      # torch on the CPU: fast, every config
        elif self.target.simulated:
            ok, note = self._check_once(e, (cfg_obj.kwargs() if cfg_obj else {}).get("PRECISION"))
        else:
            ok, note = self._check(e, index, cfg_obj)
        if note.startswith("error: no budget"):
            return Measurement(None, "budget", note)
        if ok and self.spills.get((key, index), 0) > 0:   # pruned before timing: it spills
            ok, note = False, f"rejected: spills {self.spills[(key, index)]} B per thread (pruned)"
        if not ok:
            self.log.append(f"kernel {key[:12]} ({e.kernel.form}) config {cfg_obj}: {note}")
            if note.startswith("rejected"):   # wrong numerics are a fact of this kernel+config+version
                self.db.put(dbk, Timing(0.0, False, self.target.simulated, note))
                return Measurement(None, "rejected", note)
            return Measurement(None, "error", note)   # errors may be environmental: not persisted
        try:
            seconds = self._worker_time(e, index, cfg_obj) if self._gpu_workers() \
                else self._time(e, cfg_obj)
        except NoBudget as err:
            return Measurement(None, "budget", str(err))
        except Exception as err:
            return Measurement(None, "error", f"error: {type(err).__name__}: {err}")
        self.measured += 1
        self.db.put(dbk, Timing(seconds, True, self.target.simulated, note))
        return Measurement(seconds)

    def remeasure(self, key: str, index: int) -> Measurement:
        """Time a config again, ignoring the database's timing (the search's final re-time of the
        top programs): on a GPU it runs the kernel again and stores the new time; on ``sim:*`` the
        simulated time is deterministic, so it is the stored one."""
        e = self.entries[key]
        if self.target.simulated or e.configs[index] is None:
            return self(key, index)
        first = self(key, index)          # checks numerics (or reads the verdict) as usual
        if first.status != "ok":
            return first
        try:            # with GPU workers: on worker 0, so the top programs compare on one GPU
            seconds = self._worker_time(e, index, e.configs[index], pin=0) \
                if self._gpu_workers() else self._time(e, e.configs[index])
        except NoBudget as err:
            return Measurement(None, "budget", str(err))
        except Exception as err:
            return Measurement(None, "error", f"error: {type(err).__name__}: {err}")
        self.measured += 1
        self.db.put(self._db_key(key, index), Timing(seconds, True, False, "re-timed"))
        return Measurement(seconds)

    def _check_once(self, e: KernelEntry, precision: str | None = None) -> tuple[bool, str]:
        """The numerics verdict on ``sim:*`` of a kernel at one operand precision (memoized here
        and in the database). A config at a reduced precision (``bf16``, ``fp16``, ``fp8``) runs
        its own branch of the source in the interpreter (bf16 rounding and float8 conversion as
        the GPU's through ``backends/triton/interpreter_bf16``) and is judged against the numpy
        emulation of that precision (``lumc.backends.precision``) within
        :data:`PRECISION_CHECK_RTOL`; the model-level cost of the precision is the quality
        gate's."""
        p, default = self._check_precision(e, precision)
        vkey = e.key if p == default else f"{e.key}:{p}"
        if vkey in self._verdicts:
            return self._verdicts[vkey]
        shared, fkey = self._family(e, p)
        if fkey in shared:        # the same structure and code path, checked at another size
            verdict, err = shared[fkey]
            e.check_errors[p], e.max_error = err, max(e.max_error, err)
            self.shared_checks += 1
            self._verdicts[vkey] = (verdict[0], verdict[1] + " [shared: this structure's "
                                    "generated code was checked at another size of the range]")
            return self._verdicts[vkey]
        dbk = self._verdict_key(e.key, "numerics-check" if p == default else f"numerics-check:{p}")
        hit = self.db.get(dbk)
        if hit is not None:
            verdict, err = (hit.ok, hit.note), hit.seconds   # the row keeps the check's error
            self._note_sampled(e.key, hit.note)
        else:
            # the interpreter's cost is per program and per op: big tiles, or a large kernel's
            # tiles sized for a sampled check (configs.check_config)
            cfg = e.triton.check_config(p)
            index = -1 if p == default else -2
            self.checked.pop((e.key, index), None)   # -2 serves each reduced precision in turn
            ok, note = self._check(e, index, cfg)
            verdict = (ok, note + f" (at {cfg}, CPU interpreter)")
            if note.startswith("error: no budget"):
                return verdict          # not a verdict on the kernel: not remembered
            # this precision's own error (another precision's check of the kernel is not it)
            err = self.checked.get((e.key, index), 0.0)
            if ok or note.startswith("rejected"):
                self.db.put(dbk, Timing(err, ok, True, verdict[1]))
        e.check_errors[p], e.max_error = err, max(e.max_error, err)
        if fkey is not None and (verdict[0] or verdict[1].startswith("rejected")):
            shared[fkey] = (verdict, err)
        self._verdicts[vkey] = verdict
        return verdict

    def _check_precision(self, e: KernelEntry, precision: str | None) -> tuple:
        """``(the precision a sim:* check of precision runs at, the kernel's default)``: one the
        interpreter does not emulate is checked at the default."""
        from lumc.backends.triton.configs import DEFAULT_PRECISION
        default = DEFAULT_PRECISION.get(e.triton.rendered.problem.get("dot_dtype") or "", None)
        return (precision if precision in INTERPRETER_EXACT_DOTS else default), default

    def check_error(self, key: str, config: dict | None) -> float:
        """The max rel error of the numerics check that judged ``config`` of kernel ``key``: on
        ``sim:*`` its operand precision's check (a kernel also checked at fp8 for a config the
        plan does not use reported that config's error), else that config's own; the worst of
        the kernel's checks where neither is known."""
        e, cfg = self.entries[key], config or {}
        if self.target.simulated and not is_extern(cfg) and e.triton is not None:
            p = self._check_precision(e, cfg.get("PRECISION"))[0]
            return e.check_errors.get(p, e.max_error)
        idx = next((j for j in range(len(e.configs)) if self.config_of(key, j) == config), None)
        return self.checked.get((key, idx), e.max_error)

    def _verdict_key(self, key: str, what: str) -> TimingKey:
        return TimingKey(key, what, self.target.name, self.versions["lumc"],
                         self.versions["triton"], self.versions["driver"])

    def _note_sampled(self, key: str, note: str) -> None:
        """A stored verdict judged on a sample of programs (its note says ``(on K of N programs,
        sampled)``) is reported so again (``self.sampled``)."""
        m = re.search(r"\((on \d+ of \d+ programs), sampled\)", note)
        if m:
            self.sampled[key] = m.group(1)

    def _family(self, e: KernelEntry, precision: str | None) -> tuple[dict, tuple | None]:
        """The range compile's shared verdicts (:func:`sharing_checks`) and this kernel's key
        there: its probe-size kernel (``KernelCall.family``), the rendered variant and config
        space (a different code path at this size is checked again) and the precision."""
        shared = _SHARED_CHECKS.get()
        fam = e.call.family
        if shared is None or fam is None or e.triton is None:
            return {}, None
        rk = e.triton.rendered
        hk = ("hash", id(fam))            # the probe kernel's hash, once per range compile
        if hk not in shared:              # (the kernel is kept with it: its id stays its own)
            shared[hk] = (fam, fam.content_hash())
        return shared, (shared[hk][1], rk.variant, rk.config_space, precision)

    def _check(self, e: KernelEntry, index: int, cfg) -> tuple[bool, str]:
        """Run the generated kernel on the captured inputs and compare with the reference."""
        if e.key not in self._pending and self.deadline is not None and \
                self.deadline.remaining() < 1.5 * self._check_s:
            return False, "error: no budget left for its numerics check"
        t0 = time.monotonic()
        try:
            return self._run_check(e, index, cfg)
        finally:
            self._check_s = 0.7 * self._check_s + 0.3 * (time.monotonic() - t0)

    def _run_check(self, e: KernelEntry, index: int, cfg) -> tuple[bool, str]:
        call = e.call
        ins = [self.values.get(id(n)) for n in call.inputs]
        refs = [self.values.get(id(n)) for n in call.outputs]
        ins = [x if x is not None else (n.arg.value if n.op == "Constant" else None)
               for x, n in zip(ins, call.inputs)]
        if any(x is None for x in ins) or any(r is None for r in refs):
            return True, "unchecked: no reference values captured"
        drawn = vacuous(refs, call.outputs)
        if drawn:       # the example's values say nothing here: check on a draw instead
            self._pending.pop(e.key, None)
            ins, refs = drawn_check_inputs(e.kernel, call, ins)
        if self.target.simulated and not (cfg is not None and is_extern(cfg.kwargs())) and \
                sum(int(np.prod(n.shape)) for n in call.outputs) > INTERPRETER_MAX_ELEMENTS:
            return True, "unchecked: too large for the CPU interpreter"
        fut = self._pending.pop(e.key, None) if index == -1 and not drawn else None
        if fut is not None and (fut.cancelled() or (
                self.pool is None and not (fut.done() and fut.exception() is None))):
            # its pool closed with the search (the untimed fallback's checks run after it):
            # cancelled, still queued, or lost with its worker; run it here
            fut = None
        extern = cfg is not None and is_extern(cfg.kwargs())
        try:
            if extern:
                from lumc.compiler.runtime.extern import run_extern_numpy
                outs = run_extern_numpy(e.kernel, cfg.kwargs(), ins)
            elif fut is not None:          # started in the pool ahead of need
                if hasattr(self.pool, "want"):
                    self.pool.want(fut)     # the search waits for it: it goes first
                left = self.deadline.remaining() if self.deadline is not None else None
                try:
                    outs = fut.result(timeout=left)
                except TimeoutError:
                    return False, "error: no budget left for its numerics check"
                except WorkerLost as lost:
                    if not lost.retry_here:
                        raise
                    self.pool.retried += 1         # its worker died: run once here instead
                    outs = self._launch_counting_spills(e, index, cfg, ins)
            else:
                outs = self._launch_counting_spills(e, index, cfg, ins)
        except NoBudget as err:
            return False, str(err)
        except KernelWriteError:
            raise       # the disk's fault, not the kernel's: no candidate may be dropped for it
        except Exception as err:
            return False, f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        from lumc.backends.triton.launch import to_numpy
        written, ran = None, ""
        if isinstance(outs, tuple):     # the interpreter's: a large grid runs a sample of programs
            outs, written, ran = outs
        worst = 0.0
        rounding = dot_rounding(cfg.kwargs() if cfg is not None else None)
        if rounding is not None and (self.target.simulated or extern) and \
                cfg.kwargs()["PRECISION"] == "tf32":
            rounding = None     # the interpreter's and torch CPU's tf32 dots are exact fp32
        p_tol = 0.0
        feed = {ph.arg.name: np.asarray(x) for ph, x in zip(e.kernel.inputs, ins)}
        if rounding is not None:
            # a reduced-precision dot is judged against its meaning with the same operand rounding
            kw = emulation(e.kernel, cfg.kwargs())
            emu = ReferenceExecutor(e.kernel.meaning, **kw)(feed)
            refs = [emu[k] for k in e.kernel.meaning.outputs]
            prec = cfg.kwargs()["PRECISION"]
            p_tol = PRECISION_CHECK_RTOL[prec] + (STORED_HALF_RTOL[prec] if kw.get("rounded")
                                                  else 0.0)
        for i, (o, r, n) in enumerate(zip(outs, refs, call.outputs)):
            got = o if isinstance(o, np.ndarray) else to_numpy(o)   # pool results are numpy
            if written is not None:     # judged where the sampled programs wrote (run_sampled
                # ran it whole where they left an output's first or last element unwritten)
                got = np.where(written[i], got, np.asarray(r).astype(got.dtype, copy=False))
            if n.dtype.is_float:
                err = max_rel_error(got, r)
                tol = max(dt.rtol_for(n.dtype), p_tol)
            else:       # or equal to its meaning on the same inputs, as a float one is below
                # (an ArgMax of a bf16-stored product: the reference's row max is the fp32 one's)
                err = 0.0 if exactly_equal(got, r) or exactly_equal(got, ReferenceExecutor(
                    e.kernel.meaning)(feed)[list(e.kernel.meaning.outputs)[n_index(call, n)]]) \
                    else float("inf")
                tol = 0.0
            if err > tol and n.dtype.is_float and rounding is None:
                # the fp32 reference rounds too (numpy sums naively along strided axes): judge the
                # kernel against its meaning in float64 before rejecting it
                f64 = self._f64_reference(e, ins)[n_index(call, n)]
                err = max_rel_error(got, f64)
                if err > tol:       # a value that cancels (the sum of a normalized row: ~0) is
                    # only as exact as the terms it was computed from: their size is the scale
                    err = max_rel_error(got, f64, self._term_scale(e, ins, n_index(call, n)))
            worst = max(worst, err)
            if err > tol:
                return False, f"rejected: max rel error {err:.3g} > {tol:g} on {n.dtype}" + (
                    " (on drawn inputs)" if drawn else "")
        e.max_error = max(e.max_error, worst)
        self.checked[(e.key, index)] = worst
        if ran:
            self.sampled[e.key] = ran
        sample = f" ({ran}, sampled)" if ran else ""
        return True, f"checked: max rel error {worst:.3g}{sample}" + (
            " (on drawn inputs: the example's gave no finite value here)" if drawn else "")

    def _launch_counting_spills(self, e: KernelEntry, index: int, cfg, ins: list):
        """Run the Triton kernel; on a GPU, note the register spills of what that launch compiled
        (``backends/triton/resources.py``) in ``self.spills[(key, index)]``."""
        if self.target.simulated:       # the CPU interpreter: a large grid on a sample of programs
            from lumc.backends.triton.sampled import run_sampled
            return run_sampled(e.triton, ins, cfg)
        if index < 0:
            return e.triton(*ins, config=cfg)
        if self._gpu_workers():        # compiled and run on a GPU worker, timed there too
            r = self._gpu_unit(e, index, cfg)
            if r.get("spills") is not None:
                self.spills[(e.key, index)] = r["spills"]
            return r["outs"]
        from lumc.backends.triton.resources import spills_of_launch
        n, outs = spills_of_launch(e.triton.module, e.triton.rendered.kernel_names,
                                   lambda: e.triton(*ins, config=cfg))
        if n is not None:
            self.spills[(e.key, index)] = n
        return outs

    def _f64_reference(self, e: KernelEntry, ins: list) -> list[np.ndarray]:
        """The kernel's meaning evaluated in float64 on the same inputs (outputs in order)."""
        from lumc.backends.reference import ReferenceExecutor
        feed = {ph.arg.name: np.asarray(x) for ph, x in zip(e.kernel.inputs, ins)}
        out = ReferenceExecutor(e.kernel.meaning, "float64").run_keeping(feed, set())[0]
        return [out[k] for k in e.kernel.meaning.outputs]

    def _term_scale(self, e: KernelEntry, ins: list, i: int) -> float:
        """The largest finite value of output ``i`` of the kernel's meaning in float64 with every
        sum taken over its terms' absolute values (``reference.summand_magnitudes``): the scale
        of a sum's rounding error, whatever the order, where the result cancels to about 0 (a
        normalized row's sum). An output computed without a sum keeps its own scale."""
        from lumc.backends.reference import ReferenceExecutor, summand_magnitudes
        if e.magnitudes is None:
            e.magnitudes = summand_magnitudes(e.kernel.meaning)
        feed = {ph.arg.name: np.asarray(x) for ph, x in zip(e.kernel.inputs, ins)}
        out = ReferenceExecutor(e.magnitudes, "float64").run_keeping(feed, set())[0]
        mag = np.abs(np.asarray(out[list(e.kernel.meaning.outputs)[i]], np.float64))
        return float(mag[np.isfinite(mag)].max()) if np.isfinite(mag).any() else 0.0

    def _time(self, e: KernelEntry, cfg) -> float:
        kw = cfg.kwargs() if cfg is not None else {}
        if self.target.simulated:
            if is_extern(kw):
                return simulate_extern_time(e.kernel, kw, self.target.spec)
            return simulate_kernel_time(e.kernel, kw, self.target.spec)
        return time_on_gpu(e, cfg, self.values, self.target.torch_device)


def time_on_gpu(e: KernelEntry, cfg, values, device: str, repeats: int = 25,
                warmup: int = 5) -> float:
    """Median seconds of one launch of a kernel config on the GPU (see
    :func:`lumc.compiler.runtime.gpu_timing.cuda_event_samples`), on the reference values of its inputs;
    an extern config runs its torch implementation (``lumc.compiler.runtime.extern``)."""
    ins = []
    for n in e.call.inputs:
        v = values.get(id(n))
        if v is None:
            v = n.arg.value if n.op == "Constant" else np.zeros(n.shape, n.dtype.np)
        ins.append(v)
    launch = e.triton
    if cfg is not None and is_extern(cfg.kwargs()):
        from lumc.compiler.runtime.extern import ExternKernel
        launch = e.externs.get(cfg.impl) or e.externs.setdefault(cfg.impl, ExternKernel(e.kernel, cfg.impl))
    return float(statistics.median(cuda_event_samples(launch, cfg, ins, device, repeats, warmup)))
