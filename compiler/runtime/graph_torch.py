"""A primitive graph as a ``torch.fx.GraphModule``: the torch eager and TorchInductor rivals' program.

``lumc bench --vs eager,inductor`` needs the model as torch code. ``onnx2torch`` converts an ONNX file
when it supports every op; when it does not (none of the four README models converts with
onnx2torch 1.5: GlobalMaxPool, dynamic Clip bounds, SAME_UPPER padding, Pad-18), this module replays
lumc's imported primitive graph with torch ops instead, one fx node per primitive, so torch eager and
``torch.compile`` see the same computation lumc compiles, before any of lumc's fusion.

Semantics match the reference executor (``lumc.backends.reference``):

* ``SumReduce(Mul(a, b))`` becomes ``torch.einsum`` over the operands with their broadcast (stride-0)
  dims dropped, so a matmul or convolution is one contraction (an ``mm`` for Inductor), not a
  materialized broadcast product;
* a ``SumReduce(Mul(mask, v))`` that is a prefix sum (a cumsum's triangular mask times a finite
  ``v``, ``lumc.backends.scan_structure.scan_of``) becomes ``torch.cumsum`` (:func:`prefix_sum_op`),
  and its ``[L, L]`` mask is never formed (19.6 GB of f32 at L = 70000: the replay of a long
  CumSum's scan kernel, an extern candidate, failed for memory);
* views are ``torch.as_strided`` over the source's flat row-major elements, with negative strides
  turned into a flip and masks (padding) into ``constant_pad_nd``;
* ``Cast`` from float to int truncates and saturates to the type's exact min/max (NaN -> 0), as
  ``lumc.ir.ops.cast_array`` does;
* a row mean (``lumc.backends.row_moments.find_means``: a LayerNorm's, ``ReduceMean``'s) is
  taken on shifted data (:func:`shifted_mean_op`), as the kernels and the reference take it, so a
  constant row normalizes to exactly 0;
* ``Mod`` of integers refuses a divisor of 0 with the reference executor's
  ``DivisionByZeroError`` (:func:`mod_op`), not torch's bare ``RuntimeError: ZeroDivisionError``
  (CPU; a GPU gives no error).
"""
from __future__ import annotations

import math
import string

import numpy as np

from lumc.backends.row_moments import find_means
from lumc.backends.scan_structure import scan_of
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, Node
from lumc.ir.provenance import where

_TORCH_NAMES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u64": "uint64",
                "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool"}


def torch_dtype(d: dt.DType):
    """The torch dtype of a lumc dtype."""
    import torch
    return getattr(torch, _TORCH_NAMES[d.name])


# ---- op helpers (plain torch code: dynamo inlines them when it traces the module) ----------------

def view_op(x, shape: tuple, strides: tuple, offset: int, mask):
    """``lumc.ir.ops.apply_view`` in torch: out[i] = flat(x)[offset + i . strides] where masked-in,
    else 0."""
    import torch
    if math.prod(shape) == 0:
        return x.new_zeros(shape)
    flat = x.reshape(-1)
    lo = [m[0] for m in mask] if mask is not None else [0] * len(shape)
    hi = [m[1] for m in mask] if mask is not None else list(shape)
    if any(a >= b for a, b in zip(lo, hi)):
        return x.new_zeros(shape)
    sub = [b - a for a, b in zip(lo, hi)]
    start = offset + sum(a * s for a, s in zip(lo, strides))
    flips = []
    pos_strides = []
    for k, (d, s) in enumerate(zip(sub, strides)):
        if s < 0:          # as_strided takes no negative stride: read forwards, then flip
            start += (d - 1) * s
            flips.append(k)
            s = -s
        pos_strides.append(s)
    # slicing first keeps as_strided relative to flat (an explicit storage_offset breaks dynamo's graph)
    out = torch.as_strided(flat[start:], sub, pos_strides)
    if flips:
        out = torch.flip(out, flips)
    if mask is not None and tuple(sub) != tuple(shape):
        pads = []
        for a, b, d in reversed(list(zip(lo, hi, shape))):
            pads += [a, d - b]
        if out.dtype == torch.bool:  # constant_pad_nd has no bool kernel
            return torch.constant_pad_nd(out.to(torch.uint8), pads, 0).to(torch.bool)
        return torch.constant_pad_nd(out, pads, 0)
    return out


