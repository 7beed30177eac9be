"""Vendor ("extern") implementations of a kernel: which apply, their configs and their simulated price.

A contraction kernel can also run through torch, on the vendor libraries torch calls: its
contractions as ``torch.matmul``/``bmm`` (cuBLAS/cuBLASLt, impl ``cublas``), an attention's core as
``F.scaled_dot_product_attention`` (FlashAttention/cuDNN, impl ``sdpa``), everything else in the
kernel (prologue, epilogue) as torch ops. Such an implementation is one more entry in the kernel's
config list, a plain dict with the string knob ``IMPL`` (absent or ``"triton"``: the generated Triton
kernel), so the search times, checks and stores it exactly like a Triton config
(``lumc.compiler.core.measure``), and the CPU executor and the GPU plan run it (``lumc.compiler.runtime.extern``).

Which implementations apply follows the kernel's meaning, never a model pattern:

* ``cublas``: the meaning holds at least one contraction ``SumReduce(Mul(a, b))`` that is a
  matrix or matrix-vector product (:func:`vendor_contractions`);
* ``cudnn``: at least one contraction is provably a convolution read back from its window views
  (``lumc.backends.extern_conv``), run as ``F.conv{n}d``; the others as for ``cublas``;
* ``sdpa``: the kernel is an ``attention`` form (two contractions around one softmax normalized
  by ``1 / sum``, :func:`attention_plan`) whose score function is affine in the scores (a scale,
  an additive bias, masks through ``Where``, causal masks from ``Iota``), which
  ``lumc.compiler.runtime.extern_sdpa`` verifies numerically before it accepts the config.

Simulated price (``sim:*``): the roofline of what the torch path launches, at a vendor efficiency.

* Contractions: ``max(2 B M N K / (peak * eff * fill), bytes / (bandwidth * BW_EFFICIENCY))`` plus
  one launch each. ``peak`` follows the operand precision: bf16/fp16 tensor cores; fp32 is IEEE fp32
  on CUDA cores (torch's default ``allow_tf32=False``) unless ``PRECISION`` is ``tf32``; ``fp8`` is
  ``torch._scaled_mm`` at the fp8 peak, reading 1-byte operands, plus the eager quantization of both
  operands (an amax pass and a scaled cast each: read twice, write one byte per element, four
  launches); it is offered only where every contraction is a plain GEMM with K and N multiples of
  16 (:func:`scaled_mm_applies`).
* Convolutions (``cudnn``): ``max(2 N M prod(O) Cg prod(k) / (peak * CUDNN_EFFICIENCY * fill),
  (x + w + y) bytes / (bandwidth * BW_EFFICIENCY))`` plus a launch; a depthwise convolution
  (``Cg = 1``) streams at :data:`DEPTHWISE_BW_EFFICIENCY`; tensor-core precisions on NCHW tensors
  pay cuDNN's NCHW -> NHWC transforms of ``x`` and ``y`` (read and write each, two launches), an
  fp32 operand rounded to bf16/fp16 its eager cast, and windows wider at the end than at the start
  an explicit ``F.pad`` of ``x``.
* Attention (``sdpa``): ``max(FLOPs / (peak * eff * fill), bytes / (bandwidth * BW_EFFICIENCY))``
  plus a launch, the bytes q, k, v, the output and the mask (one value per score: SDPA takes a
  dense ``attn_mask``); at ``PRECISION`` bf16/fp16 on fp32 operands, at 2 bytes, plus the eager
  casts of q, k, v down and the output back (four launches). A mask that depends on the kernel's
  inputs (a padding mask) is recomputed per call: each op of the score function over the full
  scores, one launch each (:func:`sdpa_mask_nodes`); a constant one (causal) is computed once.
* ``eff`` (:data:`CUBLAS_EFFICIENCY`, :data:`SDPA_EFFICIENCY`) is the share of dense peak the vendor
  kernel reaches on large problems; ``fill`` the share of SMs a small problem can occupy with
  64 x 64 output tiles (cuBLAS's smallest common Hopper tile), counting split-K over long K.
* A view operand torch must copy to call a GEMM (a convolution's im2col windows, its padding) costs
  that copy: read and write, one launch each.
* Every other op of the meaning runs as its own eager torch kernel: one launch each, reading its
  operands and writing its result once (views are free, as ``as_strided`` is).

All figures are estimates until a GPU measures them (``make gpu-check``); on a GPU the measurer times
the torch path itself.
"""
from __future__ import annotations

