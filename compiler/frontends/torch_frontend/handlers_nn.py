"""Handlers for the network ops: matrix products (``mm``, ``bmm``, ``addmm``...), ``convolution``,
pooling (max, average, adaptive average), upsampling, and attention
(``scaled_dot_product_attention``, kept whole by the capture's decomposition table).

PyTorch's geometry arguments (``padding`` per spatial dim, both sides; ``stride=[]`` meaning the
kernel size; one value standing for every dim) are turned into the ONNX form the library takes.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from lumc.compiler.frontends.torch_frontend.registry import (aten, arg, float_of, lib, promote,
                                                          to_tensor)
from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, toposort
from lumc.ir.tensor import Tensor


# ---- matrix products -------------------------------------------------------------------------------
@aten("mm.default", "bmm.default", "matmul.default", "dot.default", "mv.default")
def _mm(ctx, a, b):
    a, b = promote(a, b)
    return a.matmul(b)


def _scaled_sum(bias: Tensor, prod: Tensor, beta, alpha) -> Tensor:
    """``beta * bias + alpha * prod``; ``beta == 0`` ignores ``bias`` (even NaN), as PyTorch."""
    if alpha != 1:
        prod = prod.mul(to_tensor(alpha, prod.dtype))
    if beta == 0:
        return prod
    bias = bias.cast(prod.dtype)
    if beta != 1:
        bias = bias.mul(to_tensor(beta, prod.dtype))
    return bias.add(prod)


@aten("addmm.default", "baddbmm.default", "addmv.default")
def _addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    a, b = promote(a, b)
    return _scaled_sum(bias, a.matmul(b), beta, alpha)


# ---- convolution -----------------------------------------------------------------------------------
def _per_dim(v, n: int) -> list[int]:
    v = [int(v)] if isinstance(v, int) else [int(a) for a in v]
    return v * n if len(v) == 1 else v


@aten("convolution.default", requires=["conv.conv", "conv.conv_transpose"])
def _convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    unbatched = x.ndim == w.ndim - 1
    if unbatched:
        x = x.unsqueeze([0])
    x, w = promote(x, w)
    nsp = x.ndim - 2
    pads = _per_dim(padding, nsp) * 2
    kw = dict(strides=_per_dim(stride, nsp), pads=pads, dilations=_per_dim(dilation, nsp),
              group=int(groups))
    if transposed:
        y = lib("conv.conv_transpose")(x, w, bias, output_padding=_per_dim(output_padding, nsp), **kw)
    else:
        y = lib("conv.conv")(x, w, bias, **kw)
    return y.squeeze([0]) if unbatched else y


# ---- pooling ---------------------------------------------------------------------------------------
def _pool_args(x: Tensor, nsp: int, kernel_size, stride, padding, dilation=1):
    kernel = _per_dim(kernel_size, nsp)
    strides = _per_dim(stride, nsp) if stride not in (None, [], ()) else kernel
    pads = _per_dim(padding, nsp) * 2
    return kernel, strides, pads, _per_dim(dilation, nsp)


def _batched(x: Tensor, nsp: int) -> tuple[Tensor, bool]:
    """Pools accept ``[C, *spatial]`` as well as ``[N, C, *spatial]``."""
    if x.ndim == nsp + 1:
        return x.unsqueeze([0]), True
    return x, False


def _max_pool(nsp: int):
    def fn(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        xb, unb = _batched(x, nsp)
        kernel, strides, pads, dil = _pool_args(xb, nsp, kernel_size, stride, padding, dilation)
        y, idx = lib("pool.max_pool_indices")(xb, kernel, strides=strides, pads=pads,
                                              dilations=dil, ceil_mode=bool(ceil_mode))
        # ONNX indices are flat over [N, C, *spatial]; PyTorch's are flat over one plane
        n, c = xb.shape[:2]
        plane = int(np.prod(xb.shape[2:]))
        base = Tensor.iota((n, c), 0).mul(c * plane).add(Tensor.iota((n, c), 1).mul(plane))
        idx = idx.sub(base.reshape((n, c) + (1,) * nsp))
        if unb:
            y, idx = y.squeeze([0]), idx.squeeze([0])
        return y, idx
    return fn


aten("max_pool2d_with_indices.default", requires=["pool.max_pool_indices"])(_max_pool(2))
aten("max_pool3d_with_indices.default", requires=["pool.max_pool_indices"])(_max_pool(3))


def _avg_check(node) -> str | None:
    if arg(node, 6, "divisor_override") is not None:
        return "divisor_override"
    return None


def _avg_pool(nsp: int):
    def fn(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
           divisor_override=None):
        xb, unb = _batched(x, nsp)
        kernel, strides, pads, _ = _pool_args(xb, nsp, kernel_size, stride, padding)
        y = lib("pool.avg_pool")(xb, kernel, strides=strides, pads=pads, ceil_mode=bool(ceil_mode),
                                 count_include_pad=bool(count_include_pad))
        return y.squeeze([0]) if unb else y
    return fn


aten("avg_pool1d.default", requires=["pool.avg_pool"], check=_avg_check)(_avg_pool(1))
aten("avg_pool2d.default", requires=["pool.avg_pool"], check=_avg_check)(_avg_pool(2))
aten("avg_pool3d.default", requires=["pool.avg_pool"], check=_avg_check)(_avg_pool(3))


def _adaptive_windows(n_in: int, n_out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive pooling windows: output ``i`` reads inputs
    ``floor(i n_in / n_out) .. ceil((i + 1) n_in / n_out) - 1``."""
    return [((i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)) for i in range(n_out)]


