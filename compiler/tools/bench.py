"""Benchmarking a compiled model: every kernel and the whole model, on the artifact's device.

:func:`bench_compiled` returns the ``lumc bench --json`` document (format :data:`BENCH_FORMAT`):

* ``device``, ``simulated``, ``timing`` (how times were obtained), ``versions`` (lumc, Triton, torch,
  driver), ``artifact_hash``, ``model`` (name, sha256 of the source model, input shapes),
  ``precision`` and ``weights`` (the plan's ``--precision`` and ``--weights``, after any fallback);
* ``kernels``: per kernel call in launch order: form, kernel hash, config, ``time_s`` (median),
  ``min_s``/``max_s``, ``spread`` (interquartile range over the median), ``samples``, and the
  roofline figures (``bound_s``, ``flops``, ``bytes``, ``pct_of_bound``, ``arithmetic_intensity``,
  achieved FLOP/s and bytes/s);
* ``end_to_end``: the model's device time (``time_s`` and its spread), its roofline bound, the kernel
  count, ``bytes_moved`` and ``ideal_bytes``;
* ``wall``: wall-clock time of one whole call where it executes, labelled with where that is.

On a CUDA GPU kernel times are CUDA-event medians over ``repeats`` launches (an L2 flush before each,
rotating input copies), and the end-to-end time is the replay of the model's CUDA graph. On
``sim:*`` kernel times come from the analytical model (``lumc.backends.simulator``): deterministic,
one sample each; the end-to-end time is their sum; and ``wall`` is the CPU executor's time, which
is labelled CPU and is never compared (it measures numpy on this host, not the GPU).

The figures a regression check compares (:func:`regression_figures`) are per-kernel ``time_s`` plus
the end-to-end ``time_s``, ``bytes_moved`` and ``kernel_count``: on a simulated device all of them
are deterministic.
"""
from __future__ import annotations

import datetime
import hashlib
import platform
import statistics
import time
from dataclasses import dataclass

import numpy as np

from lumc.backends.extern import is_extern, simulate_extern_time
from lumc.backends.simulator import simulate_kernel_time
from lumc.compiler.runtime.compiled import CompiledModel
from lumc.compiler.runtime.program import ideal_bytes
from lumc.compiler.runtime.targets import Target, resolve_target, versions
from lumc.ir.errors import LumcError
from lumc.rewrites.cost import kernel_time_bound

BENCH_FORMAT = "lumc-bench/1"
GPU_REPEATS = 25      # default CUDA-event samples per kernel (time_on_gpu's default)
CPU_REPEATS = 5       # default wall-clock samples of the CPU executor (a whole model each)
GPU_WARMUP = 5


class BenchError(LumcError):
    """A bench that cannot run here (no GPU for a GPU artifact) or a malformed bench document."""


# ---- model identity -------------------------------------------------------------------------------

def model_sha256(cm: CompiledModel) -> str:
    """sha256 of the source model (the serialized ONNX), or of the primitive graph when there is none."""
    if cm.source_onnx is not None:
        return hashlib.sha256(cm.source_onnx).hexdigest()
    from lumc.ir.serialize import graph_to_bytes
    doc, npz, _ = graph_to_bytes(cm.graph, origins=False)
    return hashlib.sha256(doc + npz).hexdigest()


def model_identity(cm: CompiledModel) -> dict:
    """``{"name", "sha256", "inputs": {name: [shape, dtype]}}``: what a baseline must match."""
    return {"name": cm.report_dict().get("model", "model"), "sha256": model_sha256(cm),
            "inputs": {i.name: [list(i.shape), i.dtype.name] for i in cm.inputs}}


def known_model(cm: CompiledModel):
    """The known model (README, Models) this model came from (by sha256 of the source, or its
    cached file name), or None."""
    from lumc.compiler.frontends.models import MODEL_INFO
    sha = model_sha256(cm)
    name = str(cm.report_dict().get("model", ""))
    for m in MODEL_INFO.values():
        if m.sha256 == sha or name == m.filename:
            return m
    return None