import math
import weakref

from lumc.backends.devices import DeviceSpec
from lumc.backends.extern_conv import conv_plan, conv_plans
from lumc.ir.kernels import Kernel
from lumc.ir.views import prod

IMPLS = ("triton", "cublas", "cudnn", "sdpa")

# Share of dense tensor-core peak cuBLAS reaches on large bf16/fp16 GEMMs on H100/H200 SXM: public
# benchmarks (the cuBLAS line of Triton's 03-matrix-multiplication tutorial on H100, NVIDIA's
# "Hopper GEMM" CUTLASS/cuBLAS figures) put it at 700-800 TFLOP/s of 989.4; 0.78 ~ 770 TFLOP/s.
CUBLAS_EFFICIENCY = 0.78
# Share of fp32 CUDA-core peak (66.9 TFLOP/s) an IEEE fp32 SGEMM reaches: ~50 TFLOP/s (estimate).
CUBLAS_FP32_EFFICIENCY = 0.75
# FlashAttention-2 through SDPA reaches ~35-50% of bf16 peak on H100 forward passes (Dao, 2023,
# "FlashAttention-2", fig. 7; FlashAttention-3, 2024, reports FA2 at 350-400 TFLOP/s); 0.40.
SDPA_EFFICIENCY = 0.40
# SDPA on fp32 operands runs the memory-efficient kernel (FlashAttention takes only half types),
# whose fp32 GEMMs on sm_80+ are CUTLASS tensor-op MMAs with OpMultiplyAddFastF32: split TF32, three
# MMAs per product, whatever ``allow_tf32`` says (PyTorch, aten/src/ATen/native/transformers/cuda/
# mem_eff_attention/gemm_kernel_utils.h, DefaultGemmType<ArchTag, float>). So it is priced at the
# tf32x3 peak (at SDPA_EFFICIENCY, an estimate for this kernel), and no separate ``tf32`` config
# is offered: it would run the same kernel.
SDPA_FP32_PRECISION = "tf32x3"
# Share of tensor-core peak cuDNN's implicit-GEMM convolutions reach on Hopper (estimate: below
# cuBLAS's 0.78 for the im2col address math and the filter-size tails; to be replaced by gpu-check).
CUDNN_EFFICIENCY = 0.65
# Share of fp32 CUDA-core peak an IEEE fp32 cuDNN convolution reaches (estimate, below SGEMM's 0.75).
CUDNN_FP32_EFFICIENCY = 0.6
# Share of HBM bandwidth a depthwise convolution reaches (estimate: one multiply-add per element
# loaded and little reuse; ATen/cuDNN depthwise kernels are known to stream well below copy speed).
DEPTHWISE_BW_EFFICIENCY = 0.5
BW_EFFICIENCY = 0.92     # best share of HBM bandwidth a streaming kernel reaches (as the simulator)
VENDOR_TILE = 64         # smallest common output tile of Hopper cuBLAS kernels (for ``fill``)
SPLIT_K_MIN = 256        # K per split-K slice below which cuBLAS does not split further
SPLIT_K_MAX = 8


def impl_of(cfg: dict | None) -> str:
    """The implementation a config names (``triton`` when it names none)."""
    return str((cfg or {}).get("IMPL", "triton"))


def is_extern(cfg: dict | None) -> bool:
    return impl_of(cfg) != "triton"


def _contractions(kernel: Kernel) -> list:
    from lumc.backends.triton.contraction import find_contractions
    return find_contractions(kernel.meaning.nodes())


def vendor_contractions(kernel: Kernel) -> list:
    """The contractions of ``kernel``'s meaning a BLAS serves: a matrix (or matrix-vector) product,
    ``M > 1`` or ``N > 1``, summed over ``K > 1``, of floating-point operands (after their
    prologue casts: a weight stored as int8 and widened is one). A batch of dot products (``M = N =
    1``: a sum of squares in a norm, ``x * w`` summed per row) is a row reduction, not a GEMM; and
    neither cuBLAS nor cuDNN multiplies integers through torch (CUDA ``matmul``, ``bmm`` and
    ``conv`` are not implemented for int32/int64), so an integer contraction (a prefix sum's
    triangular mask, an index arithmetic product) has no vendor implementation."""
    return [c for c in _contractions(kernel) if max(c.M, c.N) > 1 and c.K > 1
            and c.a.dtype.is_float and c.b.dtype.is_float]


