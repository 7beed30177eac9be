"""Side by side: the same model through the tools a user would otherwise use, in the same process.

``lumc bench --vs eager,inductor,onnxruntime`` runs each installed rival on the same inputs and
reports ratios (rival time / lumc time: above 1, lumc is faster), never bare absolute times:

* ``onnxruntime``: the source ONNX model, CUDA execution provider on a GPU, CPU EP otherwise;
* ``eager``: torch eager. The module comes from ``onnx2torch`` when it is installed and converts
  the model; otherwise from lumc's imported primitive graph replayed with torch ops
  (``lumc.compiler.runtime.graph_torch``): not the real rival (the model's own PyTorch ops), so
  each such row and the legend say so, with the reason (onnx2torch missing or failing);
* ``inductor``: ``torch.compile`` of that module, ``mode="max-autotune"`` on a GPU. On the CPU it also
  reports TorchInductor's generated kernel count and ``num_bytes_accessed`` (from its
  ``inductor_metrics`` log, ``torch._logging.set_logs(inductor_metrics=True)``), to set beside
  lumc's kernel count and bytes moved against ``ideal_bytes``.

What lumc's time is depends on where it runs: on a GPU, its CUDA graph; without one, the CPU
executor (numpy), since a simulated H200 time is no match for a CPU rival. The rows say so.
Each rival's outputs are checked against lumc's (max relative error), so a broken conversion shows.
"""
from __future__ import annotations

import contextlib
import io
import logging
import statistics
import sys
import time
import types
from dataclasses import dataclass

import numpy as np

from lumc.compiler.runtime.compiled import CompiledModel
from lumc.ir.errors import InputError

RIVALS = ("eager", "inductor", "onnxruntime")
LOWERED = "lumc's primitive graph"     # torch_module's source when it is not the model's own ops
_ALIASES = {"ort": "onnxruntime", "torch": "eager", "torch.compile": "inductor", "compile": "inductor"}


def parse_rivals(spec: str) -> list[str]:
    """``"eager,inductor"`` -> ``["eager", "inductor"]``; ``all`` means every rival.

    Raises:
        InputError: an unknown name (listing the known ones).
    """
    names = []
    for part in str(spec).split(","):
        p = part.strip().lower()
        if not p:
            continue
        if p == "all":
            names += [r for r in RIVALS if r not in names]
            continue
        p = _ALIASES.get(p, p)
        if p not in RIVALS:
            raise InputError(f"--vs {part.strip()!r}: unknown rival; known: {', '.join(RIVALS)}")
        if p not in names:
            names.append(p)
    return names


@dataclass
class RivalResult:
    """One row of the side-by-side table.

    Attributes:
        name: the rival as shown (``onnxruntime (CPUExecutionProvider)``).
        where: the device it ran on (``cpu``, ``cuda:0``).
        time_s: median seconds per call (None when it did not run).
        ratio: ``time_s / lumc time`` (above 1: lumc is faster).
        kernels: kernels it launches, where known; bytes: bytes it moves, where known.
        max_rel_error: its outputs against lumc's (max |a - b| / max |b| over every output).
        note: why it was skipped, or what to know about the figure.
        program: what a torch rival ran: ``onnx2torch`` (the model's own ops) or
            :data:`LOWERED` (lumc's primitive graph replayed with torch ops); None for the others.
    """
    name: str
    where: str
    time_s: float | None = None
    samples: int = 0
    ratio: float | None = None
    kernels: int | None = None
    bytes: int | None = None
    compile_s: float | None = None
    max_rel_error: float | None = None
    note: str = ""
    program: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _median_time(fn, repeats: int, sync=None) -> tuple[float, int]:
    fn()                                   # warm-up (and any lazy compile)
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times)), len(times)