def bench_inputs(cm: CompiledModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for timing: the known model's recipe (token ids, bytes, audio, a text image), else
    N(0, 1) floats and small integers (``lumc.compiler.frontends.models.random_inputs``)."""
    from lumc.compiler.frontends.models import random_inputs
    shapes = {i.name: i.shape for i in cm.inputs}
    dtypes = {i.name: i.dtype.np for i in cm.inputs}
    return random_inputs(shapes, dtypes, seed=seed, info=known_model(cm))


# ---- statistics -----------------------------------------------------------------------------------

def summarize(samples: list[float]) -> dict:
    """``{"time_s": median, "min_s", "max_s", "spread": IQR / median, "samples": n}`` (seconds)."""
    xs = sorted(float(s) for s in samples)
    med = statistics.median(xs)
    q1, q3 = (np.percentile(xs, [25, 75]) if len(xs) > 1 else (xs[0], xs[0]))
    return {"time_s": med, "min_s": xs[0], "max_s": xs[-1],
            "spread": float((q3 - q1) / med) if med > 0 else 0.0, "samples": len(xs)}


# ---- where to time --------------------------------------------------------------------------------

def bench_target(cm: CompiledModel, device: str | None) -> Target:
    """The device to time on: ``device`` if given, else the one the artifact was tuned for.

    Raises:
        BenchError: a GPU artifact on a machine without a CUDA GPU (one line, naming the way out).
    """
    if device is None:
        if cm.simulated:
            device = cm.device
        else:
            device = cm.device.split(" ", 1)[0]     # "cuda:0 NVIDIA H200" -> "cuda:0"
            from lumc.compiler.runtime.targets import _cuda_available
            if not _cuda_available():
                raise BenchError(f"the artifact was tuned on {cm.device}, and this machine has no "
                                 "CUDA GPU; bench it there, or pass --device sim:h200 to simulate")
    return resolve_target(device)


def device_key(name: str) -> str:
    """The device a figure belongs to, without the GPU index (``cuda:1 NVIDIA H200`` ->
    ``NVIDIA H200``), so a baseline from another slot of the same GPU model compares."""
    return name.split(" ", 1)[1] if name.startswith("cuda") and " " in name else name


# ---- timing ---------------------------------------------------------------------------------------

def _config_obj(cfg: dict | None):
    from lumc.compiler.runtime.extern import config_from_dict
    return config_from_dict(cfg)


def gpu_kernel_samples(tk, cfg, ins: list, device: str, repeats: int,
                       warmup: int = GPU_WARMUP) -> list[float]:
    """Seconds of ``repeats`` launches of a Triton kernel with CUDA events (the method of
    ``lumc.compiler.core.measure.time_on_gpu``: 256 MiB L2 flush before each launch, rotating copies of
    the inputs), every sample kept so the spread can be reported."""
    from lumc.compiler.core.measure import cuda_event_samples
    return cuda_event_samples(tk, cfg, ins, device, repeats, warmup)


def program_values(cm: CompiledModel, inputs: dict) -> dict[int, np.ndarray]:
    """``{id(node): array}`` for every node a kernel call reads or writes, from one CPU run of the
    program (its calls may bind nodes the model graph lacks, e-graph rewrites), so GPU timing feeds
    every kernel realistic values (valid gather indices above all)."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.ir.ops import apply_view
    env = {id(n): np.asarray(inputs[name]) for name, n in cm.graph.inputs.items()}

    def value(n):
        if id(n) in env:
            return env[id(n)]
        if n.op == "Constant":
            return n.arg.value
        if n.op == "View" and n.arg.is_contiguous:
            return apply_view(value(n.srcs[0]), n.arg)
        raise KeyError(f"%{n.id} ({n.op}) has no value")

    for c in cm.program.calls:
        k = c.kernel
        feed = {ph.arg.name: value(n) for ph, n in zip(k.inputs, c.inputs)}
        for n in c.inputs:
            env.setdefault(id(n), value(n))
        res = ReferenceExecutor(k.meaning)(feed)
        for (oname, _), n in zip(k.meaning.outputs.items(), c.outputs):
            env[id(n)] = res[oname].astype(n.dtype.np, copy=False)
    return env


@dataclass
class Bencher:
    """Times one compiled model on one target; keeps what repeated measurements share (reference
    values, the GPU plan) so a re-measurement of a few kernels is cheap.

    Args:
        cm: the compiled model.
        target: where to time (see :func:`bench_target`).
        inputs: model inputs (default :func:`bench_inputs`).
    """
    cm: CompiledModel
    target: Target
    inputs: dict | None = None

    def __post_init__(self):
        if self.inputs is None:
            self.inputs = bench_inputs(self.cm)
        self._values = None
        self._plan = None
        self._kernels: dict[int, object] = {}

    # -- per kernel --
    def kernel_samples(self, index: int, repeats: int) -> list[float]:
        """Seconds per launch of kernel call ``index`` (one sample when simulated: deterministic)."""
        call = self.cm.program.calls[index]
        cfg = self.cm.configs[index]
        if self.target.simulated:
            try:
                if is_extern(cfg):
                    return [simulate_extern_time(call.kernel, dict(cfg), self.target.spec)]
                return [simulate_kernel_time(call.kernel, dict(cfg or {}), self.target.spec)]
            except ValueError as e:     # a config the simulated device cannot run
                raise BenchError(f"kernel {index} ({call.kernel.form}): {e}") from None
        if self._values is None:
            self._values = program_values(self.cm, self.inputs)
        if index not in self._kernels:
            from lumc.compiler.runtime.extern import launcher_for
            self._kernels[index] = launcher_for(call.kernel, cfg)
        ins = []
        for n in call.inputs:
            v = self._values.get(id(n))
            if v is None:
                v = n.arg.value if n.op == "Constant" else np.zeros(n.shape, n.dtype.np)
            ins.append(v)
        return gpu_kernel_samples(self._kernels[index], _config_obj(cfg), ins,
                                  self.target.torch_device, repeats)

    # -- whole model --
    def device_samples(self, kernel_times: list[float], repeats: int) -> tuple[list[float], str]:
        """End-to-end device seconds: the sum of simulated kernel times, or CUDA graph replays."""
        if self.target.simulated:
            return [float(sum(kernel_times))], "sum of simulated kernel times"
        import torch
        from lumc.compiler.runtime.gpu_plan import GpuPlan
        dev = self.target.torch_device
        if self._plan is None:
            self.cm.torch_device = dev
            self._plan = GpuPlan(self.cm)
            self._plan.run_numpy(self.inputs)          # warm-up and CUDA graph capture
        plan = self._plan
        replay = plan.graph.replay if plan.graph else plan._launch_all
        flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)
        times = []
        for _ in range(repeats):
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            torch.cuda.synchronize(dev)
            times.append(start.elapsed_time(end) / 1e3)
        how = "CUDA graph replay" if plan.graph else "kernel launches (no CUDA graph)"
        return times, how

    def wall_samples(self, repeats: int) -> tuple[list[float], str]:
        """Wall seconds of whole calls where the model executes (the CPU executor without a GPU)."""
        if self.target.simulated:
            self.cm.torch_device = "cpu"
            where = "cpu: CPU executor (numpy), wall time"
        else:
            self.cm.torch_device = self.target.torch_device
            where = f"{self.target.torch_device}: wall time of a call, host copies included"
        self.cm.run(self.inputs)                        # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.cm.run(self.inputs)
            times.append(time.perf_counter() - t0)
        return times, where