def _window_gather(y: Tensor, ax: int, wins: list[tuple[int, int]]) -> Tensor:
    """Axis ``ax`` of ``y`` as ``[len(wins), span]`` windows by one gather, each window padded to
    the longest (``span``) by repeating its last element (the caller selects or ignores them)."""
    span = max(hi - lo for lo, hi in wins)
    table = np.array([[lo + min(t, hi - lo - 1) for t in range(span)] for lo, hi in wins],
                     np.int64)
    g = lib("indexing.take")(y, Tensor.const(table.reshape(-1)), ax)
    return g.reshape(y.shape[:ax] + (len(wins), span) + y.shape[ax + 1:])


def _adaptive_avg(nsp: int):
    def fn(ctx, x, output_size):
        """The window sums over every resized axis, divided once by the windows' sizes, as eager:
        equal windows (``n_in % n_out == 0``) by a reshape, others by one gather of every window
        padded to the longest with zeros selected in (never multiplied: an inf elsewhere on the
        axis stays out of the other windows). f16/bf16 are summed and divided in f32."""
        xb, unb = _batched(x, nsp)
        outs = _per_dim(output_size, nsp)
        y = xb.cast(dt.f32) if xb.dtype in (dt.f16, dt.bf16) else xb
        counts = np.ones((), np.float64)          # the windows' sizes over the spatial axes
        for i, o in enumerate(outs):
            ax = 2 + i
            n_in = y.shape[ax]
            if o == n_in:
                counts = np.multiply.outer(counts, np.ones(o))
                continue
            wins = _adaptive_windows(n_in, o)
            counts = np.multiply.outer(counts, [float(hi - lo) for lo, hi in wins])
            if n_in % o == 0:
                y = y.reshape(y.shape[:ax] + (o, n_in // o) + y.shape[ax + 1:]).sum([ax + 1])
                continue
            g = _window_gather(y, ax, wins)
            span = g.shape[ax + 1]
            inside = np.array([[t < hi - lo for t in range(span)] for lo, hi in wins])
            inside = inside.reshape((o, span) + (1,) * (y.ndim - ax - 1))
            y = Tensor.const(inside).where(g, g.scalar_like(0.0)).sum([ax + 1])
        if counts.size and (counts != 1).any():
            y = y.div(Tensor.const(counts.astype(y.dtype.np)))
        y = y.cast(xb.dtype)
        return y.squeeze([0]) if unb else y
    return fn


aten("_adaptive_avg_pool2d.default", requires=["indexing.take"])(_adaptive_avg(2))
aten("_adaptive_avg_pool3d.default", requires=["indexing.take"])(_adaptive_avg(3))
aten("adaptive_avg_pool1d.default", requires=["indexing.take"])(_adaptive_avg(1))


def _indices_unused(node) -> str | None:
    """Adaptive max pooling is lowered for its values; its indices only where nothing reads them
    (``make_fx``, through ``torch.compile``, leaves an unread ``getitem`` of them in the graph)."""
    for u in node.users:
        if not (u.op == "call_function" and u.target.__name__ == "getitem"
                and (u.args[1] == 0 or not u.users)):
            return "the indices output of adaptive max pooling"
    return None


def _adaptive_max(nsp: int):
    def fn(ctx, x, output_size):
        xb, unb = _batched(x, nsp)
        y = xb
        for i, o in enumerate(_per_dim(output_size, nsp)):
            ax = 2 + i
            n_in = y.shape[ax]
            if o == n_in:
                continue
            # windows of PyTorch's adaptive pooling, padded to one length by repeating an
            # element (a repeat never changes a max): one Gather, one max per axis
            y = _window_gather(y, ax, _adaptive_windows(n_in, o)).max([ax + 1])
        y = y.squeeze([0]) if unb else y
        return y, Tensor.full(y.shape, 0, dt.i64)
    return fn


aten("adaptive_max_pool2d.default", requires=["indexing.take"], check=_indices_unused)(
    _adaptive_max(2))
aten("adaptive_max_pool3d.default", requires=["indexing.take"], check=_indices_unused)(
    _adaptive_max(3))


# ---- upsampling ------------------------------------------------------------------------------------
def _traced_sizes(ctx, nsp: int) -> list[int]:
    """The spatial output sizes PyTorch traced for this node (it computes ``floor(in * scale)``
    in double, which float32 does not reproduce: 90 * 1.3 is 117, not 116)."""
    from lumc.compiler.frontends.torch_frontend.lowering import concrete_int
    val = ctx.node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ctx.unsupported("upsampling without a traced output shape")
    return [concrete_int(d, ctx.sym_env) for d in val.shape[-nsp:]]


def _upsample(ctx, x: Tensor, nsp: int, scales, mode: str, align_corners=False):
    """PyTorch's nearest (floor of ``dst / scale``) and (bi/tri)linear upsampling, each axis by
    :func:`lumc.ir.library.resize.torch_axis_taps` at the traced output size, the coordinates in
    PyTorch's opmath type; f16/bf16 interpolate in f32 and round once."""
    from lumc.ir.library.resize import resize_axis, torch_axis_taps
    sizes = _traced_sizes(ctx, nsp)
    scales = list(scales) if scales else [None] * nsp
    wide = mode == "linear" and x.dtype in (dt.f16, dt.bf16)
    y = x.cast(dt.f32) if wide else x
    compute = np.float64 if x.dtype == dt.f64 else np.float32
    for i, (n_out, sc) in enumerate(zip(sizes, scales)):
        ax = x.ndim - nsp + i
        n_in = y.shape[ax]
        if n_in == n_out:           # PyTorch copies an axis of unchanged size, whatever the scale
            continue
        if n_in == 0 or n_out == 0:
            y = y.slice([0], [0], [ax]) if n_out == 0 else y
            continue
        idx, w = torch_axis_taps(n_in, n_out, mode, align_corners=bool(align_corners),
                                 scale=None if sc is None else float(sc), compute=compute)
        y = resize_axis(y, ax, idx, w)
    return y.cast(x.dtype) if wide else y


for _nsp, _d in ((1, "1d"), (2, "2d"), (3, "3d")):
    aten(f"upsample_nearest{_d}.vec", requires=["resize.resize"])(
        lambda ctx, x, output_size, scale_factors, _n=_nsp:
            _upsample(ctx, x, _n, scale_factors, "nearest"))
    aten(f"upsample_nearest{_d}.default", requires=["resize.resize"])(
        lambda ctx, x, output_size, *scales, _n=_nsp: _upsample(ctx, x, _n, scales, "nearest"))

aten("upsample_bilinear2d.vec", "upsample_linear1d.vec", "upsample_trilinear3d.vec",
     requires=["resize.resize"])(
    lambda ctx, x, output_size, align_corners, scale_factors:
        _upsample(ctx, x, x.ndim - 2, scale_factors, "linear", align_corners))
aten("upsample_bilinear2d.default", "upsample_linear1d.default", "upsample_trilinear3d.default",
     requires=["resize.resize"])(
    lambda ctx, x, output_size, align_corners, *scales:
        _upsample(ctx, x, x.ndim - 2, scales, "linear", align_corners))


# ---- attention -------------------------------------------------------------------------------------
def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale,
               enable_gqa: bool) -> tuple[Tensor, Tensor]:
    """``(softmax(scores) v, scores)`` with ``scores = q k^T * scale + mask`` over the last two dims.

    A bool ``mask`` keeps the ``True`` positions (others get ``-inf``); a float mask is added;
    ``is_causal`` keeps ``j <= i`` (top-left aligned, as PyTorch). With ``enable_gqa`` each of the
    ``Hk`` key/value heads serves ``Hq / Hk`` query heads.
    """
    q, k, v = promote(q, k, v)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    if enable_gqa and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]

        def widen(t):
            h = t.shape[-3]
            t = t.reshape(t.shape[:-2] + (1,) + t.shape[-2:])
            t = t.expand(t.shape[:-3] + (g,) + t.shape[-2:])
            return t.reshape(t.shape[:-4] + (h * g,) + t.shape[-2:])
        k, v = widen(k), widen(v)
    s = 1.0 / math.sqrt(E) if scale is None else float(scale)
    scores = q.matmul(k.transpose(-2, -1)).mul(s)
    neg_inf = scores.scalar_like(float("-inf"))
    causal = Tensor.iota((L, S), 1).le(Tensor.iota((L, S), 0)) if is_causal else None
    keep = None if mask is None or not mask.dtype.is_bool else \
        mask if causal is None else mask.logical_and(causal)
    if keep is not None:
        # one select by both conditions (where(a, where(b, s, f), f) is the same selection), so
        # the attention rules see one mask
        scores = keep.where(scores, neg_inf)
    else:
        if causal is not None:
            scores = causal.where(scores, neg_inf)
        if mask is not None:
            scores = scores.add(mask.cast(scores.dtype))
    p = lib("norm.softmax")(scores, axis=-1)
    out = p.matmul(v)
    if mask is not None and S > 0 and (mask.dtype.is_bool or _may_be_neg_inf(mask.node)):
        # PyTorch's SDPA gives 0, not softmax's NaN, for a query whose every score is -inf
        # (``_safe_softmax`` in its math path; its flash and efficient kernels the same): a causal
        # mask with left padding does this to every pad row. Whether a row can be: from the masks
        # alone (a float mask masks with -inf; a NaN in it is not a mask and still poisons the
        # row); which rows are: PyTorch's own test on the softmax's row max, which the attention
        # kernel holds (``fusion_attention``: it writes the flag for the zeroing's reader), so no
        # kernel reduces the mask.
        kept = keep
        if kept is None:   # x = where(causal, s, -inf) + m is -inf where m is -inf, or off the
            # causal band where m is below +inf (NaN and +inf make NaN there)
            dead = mask.eq(float("-inf"))
            if causal is not None:
                dead = causal.where(dead, mask.lt(float("inf")))
            kept = dead.logical_not()
        if _some_row_dead(kept) is not False:
            # the softmax's own row max (the same node after hash-consing in the e-graph): -inf
            # exactly where every score is, PyTorch's own test; the attention kernel holds it
            xc = scores if scores.dtype in (dt.f32, dt.f64) else scores.cast(dt.f32)
            # one compare: below the lowest finite value is -inf only (NaN compares false)
            dead = xc.max(-1, keepdims=True).lt(float(np.finfo(xc.dtype.np).min))
            out = dead.where(out.scalar_like(0.0), out)
    return out, scores


