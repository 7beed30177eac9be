"""ONNX ``Attention`` (opsets 23-25) and ``RotaryEmbedding``.

Attention is matmuls, an additive bias and a guarded softmax.
The structure mirrors the ONNX reference (``onnx/reference/ops/op_attention.py``) step for step, so
every output agrees with it: 3-D inputs split into heads; ``sqrt(scale)`` applied to both Q and K;
the KV cache concatenated in front of K and V; masks (bool or additive, padded with "masked" up to
the KV length), bottom-right causal masking, sliding windows and ``nonpad_kv_seqlen`` padding all
become one additive ``-inf`` bias; grouped-query heads are repeated; ``softcap`` applies before the
bias; rows with no attendable key give zeros. Unless the probabilities are an output, the softmax is
the plain one and those rows are zeroed after the value product, so the attention form (one
kernel, or SDPA) matches it. Boolean masks are turned into biases with ``Where``,
never by multiplying (``0 * -inf`` would be NaN).
"""
from __future__ import annotations

import numpy as np

from lumc.compiler.frontends.onnx_frontend.loader import dtype_of
from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib, scalar
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, concat


def _split_heads(x: Tensor, heads: int) -> Tensor:
    b, s, hidden = x.shape
    if hidden % heads:
        raise ShapeError(f"hidden size {hidden} is not divisible by {heads} heads")
    return x.reshape((b, s, heads, hidden // heads)).permute((0, 2, 1, 3))


def _bias_from(allowed: Tensor, dtype: dt.DType) -> Tensor:
    """0 where allowed, -inf elsewhere."""
    return allowed.where(Tensor.full(allowed.shape, 0.0, dtype),
                         Tensor.full(allowed.shape, -np.inf, dtype))


def _frontier(q: int, kv: int, offset, dtype: dt.DType, test, kept: list | None = None) -> Tensor:
    """Bias of ``test(i + offset - j)`` over ``(q, kv)``, or ``(batch, 1, q, kv)`` for a per-batch
    offset tensor; the test itself is appended to ``kept``."""
    i = Tensor.iota((q, kv), 0)
    j = Tensor.iota((q, kv), 1)
    if isinstance(offset, Tensor):
        off = offset.cast(dt.i64).reshape((-1, 1, 1, 1))
        diff = i.reshape((1, 1, q, kv)).add(off).sub(j.reshape((1, 1, q, kv)))
    else:
        diff = i.add(Tensor.full((q, kv), int(offset), dt.i64)).sub(j)
    ok = test(diff)
    if kept is not None:
        kept.append(ok)
    return _bias_from(ok, dtype)


def _may_mask_a_row(dead: Tensor) -> bool:
    """Whether some query may have no attendable key: decided now for a mask of constants and iotas
    (a causal mask: never; :meth:`ConstantFolder.value`), assumed for a mask of the inputs."""
    from lumc.compiler.frontends.onnx_frontend.folding import ConstantFolder
    v = ConstantFolder().value(dead) if dead.numel <= 1 << 22 else None
    return v is None or bool(np.asarray(v).any())


def _softmax_guarded(x: Tensor) -> Tensor:
    """Softmax over the last axis; an all ``-inf`` row gives zeros instead of NaN. f16/bf16 are
    computed in f32 and rounded once (as onnxruntime does)."""
    if x.dtype in (dt.f16, dt.bf16):
        return _softmax_guarded(x.cast(dt.f32)).cast(x.dtype)
    m = x.max(-1, keepdims=True)
    masked = m.eq(m.scalar_like(-np.inf))
    safe = masked.where(m.scalar_like(0.0), m)
    e = x.sub(safe).exp()
    s = e.sum(-1, keepdims=True)
    s = s.eq(s.scalar_like(0.0)).where(s.scalar_like(1.0), s)
    return e.mul(s.expand(e.shape).recip())   # the softmax spelling the kernel forms match


@handler("Attention")
def _attention(ctx: OpContext):
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    mask, past_k, past_v, nonpad = ctx.opt(3), ctx.opt(4), ctx.opt(5), ctx.opt(6)
    if (past_k is None) != (past_v is None):
        raise ShapeError("past_key and past_value must be given together")
    q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    is_causal = bool(ctx.attr("is_causal", 0))
    softcap = ctx.attr("softcap")
    mode = ctx.attr("qk_matmul_output_mode", 0)
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    precision = ctx.attr("softmax_precision")
    rank = q.ndim
    if rank == 3:
        if q_heads is None or kv_heads is None:
            raise ShapeError("3-D Attention needs q_num_heads and kv_num_heads")
        q, k, v = _split_heads(q, q_heads), _split_heads(k, kv_heads), _split_heads(v, kv_heads)
    elif rank != 4:
        raise ShapeError(f"Attention needs 3-D or 4-D inputs, got rank {rank}")
    f = q.dtype
    scale = ctx.attr("scale")
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    s = scalar(np.sqrt(np.float64(scale)).astype(f.np), f)   # sqrt(scale) on both sides, as the spec
    if past_k is not None:
        k, v = concat([past_k, k], 2), concat([past_v, v], 2)
    present_k, present_v = k, v
    nq, nkv = q.shape[2], k.shape[2]

    bias = Tensor.full((nq, nkv), 0.0, f)
    if mask is not None and mask.shape[-1] < nkv:
        pads = [(0, 0)] * (mask.ndim - 1) + [(0, nkv - mask.shape[-1])]
        mask = mask.pad(pads, False if mask.dtype.is_bool else -np.inf)
    if nonpad is not None and past_k is None:
        offset = nonpad.reshape((-1,)).sub(Tensor.full((nonpad.numel,), nq, nonpad.dtype))
    else:
        offset = past_k.shape[2] if past_k is not None else 0
    # beside the bias, which positions it masks, from its pieces (not from the bias itself, which
    # the score function reads): a bias is -inf where a piece is, unless a float mask is +inf or
    # NaN there
    kept: list[Tensor] = []
    poison = None
    if mask is not None:
        if mask.dtype.is_bool:
            kept.append(mask)
        else:
            kept.append(mask.ne(mask.scalar_like(-np.inf)))
            poison = mask.isnan().logical_or(mask.eq(mask.scalar_like(np.inf)))
    if is_causal:
        base = bias if mask is None else (_bias_from(mask, f) if mask.dtype.is_bool else mask)
        if left >= 0 or right >= 0:
            base = bias.add(base)
        bias = base.add(_frontier(nq, nkv, offset, f, lambda d: d.ge(d.scalar_like(0)), kept))
    elif mask is not None:
        bias = bias.add(_bias_from(mask, f) if mask.dtype.is_bool else mask)
    if left >= 0 or right >= 0:
        bias = Tensor.full((nq, nkv), 0.0, f).add(bias)

        def inside(d: Tensor) -> Tensor:
            ok = Tensor.full(d.shape, True, dt.bool_)
            if left >= 0:
                ok = ok.logical_and(d.le(d.scalar_like(left)))
            if right >= 0:
                ok = ok.logical_and(d.neg().le(d.scalar_like(right)))
            return ok
        bias = bias.add(_frontier(nq, nkv, offset, f, inside, kept))
    if nonpad is not None:
        j = Tensor.iota((nonpad.numel, nkv), 1)
        keep = j.lt(nonpad.cast(dt.i64).reshape((-1, 1)).expand((nonpad.numel, nkv)))
        kept.append(keep.reshape((nonpad.numel, 1, 1, nkv)))
        bias = bias.add(_bias_from(keep, f).reshape((nonpad.numel, 1, 1, nkv)))

    hq, hk = q.shape[1], k.shape[1]
    if hq != hk and hq % hk == 0 and v.shape[1] == hk:
        reps = hq // hk
        k = k.unsqueeze([2]).expand((k.shape[0], hk, reps) + k.shape[2:]).reshape(
            (k.shape[0], hq) + k.shape[2:])
        v = v.unsqueeze([2]).expand((v.shape[0], hk, reps) + v.shape[2:]).reshape(
            (v.shape[0], hq) + v.shape[2:])
    qk = q.mul(s).matmul(k.mul(s).transpose(2, 3))
    if softcap is not None and softcap > 0:
        c = scalar(softcap, f)
        qk = qk.div(c).tanh().mul(c)
    with_bias = qk.add(bias)
    qk_out = qk
    if mode == 2:
        qk_out = with_bias
    sm_in = with_bias.cast(dtype_of(precision)) if precision is not None else with_bias
    if mode == 3:       # the probabilities are an output: the reference's guarded softmax
        probs = _softmax_guarded(sm_in)
        row_masked = bias.max(-1, keepdims=True)
        row_masked = row_masked.eq(row_masked.scalar_like(-np.inf))
        probs = row_masked.where(probs.scalar_like(0.0), probs)
        qk_out = probs
        y = probs.cast(f).matmul(v)
    else:
        # the plain softmax the attention form matches (one kernel, or SDPA), and a query with
        # no attendable key zeroed after the value product: its softmax row is 0/0 there, which
        # the reference guards to 0 before the product. Same values, except where such a row
        # meets an infinite or NaN value (the reference's 0 * inf is NaN, this is 0) or every
        # key's score is itself -inf with a finite bias (infinite q or k: this gives NaN)
        wide = sm_in.cast(dt.f32) if sm_in.dtype in (dt.f16, dt.bf16) else sm_in
        probs = lib("norm.softmax")(wide, axis=-1).cast(sm_in.dtype)
        y = probs.cast(f).matmul(v)
        if kept:
            allowed = kept[0]
            for k_ in kept[1:]:
                allowed = allowed.logical_and(k_)
            if poison is not None:
                allowed = allowed.logical_or(poison)
            dead = allowed.cast(dt.f32).max(-1, keepdims=True).lt(0.5)
            if _may_mask_a_row(dead):
                y = dead.where(y.scalar_like(0.0), y)
    if rank == 3:
        y = y.permute((0, 2, 1, 3))
        y = y.reshape((y.shape[0], y.shape[1], -1))
    return [y, present_k, present_v, qk_out.cast(f)]


@handler("RotaryEmbedding", requires=["indexing.gather"])
def _rotary_embedding(ctx: OpContext):
    """Rotate pairs of the first ``rotary_embedding_dim`` features of each head by the cached
    angles (halves, or even/odd pairs when ``interleaved``), as the ONNX reference."""
    x, cos, sin, pos = ctx.input(0), ctx.input(1), ctx.input(2), ctx.opt(3)
    orig = x.shape
    if x.ndim == 4:
        x = x.permute((0, 2, 1, 3))
    elif x.ndim == 3:
        heads = ctx.attr("num_heads")
        if not heads or x.shape[2] % heads:
            raise ShapeError(f"3-D input {x.shape} needs num_heads dividing its last dim")
        x = x.reshape((x.shape[0], x.shape[1], heads, x.shape[2] // heads))
    else:
        raise ShapeError(f"RotaryEmbedding needs a 3-D or 4-D input, got {x.shape}")
    hd = x.shape[3]
    rd = ctx.attr("rotary_embedding_dim", 0) or hd
    if rd % 2 or rd > hd:
        raise ShapeError(f"rotary_embedding_dim {rd} must be even and <= head size {hd}")
    if pos is not None:
        gather = lib("indexing.gather")
        cos, sin = gather(cos, pos, axis=0), gather(sin, pos, axis=0)
    if cos.shape[-1] != rd // 2 or sin.shape[-1] != rd // 2:
        raise ShapeError(f"cos/sin caches {cos.shape}, {sin.shape} do not end in {rd // 2}")
    cos, sin = cos.unsqueeze([2]), sin.unsqueeze([2])
    rot = x.slice([0], [rd], [3])
    if ctx.attr("interleaved", 0):
        x1, x2 = rot.slice([0], [rd], [3], [2]), rot.slice([1], [rd], [3], [2])
    else:
        x1, x2 = rot.slice([0], [rd // 2], [3]), rot.slice([rd // 2], [rd], [3])
    real = cos.mul(x1).sub(sin.mul(x2))
    imag = sin.mul(x1).add(cos.mul(x2))
    if ctx.attr("interleaved", 0):
        rot = concat([real.unsqueeze([4]), imag.unsqueeze([4])], 4).reshape(rot.shape)
    else:
        rot = concat([real, imag], 3)
    out = concat([rot, x.slice([rd], [hd], [3])], 3) if rd < hd else rot
    return out.reshape(orig) if len(orig) == 3 else out.permute((0, 2, 1, 3))
