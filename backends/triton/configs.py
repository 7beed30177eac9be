"""Kernel config spaces as data, pruned by legality.

A :class:`Config` is the set of ``BLOCK_*`` sizes (powers of two), ``num_warps`` and ``num_stages`` one
launch uses; a contraction's config also names the operand precision of its ``tl.dot``
(``PRECISION``, a string constexpr: ``ieee``, ``tf32x3``, ``tf32``, ``bf16``, ``fp16`` or ``fp8``;
see ``dot_precision.py``), so precision is a knob the search tunes like a tile size. Each space below is a table of candidate values per knob; :func:`config_space` takes the
product and keeps the configs that are legal for the problem:

* blocks no larger than the problem needs (``BLOCK <= next_pow2(dim)``, with ``tl.dot``'s minimum 16);
* shared memory within the device limit: :data:`SMEM_LIMIT` is the 227 KiB a block may use on
  H100/H200 (228 KiB per SM; NVIDIA Hopper tuning guide, "Shared memory"). The estimate counts the
  pipelined operand tiles (``num_stages`` copies of the A and B tiles); ``aot.py`` checks it against
  the compiled metadata;
* register tiles no larger than ``REG_TILE`` elements per warp times ``num_warps`` (fp32 values kept
  live in registers: above ~128 per thread the compiler spills).

:func:`default_config` is the config used when none is tuned (the interpreter, first runs); the
interpreter cannot autotune, so the tests always pass one config explicitly.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from lumc.ir.graph import toposort

SMEM_LIMIT = 227 * 1024          # bytes of shared memory one block may use on sm_90
REG_TILE = 32 * 128              # live fp32 tile elements per warp before spilling
ROW_FIT = 16384                  # longest row (elements) a row kernel keeps in registers


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


# the tl.dot operand precision a contraction config takes when none is chosen, per operand dtype
DEFAULT_PRECISION = {"f32": "tf32x3", "bf16": "bf16", "f16": "fp16"}


def with_precision(cfg: "Config", problem: dict, precision: str | None = None) -> "Config":
    """``cfg`` with its ``PRECISION`` knob set (the default for the problem's ``dot_dtype`` when
    ``precision`` is None); configs of kernels without a ``tl.dot`` are returned unchanged."""
    d = problem.get("dot_dtype")
    if d is None:
        return cfg
    b = dict(cfg.blocks)
    if precision is None and "PRECISION" in b:
        return cfg                      # already chosen
    b["PRECISION"] = precision or DEFAULT_PRECISION[d]
    return Config(tuple(sorted(b.items())), cfg.num_warps, cfg.num_stages)


@dataclass(frozen=True)
class Config:
    """One launch config: block sizes (and a contraction's ``PRECISION``) plus ``num_warps`` and
    ``num_stages``."""
    blocks: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 2

    def kwargs(self) -> dict:
        return {**dict(self.blocks), "num_warps": self.num_warps, "num_stages": self.num_stages}

    def __getitem__(self, k: str) -> int:
        return dict(self.blocks)[k]

    def __str__(self) -> str:
        b = " ".join(f"{k}={v}" for k, v in self.blocks)
        return f"{b} warps={self.num_warps} stages={self.num_stages}"


def make(num_warps: int = 4, num_stages: int = 2, **blocks: int) -> Config:
    return Config(tuple(sorted(blocks.items())), num_warps, num_stages)


# ---- the spaces (candidate values per knob) ------------------------------------------------------
SPACES: dict[str, dict[str, tuple[int, ...]]] = {
    "pointwise": {"BLOCK": (128, 256, 512, 1024, 2048, 4096), "num_warps": (2, 4, 8),
                  "num_stages": (1,)},
    "row": {"BLOCK_M": (1, 2, 4, 8, 16, 32, 64, 128),
            "BLOCK_K": tuple(2 ** i for i in range(15)),
            "num_warps": (1, 2, 4, 8, 16), "num_stages": (1, 2)},
    "matmul": {"BLOCK_M": (16, 32, 64, 128, 256), "BLOCK_N": (16, 32, 64, 128, 256),
               "BLOCK_K": (16, 32, 64, 128), "GROUP_M": (8,), "num_warps": (4, 8),
               "num_stages": (2, 3, 4, 5)},
    "attention": {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128),
                  "num_warps": (4, 8), "num_stages": (1, 2, 3)},
    # two-stage reduction: SPLIT programs per row block, each reducing a chunk in BLOCK_K steps
    "split": {"BLOCK_M": (1, 2, 4, 8), "BLOCK_K": (512, 1024, 2048, 4096),
              "SPLIT": (16, 32, 64, 128, 256, 512, 1024), "num_warps": (4, 8, 16),
              "num_stages": (2,)},
    # a scan (``render_scan``): one program per row, BLOCK elements of it per step
    "scan": {"BLOCK": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096), "num_warps": (1, 2, 4, 8),
             "num_stages": (1,)},
}
# a contraction with a normalization formed on load (``norm_prologue``): N_TILES column tiles per
# program share one computation of the row statistics
SPACES["matmul_rows"] = {**SPACES["matmul"], "N_TILES": (1, 2, 4, 8)}
# a skinny contraction (``render_matmul``, ``splitk_useful``): SPLIT_K programs share each output
# tile's K range, partial tiles merged in a fixed order by a second kernel (1: no split)
SPACES["matmul_splitk"] = {**SPACES["matmul"], "SPLIT_K": (1, 2, 4, 8, 16)}
MATMUL_SPACES = ("matmul", "matmul_rows", "matmul_splitk")
# back-to-back contractions (``render_mlp``): BLOCK_M x BLOCK_F intermediate blocks over BLOCK_K
# steps, multiplied into BLOCK_N column tiles of the output
SPACES["mlp"] = {"BLOCK_M": (16, 32, 64, 128), "BLOCK_F": (16, 32, 64, 128, 256),
                 "BLOCK_K": (16, 32, 64), "BLOCK_N": (16, 32, 64, 128, 256),
                 "F_TILES": (1, 2, 3, 4, 6, 8), "num_warps": (4, 8), "num_stages": (2, 3, 4)}
MLP_ACCS = 8       # column tiles one mlp program accumulates (``render_mlp``)
MLP_MAX_N = MLP_ACCS * max(SPACES["mlp"]["BLOCK_N"])   # the widest output an mlp kernel covers
SPLITK_MIN_K = 256               # K below which a split leaves each program too little to do
SPLITK_MIN_STEPS = 2             # BLOCK_K steps each split program walks at least
SPLIT_PROGRAMS = 4 * 132         # stage-1 programs the default aims at: 4 per H100/H200 SM
SM_COUNT = 132                   # H100/H200 SXM ([H100-WP]): the grid a default tile aims to fill
# live fp32 values per thread of an fp32-operand tl.dot tile: ptxas (cuda:90, Triton 3.9) on a
# 508x512x1280 tf32x3 GEMM spills at 128x128x32/8 warps (128 by this count, 476 B) and 64x128x32/4
# (160, 592 B), not at 64x128x32/8 or 128x64x32/8 (80, 222 registers)
FP32_REGS_PER_THREAD = 96
# ...and BLOCK_K = 128 spills at any tile (PP-OCR: 32x32x128 and 64x16x128 at 8 warps, 800 and 112
# B/thread), BLOCK_K = 32 at none with <= 32 accumulators per thread
FP32_MAX_BLOCK_K = 32
MIN_FILL_TILE = 16 * 32          # smallest tile area legal at 4 warps (the REG_TILE floor below)

# Known-good configs tried right after the default, per form, as (BLOCK_M, BLOCK_N, BLOCK_K,
# num_stages, num_warps): the CUDA configs of Triton's tutorial 03-matrix-multiplication
# (``get_cuda_autotune_config``, the ones with 4 or 8 warps) and of Inductor's ``mm_configs``
# (torch/_inductor/kernel/mm_common.py); attention: tutorial 06-fused-attention's forward tiles.
KNOWN_GOOD = {
    "matmul": ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
               (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 64, 32, 2, 4), (64, 128, 32, 3, 4),
               (128, 64, 32, 3, 4), (64, 32, 32, 5, 8), (32, 64, 32, 5, 8), (128, 128, 32, 2, 8),
               (64, 64, 64, 3, 8), (32, 32, 128, 2, 4), (64, 64, 16, 2, 4)),
    "attention": ((128, 64, 0, 3, 8), (128, 64, 0, 2, 4), (64, 64, 0, 3, 4), (128, 32, 0, 3, 8)),
}


def splitk_useful(problem: dict) -> bool:
    """True for a contraction whose output tiles cannot fill the GPU at 32 x 32 (``batch *
    cdiv(M, 32) * cdiv(N, 32) < SM_COUNT``) while its ``K >= SPLITK_MIN_K`` leaves work to split
    (MiniLM's 128 x 384 x 1536 down-projection: 48 tiles for 132 SMs). Inductor and cuBLAS split
    K on the same condition: few output tiles, a long reduction."""
    tiles = problem.get("batch", 1) * cdiv(problem["M"], 32) * cdiv(problem["N"], 32)
    return tiles < SM_COUNT and problem["K"] >= SPLITK_MIN_K


def known_good(space: str, problem: dict) -> list[Config]:
    """The :data:`KNOWN_GOOD` configs of ``space`` that are legal for ``problem``, in table order,
    at the default operand precision."""
    out = []
    for bm, bn, bk, stages, warps in KNOWN_GOOD.get("matmul" if space in MATMUL_SPACES else space,
                                                    ()):
        c = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
        if space in MATMUL_SPACES:
            c.update(BLOCK_K=bk, GROUP_M=8)
        if space == "matmul_rows":
            c.update(N_TILES=1)
        if space == "matmul_splitk":
            c.update(SPLIT_K=1)
        if not _legal(space, problem, c):
            continue
        blocks = {k: v for k, v in c.items() if k not in ("num_warps", "num_stages")}
        out.append(with_precision(make(warps, stages, **blocks), problem))
    return out


def _legal_mlp(p: dict, c: dict) -> bool:
    """An mlp config (``render_mlp``): no tile past its dim's power of two; at most
    :data:`MLP_ACCS` column tiles, and no program's last F block wholly past ``F``; the live fp32
    values of one program within the registers (the intermediate block, the output tiles and,
    for fp32 operands, the hi/lo fragments of the operand tiles and of the h block: the matmul
    rule's count, :data:`FP32_REGS_PER_THREAD`); its shared memory within the block limit.
    Checked on BERT-base's kernel (cuda:90, tf32x3, 8 warps): 16 x 64 x 128 at F_TILES 3 (255
    registers, 8 B spilled) is refused, 16 x 32 x 256 at F_TILES 4 (176, none) and 16 x 64 x 128
    at F_TILES 1 (178, none) are offered."""
    w = c["num_warps"]
    bm, bf, bk, bn = c["BLOCK_M"], c["BLOCK_F"], c["BLOCK_K"], c["BLOCK_N"]
    ft = c.get("F_TILES", 1)
    if any(b > max(16, next_pow2(p[d])) for b, d in ((bm, "M"), (bf, "F"), (bk, "K"), (bn, "N"))):
        return False
    tiles = cdiv(p["N"], bn)           # accumulators live across the F_TILES blocks
    if tiles > MLP_ACCS or (ft - 1) * bf >= p["F"]:    # every F block of a program holds work
        return False
    # the column tiles' accumulators stay live across F blocks (one F block: each is stored as
    # soon as it is done)
    live = bm * bf + (tiles if ft > 1 else 1) * bm * bn
    if p.get("itemsize", 4) >= 4:   # hi/lo fragments of the operand tiles and of the h block
        live += 2 * (bm + bf) * bk + 2 * (bm + bn) * bf // 4 + 2 * bm * bf
        if bk > FP32_MAX_BLOCK_K:
            return False
    if live > FP32_REGS_PER_THREAD * 32 * w or bm * max(bf, bn) < 16 * 16 * w // 2:
        return False
    if next_pow2(p["K"]) <= bk and c["num_stages"] > 2:   # one K step: nothing to pipeline
        return False
    return shared_memory_estimate("mlp", p, c) <= SMEM_LIMIT


def shared_memory_estimate(space: str, p: dict, c: dict) -> int:
    """Bytes of shared memory the pipelined operand tiles take (an estimate; see module doc)."""
    isz = p.get("itemsize", 4)
    if space in MATMUL_SPACES:   # a paired matmul pipelines two b tiles (B_OPERANDS)
        return c["num_stages"] * (c["BLOCK_M"] + p.get("B_OPERANDS", 1) * c["BLOCK_N"]) * \
            c["BLOCK_K"] * isz
    if space == "attention":
        return attention_shared_memory(p, c)
    if space == "mlp":
        return mlp_shared_memory(isz, c)
    return 0


def mlp_shared_memory(isz: int, c: dict) -> int:
    """Bytes of shared memory one stage-1 program of an mlp kernel takes (``render_mlp``): the
    larger of its two parts' (Triton reuses the buffers of the ``K`` loop in the column tiles).

    * the ``K`` loop: ``num_stages`` pipelined ``BLOCK_M x BLOCK_K`` and ``BLOCK_K x BLOCK_F``
      operand tiles, as a matmul's;
    * the column tiles (unrolled, not pipelined): the intermediate block (``BLOCK_M x BLOCK_F``)
      and a ``BLOCK_F x BLOCK_N`` tile of ``W2`` as dot operands, 8 bytes per element for fp32
      operands (split-TF32 hi and lo), the itemsize otherwise.

    Fitted to ``metadata.shared`` of compiles for cuda:90 (``aot.py``, Triton 3.6) of BERT-base's
    fp32 mlp kernel at BLOCK_M 16-32, BLOCK_F 32-128, BLOCK_N 128-256, F_TILES 1-4, 3-4 stages, 8
    warps: exact at tf32x3 (68-144 KiB); bf16 and tf32 take less (fp32 operands are priced at
    tf32x3, the most any precision of the search takes)."""
    bm, bf, bk, bn, st = c["BLOCK_M"], c["BLOCK_F"], c["BLOCK_K"], c["BLOCK_N"], c["num_stages"]
    k_loop = st * (bm + bf) * bk * isz
    n_part = (bm * bf + bf * bn) * (8 if isz >= 4 else isz)
    return max(k_loop, n_part)


def score_bytes(nodes: list, operands: tuple) -> int:
    """``SCORE_BYTES`` of an attention meaning: bytes per score element of the tensors a key
    block reads beside q, k and v (masks, biases: each loaded as a ``[BLOCK_M, BLOCK_N]`` tile and
    pipelined like k and v; an input read per query only is counted too, a bound): the itemsizes
    of the inputs and non-scalar constants of ``nodes`` that no operand reads."""
    seen = {id(x) for x in toposort(list(operands))}
    return sum(n.dtype.itemsize for n in {id(n): n for n in nodes
                                          if n.op == "Input" or (n.op == "Constant" and n.numel > 1)
                                          }.values() if id(n) not in seen)


def attention_shared_memory(p: dict, c: dict) -> int:
    """Bytes of shared memory one attention program takes: an upper bound on what Triton 3.6
    allocates for the flash kernel on sm_90, fitted to ``metadata.shared`` of compiles for cuda:90
    (``aot.py``; BERT-base's masked fp32 attention, D = DV = 64, at BLOCK_M 64/128 x BLOCK_N
    32/64/128 x 1-3 stages x 4/8 warps in tf32x3, ieee and bf16 precision; unmasked and masked
    fp32 D = 64 and bf16 D = 128 at 8 warps):

    * a base of ``(BLOCK_M + BLOCK_N) (D + DV)`` operand-width bytes (4 for fp32 operands, whose
      split-TF32 and IEEE paths keep fp32 tiles; 2 otherwise);
    * when the key loop has more than one block, ``num_stages - 1`` pipeline buffers of
      ``BLOCK_N (2 s (D + DV) + BLOCK_M (m + 1))`` bytes: the k and v tiles at the input's itemsize
      ``s`` (doubled: BERT's strided reads of a fused QKV buffer took twice the tile), and the
      ``[BLOCK_M, BLOCK_N]`` tiles of masks and biases read beside them, ``m`` = ``SCORE_BYTES``
      bytes per score.

    Exact on BERT's kernel, 0-2.5x above the others; never below any compile measured. The operand
    tile count it replaces (``stages BLOCK_N (D + DV) + BLOCK_M D`` elements) was 2-2.9x below
    BERT's and let its 128x64 tile at 2 stages (232 KiB) pass the 227 KiB limit."""
    bm, bn = c["BLOCK_M"], c["BLOCK_N"]
    d, dv = p["BLOCK_D"], p["BLOCK_DV"]
    isz = p.get("itemsize", 4)
    wide = 4 if p.get("dot_dtype", "f32") == "f32" or isz >= 4 else 2
    base = (bm + bn) * (d + dv) * wide
    if bn >= p.get("N", bn + 1):      # one key block: nothing is loaded ahead
        return base
    per_stage = bn * (2 * isz * (d + dv) + bm * (p.get("SCORE_BYTES", 8) + 1))
    return base + (max(c["num_stages"], 1) - 1) * per_stage


def _legal(space: str, p: dict, c: dict) -> bool:
    w = c["num_warps"]
    if space == "pointwise":
        n = p["N"]
        return (c["BLOCK"] <= max(128, next_pow2(n)) and c["BLOCK"] >= 32 * w
                and c["BLOCK"] <= 32 * w * 32)
    if space == "scan":   # no block past the row, at least one element per thread
        return (c["BLOCK"] <= max(16, next_pow2(p["K"])) and c["BLOCK"] >= 32 * w // 2
                and c["BLOCK"] * p.get("SCANS", 1) <= 32 * 32 * w)   # <= 32 live values/thread
    if space == "row":
        bm, bk = c["BLOCK_M"], c["BLOCK_K"]
        if bm > next_pow2(p["M"]):
            return False
        if p["one_pass"]:
            if bk != p["BLOCK_K_FIXED"]:
                return False
        elif bk > min(4096, next_pow2(p["K"])) or bk < 256:
            return False
        tile = bm * bk
        return (tile * p.get("LIVE_TILES", 1) <= REG_TILE * w and tile >= 32 * w
                and c["num_stages"] == 1 + (not p["one_pass"]))
    if space == "matmul_rows":   # no column tile group past the last column tile
        return c["N_TILES"] <= next_pow2(cdiv(p["N"], c["BLOCK_N"])) and _legal("matmul", p, c)
    if space == "matmul_splitk":   # every split walks >= SPLITK_MIN_STEPS K steps; no split that
        sk = c["SPLIT_K"]          # leaves the grid more than 4 waves deep
        tiles = p.get("batch", 1) * cdiv(p["M"], c["BLOCK_M"]) * cdiv(p["N"], c["BLOCK_N"])
        return (sk == 1 or (sk * SPLITK_MIN_STEPS * c["BLOCK_K"] <= p["K"]
                            and tiles * sk <= 4 * SM_COUNT)) and _legal("matmul", p, c)
    if space == "matmul":
        bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
        if bm > max(16, next_pow2(p["M"])) or bn > max(16, next_pow2(p["N"])):
            return False
        if bk > max(16, next_pow2(p["K"])):
            return False
        # fp32 operands (split TF32 / IEEE) keep hi/lo operand fragments live beside the
        # accumulator: a quarter of the accumulator tile (ptxas, `lumc inspect --aot cuda:90` on
        # Magika: 64x256/4 warps spills 3.4 KiB/thread, 128x128x16/8 warps 452 B)
        reg = REG_TILE * w // (4 if p.get("itemsize", 4) >= 4 else 1)   # <= 32 acc/thread
        nb = p.get("B_OPERANDS", 1)    # a paired matmul holds two accumulators and two b tiles
        if bm * bn * nb > reg or bm * bn < 16 * 16 * w // 2:
            return False
        # and their hi/lo operand fragments: accumulator + 2 (BM + BN) BK values per thread stay
        # within FP32_REGS_PER_THREAD (32x32x128 at 4 warps, 136, spilled 784 B/thread on PP-OCR)
        if p.get("itemsize", 4) >= 4 and (bm * bn * nb + 2 * (bm + nb * bn) * bk >
                                          FP32_REGS_PER_THREAD * 32 * w or bk > FP32_MAX_BLOCK_K):
            return False
        if next_pow2(p["K"]) <= bk and c["num_stages"] > 2:  # one K step: nothing to pipeline
            return False
        return shared_memory_estimate(space, p, c) <= SMEM_LIMIT
    if space == "mlp":
        return _legal_mlp(p, c)
    if space == "attention":
        bm, bn = c["BLOCK_M"], c["BLOCK_N"]
        if bm > max(16, next_pow2(p["M"])) or bn > max(16, next_pow2(p["N"])):
            return False
        if bm * max(bn, p["BLOCK_DV"]) > REG_TILE * w:
            return False
        return shared_memory_estimate(space, p, c) <= SMEM_LIMIT
    if space == "split":
        bm, bk, sp = c["BLOCK_M"], c["BLOCK_K"], c["SPLIT"]
        if bm > next_pow2(p["M"]) or bk * sp > next_pow2(p["K"]):   # every chunk >= one block
            return False
        if cdiv(p["M"], bm) * sp > 64 * SPLIT_PROGRAMS:               # partials stay a few KiB/row
            return False
        tile = bm * bk
        return tile <= REG_TILE * w and tile >= 32 * w * 4 and bm * sp <= REG_TILE * w
    raise KeyError(f"unknown config space {space!r}")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def config_space(space: str, problem: dict) -> list[Config]:
    """Every legal config of ``space`` for ``problem`` (the sizes a renderer recorded), at the
    default operand precision (the compiler adds the other precisions its policy allows)."""
    table = SPACES[space]
    keys = list(table)
    out = []
    for values in itertools.product(*(table[k] for k in keys)):
        c = dict(zip(keys, values))
        if _legal(space, problem, c):
            blocks = {k: v for k, v in c.items() if k not in ("num_warps", "num_stages")}
            out.append(with_precision(make(c["num_warps"], c["num_stages"], **blocks), problem))
    return out


def default_config(space: str, problem: dict) -> Config:
    """A good untuned config (the pick of the Triton tutorials for each form), at the default
    operand precision; where that pick is not legal for the problem (fp32 attention's 128x64
    tiles at 2 stages take 232 KiB of shared memory), the legal config nearest to it: the same
    tiles with fewer stages first, then smaller tiles."""
    c = _default_config(space, problem)
    kw = c.kwargs()
    if space in SPACES and all(k in SPACES[space] for k in kw) and not _legal(space, problem, kw):
        legal = config_space(space, problem)
        if legal:
            def nearness(o: Config):
                ok = o.kwargs()
                same = sum(ok.get(k) == v for k, v in dict(c.blocks).items())
                return (same, ok["num_warps"] == c.num_warps, -abs(ok["num_stages"] - c.num_stages),
                        -sum(abs(ok[k] - v) for k, v in dict(c.blocks).items()
                             if isinstance(v, int)))
            c = max(legal, key=nearness)
    return with_precision(c, problem)


def _default_config(space: str, problem: dict) -> Config:
    if space == "matmul_rows":   # the matmul default; column tiles grouped while the grid fills
        base = _default_config("matmul", problem)
        b = dict(base.blocks)
        programs = problem.get("batch", 1) * cdiv(problem["M"], b["BLOCK_M"])
        tiles = cdiv(problem["N"], b["BLOCK_N"])
        nt = max([n for n in SPACES[space]["N_TILES"] if programs * cdiv(tiles, n) >= SM_COUNT]
                 or [1])
        return make(base.num_warps, base.num_stages, **b, N_TILES=nt)
    if space == "matmul_splitk":
        # the matmul default; where its grid holds at most a quarter of the SMs' worth of tiles
        # (a GEMV-like M or N), K split until the grid fills the GPU (the second kernel's launch
        # costs more than a split gains on a grid that is nearly full: the search times those)
        base = _default_config("matmul", problem)
        b = dict(base.blocks)
        tiles = problem.get("batch", 1) * cdiv(problem["M"], b["BLOCK_M"]) * \
            cdiv(problem["N"], b["BLOCK_N"])
        sk = 1
        while 4 * tiles <= SM_COUNT and tiles * sk < SM_COUNT and \
                sk < max(SPACES[space]["SPLIT_K"]) and \
                2 * sk * SPLITK_MIN_STEPS * b["BLOCK_K"] <= problem["K"]:
            sk *= 2
        return make(base.num_warps, base.num_stages, **b, SPLIT_K=sk)
    if space == "pointwise":
        b = min(1024, max(128, next_pow2(problem["N"])))
        return make(4, 1, BLOCK=b)
    if space == "scan":
        b = min(1024, max(16, next_pow2(problem["K"])))
        return make(max(1, min(4, b // 128)), 1, BLOCK=b)
    if space == "row":
        if problem["one_pass"]:
            bk = problem["BLOCK_K_FIXED"]
            bm = max(1, min(next_pow2(problem["M"]), 2048 // bk if bk < 2048 else 1))
            w = max(1, min(16, bm * bk // 256))
            w = 1 << (w.bit_length() - 1)
            return make(w, 1, BLOCK_M=bm, BLOCK_K=bk)
        bk = min(4096, next_pow2(problem["K"]))
        return make(8 if bk >= 2048 else 4, 2, BLOCK_M=1, BLOCK_K=max(256, bk))
    if space == "matmul":
        bm = min(128, max(16, next_pow2(problem["M"])))
        bn = min(128, max(16, next_pow2(problem["N"])))
        # shrink the tile until the grid fills the GPU (one program per SM at least): a 128x384
        # GEMM gets 48 programs of 32x32, not 3 of 128x128 on 132 SMs
        while problem.get("batch", 1) * cdiv(problem["M"], bm) * cdiv(problem["N"], bn) < SM_COUNT \
                and bm * bn > MIN_FILL_TILE:
            if bm >= bn:
                bm //= 2
            else:
                bn //= 2
        bk = min(64 if problem.get("itemsize", 4) <= 2 else 32, max(16, next_pow2(problem["K"])))
        stages = 3 if next_pow2(problem["K"]) > bk else 2
        if problem.get("itemsize", 4) >= 4:      # fp32 operands: 64x128 at 8 warps (no spills)
            bm = min(bm, 64)
            warps = 8 if bm * bn >= 64 * 128 else 4
        else:
            warps = 8 if bm * bn >= 128 * 128 else 4
        return make(warps, stages, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)
    if space == "attention":
        bm = min(128, max(16, next_pow2(problem["M"])))
        bn = min(64, max(16, next_pow2(problem["N"])))
        return make(4 if bm <= 64 else 8, 2, BLOCK_M=bm, BLOCK_N=bn)
    if space == "mlp":
        # F blocks of 64, row blocks shrunk until the grid fills the GPU, then as many F blocks
        # per program as keep it full (fewer partial tiles)
        bf = min(64, max(16, next_pow2(problem["F"])))
        bm = min(64, max(16, next_pow2(problem["M"])))
        while cdiv(problem["M"], bm) * cdiv(problem["F"], bf) < SM_COUNT and bm > 16:
            bm //= 2
        bk = min(32, max(16, next_pow2(problem["K"])))
        bn = max(16, min(128, next_pow2(problem["N"]), next_pow2(cdiv(problem["N"], MLP_ACCS))))
        bn = max(bn, min(32, next_pow2(problem["N"])))
        ft = max([f for f in SPACES[space]["F_TILES"]
                  if cdiv(problem["M"], bm) * cdiv(problem["F"], bf * f) >= SM_COUNT] or [1])
        return make(8, 3 if next_pow2(problem["K"]) > bk else 2,
                    BLOCK_M=bm, BLOCK_F=bf, BLOCK_K=bk, BLOCK_N=bn, F_TILES=ft)
    if space == "split":
        bk = min(4096, next_pow2(problem["K"]) // 16)
        # enough stage-1 programs to fill the GPU, each chunk still at least one block
        split = next_pow2(cdiv(SPLIT_PROGRAMS, problem["M"]))
        split = max(16, min(1024, split, next_pow2(problem["K"]) // bk))
        return make(8 if bk >= 2048 else 4, 2, BLOCK_M=1, BLOCK_K=bk, SPLIT=split)
    raise KeyError(f"unknown config space {space!r}")


INTERP_TILE = 1 << 20   # elements of one operand tile under the interpreter (numpy arrays, 4 MiB fp32)


def interpreter_config(space: str, problem: dict, precision: str | None = None) -> Config:
    """Big tiles for the Triton interpreter, whose cost is per program and per op, not per element
    (registers and shared memory do not exist there), at ``precision`` (default: the problem's).
    Not for GPUs."""
    return with_precision(_interpreter_config(space, problem), problem, precision)


CHECK_SHRINK_ABOVE = 1 << 20   # output elements from which a check's contraction tiles shrink
CHECK_SHRINK_MACS = 1 << 25    # ... or multiply-adds (a classifier's 9216 x 4096 weight, M = 1)
CHECK_PROGRAMS = 128           # ... until its grid has this many programs (4x the sample)
CHECK_SAMPLE_MACS = 1 << 22    # ... and 32 of its tiles at most this many multiply-adds


def check_config(space: str, problem: dict, precision: str | None = None) -> Config:
    """The config of a ``sim:*`` numerics check in the interpreter: :func:`interpreter_config`,
    except for a ``row`` reduction over at least :data:`CHECK_SHRINK_ABOVE` elements, whose
    ``BLOCK_M`` halves on the same terms (32 row blocks at most :data:`CHECK_SAMPLE_MACS`
    elements), and a ``matmul`` with at least :data:`CHECK_SHRINK_ABOVE` output elements or
    :data:`CHECK_SHRINK_MACS` multiply-adds, whose
    ``BLOCK_M`` and then ``BLOCK_N`` halve (not below 32) until its grid has
    :data:`CHECK_PROGRAMS` programs and 32 of its tiles at most :data:`CHECK_SAMPLE_MACS`
    multiply-adds, ``BLOCK_K`` growing back to the :data:`INTERP_TILE` operand tile: the check
    runs 32 of a large grid's programs (``lumc.backends.triton.sampled``), so a 224x224
    convolution's check runs a few of its tiles, not a few tiles of all its rows. The generated
    source is the same at every tile (tiles are compile-time constants)."""
    cfg = _interpreter_config(space, problem)
    M, N, B = problem.get("M"), problem.get("N"), problem.get("batch", 1)
    K = problem.get("K")
    if space == "row" and isinstance(M, int) and isinstance(K, int) and \
            M * K >= CHECK_SHRINK_ABOVE:    # a reduction's rows: BLOCK_M alone
        b = dict(cfg.blocks)
        while b["BLOCK_M"] > 1 and (cdiv(M, b["BLOCK_M"]) < CHECK_PROGRAMS
                                    or 32 * b["BLOCK_M"] * K > CHECK_SAMPLE_MACS):
            b["BLOCK_M"] //= 2
        return with_precision(make(cfg.num_warps, cfg.num_stages, **b), problem, precision)
    if space != "matmul" or not all(isinstance(v, int) for v in (M, N, K, B)) or \
            (M * N * B < CHECK_SHRINK_ABOVE and M * N * K * B < CHECK_SHRINK_MACS):
        return with_precision(cfg, problem, precision)
    b = dict(cfg.blocks)

    def programs():
        return cdiv(M, b["BLOCK_M"]) * cdiv(N, b["BLOCK_N"]) * B

    def heavy():
        return programs() < CHECK_PROGRAMS or \
            32 * b["BLOCK_M"] * b["BLOCK_N"] * K > CHECK_SAMPLE_MACS

    for axis in ("BLOCK_M", "BLOCK_N"):
        while heavy() and b[axis] > 32:
            b[axis] //= 2
    b["BLOCK_K"] = min(16384, max(16, next_pow2(K)),
                       max(16, INTERP_TILE // max(b["BLOCK_M"], b["BLOCK_N"])))
    return with_precision(make(cfg.num_warps, cfg.num_stages, **b), problem, precision)


def _interpreter_config(space: str, problem: dict) -> Config:
    if space == "matmul_rows":
        base = _interpreter_config("matmul", problem)
        return make(base.num_warps, base.num_stages, **dict(base.blocks), N_TILES=2)
    if space == "matmul_splitk":   # split in two, so a compile's numerics check runs the partial
        base = _interpreter_config("matmul", problem)     # tiles and their merge
        b = dict(base.blocks)
        b["BLOCK_K"] = max(16, min(b["BLOCK_K"], next_pow2(problem["K"] // 4 + 1) // 2))
        sk = 2 if 2 * SPLITK_MIN_STEPS * b["BLOCK_K"] <= problem["K"] else 1
        return make(base.num_warps, base.num_stages, **b, SPLIT_K=sk)
    if space == "pointwise":
        return make(4, 1, BLOCK=min(16384, max(16, next_pow2(problem["N"]))))
    if space == "scan":   # 1024: a 4097-long row walks five blocks (the carry is checked)
        return make(4, 1, BLOCK=min(1024, max(16, next_pow2(problem["K"]))))
    if space == "row":
        bk = problem["BLOCK_K_FIXED"] if problem["one_pass"] else min(8192, next_pow2(problem["K"]))
        bm = max(1, min(next_pow2(problem["M"]), INTERP_TILE // bk))
        return make(4, 1 + (not problem["one_pass"]), BLOCK_M=bm, BLOCK_K=bk)
    if space == "matmul":
        bm = min(4096, max(16, next_pow2(problem["M"])))
        bn = min(256, max(16, next_pow2(problem["N"])))
        bk = min(16384, max(16, next_pow2(problem["K"])), max(16, INTERP_TILE // max(bm, bn)))
        return make(4, 2, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)
    if space == "attention":
        return make(4, 1, BLOCK_M=min(128, max(16, next_pow2(problem["M"]))),
                    BLOCK_N=min(256, max(16, next_pow2(problem["N"]))))
    if space == "mlp":    # two F blocks per program and two programs' partial tiles at least,
        # so the numerics check runs the F loop and sums partials
        bf = max(16, min(256, next_pow2(problem["F"]) // 4))
        return make(4, 2, BLOCK_M=min(256, max(16, next_pow2(problem["M"]))), BLOCK_F=bf,
                    BLOCK_K=min(1024, max(16, next_pow2(problem["K"]))),
                    BLOCK_N=max(16, min(256, next_pow2(cdiv(problem["N"], MLP_ACCS)))),
                    F_TILES=2 if 2 * bf < problem["F"] else 1)
    if space == "split":   # few programs, long steps: the interpreter pays per program and per op
        bk = min(16384, max(512, next_pow2(problem["K"]) // 16))
        return make(4, 2, BLOCK_M=min(8, next_pow2(problem["M"])), BLOCK_K=bk, SPLIT=16)
    raise KeyError(f"unknown config space {space!r}")
