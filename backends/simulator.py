"""The simulated GPU: an analytical timing model of a named device, for machines without one.

``sim:h100`` and ``sim:h200`` answer "how long would this kernel config take" without a GPU, so the
search loop runs the same way everywhere, and the output says plainly that times are simulated.

The model (all terms >= the pure roofline, so a simulated time is never below the bound):

* **Roofline**: ``max(flops / (peak * tile_eff), hbm_bytes / (bandwidth * bw_eff))``, where
  ``hbm_bytes`` adds, for tiled contractions, the operand re-reads one tile config implies
  (``A`` is read ``ceil(N / BLOCK_N)`` times, ``B`` ``ceil(M / BLOCK_M)`` times), of which a fixed
  share hits L2 (``L2_HIT``). Padding a ragged edge up to a whole tile counts as work.
* **Tile efficiency** of tensor-core kernels grows with the tile's area and with software
  pipelining (``num_stages``); small tiles cannot feed the tensor cores.
* **MMA path**: a tile Triton lowers to warpgroup MMA (``warpgroup_mma``: HGMMA/QGMMA) runs at
  the dense peak; a smaller one takes per-warp ``mma.sync`` (HMMA) at ``MMA_SYNC_SHARE`` (2/3) of
  it, and an fp8 one converts its operands to fp16 first.
* **SM fill**: a grid of fewer programs than SMs computes at ``programs / SMs`` of the peak (an
  idle SM's cores do nothing); this is what split-K and smaller tiles buy for skinny problems.
* **Wave quantization**: ``programs`` thread blocks run in waves of ``sm_count * blocks_per_sm``,
  where ``blocks_per_sm`` is limited by shared memory and by 64 resident warps per SM; the last,
  partial wave costs a whole wave.
* **Latency hiding** (Little's law): HBM bandwidth is reached only with about
  ``bandwidth x latency / SMs`` bytes in flight per SM; fewer resident programs, or smaller tiles,
  reach a proportional share of it. A contraction's program instead waits on its own K loop: each
  step on the loads issued ``num_stages - 1`` steps before, one HBM round trip (``DRAM_LATENCY_S``)
  each, L2 hits included (the programs sharing a tile run at once and wait on the same miss); no
  program finishes sooner, however many share the grid.
* **Launch overhead** per kernel (the device's ``launch_overhead_s``), plus one HBM round trip per
  wave.
* **Row passes**: a looped row kernel (a row longer than its ``BLOCK_K``) reads its rows once per
  loop (``simulator_rows.row_passes``: one per reduction level, one for an online pair, one more
  for values per element; a split one, ``SPLIT`` programs per row, reduces all its reductions in
  one pass).
  Each pass after the first re-reads what the programs in flight read: from L2 at
  ``L2_HIT`` while that fits in ``L2_BYTES``, from HBM beyond; L2 reads take their time at
  ``L2_BANDWIDTH`` too, so a three-level row is never priced as one read.
* **Row statistics** of a normalization formed on load (``norm_prologue``, ``norm_epilogue``): their
  loops run before the main loop, on CUDA cores, re-reading each program's rows once per statistic
  from L2 (``L2_BANDWIDTH``; the misses from HBM); the time adds to the body.
* **Attention operand prologues** (RoPE computed on load): CUDA-core ops, the query's once, the
  keys' and values' once per query block (``attention_prologue_seconds``); the time adds.

The constants are plausible Hopper figures, not measurements; on a real GPU the measurer replaces the
whole model. Config keys read: ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K`` (contractions), ``BLOCK`` or
``BLOCK_SIZE`` (elementwise and row kernels), ``SPLIT`` (programs per row of a split reduction),
``SPLIT_K`` (programs per output tile of a split-K contraction: their fp32 partial tiles are written
and read back at HBM prices, and the finish kernel adds a launch and a wave), ``num_warps``,
``num_stages``; missing keys take the defaults below. The ``mlp`` form (``BLOCK_F``) is priced by
``lumc.backends.simulator_mlp`` with the same terms.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass

from lumc.backends.devices import H200, DeviceSpec
from lumc.backends.extern import extern_bytes, is_extern
from lumc.backends.simulator_rows import (RowWork, row_dims, row_passes,  # noqa: F401
                                          row_prologue_ops, row_statistics_work)
import lumc.backends.simulator_mlp as simulator_mlp   # the mlp form (it reads this module's terms)
import lumc.backends.simulator_scan as simulator_scan   # the scan form (the same)
from lumc.backends.simulator_attention import (SFU_OPS, attention_problem,  # noqa: F401
                                               attention_prologue_seconds, attention_prologues,
                                               attention_score_seconds)
from lumc.backends.triton.configs import attention_shared_memory
from lumc.backends.triton.contraction import paired_contractions
from lumc.ir.kernels import Kernel
from lumc.ir.views import prod

L2_HIT = 0.85            # share of tile re-reads served by L2 (50 MB on Hopper)
# L2 read bandwidth: ~5.5 TB/s measured on an H100 PCIe (114 SMs, Chips and Cheese, "Nvidia's H100:
# Funny L2, and Tons of Bandwidth", 2023); taken for the SXM parts too (a floor: more SMs, higher
# clocks). A grid of few programs reaches a share: each SM pulls at most L2_SM_HEADROOM times its
# even share (estimate)
L2_BANDWIDTH = 5.5e12
L2_SM_HEADROOM = 2.0
L2_BYTES = 50 * 1024 * 1024   # Hopper's L2 (H100 SXM, H200: 50 MB; [H100-WP])
BW_EFFICIENCY = 0.92     # best achievable share of HBM bandwidth for a streaming kernel
DRAM_LATENCY_S = 0.6e-6  # one HBM round trip: the least a wave of programs takes
BYTES_IN_FLIGHT_PER_SM = 24 * 1024   # bandwidth x latency / SMs: 4.8 TB/s x 0.6 us / 132 (Little's law)
MAX_WARPS_PER_SM = 64    # Hopper: 2048 threads per SM
SMEM_PER_SM = 228 * 1024
TENSOR_FORMS = ("matmul", "attention")

# Calibration of tensor-core kernels to what generated (pointer-based, non-TMA, non-warp-
# specialized) Triton GEMMs reach on Hopper: 700-790 TFLOP/s bf16 at 4096^3-8192^3 on H100/H200
# SXM (the figure of lumc issue 11, from Triton's 03-matrix-multiplication tutorial benchmark run
# on Hopper; to be replaced by `make gpu-check`'s measurement), i.e. 0.71-0.80 of the 989.4 dense
# peak. The best tile reaches TRITON_MMA_EFFICIENCY of peak; smaller tiles, fewer stages and
# shorter K steps less (simulate_kernel_time then adds waves, L2 re-reads and launch: 8192^3 bf16
# at 128x256x64 is ~740 TFLOP/s simulated):
TRITON_MMA_EFFICIENCY = 0.78   # ~770 TFLOP/s bf16 at the best tile (was 1.0: ~926 after waves)
TILE_AREA_FLOOR = 0.35         # share of the best tile's rate a 16x16 tile still reaches (estimate)
STAGE_EFFICIENCY = {1: 0.7, 2: 0.85}   # no / double buffering vs >= 3 stages (estimate)


def tensor_core_efficiency(bm: int, bn: int, bk: int, stages: int) -> float:
    """Share of the ``tl.dot`` peak a tile config reaches: ``TRITON_MMA_EFFICIENCY`` at a
    128x128 (or larger) tile with >= 3 stages and ``BLOCK_K >= 32``, less for smaller tiles (operand
    reuse grows with the tile side), shallower pipelines and shorter K steps. The pure roofline
    (``config_bound``) does not use it: it stays a bound."""
    area = min(1.0, (bm * bn) / (128 * 128))
    eff = (TILE_AREA_FLOOR + (1 - TILE_AREA_FLOOR) * area ** 0.5) * \
        STAGE_EFFICIENCY.get(max(stages, 1), 1.0)
    eff *= min(1.0, bk / 32) ** 0.25
    return TRITON_MMA_EFFICIENCY * eff


@dataclass(frozen=True)
class Contraction:
    """The shape of a contraction kernel: ``batch`` independent ``M x K @ K x N`` products;
    ``operands_b`` right operands multiplied by each left tile (2: a paired matmul, a gated MLP's
    gate and up in one kernel: twice the FLOPs, two ``b`` streams, two accumulators)."""
    batch: int
    m: int
    n: int
    k: int
    operands_b: int = 1


# Share of the tensor-core peak that the per-warp ``mma.sync`` path (SASS ``HMMA``) reaches on
# Hopper: "the older mma.sync instruction can only reach about 2/3 the peak throughput of the Hopper
# Tensor Cores" (Shah et al., "FlashAttention-3", arXiv:2407.08608, sec. 2.2, citing Luo et al.,
# "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture", arXiv:2402.13499). The dense
# peaks of ``DeviceSpec.tensor_flops`` are warpgroup-MMA (wgmma: HGMMA, QGMMA) figures.
MMA_SYNC_SHARE = 2.0 / 3.0


def warpgroup_mma(cfg: dict) -> bool:
    """True when Triton lowers the config's ``tl.dot`` to Hopper's warpgroup MMA (wgmma: HGMMA,
    QGMMA): ``num_warps`` a multiple of 4, ``BLOCK_M`` a multiple of 64 and ``BLOCK_N`` of 8
    (Triton 3.x ``supportMMA(dot, 3)`` in ``AccelerateMatmul``: the warps of a warpgroup may tile N,
    so 64 rows suffice whatever the warp count). Other tiles take the per-warp ``mma.sync`` path
    (HMMA), where e4m3 operands are converted to fp16 first. Source: the SASS of an fp8 matmul
    compiled for sm_90 with Triton 3.9 (``lumc inspect --aot cuda:90``): QGMMA at BLOCK_M 64 with 4
    or 8 warps and at 128 with 4 or 8; HMMA.F32 (fp16) at BLOCK_M 16 and 32 (4 and 8 warps)."""
    w = int(cfg.get("num_warps", 4))
    bm, bn = int(cfg.get("BLOCK_M", 64)), int(cfg.get("BLOCK_N", 64))
    return w % 4 == 0 and bm >= 64 and bm % 64 == 0 and bn % 8 == 0


def dot_peak(dev: DeviceSpec, cfg: dict, operand_dtype: str) -> float:
    """FLOP/s of a contraction config: the peak of its ``PRECISION`` knob (``DeviceSpec.dot_peak``:
    ``ieee`` on CUDA cores, ``tf32x3`` a third of TF32, ...), else the operand dtype's tensor peak;
    a tile on the ``mma.sync`` path (not :func:`warpgroup_mma`) at :data:`MMA_SYNC_SHARE` of it."""
    p = cfg.get("PRECISION")
    wgmma = warpgroup_mma(cfg)
    if p == "fp8" and not wgmma:
        p = "fp16"      # the per-warp MMA path converts e4m3 to fp16 (HMMA.16816.F32 in the SASS)
    if p == "ieee":
        return dev.dot_peak(p)
    if p is not None:
        peak = dev.dot_peak(p)
    elif operand_dtype in dev.tensor_flops:
        peak = dev.tensor_flops[operand_dtype]
    else:
        return min(dev.vector_flops.values())
    return peak if wgmma else peak * MMA_SYNC_SHARE


FP8_SCALE_OPS = 6   # CUDA-core ops per operand element per K step: abs, max, div, clamp (2), convert


def fp8_scaling_seconds(c: "Contraction", cfg: dict, dev: DeviceSpec) -> float:
    """CUDA-core time of the in-kernel fp8 scaling (``dot_precision.py``): every program scales its
    ``BLOCK_M x BLOCK_K`` and ``BLOCK_K x BLOCK_N`` tiles at each K step (:data:`FP8_SCALE_OPS`
    each) and rescales its ``BLOCK_M x BLOCK_N`` partial product (2 ops), at the fp32 vector peak."""
    bm, bn, bk = cfg.get("BLOCK_M", 64), cfg.get("BLOCK_N", 64), cfg.get("BLOCK_K", 32)
    programs = c.batch * math.ceil(c.m / bm) * math.ceil(c.n / bn)
    steps = math.ceil(c.k / bk)
    # a paired matmul scales its a tile again for the second product (the renderer's branch)
    ops = c.operands_b * programs * steps * (FP8_SCALE_OPS * (bm + bn) * bk + 2 * bm * bn)
    return ops / dev.vector_flops["f32"]


def _prologue_views(x, depth: int = 4) -> list:
    """The full-shape ``View`` reads under an operand's elementwise prologue (scalars skipped)."""
    if x.op == "View":
        return [x]
    if depth == 0 or not x.srcs or x.op in ("SumReduce", "MaxReduce", "Gather"):
        return []
    out = []
    for s in x.srcs:
        if s.shape != x.shape:
            continue
        got = _prologue_views(s, depth - 1)
        if not got and s.numel > 1:
            return []
        out += got
    return out