MAX_STATIC_MASK = 1 << 22   # masks evaluated while lowering (4M elements)


def _some_row_dead(kept: Tensor) -> bool | None:
    """Whether a query row of ``kept`` keeps no key, evaluated now when the mask reads no input
    (a causal mask built from ``arange``: never); None when it reads one, or is too large or
    symbolic to evaluate."""
    if not isinstance(kept.numel, int) or kept.numel > MAX_STATIC_MASK:
        return None
    if any(n.op == "Input" for n in toposort([kept.node])):
        return None
    try:
        val = ReferenceExecutor(Graph({}, {"kept": kept.node}))({})["kept"]
    except Exception:   # a symbolic size: decided at run time
        return None
    return bool((~np.asarray(val, bool).any(axis=-1)).any())


def _may_be_neg_inf(n, depth: int = 64) -> bool:
    """Whether a float mask may hold -inf (then a row may be dead): False only when it is built
    from constants without -inf, selects between such values, or casts integers (transformers'
    padding masks: ``where(pad, finfo.min, 0)``); any arithmetic may overflow, so True."""
    while depth > 0 and n.op in ("View", "Contiguous"):
        n, depth = n.srcs[0], depth - 1
    if n.op == "Constant":
        return bool(np.isneginf(np.asarray(n.arg.value, dtype=np.float64)).any())
    if n.op == "Cast":
        return n.srcs[0].dtype.is_float and _may_be_neg_inf(n.srcs[0], depth - 1)
    if n.op == "Where":
        return _may_be_neg_inf(n.srcs[1], depth - 1) or _may_be_neg_inf(n.srcs[2], depth - 1)
    return True