def cast_op(x, to_name: str, saturate: bool):
    """ONNX Cast: to bool is ``x != 0``; with ``saturate`` (float to int) truncates and saturates
    to the type's exact min/max, NaN -> 0 (``lumc.ir.ops.cast_array``)."""
    import torch
    to = getattr(torch, to_name)
    if to == torch.bool:
        return x != 0
    if saturate:
        lo, hi = torch.iinfo(to).min, torch.iinfo(to).max   # hi + 1 and lo: exact doubles
        y = torch.trunc(x.to(torch.float64))
        over, under = y >= float(hi + 1), y < float(lo)
        inside = torch.where(over | under | torch.isnan(y), torch.zeros_like(y), y).to(to)
        if not to.is_signed:
            # torch has no masked_fill for uint16/32/64: the max is all ones, -1 in the signed
            # view of the same width (below the range is 0 already)
            signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[to.itemsize]
            return inside.view(signed).masked_fill(over, -1).view(to)
        return inside.masked_fill(over, hi).masked_fill(under, lo)
    if any(st == 0 and d > 1 for st, d in zip(x.stride(), x.shape)):
        # a broadcast view: convert its distinct elements once, stay a view
        idx = tuple(slice(0, 1) if (st == 0 and d > 1) else slice(None)
                    for st, d in zip(x.stride(), x.shape))
        return x[idx].to(to).expand(x.shape)
    return x.to(to)


def mod_op(a, b, site: dict | None = None):
    """C ``fmod`` (``Mod``), as ``torch.fmod`` (an integer one checks its divisor first: on a GPU,
    one synchronization).

    Raises:
        DivisionByZeroError: an integer divisor is 0 (one line naming the model node where
            ``site`` has it (:func:`lumc.ir.provenance.where`), the op and the dtype), as
            the reference executor raises it. Raised here, in a helper, so that ``torch.fx``
            prints no code listing of the generated ``forward`` on stderr.
    """
    import torch
    if not a.dtype.is_floating_point and bool((b == 0).any()):
        from lumc.ir.errors import DivisionByZeroError
        from lumc.ir.ops import int_mod_by_zero
        raise DivisionByZeroError(int_mod_by_zero(str(b.dtype).removeprefix("torch.")),
                                  **(site or {"op": "Mod"}))
    return torch.fmod(a, b)


def sum_op(x, axes: tuple, out_name: str, acc_name: str):
    import torch
    if not axes:
        return x
    return torch.sum(x.to(getattr(torch, acc_name)), dim=axes, keepdim=True).to(getattr(torch, out_name))


def max_op(x, axes: tuple, fill):
    import torch
    if not axes:
        return x
    if x.numel() == 0:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        return torch.full(shape, fill, dtype=x.dtype, device=x.device)
    return torch.amax(x, dim=axes, keepdim=True)


def gather_op(table, index, axis: int):
    out_shape = tuple(table.shape[:axis]) + tuple(index.shape) + tuple(table.shape[axis + 1:])
    import torch
    return torch.index_select(table, axis, index.reshape(-1).to(torch.int64)).reshape(out_shape)


def iota_op(shape: tuple, axis: int, dtype_name: str, like):
    import torch
    r = torch.arange(shape[axis], dtype=getattr(torch, dtype_name), device=like.device)
    b = [1] * len(shape)
    b[axis] = shape[axis]
    return r.reshape(b).expand(shape)


def contraction_op(a, b, spec: str, a_index: tuple, b_index: tuple, scale: int, keep_shape: tuple,
                   out_shape: tuple, acc_name: str, out_name: str):
    """``sum(a * b, axes, keepdims=True)`` as one einsum over the compacted operands."""
    import torch
    acc = getattr(torch, acc_name)
    ca = a[a_index].to(acc)
    cb = b[b_index].to(acc)
    r = torch.einsum(spec, ca, cb)
    if scale != 1:
        r = r * scale
    full = tuple(d for d in out_shape if d is not None)
    r = r.reshape(keep_shape).expand(full)
    return r.reshape(tuple(1 if d is None else d for d in out_shape)).to(getattr(torch, out_name))


def prefix_sum_op(v, k: int, exclusive: bool, reverse: bool, acc_name: str, out_name: str):
    """A prefix sum's value (shape ``[..., L, 1, ...]``) from its operand ``v`` (``[..., i, j,
    ...]`` with ``j`` at axis ``k``, constant along ``i``), as the reference executor's
    ``_prefix_sum``: a cumsum along ``j`` in the accumulator dtype, shifted one when exclusive,
    flipped when reversed, a zero sum +0.0 (the contraction's sum starts from +0.0)."""
    import torch
    acc = getattr(torch, acc_name)
    row = v.narrow(k - 1, 0, 1).to(acc)
    if reverse:
        row = torch.flip(row, (k,))
    s = torch.cumsum(row, dim=k, dtype=acc)
    if exclusive:
        s = torch.cat([torch.zeros_like(s.narrow(k, 0, 1)), s.narrow(k, 0, s.shape[k] - 1)], dim=k) \
            if acc.is_floating_point else s - row
    if acc.is_floating_point:
        s = s + 0.0
    if reverse:
        s = torch.flip(s, (k,))
    return s.transpose(k - 1, k).contiguous().to(getattr(torch, out_name))