def contraction_dims(kernel: Kernel) -> Contraction | None:
    """Find ``SumReduce(Mul(a, b))`` in the kernel's meaning and classify its iteration space.

    Dims reduced are K; dims where ``a`` is broadcast (stride 0) are N, where ``b`` is, M; dims
    where neither is broadcast are batch. None if the kernel has no such contraction.
    """
    # the product with the largest iteration space: a normalization formed on load has a sum of
    # squares (``SumReduce(Mul(d, d))``) over the operand alone
    prods = [n for n in kernel.meaning.nodes() if n.op == "SumReduce" and n.srcs[0].op == "Mul"]
    if not prods:
        return None
    n = max(prods, key=lambda x: x.srcs[0].numel)
    mul = n.srcs[0]
    space = mul.shape
    red = set(n.arg)

    def bcast(x, d):
        # through a prologue (a weight cast from bf16, an int8 dequant): every view it reads is
        # broadcast along d
        views = _prologue_views(x)
        return bool(views) and space[d] > 1 and all(v.arg.strides[d] == 0 for v in views)

    a, b = mul.srcs
    pair = paired_contractions(kernel.meaning.nodes()) if kernel.form == "matmul" else None
    m = nn = kk = batch = 1
    for d, size in enumerate(space):
        if d in red:
            kk *= size
        elif bcast(a, d) and not bcast(b, d):
            nn *= size
        elif bcast(b, d) and not bcast(a, d):
            m *= size
        else:
            batch *= size
    return Contraction(batch, m, nn, kk, 2 if pair is not None else 1)


