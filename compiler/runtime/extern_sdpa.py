"""An attention kernel through ``F.scaled_dot_product_attention`` (FlashAttention / cuDNN / the
memory-efficient kernel on a GPU; torch's CPU kernel here): the ``sdpa`` extern implementation.

The kernel's meaning is ``out = epilogue(softmax2(f(q . k)) @ v)`` in primitives
(``lumc.backends.triton.render_attention.AttentionPlan`` finds the two contractions ``C1``, ``C2``,
the online-softmax pair and the normalizer). SDPA computes ``softmax(scale * q k^T + mask) v``, so
the score function ``f`` must be affine in the scores, ``f(S) = alpha * S + beta``, with ``alpha`` a
constant and ``beta`` any mask or bias (``-inf`` where ``Where`` masks). That is checked, not assumed:
at construction ``f`` is evaluated at ``S = 0, 1, 2`` on two random draws of the kernel's inputs,
``alpha`` must be one positive constant and ``f(2) = 2 alpha + beta``; otherwise the implementation
does not apply (``ValueError``). Per call, ``beta`` is ``f`` evaluated at ``S = 0`` (the mask's own
inputs only: no score matrix is formed; once per device for a mask of constants and iotas; none at
all where it is constant, ``is_causal`` where it is the causal triangle:
``lumc.backends.extern.sdpa_mask_kind``), and since ``softmax2(c x) = softmax(c ln2 x)``, SDPA gets
``scale = alpha c ln 2`` and ``attn_mask = beta c ln 2``. The normalizer must be ``1 / sum`` (what SDPA
applies). Everything before the products (prologues) and after ``C2`` (the epilogue) is evaluated
with torch ops (:class:`TorchEvaluator`).
"""
from __future__ import annotations

import math

import numpy as np

from lumc.ir.graph import Node
from lumc.ir.kernels import Kernel


class TorchEvaluator:
    """Values of a meaning's nodes as torch tensors, on demand and memoized; ``overrides`` fixes
    some nodes' values (what the rest is computed from). Semantics: ``lumc.compiler.runtime.graph_torch``."""

    def __init__(self, kernel: Kernel, feed: dict, device, overrides: dict | None = None,
                 memo: dict | None = None, constants: dict | None = None, broadcast: bool = False):
        self.kernel, self.feed, self.device = kernel, feed, device
        # broadcast: a value may keep size 1 along a dim its node is constant over (a stride-0
        # view's broadcast, which elementwise ops keep by torch's broadcasting), so a padding mask
        # [B, 1, 1, N] viewed as [B, H, M, N] scores is computed at its own size, not per score
        self.broadcast = broadcast
        # weights copied to the device once (a host copy cannot happen inside a CUDA-graph capture)
        self.constants = constants if constants is not None else {}
        self.memo: dict[int, object] = dict(memo or {})
        for n, v in (overrides or {}).items():
            self.memo[id(n)] = v

    def __call__(self, n: Node):
        hit = self.memo.get(id(n))
        if hit is not None:
            return hit
        for m in _topo(n, self.memo):
            if id(m) not in self.memo:
                self.memo[id(m)] = self._eval(m)
        return self.memo[id(n)]

    def _eval(self, n: Node):
        import torch
        from lumc.compiler.runtime import graph_torch as gt
        from lumc.compiler.runtime.extern import _native_contraction
        op = n.op
        v = [self.memo.get(id(s)) for s in n.srcs]
        if self.broadcast and op not in ELEMENTWISE_TORCH:
            if op == "View":
                return self._broadcast_view(n, v[0])
            # anything else reads its operands whole (expand: a view, no copy)
            v = [x.expand(s.shape) if tuple(x.shape) != tuple(s.shape) else x
                 for x, s in zip(v, n.srcs)]
        if op == "Input":
            return self.feed[n.arg.name]
        if op == "Constant":
            key = (id(n), str(self.device))
            if key not in self.constants:
                from lumc.backends.triton.launch import to_torch
                # ascontiguousarray makes a 0-d value 1-d: keep the node's shape
                v = np.ascontiguousarray(n.arg.value).reshape(np.shape(n.arg.value))
                self.constants[key] = to_torch(v, str(self.device))
            return self.constants[key]
        if op == "Iota":
            like = torch.empty(0, device=self.device)
            return gt.iota_op(n.arg.shape, n.arg.axis, gt._TORCH_NAMES[n.dtype.name], like)
        if op in _UNARY:
            return getattr(torch, _UNARY[op])(v[0])
        if op == "Cast":
            sat = n.srcs[0].dtype.is_float and n.arg.is_int
            return gt.cast_op(v[0], gt._TORCH_NAMES[n.arg.name], sat)
        if op in _BINARY:
            f = gt.mod_op if op == "Mod" else getattr(torch, _BINARY[op])
            return f(v[0], v[1])
        if op == "Where":
            return torch.where(*v)
        if op == "SumReduce":
            if n.srcs[0].op == "Mul":
                a, b = (self(x).expand(x.shape) for x in n.srcs[0].srcs)
                return _native_contraction(None)(a, b, *gt._contraction_args(n))
            acc = n.dtype.accumulator if n.dtype.is_float else n.dtype
            return gt.sum_op(v[0], tuple(n.arg), gt._TORCH_NAMES[n.dtype.name],
                             gt._TORCH_NAMES[acc.name])
        if op == "MaxReduce":
            fill = n.dtype.min_value()
            fill = float(fill) if n.dtype.is_float else (bool(fill) if n.dtype.is_bool else int(fill))
            return gt.max_op(v[0], tuple(n.arg), fill)
        if op == "Gather":
            return gt.gather_op(v[0], v[1], int(n.arg))
        if op == "View":
            a = n.arg
            return gt.view_op(v[0], tuple(a.shape), tuple(a.strides), int(a.offset), a.mask)
        if op == "Contiguous":
            return v[0].contiguous()
        raise NotImplementedError(f"no torch evaluation for primitive op {op}")

    def _broadcast_view(self, n: Node, x):
        """A view in broadcast mode: a broadcast scalar stays one (unless the view pads it); a
        stride-0 dim of the view keeps size 1."""
        from lumc.compiler.runtime import graph_torch as gt
        a, src = n.arg, n.srcs[0]
        if tuple(x.shape) != tuple(src.shape):
            if a.mask is None and x.numel() == 1:
                return x.reshape([1] * len(a.shape))
            x = x.expand(src.shape)      # read whole (view_op copies it): correct, not minimal
        out = gt.view_op(x, tuple(a.shape), tuple(a.strides), int(a.offset), a.mask)
        if a.mask is None:
            for k, st in enumerate(a.strides):
                if st == 0 and out.shape[k] > 1:
                    out = out.narrow(k, 0, 1)
        return out


