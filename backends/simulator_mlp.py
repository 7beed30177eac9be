"""The simulated time of an ``mlp`` kernel (``lumc.backends.triton.render_mlp``): two chained
contractions, the intermediate on chip, split over ``F``.

Priced with the terms of ``lumc.backends.simulator`` (each >= the pure roofline), for what the
rendered code issues:

* **Work**: both products over whole tiles (``2 * Mp * Kp * Fp + 2 * Mp * Fp * Np``, each dim
  padded to its block, ``F`` to whole programs of ``F_TILES`` blocks), at the config's
  ``PRECISION`` peak times each product's tile efficiency (``BLOCK_M x BLOCK_F`` over ``BLOCK_K``
  steps, then ``BLOCK_M x BLOCK_N`` over one ``BLOCK_F`` step), scaled by SM fill
  (``cdiv(M, BLOCK_M) * cdiv(F, BLOCK_F * F_TILES)`` programs).
* **Bytes**: the inputs and outputs once; ``W1`` and ``W2`` again for every further row block and
  ``A`` for every further F block (its K loop runs once per block), of which ``L2_HIT`` is
  served by L2; the fp32 partial tiles written and read back
  (``2 * cdiv(F, BLOCK_F * F_TILES) * M * N * 4``) at HBM prices.
* **Row statistics** of a normalization formed on load: one pass over each program's rows per
  statistic, re-read from L2, and the normalized tile's ops per element, on CUDA cores.
* **Latency**: no program finishes before the ``K`` and ``N`` loops of each of its ``F_TILES``
  blocks, each step waiting on loads issued ``num_stages - 1`` steps before
  (``DRAM_LATENCY_S``); waves of resident programs.
* **Launches**: two kernels (the finish kernel adds a launch and a wave).
"""
from __future__ import annotations

import math
import weakref

import lumc.backends.simulator as sim   # its constants, at call time (it imports this module)
from lumc.backends.devices import DeviceSpec
from lumc.backends.triton.configs import mlp_shared_memory
from lumc.ir.kernels import Kernel

_DIMS: "weakref.WeakKeyDictionary[Kernel, tuple]" = weakref.WeakKeyDictionary()


def mlp_dims(kernel: Kernel) -> tuple[int, int, int, int, int, int]:
    """``(M, K, F, N, itemsize, statistics)`` of an mlp kernel: the chained contractions' sizes,
    the operand itemsize and the row statistics of its first operand's normalization (0 without)."""
    hit = _DIMS.get(kernel)
    if hit is None:
        from lumc.backends.triton.render_mlp import chained_contractions
        nodes = kernel.meaning.nodes()
        c1, c2 = chained_contractions(nodes)
        stats = sum(1 for n in nodes if n.op in ("SumReduce", "MaxReduce")
                    and n is not c1.node and n is not c2.node)
        hit = _DIMS[kernel] = (c1.M, c1.K, c1.N, c2.N, c1.a.dtype.itemsize, stats)
    return hit


def _blocks(cfg: dict) -> tuple[int, int, int, int]:
    return (int(cfg.get("BLOCK_M", 64)), int(cfg.get("BLOCK_F", 64)), int(cfg.get("BLOCK_K", 32)),
            int(cfg.get("BLOCK_N", 64)))


def mlp_splits(kernel: Kernel, cfg: dict) -> int:
    """Programs per row block (and partial tiles per output element): ``cdiv(F, BLOCK_F *
    F_TILES)``."""
    return math.ceil(mlp_dims(kernel)[2] / (_blocks(cfg)[1] * int(cfg.get("F_TILES", 1))))


def mlp_padded_flops(kernel: Kernel, cfg: dict) -> int:
    """FLOPs the config issues: both products over whole tiles (every program's ``F_TILES``
    blocks, those past ``F`` included)."""
    M, K, F, N, _, _ = mlp_dims(kernel)
    bm, bf, bk, bn = _blocks(cfg)
    mp = math.ceil(M / bm) * bm
    fp = mlp_splits(kernel, cfg) * int(cfg.get("F_TILES", 1)) * bf
    return 2 * mp * fp * (math.ceil(K / bk) * bk) + 2 * mp * fp * (math.ceil(N / bn) * bn)