def _smem_bytes(kernel: Kernel, cfg: dict, itemsize: int, operands_b: int = 1) -> int:
    """Shared memory one program takes: attention's fitted bound (``configs``), a contraction's
    pipelined operand tiles (``operands_b`` right tiles: 2 for a paired matmul), a row kernel's
    fp32 row buffer."""
    if kernel.form == "attention":
        return attention_shared_memory(attention_problem(kernel), {
            "BLOCK_M": cfg.get("BLOCK_M", 64), "BLOCK_N": cfg.get("BLOCK_N", 64),
            "num_stages": cfg.get("num_stages", 2)})
    if kernel.form in TENSOR_FORMS:
        bm, bn, bk = cfg.get("BLOCK_M", 64), cfg.get("BLOCK_N", 64), cfg.get("BLOCK_K", 32)
        return (bm * bk + operands_b * bk * bn) * itemsize * max(cfg.get("num_stages", 2), 1)
    return cfg.get("BLOCK", cfg.get("BLOCK_SIZE", 1024)) * 4 if kernel.form != "pointwise" else 0


_STATIC: "weakref.WeakKeyDictionary[Kernel, tuple]" = weakref.WeakKeyDictionary()


def _static(kernel: Kernel) -> tuple:
    """What :func:`simulate_kernel_time` needs of a kernel that no config changes, computed once per
    kernel (a search prices hundreds of configs of each): bytes read and written, the widest float
    dtype, FLOPs, the contraction's dims, the row-prologue work and the row dims."""
    hit = _STATIC.get(kernel)
    if hit is None:
        dtype = max((n.dtype for n in kernel.inputs if n.dtype.is_float), key=lambda d: d.itemsize,
                    default=kernel.outputs[0].dtype)
        c = contraction_dims(kernel) if kernel.form in TENSOR_FORMS else None
        prologue = row_statistics_work(kernel, c) if c is not None and kernel.form == "matmul" \
            else RowWork()
        if c is not None and kernel.form == "matmul":
            from lumc.backends.triton.render_matmul import stored_view_ops
            prologue = dataclasses.replace(prologue, store_ops=stored_view_ops(kernel))
        rows = (*row_dims(kernel), row_prologue_ops(kernel), row_passes(kernel)) \
            if c is None and kernel.form not in ("pointwise", "gather", "mlp", "scan") else None
        hit = (sum(kernel.read_bytes()), sum(n.nbytes for n in kernel.outputs), dtype,
               kernel.flops(), c, prologue, rows)
        _STATIC[kernel] = hit
    return hit