def shifted_mean_op(x, axes: tuple, acc_name: str, out_name: str):
    """The mean of ``x`` over ``axes`` (kept) on shifted data: ``K0 + sum(x - K0) / L`` with
    ``K0`` the first element along ``axes`` (0 where not finite; a view, no extra pass over ``x``),
    summed in the accumulator dtype ``acc_name``. Exact on a constant row, as the kernels (whose
    ``K0`` is the first chunk's mean) and the reference (a float64 sum) are; elsewhere within the
    rounding of an fp32 sum."""
    import torch
    acc = getattr(torch, acc_name)
    first = x
    for a in axes:
        first = first.narrow(a, 0, 1)
    k0 = torch.where(torch.isfinite(first), first, torch.zeros_like(first)).to(acc)
    length = math.prod(x.shape[a] for a in axes)
    return (k0 + (x.to(acc) - k0).sum(dim=axes, keepdim=True) / length).to(getattr(torch, out_name))


def _broadcast_dims(x: Node) -> list[bool]:
    """Dims along which ``x`` repeats one value (a stride-0 unmasked view) — dropped by einsum."""
    if x.op == "View" and x.arg.mask is None:
        return [st == 0 and d > 1 for st, d in zip(x.arg.strides, x.shape)]
    return [False] * len(x.shape)


def _contraction_args(s: Node) -> tuple:
    a, b = s.srcs[0].srcs
    shape = a.shape
    rank = len(shape)
    letters = string.ascii_letters[:rank]
    ba, bb = _broadcast_dims(a), _broadcast_dims(b)
    ia = tuple(0 if f else slice(None) for f in ba)
    ib = tuple(0 if f else slice(None) for f in bb)
    sa = "".join("" if f else letters[k] for k, f in enumerate(ba))
    sb = "".join("" if f else letters[k] for k, f in enumerate(bb))
    red = set(s.arg)
    present = set(sa) | set(sb)
    out_sub = "".join(letters[k] for k in range(rank) if k not in red and letters[k] in present)
    scale = 1
    for k in range(rank):   # reduced dims broadcast in both operands scale the sum by their extent
        if letters[k] not in present and k in red:
            scale *= shape[k]
    keep_shape = tuple(shape[k] if letters[k] in present else 1 for k in range(rank) if k not in red)
    out_shape = tuple(None if k in red else shape[k] for k in range(rank))
    acc = s.dtype.accumulator if s.dtype.is_float else s.dtype
    return (f"{sa},{sb}->{out_sub}", ia, ib, scale, keep_shape, out_shape,
            _TORCH_NAMES[acc.name], _TORCH_NAMES[s.dtype.name])


# ---- the module ------------------------------------------------------------------------------------