# the elementwise primitives by torch function name (Mod: graph_torch.mod_op, C fmod); with Cast
# and Where, what torch's broadcasting computes as it is (TorchEvaluator's broadcast mode)
_UNARY = {"Exp2": "exp2", "Log2": "log2", "Sin": "sin", "Sqrt": "sqrt", "Recip": "reciprocal"}
_BINARY = {"Add": "add", "Mul": "mul", "Div": "div", "Mod": None, "LessThan": "lt"}
ELEMENTWISE_TORCH = frozenset(_UNARY) | frozenset(_BINARY) | {"Cast", "Where"}


def _topo(root: Node, known: dict) -> list[Node]:
    """``root`` and what it depends on, sources first, stopping at nodes already ``known``
    (iterative: meanings can be deep)."""
    out, seen, stack = [], set(), [(root, False)]
    while stack:
        n, done = stack.pop()
        if done:
            out.append(n)
            continue
        if id(n) in seen or id(n) in known:
            continue
        seen.add(id(n))
        stack.append((n, True))
        # a contraction's product is never materialized: its operands are evaluated instead
        srcs = n.srcs[0].srcs if (n.op == "SumReduce" and n.srcs and n.srcs[0].op == "Mul") else n.srcs
        stack.extend((s, False) for s in srcs)
    return out


def _compact(t, c, groups, broadcast: bool = False):
    """``t`` over ``c.full`` as a ``[prod(group) for group]`` tensor (other dims read at 0). With
    ``broadcast``, ``t`` may hold size 1 along dims it is constant over, and a group all of such
    dims stays size 1 (SDPA broadcasts it): only the groups it varies along are formed."""
    keep = [d for g in groups for d in g]
    idx = tuple(slice(None) if d in keep else 0 for d in range(len(c.full)))
    sub = (t if broadcast else t.expand(c.full))[idx]
    kept = [d for d in range(len(c.full)) if d in keep]
    sub = sub.permute([kept.index(d) for d in keep])
    sizes, pos = [], 0
    for g in groups:
        span = range(pos, pos + len(g))
        pos += len(g)
        if broadcast and all(sub.shape[i] == 1 for i in span):
            sizes.append(1)
            continue
        sub = sub.expand([c.full[keep[i]] if i in span else d for i, d in enumerate(sub.shape)])
        sizes.append(math.prod(c.full[d] for d in g))
    return sub.reshape(sizes)


