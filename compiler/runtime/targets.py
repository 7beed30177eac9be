"""Where a compiled program runs and is timed: a real CUDA GPU or a simulated one.

``cuda`` / ``cuda:N`` time generated Triton kernels on that GPU; ``sim:h100`` / ``sim:h200`` time them
with the analytical model of ``lumc.backends.simulator`` and execute on the CPU. The default is the
first CUDA GPU, else ``sim:h200``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lumc.backends.devices import DeviceSpec, get_device
from lumc.ir.errors import LumcError


@dataclass(frozen=True)
class Target:
    """A resolved device.

    Attributes:
        name: what reports and the tuning database call it (``sim:h200``, ``cuda:0 NVIDIA H200``).
        spec: the ceilings (for a GPU: the closest known spec, refined by measured ceilings).
        simulated: True when times come from the analytical model.
        torch_device: ``cuda:N`` on a GPU, ``cpu`` otherwise (where the plan executes).
    """
    name: str
    spec: DeviceSpec
    simulated: bool
    torch_device: str


def _cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: no GPU path
        return False


def run_device(device) -> str | None:
    """Where a loaded artifact runs (``lumc.load(path, device)``): None (a CUDA GPU for an
    artifact tuned on one, where one is present; else the CPU), ``"cpu"`` or ``"cuda[:N]"``
    (normalized to ``cuda:N``; a ``torch.device`` too).

    Raises:
        LumcError: another name (``sim:h200`` names a compile target, not where a plan runs), a
            CUDA device on a machine without one, or an index past the GPUs there.
    """
    if device is None:
        return None
    if type(device).__module__.startswith("torch") and type(device).__name__ == "device":
        device = str(device)
    if not isinstance(device, str):
        raise LumcError(f"device {device!r}: a loaded artifact runs on 'cpu' or 'cuda[:N]'")
    d = device.strip().lower()
    if d == "cpu":
        return "cpu"
    if d == "cuda" or (d.startswith("cuda:") and d[5:].isdigit()):
        if not _cuda_available():
            raise LumcError(f"device {device!r}: no CUDA GPU on this machine; load with "
                            "device='cpu' (or leave it out)")
        import torch
        idx = int(d[5:]) if ":" in d else 0
        if idx >= torch.cuda.device_count():
            raise LumcError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return f"cuda:{idx}"
    raise LumcError(f"device {device!r}: a loaded artifact runs on 'cpu' or 'cuda[:N]' (a "
                    "sim:* device is a compile target; the artifact keeps the times it was "
                    "compiled with)")


def resolve_target(device: str | None) -> Target:
    """Resolve ``--device``.

    Raises:
        LumcError: for an unknown device name, or ``cuda`` on a machine without a CUDA GPU.
    """
    if device is None:
        device = "cuda:0" if _cuda_available() else "sim:h200"
    if type(device).__module__.startswith("torch") and type(device).__name__ == "device":
        device = str(device)                  # torch.device("cuda:1")
    if not isinstance(device, str):
        raise LumcError(f"device {device!r}: expected a device name: cuda[:N], sim:h100 or "
                        "sim:h200")
    d = device.strip().lower()
    if d.startswith("sim:"):
        try:
            spec = get_device(d[4:])
        except KeyError:
            raise LumcError(f"unknown simulated device {device!r}; use sim:h100 or sim:h200") \
                from None
        return Target(f"sim:{spec.name}", spec, True, "cpu")
    if d.startswith("cuda:") and not d[5:].isdigit():
        raise LumcError(f"unknown device {device!r}; use cuda[:N], sim:h100 or sim:h200")
    if d == "cuda" or d.startswith("cuda:"):
        if not _cuda_available():
            raise LumcError(f"device {device!r}: no CUDA GPU on this machine; use --device sim:h200 "
                            "(simulated timing)")
        import torch
        idx = int(d.split(":")[1]) if ":" in d else 0
        if idx >= torch.cuda.device_count():
            raise LumcError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
        gpu = torch.cuda.get_device_name(idx)
        key = "h200" if "H200" in gpu else "h100-sxm"
        set_current_device(f"cuda:{idx}")     # cuda:N > 0: allocation, launch and timing there
        return Target(f"cuda:{idx} {gpu}", get_device(key), False, f"cuda:{idx}")
    raise LumcError(f"unknown device {device!r}; use cuda[:N], sim:h100 or sim:h200")


def fork_safe() -> bool:
    """True when worker processes may be forked: kernels run in the Triton interpreter (no GPU
    here) and CUDA has not been initialized in this process. A child forked after CUDA was touched
    cannot use it (CUDA's rule; torch raises "Cannot re-initialize CUDA in forked subprocess"), so
    on a machine with a GPU a ``sim:*`` compile checks kernels in-process, on the GPU."""
    import sys
    from lumc.backends.triton.launch import interpreter_mode
    if not interpreter_mode():
        return False
    torch = sys.modules.get("torch")
    try:
        return not (torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def set_current_device(torch_device: str) -> None:
    """Make ``cuda:N`` the current CUDA device (allocation and launches that name plain ``cuda``,
    Triton's launcher, events); nothing for ``cpu``."""
    if torch_device.startswith("cuda"):
        import torch
        torch.cuda.set_device(torch.device(torch_device))


_SOURCE_HASH: str | None = None


def source_hash() -> str:
    """A hash of lumc's own Python sources (12 hex digits): timings and stored plans are keyed by
    it, so a change to the compiler (a new rule, a simulator fix) never reuses stale results."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        import hashlib
        import pathlib

        import lumc.backends
        import lumc.compiler
        import lumc.ir
        import lumc.rewrites
        h = hashlib.sha256()
        for pkg in (lumc.ir, lumc.rewrites, lumc.backends, lumc.compiler):
            root = pathlib.Path(pkg.__file__).parent
            for f in sorted(root.rglob("*.py")):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
        _SOURCE_HASH = h.hexdigest()[:12]
    return _SOURCE_HASH


def versions(gpu: bool | None = None) -> dict[str, str]:
    """lumc, Triton, torch and CUDA driver versions (``none`` where absent), for keys and reports.

    Versions are read from package metadata, without importing triton (its import fixes the
    interpreter mode) or torch (slow); the driver is asked only when ``gpu`` is not False.
    """
    from importlib.metadata import PackageNotFoundError, version
    from lumc import __version__
    out = {"lumc": f"{__version__}+{source_hash()}", "triton": "none", "torch": "none",
           "driver": "none"}
    for pkg in ("triton", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    if gpu is not False and _cuda_available():
        import torch
        out["driver"] = str(torch.version.cuda) + "/" + ".".join(
            map(str, torch.cuda.get_device_capability()))   # the current device (cuda:N)
    return out


def measure_ceilings(torch_device: str) -> dict[str, float]:
    """Measured ceilings of a CUDA GPU: ``{"bandwidth": bytes/s, "bf16": FLOP/s, "f16": FLOP/s}``.

    Bandwidth is a 1 GiB device-to-device copy (read + write counted); compute is an 8192^3 bf16
    ``torch.matmul``. Each is the median of 10 runs after warm-up, timed with CUDA events (the
    method of Triton's ``do_bench``).
    """
    import statistics

    import torch

    def median_seconds(fn, reps=10):
        fn()
        torch.cuda.synchronize(torch_device)
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize(torch_device)
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)

    n = 1 << 28                                   # 1 GiB of fp32
    src = torch.empty(n, dtype=torch.float32, device=torch_device)
    dst = torch.empty_like(src)
    copy_s = median_seconds(lambda: dst.copy_(src))
    del src, dst
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device=torch_device)
    y = torch.randn(m, m, dtype=torch.bfloat16, device=torch_device)
    mm_s = median_seconds(lambda: torch.matmul(x, y))
    flops = 2.0 * m ** 3 / mm_s
    return {"bandwidth": 2.0 * n * 4 / copy_s, "bf16": flops, "f16": flops}


def with_measured_ceilings(target: Target, db) -> Target:
    """The target with its spec's bandwidth and tensor-core peaks replaced by measured ones,
    measured once per device and versions and cached in the tuning database. Simulated targets are
    returned unchanged."""
    if target.simulated:
        return target
    from lumc.compiler.runtime.tuning_db import Timing, TimingKey
    ver = versions(gpu=True)
    keys = {k: TimingKey("__ceiling__", k, target.name, ver["lumc"], ver["triton"], ver["driver"])
            for k in ("bandwidth", "bf16", "f16")}
    got = {k: db.get(key) for k, key in keys.items()}
    if any(v is None for v in got.values()):
        measured = measure_ceilings(target.torch_device)
        for k, key in keys.items():
            db.put(key, Timing(measured[k], True, False, "measured ceiling"))
        vals = measured
    else:
        vals = {k: v.seconds for k, v in got.items()}
    tensor = dict(target.spec.tensor_flops)
    tensor.update({"bf16": vals["bf16"], "f16": vals["f16"]})
    spec = dataclasses.replace(target.spec, hbm_bandwidth=vals["bandwidth"], tensor_flops=tensor)
    return dataclasses.replace(target, spec=spec)