def kernel_figures(cm: CompiledModel, target: Target) -> list[dict]:
    """Per kernel call: index, form, kernel hash, config and roofline figures (no times)."""
    ceil = target.spec.as_ceilings()
    rows = []
    for i, (c, cfg) in enumerate(zip(cm.program.calls, cm.configs)):
        k = c.kernel
        rows.append({"index": i, "form": k.form, "kernel": k.content_hash(), "config": cfg,
                     "bound_s": kernel_time_bound(k, ceil), "flops": k.flops(),
                     "bytes": k.min_bytes(), "arithmetic_intensity": k.arithmetic_intensity()})
    return rows


def add_time(row: dict, samples: list[float]) -> dict:
    """Fill a kernel row's time fields and the achieved rates from its samples."""
    row.update(summarize(samples))
    t = row["time_s"]
    row["pct_of_bound"] = 100.0 * row["bound_s"] / t if t > 0 else None
    row["achieved_flops_per_s"] = row["flops"] / t if t > 0 else None
    row["achieved_bytes_per_s"] = row["bytes"] / t if t > 0 else None
    return row


def bench_compiled(cm: CompiledModel, *, device: str | None = None, repeats: int | None = None,
                   inputs: dict | None = None, artifact_hash: str | None = None,
                   wall: bool = True, bencher: Bencher | None = None) -> dict:
    """Time every kernel and the whole model; returns the bench document (module docstring).

    Args:
        cm: the compiled model.
        device: where to time (default: the artifact's device; see :func:`bench_target`).
        repeats: samples per figure (default :data:`GPU_REPEATS` per kernel on a GPU, and
            :data:`CPU_REPEATS` wall-clock calls of the CPU executor).
        inputs: model inputs (default :func:`bench_inputs`).
        artifact_hash: the ``.lumc`` file's hash (``lumc.compiler.runtime.artifact.artifact_hash``).
        wall: also time whole calls where the model executes (``wall``).
        bencher: reuse a :class:`Bencher` (its target wins over ``device``).
    Raises:
        BenchError: no GPU for a GPU artifact; a config the simulated device cannot run.
    """
    b = bencher or Bencher(cm, bench_target(cm, device), inputs)
    tgt = b.target
    n = repeats or (GPU_REPEATS if not tgt.simulated else 1)
    rows = kernel_figures(cm, tgt)
    for row in rows:
        add_time(row, b.kernel_samples(row["index"], n))
    dev_samples, how = b.device_samples([r["time_s"] for r in rows], n)
    rep = cm.report_dict()
    e2e = {**summarize(dev_samples), "how": how,
           "bound_s": float(sum(r["bound_s"] for r in rows)), "kernel_count": len(rows),
           "bytes_moved": int(sum(r["bytes"] for r in rows)),
           # the plan's own (a size range's call: at its size, as bytes_moved is; the report's
           # is the bucket's representative size's)
           "ideal_bytes": ideal_bytes(cm.graph, cm.program),
           "flops": int(sum(r["flops"] for r in rows))}
    doc = {
        "format": BENCH_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": tgt.name, "simulated": tgt.simulated,
        "timing": (f"simulated: analytical model of {tgt.spec.name} (deterministic)" if tgt.simulated
                   else f"measured: CUDA events, median of {n}"),
        "versions": versions(gpu=not tgt.simulated), "artifact_hash": artifact_hash,
        "model": model_identity(cm),
        "precision": rep.get("precision"), "weights": rep.get("weights"),
        "compiled_on": cm.device, "repeats": n,
        "host": {"machine": platform.machine(), "processor": platform.processor() or "unknown",
                 "python": platform.python_version()},
        "kernels": rows, "end_to_end": e2e,
    }
    if wall:
        w, where = b.wall_samples(repeats or (CPU_REPEATS if tgt.simulated else 10))
        doc["wall"] = {**summarize(w), "where": where}
    return doc