_ALPHAS: dict[str, float] = {}   # the probed scale per kernel content (Kernel.content_hash)


# scores the score function is probed at: alpha from 0 and 1, linearity out to 128 (a soft cap of
# 30 or 50, Gemma-2's, bends there by percents; one of 1e6 would pass, and then differs from the
# affine function by less than fp32 resolves at the probe's scale), and negative scores: |S| is S
# at every S >= 0
PROBE_SCORES = (0.0, 1.0, 2.0, 64.0, 128.0, -1.0, -64.0, -128.0)


class SdpaAttention:
    """The ``sdpa`` implementation of one attention kernel (see module docstring).

    Raises:
        ValueError: when the kernel's meaning is not an attention SDPA can compute.
    """

    def __init__(self, kernel: Kernel):
        from lumc.backends.extern import attention_plan
        p = attention_plan(kernel)
        if p is None:
            raise ValueError("not an SDPA attention (two products around one softmax, normalized "
                             "by 1 / sum)")
        self.kernel, self.p = kernel, p
        self.constants: dict = {}
        self.x = p.softmax.m.srcs[0]
        # the probe runs the score function six times: once per distinct meaning (a model's
        # layers share one), not once per kernel object or per call
        key = kernel.content_hash()
        alpha = _ALPHAS.get(key)
        if alpha is None:
            alpha = _ALPHAS[key] = self._probe_alpha()
        self.alpha = alpha
        # a constant or causal mask is no mask (SDPA may then pick FlashAttention); another mask
        # of iotas and constants is computed once per device and dtype, outside a CUDA-graph
        # capture (a tensor allocated in one belongs to its pool)
        from lumc.backends.extern import sdpa_mask_kind
        self.mask_kind = sdpa_mask_kind(kernel)
        self._mask_fixed = self.mask_kind != "input"
        self._masks: dict = {}
        self._dead: dict = {}    # per fixed mask: its fully masked queries (None: there are none)

    def _probe_alpha(self) -> float:
        import torch
        c1 = self.p.c1
        alphas = []
        for seed in (0, 1):
            rng = np.random.default_rng(seed)
            feed = {}
            for ph in self.kernel.inputs:
                if ph.dtype.is_float:
                    a = rng.standard_normal(ph.shape).astype(np.float32)
                else:
                    a = rng.integers(0, 2, ph.shape)
                from lumc.backends.triton.launch import to_torch
                feed[ph.arg.name] = to_torch(a.astype(ph.dtype.np), "cpu")
            xs = []
            # far points too: a soft cap c * tanh(S / c) is linear to 1e-5 near 0, not at 64
            for s in PROBE_SCORES:
                ov = {c1.node: torch.full(c1.node.shape, s, dtype=_torch_dt(c1.node))}
                xs.append(TorchEvaluator(self.kernel, feed, "cpu", ov)(self.x).double())
            fin = torch.isfinite(xs[0])
            # alpha from positions with a moderate bias; where the bias is huge (a -1e4 or
            # finfo.min mask) fp32 keeps alpha only to the bias's rounding, which is what's checked
            mod = fin & (xs[0].abs() < 1e4)
            if not bool(mod.any()) or not bool(torch.equal(torch.isfinite(xs[1]), fin)):
                continue
            d1 = xs[1] - xs[0]
            a = float(d1[mod].mean())
            for s, x in zip(PROBE_SCORES[2:], xs[2:]):
                if not torch.equal(torch.isfinite(x), fin):
                    raise ValueError("not an SDPA attention: the score function is not "
                                     "alpha * S + mask")
            for s, x in zip(PROBE_SCORES[1:], xs[1:]):
                slack = abs(s) * 1e-5 * max(1.0, abs(a)) + 4 * 2.0 ** -23 * (xs[0].abs() + x.abs())
                if not (a > 0 and bool(((x - xs[0] - s * a).abs() <= slack)[fin].all())):
                    raise ValueError("not an SDPA attention: the score function is not "
                                     "alpha * S + mask")
            alphas.append(a)
        if not alphas or max(alphas) - min(alphas) > 1e-6 * max(alphas):
            raise ValueError("not an SDPA attention: the score scale depends on the inputs")
        return alphas[0]

    def __call__(self, feed: dict, device, precision: str | None = None) -> list:
        """The kernel's outputs (``out0..`` order) for ``feed`` (``{placeholder: tensor}``).

        ``precision`` ``bf16``/``fp16`` on fp32 operands: q, k, v and the mask are cast to that
        type (finite mask values clamped to its range first, so a -1e9 mask stays finite) and
        SDPA runs its half-precision kernels; its output, in that type, is cast back. The rounding
        this costs is what the numerics check emulates (``backends/precision.py: emulation``)."""
        import torch
        from torch.nn import functional as F
        p, c1, c2 = self.p, self.p.c1, self.p.c2
        ev = TorchEvaluator(self.kernel, feed, device, constants=self.constants)
        # 4-D, [1, batch, L, D]: PyTorch's fused kernels (FlashAttention, memory-efficient, cuDNN,
        # the CPU flash kernel) take nothing else; a 3-D call runs the math fallback, which forms
        # the score matrix (``sdp_utils_cpp.h: check_tensor_shapes``)
        q = _compact(ev(c1.a), c1, ((), c1.batch_dims, c1.m_dims, c1.k_dims))
        k = _compact(ev(c1.b), c1, ((), c1.batch_dims, c1.n_dims, c1.k_dims))
        v = _compact(ev(c2.b), c2, ((), c2.batch_dims, c2.k_dims, c2.n_dims))
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision or "")
        if half is not None and q.dtype == torch.float32:
            q, k, v = q.to(half), k.to(half), v.to(half)
        ln2c = p.softmax.scale * math.log(2.0)
        mkey = (str(device), q.dtype)
        mask = self._masks.get(mkey) if self._mask_fixed else None
        dead = self._dead.get(mkey) if self._mask_fixed else None
        if mask is None and self.mask_kind not in ("none", "causal"):
            # at the mask's own size: a padding mask stays [B, 1, 1, N], not one value per score
            zero = torch.zeros([1] * len(c1.node.shape), dtype=_torch_dt(c1.node), device=device)
            beta = TorchEvaluator(self.kernel, feed, device, {c1.node: zero}, ev.memo,
                                  self.constants, broadcast=True)(self.x)
            mask = _compact(_t_to_scores(beta.to(torch.float32) * ln2c, p.t2f1, c1.node.shape),
                            c1, ((), c1.batch_dims, c1.m_dims, c1.n_dims), broadcast=True)
            capturing = str(device).startswith("cuda") and torch.cuda.is_current_stream_capturing()
            if self._mask_fixed and not capturing and self.mask_kind == "unknown":
                # too large to classify on the host; classified as the model has it (fp32), not
                # as the first call's precision rounds it: the verdict serves every later call
                from lumc.backends.extern import classify_mask
                self.mask_kind = classify_mask(mask.expand(q.shape[:-1] + k.shape[-2:-1]))
            if q.dtype != mask.dtype:       # finite values stay finite: -1e9 is not -inf in fp16
                fi = torch.finfo(q.dtype)
                mask = torch.where(torch.isfinite(mask), mask.clamp(fi.min, fi.max), mask)
            mask = mask.to(q.dtype)
            # a query whose every key is -inf: the meaning's softmax is 0/0 = NaN there, where
            # SDPA's kernels give 0 (PyTorch's _safe_softmax); the model's own zeroing (if any) is
            # the epilogue's, so the kernel keeps its meaning. A fixed mask decides it once.
            dead = torch.isneginf(mask).all(-1, keepdim=True)
            if self._mask_fixed and not capturing:
                if self.mask_kind in ("none", "causal"):
                    mask = None
                else:
                    self._masks[mkey] = mask
                dead = self._dead[mkey] = dead if bool(dead.any()) else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.alpha * ln2c,
                                             is_causal=self.mask_kind == "causal")
        if dead is not None:
            out = out.masked_fill(dead, float("nan"))
        # back to C2's output layout: [batch.., query.., value..] at their dims, 1 elsewhere
        dims = list(c2.batch_dims) + list(c2.m_dims) + list(c2.n_dims)
        t = out.reshape([c2.full[d] for d in dims])
        order = sorted(dims)
        t = t.permute([dims.index(d) for d in order]).reshape(c2.node.shape)
        t = t.to(_torch_dt(c2.node))
        fin = TorchEvaluator(self.kernel, feed, device, {c2.node: t}, ev.memo, self.constants)
        return [fin(o) for o in self.kernel.meaning.outputs.values()]


def _t_to_scores(t, t2f1: list[int], shape: tuple):
    """``t`` over the softmax's domain (``T``, maybe with broadcast size-1 dims) reshaped to the
    scores' ``shape``: ``T`` and the scores differ only in unit dims (``AttentionPlan.t2f1``: the
    scores' dim of each non-unit dim of ``T``)."""
    out = [1] * len(shape)
    for j, f in enumerate(t2f1):
        if f >= 0:
            out[f] = t.shape[j]
    return t.reshape(out)


def _torch_dt(n: Node):
    from lumc.backends.triton.launch import torch_dtype
    return torch_dtype(n.dtype)