def _sdpa_check(node) -> str | None:
    if arg(node, 4, "dropout_p", 0.0):
        return "attention dropout (dropout_p > 0)"
    return None


@aten("scaled_dot_product_attention.default", requires=["norm.softmax"], check=_sdpa_check)
def _sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    return _attention(q, k, v, attn_mask, bool(is_causal), scale, bool(enable_gqa))[0]


def _flash_check(node) -> str | None:
    if arg(node, 3, "dropout_p", 0.0):
        return "attention dropout (dropout_p > 0)"
    return None


@aten("_scaled_dot_product_flash_attention_for_cpu.default",
      requires=["norm.softmax", "reduce.reduce"], check=_flash_check)
def _flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    # grouped heads without a flag: fewer key/value heads than query heads each serve a group
    # (what ``F.scaled_dot_product_attention(..., enable_gqa=True)`` decomposes to)
    out, scores = _attention(q, k, v, attn_mask, bool(is_causal), scale, True)
    # the second result: log-sum-exp of each query's scores, f32 [B, H, L]
    lse = lib("reduce.reduce")(scores.cast(dt.f32), "log_sum_exp", [-1], keepdims=False)
    return out, lse


@aten("_cdist_forward.default")
def _cdist(ctx, x1, x2, p, compute_mode=None):
    """``cdist``: the ``p``-norm distance of every row of ``x1`` ``[..., P, M]`` to every row of
    ``x2`` ``[..., R, M]``, ``[..., P, R]``, from the differences themselves (PyTorch's default
    forms Euclidean distances of more than 25 rows through a matmul, ``|a|^2 + |b|^2 - 2 a.b``,
    which loses digits to cancellation; this does not). ``p = 0`` counts differing coordinates,
    ``p = inf`` takes the largest difference."""
    x1, x2 = promote(x1, x2)
    x1, x2 = float_of(x1), float_of(x2)
    diff = x1.unsqueeze([-2]).sub(x2.unsqueeze([-3])).abs()             # [..., P, R, M]
    p = float(p)
    if p == 0.0:   # a NaN coordinate makes the count NaN, as PyTorch's
        ones = diff.ne(diff.scalar_like(0.0)).cast(diff.dtype)
        return diff.isnan().where(diff, ones).sum([-1])
    if math.isinf(p):
        return diff.max([-1])
    if p == 1.0:
        return diff.sum([-1])
    if p == 2.0:
        return diff.mul(diff).sum([-1]).sqrt()
    total = diff.pow(diff.scalar_like(p)).sum([-1])
    return total.pow(total.scalar_like(1.0 / p))


_GRID_MODES = {0: "linear", 1: "nearest", 2: "cubic"}       # at::native::GridSamplerInterpolation
_GRID_PADDING = {0: "zeros", 1: "border", 2: "reflection"}  # at::native::GridSamplerPadding


@aten("grid_sampler_2d.default", "grid_sampler_3d.default", requires=["sample.grid_sample"])
def _grid_sampler(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    """``F.grid_sample``: :func:`lumc.ir.library.sample.grid_sample` (PyTorch's ``GridSampler.h``
    semantics, which ONNX adopted, except that PyTorch's bicubic pads each tap, not the
    position)."""
    x, grid = promote(x, grid)
    mode = _GRID_MODES[int(interpolation_mode)]
    return lib("sample.grid_sample")(x, grid, mode, _GRID_PADDING[int(padding_mode)],
                                     bool(align_corners), style="torch")