# ---- figures and tables ---------------------------------------------------------------------------

def regression_figures(doc: dict) -> dict:
    """The figures a baseline comparison checks: ``{"kernels": [(key, time_s)], "model": {...}}``
    with the model's ``time_s``, ``bytes_moved`` and ``kernel_count``."""
    e = doc["end_to_end"]
    return {"kernels": [(k["kernel"], k["time_s"]) for k in doc["kernels"]],
            "model": {"time_s": e["time_s"], "bytes_moved": e["bytes_moved"],
                      "kernel_count": e["kernel_count"]}}


def _us(t) -> str:
    return f"{t * 1e6:10.2f}" if t is not None else f"{'-':>10}"


def kernel_table(rows: list[dict], title: str) -> str:
    """Per-kernel table: form, hash, time (median and spread), bound, % of bound, arithmetic
    intensity, achieved GFLOP/s and GB/s, config."""
    lines = [title,
             f"{'#':>3} {'form':<10} {'kernel':<8} {'time us':>10} {'spread':>7} {'bound us':>10} "
             f"{'% bound':>8} {'FLOP/B':>8} {'GFLOP/s':>9} {'GB/s':>8}  config"]
    for r in rows:
        t = r.get("time_s")
        pct = r.get("pct_of_bound")
        gf = (r["flops"] / t / 1e9) if t else None
        gb = (r["bytes"] / t / 1e9) if t else None
        sp = r.get("spread")
        cfg = " ".join(f"{a}={b}" for a, b in (r.get("config") or {}).items())
        lines.append(
            f"{r.get('index', 0):>3} {r['form']:<10} {str(r.get('kernel', ''))[:8]:<8} {_us(t)} "
            f"{(f'{100 * sp:6.1f}%' if sp is not None else '      -')} {_us(r['bound_s'])} "
            f"{(f'{pct:7.1f}%' if pct is not None else '       -')} "
            f"{r.get('arithmetic_intensity', 0.0):8.2f} "
            f"{(f'{gf:9.1f}' if gf is not None else '        -')} "
            f"{(f'{gb:8.1f}' if gb is not None else '       -')}  {cfg}")
    return "\n".join(lines)


def bench_summary(doc: dict) -> str:
    """What ``lumc bench`` prints: the kernel table, then the end-to-end and wall-clock lines."""
    unit = "simulated" if doc["simulated"] else "measured"
    m = doc["model"]
    head = (f"lumc bench: {m['name']} on {doc['device']} ({doc['timing']}); "
            f"artifact {str(doc.get('artifact_hash'))[:12]}")
    out = [kernel_table(doc["kernels"], head)]
    e = doc["end_to_end"]
    ideal = e.get("ideal_bytes")
    ratio = f" ({e['bytes_moved'] / ideal:.2f}x ideal {ideal / 1e6:.3f} MB)" if ideal else ""
    out.append(f"end to end ({unit}, {e['how']}): {e['time_s'] * 1e6:.2f} us"
               + (f" (spread {100 * e['spread']:.1f}%, {e['samples']} samples)" if e["samples"] > 1 else "")
               + f", bound {e['bound_s'] * 1e6:.2f} us, {e['kernel_count']} kernel"
               f"{'s' * (e['kernel_count'] != 1)}, "
               f"{e['bytes_moved'] / 1e6:.3f} MB moved{ratio}")
    w = doc.get("wall")
    if w:
        out.append(f"wall ({w['where']}): median {w['time_s'] * 1e3:.3f} ms, min "
                   f"{w['min_s'] * 1e3:.3f} ms, max {w['max_s'] * 1e3:.3f} ms over {w['samples']} call"
                   f"{'s' * (w['samples'] != 1)}"
                   + (" -- not compared: it times numpy on this host, not the GPU" if doc["simulated"] else ""))
    return "\n".join(out)
