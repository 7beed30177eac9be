"""Stateful sequence ops of recent opsets (24-27), following their ONNX reference implementations:
``TensorScatter`` (KV-cache write), ``CausalConvWithState`` (depthwise causal conv with a carried
state, Mamba style) and ``LinearAttention`` (linear / gated / delta / gated-delta recurrences,
unrolled over the static sequence length, state in f32)."""
from __future__ import annotations

import numpy as np

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib, scalar
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, concat, normalize_axis


@handler("TensorScatter", requires=["indexing.gather_elements"])
def _tensor_scatter(ctx: OpContext):
    """``present[b, .., write_indices[b] + s, ..] = update[b, .., s, ..]`` (mod the cache length
    in ``circular`` mode); other positions keep ``past_cache``."""
    past, upd, widx = ctx.input(0), ctx.input(1), ctx.opt(2)
    axis = normalize_axis(ctx.attr("axis", -2), past.ndim)
    mode = ctx.attr("mode", "linear")
    if axis == 0 or any(p != u for k, (p, u) in enumerate(zip(past.shape, upd.shape)) if k != axis):
        raise ShapeError(f"update {upd.shape} does not fit cache {past.shape} on axis {axis}")
    m, n = past.shape[axis], upd.shape[axis]
    w = Tensor.full((past.shape[0],), 0, dt.i64) if widx is None else widx.cast(dt.i64)
    w = w.reshape((past.shape[0],) + (1,) * (past.ndim - 1)).expand(past.shape)
    src = Tensor.iota(past.shape, axis).sub(w)
    if mode == "circular":
        src = src.mod(src.scalar_like(m))
    elif mode != "linear":
        raise ShapeError(f"unknown mode {mode!r}")
    ok = src.lt(src.scalar_like(0)).logical_not().logical_and(src.lt(src.scalar_like(n)))
    safe = ok.where(src, src.scalar_like(0))
    return ok.where(lib("indexing.gather_elements")(upd, safe, axis=axis), past)


@handler("CausalConvWithState", requires=["conv.conv", "activations.silu"])
def _causal_conv_with_state(ctx: OpContext):
    x, w, b, past = ctx.input(0), ctx.input(1), ctx.opt(2), ctx.opt(3)
    act = ctx.attr("activation", "none")
    if x.ndim != 3 or w.ndim != 3:
        raise ShapeError(f"needs input [B, C, L] and weight [C, 1, k], got {x.shape}, {w.shape}")
    bsz, c, _ = x.shape
    k = w.shape[2]
    pad = Tensor.full((bsz, c, k - 1), 0, x.dtype) if past is None else past
    padded = concat([pad, x], 2) if k > 1 else x
    y = lib("conv.conv")(padded, w, b, group=c)
    if act in ("silu", "swish"):
        y = lib("activations.silu")(y.cast(dt.f32)).cast(x.dtype) if x.dtype != dt.f32 else \
            lib("activations.silu")(y)
    elif act != "none":
        raise ShapeError(f"unknown activation {act!r}")
    length = padded.shape[2]
    state = padded.slice([length - (k - 1)], [length], [2])
    return [y, state]


def _heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, H*D) -> (B, H, T, D)."""
    b, t, hd = x.shape
    if hd % heads:
        raise ShapeError(f"last dim {hd} is not divisible by {heads} heads")
    return x.reshape((b, t, heads, hd // heads)).permute((0, 2, 1, 3))


@handler("LinearAttention")
def _linear_attention(ctx: OpContext):
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    past, decay, beta = ctx.opt(3), ctx.opt(4), ctx.opt(5)
    rule = ctx.attr("update_rule", "gated_delta")
    hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if not hq or not hkv or hq % hkv:
        raise ShapeError(f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta") or gating != (decay is not None) \
            or delta != (beta is not None):
        raise ShapeError(f"update_rule {rule!r} does not fit the decay/beta inputs given")
    out_dtype = q.dtype
    b, t, _ = q.shape
    dk, dv = q.shape[-1] // hq, v.shape[-1] // hkv
    q4, k4, v4 = (_heads(a, h).cast(dt.f32) for a, h in ((q, hq), (k, hkv), (v, hkv)))
    if decay is not None:
        last = decay.shape[-1]
        if last == hkv:
            g4 = decay.reshape((b, t, hkv, 1)).permute((0, 2, 1, 3))
        elif last == hkv * dk:
            g4 = _heads(decay, hkv)
        else:
            raise ShapeError(f"decay last dim {last} must be {hkv} or {hkv * dk}")
        g4 = g4.cast(dt.f32).exp()
    if beta is not None:
        bl = beta.shape[-1]
        beta4 = beta.reshape((b, t, bl, 1)).permute((0, 2, 1, 3)).cast(dt.f32)
    state_dtype = past.dtype if past is not None else out_dtype
    state = past.cast(dt.f32) if past is not None else Tensor.full((b, hkv, dk, dv), 0.0, dt.f32)
    scale = ctx.attr("scale")
    scale = 1.0 / np.sqrt(dk) if not scale else float(scale)
    group = hq // hkv
    outs = []
    for i in range(t):
        q_t = q4.slice([i], [i + 1], [2]).squeeze([2])            # (B, Hq, dk)
        k_t = k4.slice([i], [i + 1], [2]).squeeze([2])            # (B, Hkv, dk)
        v_t = v4.slice([i], [i + 1], [2]).squeeze([2])            # (B, Hkv, dv)
        if gating:
            state = state.mul(g4.slice([i], [i + 1], [2]).squeeze([2]).unsqueeze([3]))
        if delta:
            retrieved = k_t.unsqueeze([2]).matmul(state).squeeze([2])   # (B, Hkv, dv)
            bt = beta4.slice([i], [i + 1], [2]).squeeze([2])
            v_t = bt.mul(v_t.sub(retrieved))
        state = state.add(k_t.unsqueeze([3]).mul(v_t.unsqueeze([2])))
        read = state
        if group > 1:
            read = state.unsqueeze([2]).expand((b, hkv, group, dk, dv)).reshape((b, hq, dk, dv))
        o = q_t.unsqueeze([2]).matmul(read).squeeze([2]).mul(scalar(scale, dt.f32))
        outs.append(o.unsqueeze([2]))                              # (B, Hq, 1, dv)
    y = concat(outs, 2) if len(outs) > 1 else outs[0]
    y = y.permute((0, 2, 1, 3)).reshape((b, t, hq * dv)).cast(out_dtype)
    return [y, state.cast(state_dtype)]