def _rel_error(got: list, ref: list) -> float:
    worst = 0.0
    for g, r in zip(got, ref):
        g = np.asarray(g, dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        if g.shape != r.shape:
            return float("inf")
        if r.size == 0:
            continue
        fin = np.isfinite(r)
        if not np.array_equal(np.isfinite(g), fin):
            return float("inf")
        if fin.any():
            scale = max(float(np.abs(r[fin]).max()), 1e-30)
            worst = max(worst, float(np.abs(g[fin] - r[fin]).max()) / scale)
    return worst


# ---- onnxruntime ---------------------------------------------------------------------------------

def run_onnxruntime(cm: CompiledModel, inputs: dict, ref: list, on_gpu: bool, repeats: int,
                    threads: int | None = None) -> RivalResult:
    try:
        import onnxruntime as ort
    except ImportError:
        return RivalResult("onnxruntime", "-", note="not installed (pip install onnxruntime)")
    if cm.source_onnx is None:
        return RivalResult("onnxruntime", "-", note="no source ONNX (compiled from a torch module)")
    avail = ort.get_available_providers()
    note = ""
    if on_gpu and "CUDAExecutionProvider" in avail:
        providers, where = ["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda:0"
    else:
        providers, where = ["CPUExecutionProvider"], "cpu"
        if on_gpu:
            note = "CUDA EP not installed (pip install onnxruntime-gpu): CPU EP against lumc on GPU"
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    t0 = time.perf_counter()
    try:
        sess = ort.InferenceSession(cm.source_onnx, opts, providers=providers)
    except Exception as e:   # onnxruntime raises its own untyped errors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return RivalResult("onnxruntime", where, note=f"cannot load the model: {first[:160]}")
    compile_s = time.perf_counter() - t0
    names = [o.name for o in cm.outputs]
    feeds = {i.name: inputs[i.name] for i in sess.get_inputs() if i.name in inputs}
    out = sess.run(names, feeds)
    t, n = _median_time(lambda: sess.run(names, feeds), repeats)
    label = f"onnxruntime ({providers[0]})"
    if where != "cpu":
        note = (note + "; " if note else "") + "numpy in/out: host copies included"
    return RivalResult(label, where, t, n, compile_s=compile_s, max_rel_error=_rel_error(out, ref),
                       note=note)


# ---- torch: eager and inductor ---------------------------------------------------------------------

@contextlib.contextmanager
def _torchvision_placeholder():
    """onnx2torch imports torchvision only for its NonMaxSuppression and RoiAlign converters; PyPI's
    torchvision wheel is CUDA-built and does not load beside the CPU torch, so while onnx2torch is
    imported a placeholder stands in (those two ops then fail to convert, the rest work)."""
    try:
        import torchvision  # noqa: F401
        yield
        return
    except Exception:
        pass

    def unavailable(*a, **k):
        raise RuntimeError("torchvision is not available")
    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    ops.nms = ops.roi_align = ops.box_convert = unavailable
    tv.ops = ops
    saved = {k: sys.modules.get(k) for k in ("torchvision", "torchvision.ops")}
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = tv, ops
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def torch_module(cm: CompiledModel):
    """``(module, source, note)``: the model as a torch module taking the inputs positionally.

    ``onnx2torch`` when installed and it converts every node (its module takes the ONNX graph's
    inputs in order); otherwise the primitive-graph replay of ``lumc.compiler.runtime.graph_torch``.
    """
    note = "the artifact holds no source ONNX model"
    if cm.source_onnx is not None:
        try:
            with _torchvision_placeholder():
                import onnx2torch
        except ImportError:
            onnx2torch = None
            note = "onnx2torch is not installed (pip install onnx2torch)"
        if onnx2torch is not None:
            import onnx
            try:
                m = onnx.load_from_string(cm.source_onnx)
                order = [i.name for i in m.graph.input
                         if i.name not in {t.name for t in m.graph.initializer}]
                if order == [i.name for i in cm.inputs]:
                    return onnx2torch.convert(m).eval(), "onnx2torch", ""
                note = "onnx2torch's module takes the inputs in another order"
            except Exception as e:
                note = f"onnx2torch cannot convert it: {_short_reason(e)}"
    from lumc.compiler.runtime.graph_torch import graph_module
    mod = graph_module(cm.graph).eval()
    return mod, LOWERED, note


def _short_reason(e: Exception) -> str:
    """One short phrase for why onnx2torch failed (its messages embed whole op descriptions)."""
    import re
    msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
    m = re.search(r"operation_type='(\w+)', version=(\d+)", msg)
    if m:
        return f"no converter for {m.group(1)}-{m.group(2)}"
    return msg[:60]


def _to_list(out) -> list:
    if isinstance(out, (list, tuple)):
        return [o.detach().cpu().numpy() for o in out]
    return [out.detach().cpu().numpy()]


class _DropRecords(logging.Filter):
    def filter(self, record):   # keep the metrics computed, not printed (they list every node)
        return False


@contextlib.contextmanager
def inductor_metrics():
    """Turn on TorchInductor's ``inductor_metrics`` log (which makes it count bytes accessed) with
    its output suppressed; yields ``torch._inductor.metrics`` after a reset."""
    import torch
    import torch._inductor.compile_fx  # noqa: F401  (creates the inductor_metrics artifact logger)
    import torch._inductor.metrics as metrics
    torch._logging.set_logs(inductor_metrics=True)
    loggers = [logging.getLogger(n) for n in logging.root.manager.loggerDict
               if n.endswith("__inductor_metrics")]
    drop = _DropRecords()
    for lg in loggers:
        lg.addFilter(drop)
    metrics.reset()
    try:
        yield metrics
    finally:
        for lg in loggers:
            lg.removeFilter(drop)
        torch._logging.set_logs()


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    if not threads:
        yield
        return
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_torch(cm: CompiledModel, names: list[str], inputs: dict, ref: list, device: str,
              repeats: int) -> list[RivalResult]:
    """The ``eager`` and/or ``inductor`` rows."""
    try:
        import torch
    except ImportError:
        return [RivalResult(n, "-", note="torch not installed") for n in names]
    mod, source, why = torch_module(cm)
    src_note = ("from onnx2torch" if source != LOWERED else
                f"ran lumc's lowered graph, not the model's own PyTorch ops: {why}")
    on_gpu = device.startswith("cuda")
    mod = mod.to(device)
    args = [torch.from_numpy(np.array(inputs[i.name], order="C")).to(device) for i in cm.inputs]
    sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else None
    rows = []
    with torch.no_grad():
        if "eager" in names:
            out = _to_list(mod(*args))
            t, n = _median_time(lambda: mod(*args), repeats, sync)
            rows.append(RivalResult("torch eager", device, t, n, max_rel_error=_rel_error(out, ref),
                                    note=src_note, program=source))
        if "inductor" in names:
            mode = "max-autotune" if on_gpu else None
            label = f"torch.compile ({mode or 'default'})"
            try:
                torch._dynamo.reset()
                with inductor_metrics() as metrics:
                    compiled = torch.compile(mod, mode=mode)
                    t0 = time.perf_counter()
                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        out = _to_list(compiled(*args))
                    compile_s = time.perf_counter() - t0
                    kernels, nbytes = metrics.generated_kernel_count, metrics.num_bytes_accessed
                t, n = _median_time(lambda: compiled(*args), repeats, sync)
            except Exception as e:   # an Inductor failure is a rival's failure, not lumc's
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                rows.append(RivalResult(label, device, note=f"failed: {type(e).__name__}: {first[:120]}",
                                        program=source))
            else:
                rows.append(RivalResult(label, device, t, n, kernels=kernels,
                                        bytes=nbytes or None,
                                        compile_s=compile_s, max_rel_error=_rel_error(out, ref),
                                        note=src_note + f"; compiled in {compile_s:.0f} s",
                                        program=source))
    return rows


def run_rivals(cm: CompiledModel, names: list[str], inputs: dict, lumc_time_s: float, lumc_where: str,
               device: str, repeats: int = 10, threads: int | None = None,
               lumc_how: str = "") -> list[RivalResult]:
    """Run the named rivals on ``inputs`` and fill each row's ratio against ``lumc_time_s``.

    Args:
        cm: the compiled model (its outputs on ``inputs`` are the reference for max_rel_error).
        names: from :func:`parse_rivals`.
        inputs: ``{input name: array}``.
        lumc_time_s: lumc's end-to-end time on ``lumc_where`` (GPU run, or the CPU executor);
            ``lumc_how`` names it in the lumc row (``CPU executor``, ``CUDA graph replay``).
        device: where the torch rivals run (``cpu`` or ``cuda:N``).
        repeats: timed calls per rival (median).
        threads: CPU threads for torch and onnxruntime (None: their defaults). On a busy host one
            thread each gives steadier ratios (idle-waiting thread pools cost milliseconds).
    Returns:
        A lumc row first (ratio 1), then one row per rival in ``names`` order.
    """
    out = cm.run(inputs)
    ref = [out[o.name] for o in cm.outputs]
    rep = cm.report_dict()
    rows = [RivalResult(f"lumc ({lumc_how})" if lumc_how else "lumc", lumc_where, lumc_time_s, ratio=1.0, kernels=len(cm.program.calls),
                        bytes=int(rep.get("bytes_moved") or sum(c.kernel.min_bytes() for c in cm.program.calls)),
                        max_rel_error=0.0)]
    torch_names = [n for n in names if n in ("eager", "inductor")]
    got: dict[str, RivalResult] = {}
    if "onnxruntime" in names:
        got["onnxruntime"] = run_onnxruntime(cm, inputs, ref, device.startswith("cuda"), repeats,
                                             threads)
    if torch_names:
        with _torch_threads(threads):
            for n, r in zip(torch_names, run_torch(cm, torch_names, inputs, ref, device, repeats)):
                got[n] = r
    for n in names:
        r = got[n]
        if r.time_s is not None and lumc_time_s:
            r.ratio = r.time_s / lumc_time_s
        rows.append(r)
    return rows


def rivals_table(rows: list[RivalResult], ideal_bytes: int | None) -> str:
    """The side-by-side table: ratio of each rival's time to lumc's, kernels, bytes vs ideal."""
    lines = [f"{'':<36} {'where':<7} {'time/lumc':>9} {'kernels':>8} {'MB moved':>9} "
             f"{'x ideal':>8} {'max rel err':>11}  note"]
    for r in rows:
        ratio = f"{'-':>9}" if r.ratio is None else (
            f"{r.ratio:8.2f}x" if r.ratio >= 0.1 else f"{r.ratio:8.1e}x")   # 0.00x hid 400x
        k = f"{r.kernels:>8}" if r.kernels is not None else f"{'-':>8}"
        mb = f"{r.bytes / 1e6:9.3f}" if r.bytes is not None else f"{'-':>9}"
        xi = f"{r.bytes / ideal_bytes:8.2f}" if (r.bytes is not None and ideal_bytes) else f"{'-':>8}"
        err = f"{r.max_rel_error:11.2e}" if r.max_rel_error is not None else f"{'-':>11}"
        lines.append(f"{r.name:<36} {r.where:<7} {ratio} {k} {mb} {xi} {err}  {r.note}")
    lines.append("time/lumc > 1: lumc is faster. kernels: lumc's launches; Inductor's generated "
                 "kernels (extern mm/conv calls not counted).\nMB moved: lumc's bytes_moved, each "
                 "kernel's inputs read once and outputs written once, summed over its kernels "
                 "(values passed between kernels count; re-reads inside a kernel do not); "
                 "Inductor's num_bytes_accessed. x ideal: over inputs + weights + outputs, each once."
                 "\nmax rel err: each rival's outputs against lumc's (lumc's row: 0 by definition).")
    lowered = [r.name for r in rows if r.program == LOWERED]
    if lowered:
        lines.append(f"{' and '.join(lowered)}: torch ran lumc's lowered primitive graph, not the "
                     "model's own PyTorch ops (the note says why), so these ratios are not against "
                     "the real rival.")
    return "\n".join(lines)
