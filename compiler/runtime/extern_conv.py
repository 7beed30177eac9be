"""The ``cudnn`` extern implementation: a kernel's convolutions through ``F.conv{1,2,3}d``.

:func:`conv_replacements` gives ``lumc.compiler.runtime.graph_torch.graph_module`` one replacement per
convolution :func:`lumc.backends.extern_conv.conv_plans` proved, so the kernel replays as torch ops
with each convolution one vendor call (cuDNN on a GPU, oneDNN on the CPU) instead of an einsum
over its im2col views; every other op of the meaning (bias, activation, residual) stays a torch op.

Numerics follow the reference executor and the ``cublas`` path: fp32 convolutions are IEEE fp32
(``torch.backends.cudnn.allow_tf32`` off; cuDNN's default is on) unless ``PRECISION`` is ``tf32``;
``bf16``/``fp16`` round fp32 operands to that type first; half operands accumulate in fp32 (cuDNN's
default on tensor cores; on the CPU they are upcast, as the reference sums in fp32 and rounds once).
"""
from __future__ import annotations

import contextlib

from lumc.backends.extern_conv import ConvPlan, conv_plans

_HALF = {"bf16": "bfloat16", "fp16": "float16"}


def conv_op(x, w, x_shape: tuple, w_shape: tuple, stride: tuple, dilation: tuple, pad_begin: tuple,
            pad_end: tuple, groups: int, out_spatial: tuple, perm: tuple, node_shape: tuple,
            precision: str | None, out_name: str):
    """``plan.node``'s value: ``F.conv{n}d`` of ``x`` reshaped to ``x_shape`` with ``w`` reshaped
    to ``w_shape``, laid out as the contraction's keepdims result (``perm`` orders the output axes
    ``(N, g, Mg, *O)`` as the product's dims, then ``node_shape``)."""
    import torch
    import torch.nn.functional as F
    nsp = len(stride)
    xt = x.reshape(x_shape)
    wt = w.reshape(w_shape)
    if precision in _HALF and xt.dtype == torch.float32:
        half = getattr(torch, _HALF[precision])
        xt, wt = xt.to(half), wt.to(half)
    if xt.device.type == "cpu" and xt.dtype in (torch.float16, torch.bfloat16):
        xt, wt = xt.float(), wt.float()
    if all(e <= b for b, e in zip(pad_begin, pad_end)):
        padding = tuple(pad_begin)
    else:   # the windows read past the end further than they start before it: pad explicitly
        pads = []
        for b, e in reversed(list(zip(pad_begin, pad_end))):
            pads += [b, max(e, 0)]
        xt = F.pad(xt, pads)
        padding = (0,) * nsp
    conv = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1]
    y = conv(xt, wt, None, stride, padding, dilation, groups)
    y = y[(slice(None), slice(None)) + tuple(slice(0, o) for o in out_spatial)]
    n, m = y.shape[:2]
    y = y.reshape((n, groups, m // groups) + tuple(out_spatial)).permute(perm)
    return y.reshape(node_shape).to(getattr(torch, out_name))


def _perm(plan: ConvPlan) -> tuple:
    """Output axes ``(N, g, Mg, O_0, ...)`` in the order the product's dims hold them (absent roles,
    all of size 1, last)."""
    axis = {"n": 0, "g": 1, "m": 2, **{f"o{s}": 3 + s for s in range(plan.nsp)}}
    present = [axis[r] for r in plan.out_roles if r is not None]
    return tuple(present + [a for a in range(3 + plan.nsp) if a not in present])


def conv_replacements(kernel, precision: str | None) -> dict:
    """``{id(SumReduce): (conv_op, [x, w], args)}`` for every convolution of ``kernel``'s meaning."""
    from lumc.backends.triton.contraction import find_contractions
    from lumc.compiler.runtime.graph_torch import _TORCH_NAMES
    out = {}
    for p in conv_plans(find_contractions(kernel.meaning.nodes())):
        args = (p.x_shape, p.w_shape, p.stride, p.dilation, p.pad_begin, p.pad_end, p.groups,
                p.out_spatial, _perm(p), tuple(p.node.shape), precision,
                _TORCH_NAMES[p.node.dtype.name])
        out[id(p.node)] = (conv_op, [p.x, p.w], args)
    return out


@contextlib.contextmanager
def cudnn_tf32(allow: bool, device: str):
    """``torch.backends.cudnn.allow_tf32`` set for the duration on a CUDA ``device`` (restored
    after; nothing to set on the CPU). Where torch froze its flags (its test harness), through
    ``torch.backends.cudnn.flags``."""
    import torch
    cd = torch.backends.cudnn
    if not str(device).startswith("cuda") or cd.allow_tf32 == allow:
        yield
        return
    old = cd.allow_tf32
    try:
        cd.allow_tf32 = allow
    except RuntimeError:       # "not allowed to set torch.backends.cudnn flags": the context form
        with cd.flags(enabled=cd.enabled, benchmark=cd.benchmark, deterministic=cd.deterministic,
                      allow_tf32=allow):
            yield
        return
    try:
        yield
    finally:
        cd.allow_tf32 = old