def mlp_workspace_bytes(kernel: Kernel, cfg: dict) -> int:
    """The fp32 partial tiles: :func:`mlp_splits` per output element, written and read back."""
    M, _, F, N, _, _ = mlp_dims(kernel)
    return 2 * mlp_splits(kernel, cfg) * M * N * 4


def simulate_mlp_time(kernel: Kernel, cfg: dict, dev: DeviceSpec, in_bytes: int,
                      out_bytes: int, dtype_name: str) -> float:
    """Simulated seconds of one launch of both kernels (see the module docstring).

    Raises:
        ValueError: when the config cannot run (shared memory over the per-block limit).
    """
    M, K, F, N, isz, stats = mlp_dims(kernel)
    bm, bf, bk, bn = _blocks(cfg)
    warps, stages = int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 2))
    smem = mlp_shared_memory(isz, {"BLOCK_M": bm, "BLOCK_F": bf, "BLOCK_K": bk, "BLOCK_N": bn,
                                   "num_stages": stages})
    if smem > dev.smem_per_block:
        raise ValueError(f"config {cfg} needs {smem} B of shared memory > {dev.smem_per_block} B")
    ft = int(cfg.get("F_TILES", 1))
    tm, tf, tn = math.ceil(M / bm), mlp_splits(kernel, cfg), math.ceil(N / bn)
    programs = tm * tf
    if programs == 0:
        return 2 * dev.launch_overhead_s
    resident = max(1, min(sim.MAX_WARPS_PER_SM // max(warps, 1),
                          sim.SMEM_PER_SM // max(smem, 1)))
    slots = dev.sm_count * resident
    waves = math.ceil(programs / slots)
    sm_fill = min(1.0, programs / dev.sm_count)
    peak = sim.dot_peak(dev, cfg, dtype_name)
    mp, fp = tm * bm, tf * ft * bf
    eff1 = sim.tensor_core_efficiency(bm, bf, bk, stages)   # h block over BLOCK_K steps
    eff2 = sim.tensor_core_efficiency(bm, bn, bf, stages)   # column tiles over one F block
    work = 2 * mp * fp * math.ceil(K / bk) * bk / eff1 + 2 * mp * fp * tn * bn / eff2
    a_bytes, w1, w2 = M * K * isz, K * F * isz, F * N * isz
    rereads = (tf * ft - 1) * a_bytes + (tm - 1) * (w1 + w2)
    hbm = in_bytes + out_bytes + rereads * (1 - sim.L2_HIT) + mlp_workspace_bytes(kernel, cfg)
    body = max(work / (peak * sm_fill), hbm / (dev.hbm_bandwidth * sim.BW_EFFICIENCY))
    if stats:   # the statistics loops run before the main loop: their time adds
        reread = a_bytes * stats * tf
        l2_bw = sim.L2_BANDWIDTH * min(1.0, sim.L2_SM_HEADROOM * programs / dev.sm_count)
        ops = programs * bm * K * (stats + 4)     # each statistic's body, and the normalized tile
        body += ops / dev.vector_flops["f32"] + reread * (1 - sim.L2_HIT) / (
            dev.hbm_bandwidth * sim.BW_EFFICIENCY) + reread * sim.L2_HIT / l2_bw
    # no program finishes before its own loops: per F block, K steps, then N steps, each on
    # loads issued num_stages - 1 steps before
    steps = ft * (math.ceil(K / bk) + tn)
    loop_floor = steps * sim.DRAM_LATENCY_S / max(stages - 1, 1) * waves
    if programs >= slots:
        body *= min(waves * slots / programs, 1.0 + 1.0 / waves)
    body = max(body, loop_floor)
    # the finish kernel: a launch and a wave
    return 2 * dev.launch_overhead_s + body + (waves + 1) * sim.DRAM_LATENCY_S


def mlp_bound(kernel: Kernel, cfg: dict, dev: DeviceSpec, in_bytes: int, out_bytes: int,
              dtype_name: str) -> float:
    """A lower bound on the config's time: its padded FLOPs at the precision's peak, or its
    bytes at full bandwidth, plus both launches."""
    return max(mlp_padded_flops(kernel, cfg) / sim.dot_peak(dev, cfg, dtype_name),
               (in_bytes + out_bytes) / dev.hbm_bandwidth) + 2 * dev.launch_overhead_s