def extern_impls(kernel: Kernel) -> list[str]:
    """The extern implementations that apply to ``kernel`` by its meaning (see module doc)."""
    if not vendor_contractions(kernel):
        return []
    return ((["sdpa"] if attention_plan(kernel) is not None else []) + ["cublas"]
            + (["cudnn"] if conv_plans(_contractions(kernel)) else []))


_PLANS: "weakref.WeakKeyDictionary[Kernel, object]" = weakref.WeakKeyDictionary()


def attention_plan(kernel: Kernel):
    """The ``AttentionPlan`` of an ``attention`` kernel that SDPA can compute structurally (the
    probabilities a view of ``exp2(...) / sum``), else None; once per kernel object (the search
    prices every extern config through it). Whether its score function is affine (a scale and a
    mask) is checked numerically by ``lumc.compiler.runtime.extern_sdpa``."""
    if kernel.form != "attention":
        return None
    if kernel not in _PLANS:
        _PLANS[kernel] = _attention_plan(kernel)
    return _PLANS[kernel]


def _attention_plan(kernel: Kernel):
    from lumc.backends.triton.codegen import RenderError
    from lumc.backends.triton.render_attention import AttentionPlan
    try:
        p = AttentionPlan(kernel)
    except RenderError:
        return None
    if p.pushed:
        return None
    g = p.g
    while g.op in ("View", "Cast"):
        g = g.srcs[0]
    s = g.srcs[0] if g.op == "Recip" else None
    while s is not None and s.op in ("View", "Cast"):
        s = s.srcs[0]
    return p if s is p.softmax.s else None


# operand precisions torch's vendor GEMMs run (``allow_tf32`` off/on, operands rounded to half, or
# quantized to e4m3 with row-wise scales for ``torch._scaled_mm``)
TORCH_PRECISIONS = ("ieee", "tf32", "bf16", "fp16", "fp8")


def extern_configs(kernel: Kernel, dev: DeviceSpec | None = None) -> list[dict]:
    """The extern configs of ``kernel``: per implementation, one per operand precision the device's
    policy (``DeviceSpec.dot_precisions``) allows that torch can run (``{"IMPL": "cublas",
    "PRECISION": "ieee"}``); an operand dtype without a policy runs natively (no ``PRECISION``)."""
    d = _dtype(kernel).name
    allowed = (dev.dot_precisions.get(d) if dev is not None and hasattr(dev, "dot_precisions")
               else None)
    precs = [p for p in (allowed or ()) if p in TORCH_PRECISIONS] or [None]
    out = []
    for impl in extern_impls(kernel):
        if impl == "sdpa" and not sdpa_fused_ok(kernel):
            continue        # SDPA would run its math fallback (sdpa_fused_ok)
        for p in precs:
            if p == "fp8" and (impl != "cublas" or not scaled_mm_applies(kernel)):
                continue
            if impl == "sdpa" and p == "tf32" and d == "f32" and "ieee" in precs:
                continue        # SDPA's fp32 kernel has no TF32 mode (see SDPA_FP32_PRECISION)
            if impl == "sdpa" and p in ("bf16", "fp16") and d == "f32" and \
                    not sdpa_half_ok(kernel, p):
                continue        # its mask would change in the half type (sdpa_half_ok)
            out.append({"IMPL": impl} if p is None else {"IMPL": impl, "PRECISION": p})
    return out


# head dims every fused SDPA kernel takes: FlashAttention-2 (q, k, v one head dim, a multiple of 8,
# at most 256), the memory-efficient kernel (multiples of 8 for half types, 4 for fp32) and cuDNN
# (multiples of 8, at most 128 on older versions: it is not the only backend); PyTorch's
# ``sdp_utils.cpp`` (check_head_dim_size_flash / _mem_efficient) and FlashAttention-2's README
SDPA_HEAD_MULTIPLE, SDPA_MAX_HEAD = 8, 256


def sdpa_fused_ok(kernel: Kernel) -> bool:
    """Whether PyTorch runs this attention on a fused kernel (not the math fallback, which forms
    the ``[batch, M, N]`` score matrix the simulator does not price): query/key and value head
    dims multiples of :data:`SDPA_HEAD_MULTIPLE` and at most :data:`SDPA_MAX_HEAD`."""
    p = attention_plan(kernel)
    return p is not None and all(d % SDPA_HEAD_MULTIPLE == 0 and 0 < d <= SDPA_MAX_HEAD
                                 for d in (p.c1.K, p.c2.N))


