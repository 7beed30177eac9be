"""The simulated time of a ``scan`` kernel (``lumc.backends.triton.render_scan``).

One program per row walks the row in ``BLOCK``-wide steps; the model (seconds, all terms at least
the roofline of ``lumc.backends.simulator``):

* **Bytes once, adds per element**: ``max(flops / vector peak, bytes / bandwidth)``, the flops
  those of :meth:`~lumc.ir.kernels.Kernel.flops` (one add per element plus the prologue and
  epilogue) scaled to the lanes issued (a ragged last step runs a whole ``BLOCK``); a grid of fewer
  programs than SMs computes at ``programs / SMs`` of the peak and keeps fewer bytes in flight
  (Little's law, as the row kernels there).
* **The serial chain per row**: a step's loads are issued after the step before (one stage, and
  the carried sum orders the steps), so every step waits one HBM round trip
  (``DRAM_LATENCY_S``); a row of ``L`` elements takes at least ``ceil(L / BLOCK)`` of them, per
  wave of programs. This is what makes few long rows slow, and a wider ``BLOCK`` faster there.
* **Launch overhead** and one round trip per wave, as every kernel.
"""
from __future__ import annotations

import math

from lumc.backends.devices import DeviceSpec
from lumc.backends.triton.render_scan import kernel_scan
from lumc.ir.kernels import Kernel
from lumc.ir.views import prod


def scan_dims(kernel: Kernel) -> tuple[int, int]:
    """``(rows, L)``: programs of the scan and elements along its axis."""
    spec = kernel_scan(kernel)
    return prod(spec.rows), spec.n


def simulate_scan_time(kernel: Kernel, cfg: dict, dev: DeviceSpec, hbm_bytes: int, flops: int,
                       itemsize: int, dtype: str) -> float:
    """Simulated seconds of one launch of a scan kernel with config ``cfg`` (``BLOCK``,
    ``num_warps``) on ``dev``; ``hbm_bytes``: inputs once plus outputs once."""
    from lumc.backends.simulator import BW_EFFICIENCY, BYTES_IN_FLIGHT_PER_SM, DRAM_LATENCY_S, \
        MAX_WARPS_PER_SM
    rows, n = scan_dims(kernel)
    if rows == 0 or n == 0:
        return dev.launch_overhead_s
    block = int(cfg.get("BLOCK", 1024))
    warps = int(cfg.get("num_warps", 4))
    steps = math.ceil(n / block)
    resident = max(1, MAX_WARPS_PER_SM // max(warps, 1))
    slots = dev.sm_count * resident
    waves = math.ceil(rows / slots)
    issued = rows * steps * block
    flops = flops * issued / (rows * n)
    sm_fill = min(1.0, rows / dev.sm_count)
    per_sm = min(rows / dev.sm_count, resident) * block * itemsize
    bw_eff = BW_EFFICIENCY * max(min(1.0, per_sm / BYTES_IN_FLIGHT_PER_SM), 0.02)
    peak = dev.vector_flops.get(dtype, min(dev.vector_flops.values()))
    body = max(flops / (peak * sm_fill), hbm_bytes / (dev.hbm_bandwidth * bw_eff))
    chain = steps * DRAM_LATENCY_S * waves
    return dev.launch_overhead_s + max(body, chain) + waves * DRAM_LATENCY_S


def scan_bound(kernel: Kernel, cfg: dict, dev: DeviceSpec, hbm_bytes: int, flops: int,
               dtype: str) -> float:
    """A lower bound of :func:`simulate_scan_time`: the roofline of the lanes ``cfg`` issues."""
    rows, n = scan_dims(kernel)
    block = int(cfg.get("BLOCK", 1))
    if rows and n:
        flops = flops * rows * math.ceil(n / block) * block / (rows * n)
    peak = dev.vector_flops.get(dtype, min(dev.vector_flops.values()))
    return max(flops / peak, hbm_bytes / dev.hbm_bandwidth) + dev.launch_overhead_s