def graph_module(graph: Graph, replace: dict | None = None):
    """Build a ``torch.fx.GraphModule`` computing ``graph``.

    Its ``forward`` takes the graph's inputs positionally (in ``graph.inputs`` order, as torch tensors)
    and returns a tuple of outputs in ``graph.outputs`` order. Constants are non-persistent buffers,
    so ``.to(device)`` moves them. ``replace`` maps ``id(node)`` to ``(fn, src_nodes, args)``: that
    node becomes ``fn(*values of src_nodes, *args)`` (a vendor call for a contraction, the extern
    ``cudnn`` path), and nodes only it read are dropped.

    Raises:
        NotImplementedError: for a primitive op this replay does not know (a new row of the op table).
    """
    import torch
    import torch.fx as fx

    root = torch.nn.Module()
    g = fx.Graph()
    env: dict[int, fx.Node] = {}
    order = graph.nodes()
    users: dict[int, list[Node]] = {}
    for n in order:
        for s in n.srcs:
            users.setdefault(id(s), []).append(n)
    out_ids = {id(n) for n in graph.outputs.values()}
    fused = {id(n.srcs[0]) for n in order if n.op == "SumReduce" and n.srcs[0].op == "Mul"
             and id(n.srcs[0]) not in out_ids
             and all(u.op == "SumReduce" for u in users.get(id(n.srcs[0]), []))}
    for i, (name, n) in enumerate(graph.inputs.items()):
        env[id(n)] = g.placeholder(f"in{i}")
    nconst = 0
    scans = False          # a prefix sum leaves its mask's nodes dead
    means = {id(m): s1 for s1, m, _ in find_means(order) if id(s1.srcs[0]) not in fused}
    first = next(iter(env.values()), None)
    for n in order:
        if id(n) in env or id(n) in fused:
            continue
        op = n.op
        ins = [env.get(id(s)) for s in n.srcs]
        cf = g.call_function
        if replace is not None and id(n) in replace:
            fn, srcs, extra = replace[id(n)]
            env[id(n)] = cf(fn, (*[env[id(s)] for s in srcs], *extra))
            continue
        if id(n) in means:
            s1 = means[id(n)]
            acc = n.dtype.accumulator
            r = cf(shifted_mean_op, (env[id(s1.srcs[0])], tuple(s1.arg), _TORCH_NAMES[acc.name],
                                     _TORCH_NAMES[n.dtype.name]))
        elif op == "Constant":
            name = f"const{nconst}"
            nconst += 1
            value = np.array(n.arg.value, order="C")   # keeps rank 0
            if n.dtype == dt.bf16:
                t = torch.from_numpy(value.view(np.int16).copy()).view(torch.bfloat16)
            else:
                t = torch.from_numpy(value.copy())
            root.register_buffer(name, t, persistent=False)
            r = g.get_attr(name)
        elif op == "Iota":
            like = first if first is not None else _first_const(g, root)
            r = cf(iota_op, (n.arg.shape, n.arg.axis, _TORCH_NAMES[n.dtype.name], like))
        elif op in ("Exp2", "Log2", "Sin", "Sqrt", "Recip"):
            fn = {"Exp2": torch.exp2, "Log2": torch.log2, "Sin": torch.sin, "Sqrt": torch.sqrt,
                  "Recip": torch.reciprocal}[op]
            r = cf(fn, (ins[0],))
        elif op == "Cast":
            sat = n.srcs[0].dtype.is_float and n.arg.is_int
            r = cf(cast_op, (ins[0], _TORCH_NAMES[n.arg.name], sat))
        elif op == "Mod":
            r = cf(mod_op, (ins[0], ins[1], where(n)))     # a 0 divisor names its model node
        elif op in ("Add", "Mul", "Div", "LessThan"):
            fn = {"Add": torch.add, "Mul": torch.mul, "Div": torch.div, "LessThan": torch.lt}[op]
            r = cf(fn, (ins[0], ins[1]))
        elif op == "Where":
            r = cf(torch.where, tuple(ins))
        elif op == "SumReduce":
            spec = scan_of(n) if id(n.srcs[0]) in fused else None
            if spec is not None and spec.n > 0:
                acc = n.dtype.accumulator if n.dtype.is_float else n.dtype
                r = cf(prefix_sum_op, (env[id(spec.operand)], spec.k, spec.exclusive, spec.reverse,
                                       _TORCH_NAMES[acc.name], _TORCH_NAMES[n.dtype.name]))
                scans = True
            elif id(n.srcs[0]) in fused:
                a, b = n.srcs[0].srcs
                r = cf(contraction_op, (env[id(a)], env[id(b)], *_contraction_args(n)))
            else:
                acc = n.dtype.accumulator if n.dtype.is_float else n.dtype
                r = cf(sum_op, (ins[0], tuple(n.arg), _TORCH_NAMES[n.dtype.name], _TORCH_NAMES[acc.name]))
        elif op == "MaxReduce":
            fill = n.dtype.min_value()
            fill = float(fill) if n.dtype.is_float else (bool(fill) if n.dtype.is_bool else int(fill))
            r = cf(max_op, (ins[0], tuple(n.arg), fill))
        elif op == "Gather":
            r = cf(gather_op, (ins[0], ins[1], int(n.arg)))
        elif op == "View":
            v = n.arg
            r = cf(view_op, (ins[0], tuple(v.shape), tuple(v.strides), int(v.offset), v.mask))
        elif op == "Contiguous":
            r = cf(torch.Tensor.contiguous, (ins[0],))
        else:
            raise NotImplementedError(f"graph_module: no torch replay for primitive op {op}")
        env[id(n)] = r
    outs = []
    for name, n in graph.outputs.items():
        outs.append(g.call_function(torch.Tensor.contiguous, (env[id(n)],)))
    g.output(tuple(outs))
    if replace or scans or means:     # a pair's sum, when only its mean read it
        g.eliminate_dead_code()
    return fx.GraphModule(root, g, class_name="LumcGraphModule")


def _first_const(g, root):
    import torch
    if not hasattr(root, "_device_anchor"):
        root.register_buffer("_device_anchor", torch.zeros(()), persistent=False)
    return g.get_attr("_device_anchor")