def scaled_mm_applies(kernel: Kernel) -> bool:
    """True when every contraction of ``kernel`` is a plain matrix product with K and N multiples
    of 16 (what ``torch._scaled_mm`` takes: one batch, row-major A, column-major B)."""
    cs = vendor_contractions(kernel)
    return bool(cs) and all(c.batch == 1 and c.K % 16 == 0 and c.N % 16 == 0 for c in cs)


def _dtype(kernel: Kernel):
    return max((n.dtype for n in kernel.inputs if n.dtype.is_float), key=lambda d: d.itemsize,
               default=kernel.outputs[0].dtype)


def _peak(dev: DeviceSpec, dtype_name: str, precision: str | None) -> tuple[float, float]:
    """``(peak FLOP/s, efficiency)`` of a vendor GEMM at this operand precision (``ieee``: fp32
    CUDA cores; the others at their tensor-core peak, ``DeviceSpec.dot_peak``)."""
    if dtype_name == "f64":
        return dev.vector_flops["f64"], CUBLAS_FP32_EFFICIENCY
    prec = precision or {"f32": "ieee", "bf16": "bf16", "f16": "fp16"}.get(dtype_name, "ieee")
    if prec == "ieee":
        return dev.vector_flops["f32"], CUBLAS_FP32_EFFICIENCY
    return dev.dot_peak(prec), CUBLAS_EFFICIENCY