def simulate_kernel_time(kernel: Kernel, cfg: dict, dev: DeviceSpec) -> float:
    """Simulated seconds for one launch of ``kernel`` with config ``cfg`` on ``dev``.

    Raises:
        ValueError: when the config cannot run (shared memory over the per-block limit).
    """
    in_bytes, out_bytes, dtype, flops, c, prologue, rows = _static(kernel)
    if kernel.form == "mlp":
        return simulator_mlp.simulate_mlp_time(kernel, cfg, dev, in_bytes, out_bytes, dtype.name)
    if kernel.form == "scan":
        return simulator_scan.simulate_scan_time(kernel, cfg, dev, in_bytes + out_bytes, flops,
                                                 dtype.itemsize, dtype.name)
    warps = int(cfg.get("num_warps", 4))
    stages = int(cfg.get("num_stages", 2))
    l2_reread = 0.0     # bytes a looped row kernel's later passes read again from L2
    smem = _smem_bytes(kernel, cfg, dtype.itemsize, c.operands_b if c is not None else 1)
    if smem > dev.smem_per_block:
        raise ValueError(f"config {cfg} needs {smem} B of shared memory > {dev.smem_per_block} B")
    resident = max(1, min(MAX_WARPS_PER_SM // max(warps, 1), SMEM_PER_SM // smem if smem else 32))
    slots = dev.sm_count * resident
    hbm = in_bytes + out_bytes
    if c is not None and kernel.form == "attention":
        bm, bn = cfg.get("BLOCK_M", 64), cfg.get("BLOCK_N", 64)
        tm, tn = math.ceil(c.m / bm), math.ceil(c.n / bn)
        bd = attention_problem(kernel)["BLOCK_D"]
        # the flash grid: one program per query block (``render_attention``), looping over the
        # key blocks; it loads its q tile once and every k and v tile (again per query block:
        # from L2 after the first)
        programs = c.batch * tm
        # what the programs stream, L2 hits included (each waits on its tiles either way): a
        # grid of more query blocks is not faster for having fewer bytes per program in DRAM
        hbm = max(hbm, programs * (bm + 2 * tn * bn) * bd * dtype.itemsize + out_bytes)
        flops = max(flops, 4 * c.batch * tm * bm * tn * bn * bd)
        tile_eff = tensor_core_efficiency(bm, bn, bd, stages)
        peak = dot_peak(dev, cfg, dtype.name)
        tile_bytes = (bm + 2 * bn * max(stages - 1, 1)) * bd * dtype.itemsize
    elif c is not None:
        bm, bn, bk = cfg.get("BLOCK_M", 64), cfg.get("BLOCK_N", 64), cfg.get("BLOCK_K", 32)
        tm, tn = math.ceil(c.m / bm), math.ceil(c.n / bn)
        # a normalization formed on load: N_TILES column tiles per program (``norm_prologue``)
        groups = math.ceil(tn / max(int(cfg.get("N_TILES", 1)), 1))
        # split-K: SPLIT_K programs per output tile, each a share of K in whole BLOCK_K steps
        sk = max(int(cfg.get("SPLIT_K", 1)), 1)
        programs = c.batch * tm * groups * sk
        a_bytes = c.batch * c.m * c.k * dtype.itemsize
        b_bytes = c.operands_b * c.batch * c.k * c.n * dtype.itemsize
        hbm += (a_bytes * prologue.operand_buffers * (tn - 1) + b_bytes * (tm - 1)) * (1 - L2_HIT)
        if sk > 1:   # the fp32 partial tiles written and read back by the finish kernel (at HBM)
            hbm += 2 * sk * c.batch * tm * bm * tn * bn * 4
        padded = 2 * c.operands_b * c.batch * tm * bm * tn * bn * math.ceil(c.k / (bk * sk)) * bk * sk
        flops = max(flops, padded)
        tile_eff = tensor_core_efficiency(bm, bn, bk, stages)
        peak = dot_peak(dev, cfg, dtype.name)
        tile_bytes = (bm + c.operands_b * bn) * bk * dtype.itemsize * max(stages - 1, 1)
        # no program finishes before its own K loops (N_TILES column tiles each): every step waits
        # on the loads issued num_stages - 1 steps before (Triton's software pipeline), a DRAM
        # round trip (L2 hits too: the programs that share a tile run at once and wait on the
        # same miss). A grid of more programs is not faster for that.
        steps = math.ceil(tn / groups) * math.ceil(math.ceil(c.k / sk) / bk)
        loop_floor = steps * DRAM_LATENCY_S / max(stages - 1, 1) * math.ceil(programs / slots)
    else:
        out_elems = max(sum(prod(n.shape) for n in kernel.outputs), 1)
        if kernel.form in ("pointwise", "gather"):
            block = int(cfg.get("BLOCK", cfg.get("BLOCK_SIZE", 1024)))
            programs = math.ceil(out_elems / block)
            tile_bytes = block * dtype.itemsize * max(len(kernel.inputs), 1)
            issued = programs * block
            flops = flops * issued / out_elems
        else:
            # row kernels: BLOCK_M rows per program, each row read in BLOCK_K-wide chunks
            rows, row, pro_ops, passes = rows
            rows_pp = int(cfg.get("BLOCK_M", 1))
            chunk = int(cfg.get("BLOCK_K", cfg.get("BLOCK", 1024)))
            split = int(cfg.get("SPLIT", 1))      # a split reduction: SPLIT programs per row group
            programs = math.ceil(rows / rows_pp) * split
            tile_bytes = rows_pp * min(chunk, math.ceil(row / split)) * dtype.itemsize
            # each program steps over its share of the row (a split one: CHUNK = ceil(ceil(K /
            # SPLIT) / BLOCK_K) * BLOCK_K elements, ``render_split``) in BLOCK_K-wide chunks
            issued = programs * rows_pp * math.ceil(math.ceil(row / split) / chunk) * chunk
            flops = flops * max(issued / (rows * row), 1.0) + issued * pro_ops
            # a looped row kernel re-reads its rows once per further pass: what the programs
            # in flight read stays in L2 while it fits (the rest of the share from HBM); a split
            # one (level-0 reductions only, ``render_split``) reduces them all in one pass
            if row > chunk and passes > 1 and split == 1:
                live = in_bytes * min(1.0, slots / max(programs, 1))
                hit = L2_HIT * min(1.0, L2_BYTES / max(live, 1.0))
                hbm += (passes - 1) * in_bytes * (1 - hit)
                l2_reread = (passes - 1) * in_bytes * hit
        tile_eff = 1.0
        peak = dev.vector_flops.get(dtype.name, min(dev.vector_flops.values()))
    if programs == 0:       # an empty output (a zero-size batch): a grid of no programs
        return dev.launch_overhead_s
    # Little's law: HBM is saturated only with enough bytes in flight per SM
    per_sm = min(programs / dev.sm_count, resident) * tile_bytes
    occupancy = min(1.0, per_sm / BYTES_IN_FLIGHT_PER_SM)
    bw_eff = BW_EFFICIENCY * max(occupancy, 0.02)
    if c is not None and kernel.form == "matmul":
        # a contraction's latency-bound regime is its K-loop floor (below), which counts every
        # byte a program streams, L2 hits included; the aggregate term here counted only the HBM
        # share, so a second row block's re-reads of the same weights came nearly free
        bw_eff = BW_EFFICIENCY
    waves = max(1, math.ceil(programs / slots))
    quant = waves * slots / max(programs, 1) if programs >= slots else 1.0
    # a grid of fewer programs than SMs leaves the other SMs' cores idle
    sm_fill = min(1.0, programs / dev.sm_count)
    body = max(flops / (peak * tile_eff * sm_fill), hbm / (dev.hbm_bandwidth * bw_eff)
               + l2_reread / (L2_BANDWIDTH * min(1.0, L2_SM_HEADROOM * programs / dev.sm_count)))
    if c is not None and cfg.get("PRECISION") == "fp8":
        body += fp8_scaling_seconds(c, cfg, dev)
    if kernel.form == "attention":
        # the score function on every padded score tile; and no program finishes before its own
        # loop over the key blocks: per block a tile of both products at one SM's share of the
        # peak, or its k and v tiles at one SM's share of the bandwidth
        padded = tm * bm * tn * bn / max(c.m * c.n, 1)
        body += (attention_prologue_seconds(kernel, cfg, dev)
                 + attention_score_seconds(kernel, dev) * padded) / max(sm_fill, 1e-9)
        per_block = max(4 * bm * bn * bd / (peak * tile_eff / dev.sm_count),
                        2 * bn * bd * dtype.itemsize / (dev.hbm_bandwidth * BW_EFFICIENCY
                                                        / dev.sm_count))
        body = max(body, tn * per_block * math.ceil(programs / slots))
    if c is not None and kernel.form == "matmul":
        # a normalization formed on load: every program re-reads its rows of the operand once per
        # statistic (L2 after the first) and computes the prologue for its tile, on CUDA cores
        # (the statistics once per program, the normalized tile once per column tile); a residual
        # normalized in the epilogue: its rows re-read once per statistic over N, the same way
        # (the statistics loops run before the main loop: their time adds, it does not overlap)
        rw = prologue
        reread = 0.0        # bytes the statistics loops read again
        before = body
        if rw.prologue:
            rows = bm * math.ceil(c.k / bk) * bk
            body += (programs * rows * rw.prologue + c.batch * tm * tn * rows * rw.prologue_ops) / \
                dev.vector_flops["f32"]
            reread += a_bytes * rw.prologue * groups
        if rw.epilogue:
            rows = bm * tn * bn
            body += programs * rows * (rw.epilogue + rw.epilogue_ops) / dev.vector_flops["f32"]
            reread += c.batch * c.m * c.n * dtype.itemsize * rw.epilogue * groups
        if rw.store_ops:
            # outputs stored through a view: their index digits over every padded tile element,
            # on the INT32 units: half the FP32 lanes (NVIDIA H100 whitepaper, the SM: 16 INT32
            # and 32 FP32 units per quarter), one op per lane and clock where vector_flops
            # counts an FMA as 2
            body += c.batch * tm * bm * tn * bn * rw.store_ops / (dev.vector_flops["f32"] / 4)
        if reread:
            l2_bw = L2_BANDWIDTH * min(1.0, L2_SM_HEADROOM * programs / dev.sm_count)
            body += reread * (1 - L2_HIT) / (dev.hbm_bandwidth * bw_eff) + reread * L2_HIT / l2_bw
        loop_floor += body - before     # the statistics loops run before the main loop
    if programs >= slots:
        body *= min(quant, 1.0 + 1.0 / waves)
    if c is not None and kernel.form == "matmul":
        body = max(body, loop_floor)
    if c is not None and int(cfg.get("SPLIT_K", 1)) > 1:   # the finish kernel: a launch, a wave
        body += dev.launch_overhead_s + DRAM_LATENCY_S
    return dev.launch_overhead_s + body + waves * DRAM_LATENCY_S


def config_bound(kernel: Kernel, cfg: dict, dev: DeviceSpec) -> float:
    """A lower bound on the time of ``kernel`` run with config ``cfg`` (seconds, launch included).

    It is the roofline of the work that config really issues: a tile computes its whole
    ``BLOCK_M x BLOCK_N x BLOCK_K`` extent even where the problem's edge masks it, and a
    row or elementwise program runs all its ``BLOCK`` lanes; so
    ``max(padded_flops / peak, min_bytes / bandwidth) + launch``. Never below the kernel's pure
    roofline bound, and a config whose bound is not below the best time measured for the kernel
    cannot win: the search prunes it without compiling.
    """
    in_bytes, out_bytes, dtype, flops, c, _, rows = _static(kernel)   # per kernel, not per config
    if kernel.form == "mlp":     # its padded FLOPs are at least the meaning's
        return simulator_mlp.mlp_bound(kernel, cfg, dev, in_bytes, out_bytes, dtype.name)
    if kernel.form == "scan":
        return simulator_scan.scan_bound(kernel, cfg, dev, in_bytes + out_bytes, flops, dtype.name)
    if c is not None:
        bm, bn, bk = cfg.get("BLOCK_M", 16), cfg.get("BLOCK_N", 16), cfg.get("BLOCK_K", 16)
        sk = max(int(cfg.get("SPLIT_K", 1)), 1)
        padded = 2 * c.operands_b * c.batch * (math.ceil(c.m / bm) * bm) * \
            (math.ceil(c.n / bn) * bn) * (math.ceil(c.k / (bk * sk)) * bk * sk)
        flops = max(flops, padded)
        peak = dot_peak(dev, cfg, dtype.name)
        finish = dev.launch_overhead_s if sk > 1 else 0.0   # split-K's second (finish) kernel
    else:
        out_elems = max(sum(prod(n.shape) for n in kernel.outputs), 1)
        block = int(cfg.get("BLOCK", cfg.get("BLOCK_K", 1)))
        if kernel.form in ("pointwise", "gather"):
            lanes = math.ceil(out_elems / block) * block
            flops = flops * lanes / out_elems
        else:
            rows, row, pro_ops, _ = rows
            rows_pp = int(cfg.get("BLOCK_M", 1))
            issued = math.ceil(rows / rows_pp) * rows_pp * math.ceil(row / block) * block
            flops = flops * max(issued / (rows * row), 1.0) + issued * pro_ops
        peak = dev.vector_flops.get(dtype.name, min(dev.vector_flops.values()))
        finish = 0.0
    return max(flops / peak, (in_bytes + out_bytes) / dev.hbm_bandwidth) + \
        dev.launch_overhead_s + finish


def workspace_bytes(kernel: Kernel, cfg: dict) -> int:
    """Bytes config ``cfg`` of ``kernel`` moves through GPU memory besides its inputs and outputs
    (which :meth:`~lumc.ir.kernels.Kernel.min_bytes` counts): a split-K contraction's fp32 partial
    tiles, ``SPLIT_K`` per output element, each written by its share's program and read back by
    the finish kernel (``render_matmul``: ``2 * SPLIT_K * batch * M * N * 4``); an mlp kernel's,
    one per F split (``simulator_mlp.mlp_workspace_bytes``); an extern implementation's
    (``{"IMPL": ...}``), what its torch path reads and writes beyond ``min_bytes``: the
    intermediates each eager op and vendor call writes and the next reads back
    (``lumc.backends.extern.extern_bytes``; 0 where it moves less, an fp8 GEMM's 1-byte operands).
    0 for every other kernel and config (a split reduction's partials, ``2 * rows * SPLIT``
    accumulators, are a few KiB and left out). The report's ``workspace_bytes``: what
    ``bytes_moved`` leaves out."""
    if is_extern(cfg):   # the torch path's bytes do not depend on the device
        return max(0, extern_bytes(kernel, cfg, H200) - kernel.min_bytes())
    if kernel.form == "mlp":     # its F blocks' partial tiles (``simulator_mlp``)
        return simulator_mlp.mlp_workspace_bytes(kernel, cfg)
    sk = max(int(cfg.get("SPLIT_K", 1) or 1), 1)
    if sk == 1 or kernel.form not in TENSOR_FORMS:
        return 0
    c = _static(kernel)[4]
    return 0 if c is None else 2 * sk * c.batch * c.m * c.n * 4