def _fill(c, dev: DeviceSpec) -> float:
    tiles = c.batch * math.ceil(c.M / VENDOR_TILE) * math.ceil(c.N / VENDOR_TILE)
    tiles *= max(1, min(SPLIT_K_MAX, c.K // SPLIT_K_MIN))
    return min(1.0, max(tiles, 1) / dev.sm_count)     # an empty product: no work, no 0 / 0


def _eager_ops(kernel: Kernel, skip: set[int]) -> list:
    """The meaning's nodes that become one eager torch kernel each (not views, leaves, or the
    products a contraction consumes)."""
    return [n for n in kernel.meaning.nodes()
            if id(n) not in skip and n.op not in ("Input", "Constant", "Iota", "View")]


class _TorchPath:
    """What the torch path of an extern implementation launches, summed: ``seconds`` (each launch's
    roofline at its efficiency, plus the launch overhead) and ``bytes`` (what each launch reads and
    writes in GPU memory)."""

    def __init__(self, dev: DeviceSpec):
        self.dev, self.bw = dev, dev.hbm_bandwidth * BW_EFFICIENCY
        self.seconds, self.bytes = 0.0, 0

    def launch(self, nbytes: float, compute_s: float = 0.0, launches: int = 1,
               bw: float | None = None) -> None:
        """``launches`` kernels that move ``nbytes`` in all, at ``max(compute_s, nbytes / bw)``."""
        self.seconds += max(compute_s, nbytes / (bw or self.bw)) + launches * self.dev.launch_overhead_s
        self.bytes += int(nbytes)


def simulate_extern_time(kernel: Kernel, cfg: dict, dev: DeviceSpec) -> float:
    """Simulated seconds of one run of ``kernel`` through its extern implementation ``cfg["IMPL"]``.

    Raises:
        ValueError: when the implementation does not apply to the kernel.
    """
    return _torch_path(kernel, cfg, dev).seconds


def extern_bytes(kernel: Kernel, cfg: dict, dev: DeviceSpec) -> int:
    """Bytes the extern implementation ``cfg["IMPL"]`` of ``kernel`` reads and writes in GPU memory:
    every launch of its torch path (module doc), the intermediates it writes and reads back
    included, so at least ``kernel.min_bytes()`` but for an fp8 GEMM's 1-byte operands.

    Raises:
        ValueError: when the implementation does not apply to the kernel.
    """
    return _torch_path(kernel, cfg, dev).bytes


def _torch_path(kernel: Kernel, cfg: dict, dev: DeviceSpec) -> _TorchPath:
    impl = impl_of(cfg)
    if impl not in extern_impls(kernel):
        raise ValueError(f"implementation {impl!r} does not apply to this {kernel.form} kernel")
    cs = _contractions(kernel)
    dtype = _dtype(kernel)
    peak, eff = _peak(dev, dtype.name, cfg.get("PRECISION"))
    isz = dtype.itemsize
    path = _TorchPath(dev)
    skip: set[int] = set()
    if impl == "sdpa":
        c1, c2 = vendor_contractions(kernel)
        # the fused attention: q, k, v and out once; FLOPs of both products
        flops = 2 * c1.batch * c1.M * c1.N * c1.K + 2 * c2.batch * c2.M * c2.N * c2.K
        # an fp32 kernel at bf16/fp16 casts q, k, v down and the output back, eager ops
        half = isz == 4 and cfg.get("PRECISION") in ("bf16", "fp16")
        ksz = 2 if half else isz
        qkv = c1.batch * (c1.M + c1.N) * c1.K + c2.batch * c2.K * c2.N
        out_n = c2.batch * c2.M * c2.N
        # the mask SDPA reads: one value per score (the score function at S = 0, compacted),
        # none where it is constant or causal (``sdpa_mask_kind``), whose masked blocks are skipped
        scores = c1.batch * c1.M * c1.N
        kind = sdpa_mask_kind(kernel)
        flops *= sdpa_causal_share(kernel)
        nbytes = (qkv + out_n + (scores if kind in ("input", "dense", "unknown") else 0)) * ksz
        # FlashAttention / the memory-efficient kernel on tensor cores for half types; fp32 runs
        # the memory-efficient kernel in split TF32 whatever PRECISION says
        peak_a = peak if ksz <= 2 else dev.dot_peak(SDPA_FP32_PRECISION)
        path.launch(nbytes, flops / (peak_a * SDPA_EFFICIENCY * _fill(c1, dev)))
        if half:
            path.launch((qkv + out_n) * (isz + ksz), launches=4)
        mask_nodes = sdpa_mask_nodes(kernel)
        if kind == "input":
            # the mask is recomputed per call (``extern_sdpa``): zeros for the scores, each op of
            # the score function at S = 0, the ln 2 scale, and at half precision the clamp to its
            # range and the cast (isfinite, clamp, where, to); priced over the full scores, an
            # upper bound: the runtime forms a mask only along the dims it varies over (a padding
            # mask's [B, 1, 1, N]), and its launches dominate at model sizes
            for n in mask_nodes:
                if n.op in ("Input", "Constant", "View"):
                    continue
                path.launch(n.nbytes + sum(min(x.nbytes, x.srcs[0].nbytes) if x.op == "View"
                                           else x.nbytes for x in n.srcs if x.numel > 1))
            path.launch(3 * scores * isz, launches=2)
            if half:
                path.launch(scores * 36, launches=4)
            # its fully masked queries (isneginf, all) and their rows set to NaN (masked_fill)
            path.launch(scores * ksz + 2 * out_n * ksz, launches=3)
        elif kind == "dense" and _MASK_DEAD.get(kernel.content_hash()):
            path.launch(2 * out_n * ksz)    # a fixed mask's dead queries
        # the softmax and score function run inside it: the operands' prologues (RoPE, a
        # QK-norm) run before it and the ops after the value product after it, as eager ops
        from lumc.backends.triton.render_matmul import dependents
        from lumc.ir.graph import toposort
        nodes = kernel.meaning.nodes()
        after = {id(n) for n in dependents(nodes, c2.node)}
        before = {id(n) for n in toposort([c1.a, c1.b, c2.b])}
        skip = {id(n) for n in nodes if id(n) not in after and id(n) not in before} | \
            {id(c2.node)}
    elif impl == "cudnn":
        skip = _cudnn_time(path, cs, cfg, isz, peak)
        cs = [c for c in cs if id(c.node) not in skip]
    if impl in ("cublas", "cudnn"):
        fp8 = cfg.get("PRECISION") == "fp8"
        for c in cs:
            flops = 2 * c.batch * c.M * c.N * c.K
            osz = 1 if fp8 else isz
            nbytes = (c.batch * c.M * c.K + c.batch * c.K * c.N) * osz + c.batch * c.M * c.N * isz
            path.launch(nbytes, flops / (peak * eff * _fill(c, dev)))
            _materialized_operands(path, c, isz)
            if fp8:   # quantizing each operand: an amax pass and a scaled cast, eager torch ops
                path.launch((c.batch * (c.M + c.N) * c.K) * (2 * isz + 1), launches=4)
            skip |= {id(c.node), id(c.node.srcs[0])}
    for n in _eager_ops(kernel, skip):
        # a broadcast operand (a view) is read once from memory, at its source's size
        path.launch(sum(min(s.nbytes, s.srcs[0].nbytes) if s.op == "View" else s.nbytes
                        for s in n.srcs if s.op != "Constant" or s.numel > 1) + n.nbytes)
    return path


def sdpa_mask_nodes(kernel: Kernel) -> list:
    """The nodes SDPA's mask is computed from: the score function evaluated at ``S = 0``
    (``compiler/runtime/extern_sdpa.py``), i.e. everything the softmax's input depends on, sources
    first, not through the score contraction (an operand's value it reads directly, a QK-norm's
    row factor applied to the scores, is among them). A mask none of whose nodes is an ``Input``
    (a causal mask of iotas, a constant bias) is the same on every call."""
    from lumc.ir.graph import toposort
    p = attention_plan(kernel)
    if p is None:
        return []
    return [n for n in toposort([p.softmax.m.srcs[0]], stop=[p.c1.node]) if n is not p.c1.node]


# the largest score tensor whose constant mask is evaluated (on the CPU, once per kernel content) to
# see whether SDPA can run it without a mask or with ``is_causal``; larger ones are read as dense
MASK_EVAL_MAX = 1 << 24
_MASK_KINDS: dict[str, str] = {}
# a mask value (natural-log units, as SDPA adds it) at or below this is masked: added to any score
# under 1e29 in fp32 it rounds to itself and its exp is 0, as -inf's (finfo(float32).min scaled by
# 1/sqrt(d) is ~-3e37; -1e9 or -1e4 masks are not: a large enough score would still show through)
MASKED_LOGIT = -1e30
_MASK_HALF_EXACT: dict[str, dict] = {}
_MASK_DEAD: dict[str, bool] = {}   # whether a fixed mask masks every key of some query


def sdpa_mask_kind(kernel: Kernel) -> str:
    """What SDPA needs for the kernel's mask (the score function at ``S = 0``, as ``[batch, M, N]``):

    * ``"input"``: it depends on the kernel's inputs (a padding mask): computed per call, dense;
    * ``"none"``: one finite value everywhere (softmax ignores a constant shift): no mask, so
      FlashAttention serves it;
    * ``"causal"``: one finite value where key ``j <= `` query ``i`` and ``-inf`` elsewhere, in every
      batch: ``is_causal=True`` (SDPA's top-left aligned lower triangle), FlashAttention again,
      skipping the masked key blocks;
    * ``"dense"``: anything else: an ``attn_mask``, computed once per device;
    * ``"unknown"``: a constant mask over :data:`MASK_EVAL_MAX` scores, too large to evaluate here:
      priced as dense; the runtime computes it once on its device and classifies it there
      (``compiler/runtime/extern_sdpa.py``), so a large causal mask still runs ``is_causal``.

    Masked means ``-inf`` or at most :data:`MASKED_LOGIT` once scaled (HF's ``finfo.min``).
    """
    if attention_plan(kernel) is None:
        return "dense"
    nodes = sdpa_mask_nodes(kernel)
    if any(n.op == "Input" for n in nodes):
        return "input"
    key = kernel.content_hash()
    hit = _MASK_KINDS.get(key)
    if hit is None:
        hit = _MASK_KINDS[key] = _fixed_mask_kind(kernel, nodes)
    return hit


def _mask_values(kernel: Kernel, nodes: list, feed: dict | None = None):
    """The mask SDPA gets before its ``c ln 2`` scale: the score function at ``S = 0`` as a float64
    ``[batch, M, N]`` array (``feed``: values of the mask's ``Input`` nodes by name), or None over
    :data:`MASK_EVAL_MAX` scores."""
    import numpy as np
    from lumc.backends.reference import ReferenceExecutor
    p = attention_plan(kernel)
    if p is None or p.c1.node.numel > MASK_EVAL_MAX:
        return None
    c1 = p.c1
    ex = ReferenceExecutor(kernel.meaning)
    vals = {id(c1.node): np.zeros(c1.node.shape, c1.node.dtype.np)}
    with np.errstate(all="ignore"):
        for n in nodes:
            vals[id(n)] = (feed[n.arg.name] if n.op == "Input" else
                           ex._eval(n, vals, False, force=True))
    x = p.softmax.m.srcs[0]
    beta = np.broadcast_to(vals[id(x)], x.shape).astype(np.float64).reshape(c1.node.shape)
    groups = (c1.batch_dims, c1.m_dims, c1.n_dims)
    keep = [d for g in groups for d in g]
    sub = beta[tuple(slice(None) if d in keep else 0 for d in range(len(c1.full)))]
    kept = [d for d in range(len(c1.full)) if d in keep]
    return np.transpose(sub, [kept.index(d) for d in keep]).reshape(
        [prod(c1.full[d] for d in g) for g in groups])


def _fixed_mask_kind(kernel: Kernel, nodes: list) -> str:
    import numpy as np
    import torch
    from lumc.backends.triton.attention_mask import mask_depends_on_scores
    sub = _mask_values(kernel, nodes)
    if sub is None:
        return "unknown"
    p = attention_plan(kernel)
    if mask_depends_on_scores(p.softmax.m.srcs[0], p.c1.node):   # not SDPA's (its probe refuses)
        return "dense"
    fin = np.isfinite(sub)
    _MASK_DEAD[kernel.content_hash()] = bool(np.isneginf(sub).all(-1).any())
    ln2c = attention_plan(kernel).softmax.scale * math.log(2.0)
    _MASK_HALF_EXACT[kernel.content_hash()] = {h: _exact_in(sub[fin] * ln2c, h)
                                               for h in ("bf16", "fp16")}
    return classify_mask(torch.from_numpy(sub * ln2c))


def classify_mask(mask) -> str:
    """``none``, ``causal`` or ``dense`` (:func:`sdpa_mask_kind`) for a computed ``[batch, M, N]``
    mask tensor in SDPA's units (scaled by ``c ln 2``), on whatever device holds it: the host's
    evaluation here, the runtime's of a mask too large for the host (``extern_sdpa``)."""
    import torch
    m = mask.double() if mask.device.type == "cpu" else mask.float()
    if bool(torch.isnan(m).any()) or bool(torch.isposinf(m).any()):
        return "dense"
    # masked: -inf, or a value that swamps any score short of fp32 overflow (HF's finfo.min masks)
    masked = ~torch.isfinite(m) | (m <= MASKED_LOGIT)
    if bool(masked.all()):
        return "dense"
    vals = m[~masked]
    if not bool((vals == vals[0]).all()):
        return "dense"
    if not bool(masked.any()):
        return "none"
    tri = torch.ones(m.shape[-2:], dtype=torch.bool, device=m.device).tril()
    return "causal" if bool(torch.equal(~masked, tri.expand_as(masked))) else "dense"


def _exact_in(v, half: str) -> bool:
    """Whether finite mask values ``v`` (as SDPA gets them, scaled) survive its clamp to the range
    of ``half`` and the cast unchanged; a value at or below -2^20 that stays there after the clamp
    masks (exp of it underflows, and it swamps any score) and may round."""
    import ml_dtypes
    import numpy as np
    t = ml_dtypes.bfloat16 if half == "bf16" else np.float16
    fi = ml_dtypes.finfo(t)
    c = np.clip(v, float(fi.min), float(fi.max))
    back = c.astype(t).astype(np.float64)
    return bool(np.all((back == v) | ((v <= -2.0 ** 20) & (c <= -2.0 ** 20))))


def sdpa_half_ok(kernel: Kernel, half: str) -> bool:
    """Whether SDPA at ``half`` (bf16/fp16) on fp32 operands gets the kernel's mask as the model
    has it. SDPA takes the mask in the half type: a bias is rounded to it (ALiBi at bf16: 3e-2 off
    at L = 128), and in fp16 a finite mask value beyond its range is clamped to -65504, which no
    longer swamps the scores of a fully masked row. Offered where no mask is passed (``none``,
    ``causal``), where a constant mask's values are exact in the type (or still mask after the
    clamp), and for a mask of the inputs where every input is bool and the mask, evaluated for two
    random draws of them, is exact (a padding mask ``where(m, s, -inf)``); a float or integer
    input's values are unknown until run time."""
    import numpy as np
    kind = sdpa_mask_kind(kernel)
    if kind in ("none", "causal"):
        return True
    if kind == "dense":
        return _MASK_HALF_EXACT.get(kernel.content_hash(), {}).get(half, False)
    nodes = sdpa_mask_nodes(kernel)
    ins = [n for n in nodes if n.op == "Input"]
    if not all(n.dtype.is_bool for n in ins):
        return False
    ln2c = attention_plan(kernel).softmax.scale * math.log(2.0)
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        sub = _mask_values(kernel, nodes, {n.arg.name: rng.random(n.shape) < 0.5 for n in ins})
        if sub is None or not _exact_in(sub[np.isfinite(sub)] * ln2c, half):
            return False
    return True


def sdpa_causal_share(kernel: Kernel) -> float:
    """The share of scores a causal SDPA computes (``sum_i min(i + 1, N) / (M N)``), else 1."""
    if sdpa_mask_kind(kernel) != "causal":
        return 1.0
    c1 = attention_plan(kernel).c1
    return sum(min(i + 1, c1.N) for i in range(c1.M)) / (c1.M * c1.N)


def _materialized_operands(path: _TorchPath, c, isz: int) -> None:
    """The copies torch makes to hand a contraction's view operands to a GEMM: a view reading more
    distinct positions than its source holds (a convolution's im2col windows) is written out
    (``einsum`` reshapes it), and a padding view under it is written by ``constant_pad_nd``: each a
    read and a write and one launch."""
    for op in (c.a, c.b):
        if op.op != "View":
            continue
        dense = prod(d for d, st in zip(op.shape, op.arg.strides) if st != 0 and d > 1)
        if dense > op.srcs[0].numel:
            path.launch(2 * dense * isz)
        src = op.srcs[0]
        if src.op == "View" and src.arg.mask is not None:
            path.launch((src.srcs[0].numel + src.numel) * isz)


def _cudnn_time(path: _TorchPath, cs, cfg: dict, isz: int, peak: float) -> set:
    """Adds the convolutions among ``cs`` through cuDNN (module doc) to ``path``; returns the ids
    of the nodes they cover (their products and sums)."""
    prec, dev = cfg.get("PRECISION"), path.dev
    tensor = prec in ("tf32", "bf16", "fp16") or isz <= 2
    skip: set[int] = set()
    for c in cs:
        p = conv_plan(c)
        if p is None:
            continue
        xb, wb = prod(p.x_shape) * isz, prod(p.w_shape) * isz
        yb = p.x_shape[0] * p.w_shape[0] * prod(p.out_spatial) * isz
        fill = min(1.0, max(math.ceil(p.x_shape[0] * prod(p.out_spatial) / VENDOR_TILE)
                            * math.ceil(p.w_shape[0] / VENDOR_TILE), 1) / dev.sm_count)
        eff = CUDNN_EFFICIENCY if tensor else CUDNN_FP32_EFFICIENCY
        stream = path.bw * (DEPTHWISE_BW_EFFICIENCY / BW_EFFICIENCY if p.w_shape[1] == 1 else 1.0)
        path.launch(xb + wb + yb, p.flops / (peak * eff * fill), bw=stream)
        if tensor:      # NCHW -> NHWC of x and back for y
            path.launch(2 * (xb + yb), launches=2)
        if prec in ("bf16", "fp16") and isz == 4:   # the eager rounding casts of x and w
            path.launch((xb + wb) * 1.5, launches=2)
        if not p.symmetric:
            path.launch(2 * xb)
        skip |= {id(c.node), id(c.node.srcs[0])}
    return skip


def extern_bound(kernel: Kernel, cfg: dict, dev: DeviceSpec) -> float:
    """A lower bound on the extern implementation's time: the kernel's pure roofline plus one launch
    per kernel the torch path issues (at least one)."""
    flops = kernel.flops()
    dtype = _dtype(kernel)
    peak, _ = _peak(dev, dtype.name, cfg.get("PRECISION"))
    peak = max(peak, dev.tensor_flops.get(dtype.name, peak)) if impl_of(cfg) == "sdpa" else peak
    launches = max(1, len(_contractions(kernel)) if impl_of(cfg) == "cublas" else 1)
    return max(flops / peak, kernel.min_bytes() / dev.hbm_bandwidth) + launches * dev.launch_overhead_s


def matmul_flops(kernel: Kernel) -> int:
    """FLOPs of the kernel's contractions alone (``2 B M N K`` each)."""
    return sum(2 * c.batch * c.M * c.N * c.K for c in _contractions(kernel))


