"""Control flow, resolved at import time. ``If``: a constant condition inlines the chosen branch
(outer names visible); a runtime condition imports both branches and selects with ``Where`` when
their outputs agree in shape and dtype (both sides are side-effect free, so computing both is only
a cost); otherwise it raises :class:`~lumc.ir.errors.RuntimeIfError`, from which the compiler builds
one variant per branch, selected at run time (``lumc.compiler.core.variants``). ``Scan`` and ``Loop`` are unrolled over their static length / constant trip count."""
from __future__ import annotations

import numpy as np
import onnx

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, constant, handler
from lumc.ir.errors import LumcError, RuntimeIfError, ShapeError, UnsupportedOpError
from lumc.ir.tensor import Tensor, normalize_axis, stack


def _check_if(node: onnx.NodeProto, opset: int) -> str | None:
    for a in node.attribute:
        if a.name in ("then_branch", "else_branch"):
            for o in a.g.output:
                if o.type.WhichOneof("value") not in (None, "tensor_type"):
                    return f"{o.type.WhichOneof('value').replace('_type', '')} branch output"
    return None


@handler("If", check=_check_if)
def _if(ctx: OpContext):
    cond = ctx.input(0)
    v = ctx.importer.folder.value(cond)
    if v is not None:
        if v.size != 1:
            raise UnsupportedOpError(f"condition has {v.size} elements, expected 1")
        branch = ctx.attr("then_branch") if bool(v.reshape(-1)[0]) else ctx.attr("else_branch")
        return ctx.run_subgraph(branch)
    branches = []
    for which in ("then_branch", "else_branch"):
        try:
            branches.append(ctx.run_subgraph(ctx.attr(which)))
        except LumcError as e:   # this branch does not apply at these shapes (a sample-rate switch)
            raise RuntimeIfError(
                f"the condition is known only at run time and {which} does not import at these "
                f"shapes ({e.reason}); fix the condition's input at compile time with --bind "
                "NAME=VALUE (bind= in the API)", if_output=ctx.node.output[0],
                cond=ctx.node.input[0]) from None
    then, other = branches
    c = cond.reshape(())
    outs = []
    for k, (a, b) in enumerate(zip(then, other)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise RuntimeIfError(f"runtime condition with branch output {k} of different shapes "
                                 f"or dtypes ({a.dtype}{list(a.shape)} vs "
                                 f"{b.dtype}{list(b.shape)})", if_output=ctx.node.output[0],
                                 cond=ctx.node.input[0])
        outs.append(c.where(a, b))
    return outs


@handler("Scan")
def _scan(ctx: OpContext):
    """Unrolled over the (static) scan length: each step imports the body with the carried states
    and one slice of every scan input bound, and the per-step scan outputs are stacked."""
    if ctx.opset < 9:
        return _scan_8(ctx)
    body = ctx.attr("body")
    m = ctx.attr("num_scan_inputs")
    ins = [t for t in ctx.inputs]
    n_state = len(ins) - m
    states, scans = ins[:n_state], ins[n_state:]
    in_axes = [normalize_axis(a, x.ndim)
               for a, x in zip(ctx.attr("scan_input_axes", [0] * m), scans)]
    in_dirs = ctx.attr("scan_input_directions", [0] * m)
    n_out = len(body.output) - n_state
    out_axes = ctx.attr("scan_output_axes", [0] * n_out)
    out_dirs = ctx.attr("scan_output_directions", [0] * n_out)
    lengths = {x.shape[a] for x, a in zip(scans, in_axes)}
    if len(lengths) != 1:
        raise ShapeError(f"scan inputs disagree in length: {sorted(lengths)}")
    steps = lengths.pop()
    if steps == 0 and n_out:
        raise UnsupportedOpError("a Scan of length 0 has scan outputs of unknown shape")
    states, per_step = _unrolled_scan(ctx, states, scans, in_axes, in_dirs, steps)
    scanned = []
    for k, seq in enumerate(per_step):
        seq = seq[::-1] if out_dirs[k] else seq
        scanned.append(stack(seq, normalize_axis(out_axes[k], seq[0].ndim + 1)))
    return states + scanned


def _unrolled_scan(ctx: OpContext, states: list[Tensor], scans: list[Tensor], in_axes: list[int],
                   in_dirs: list[int], steps: int) -> tuple[list[Tensor], list[list[Tensor]]]:
    """The body run ``steps`` times (input ``j`` read along ``in_axes[j]``, from its end where
    ``in_dirs[j]``): the final states and, per scan output, its ``steps`` elements in order."""
    body = ctx.attr("body")
    n_state = len(states)
    names = [i.name for i in body.input]
    per_step: list[list[Tensor]] = [[] for _ in range(len(body.output) - n_state)]
    for t in range(steps):
        binds = dict(zip(names, states))
        for j, (x, a) in enumerate(zip(scans, in_axes)):
            i = steps - 1 - t if in_dirs[j] else t
            binds[names[n_state + j]] = x.slice([i], [i + 1], [a]).squeeze([a])
        outs = ctx.run_subgraph(body, binds)
        states = outs[:n_state]
        for k, seq in enumerate(per_step):
            seq.append(outs[n_state + k])
    return states, per_step


def _scan_8(ctx: OpContext):
    """Opset-8 ``Scan``: axis 0 of every state and scan input is a batch, axis 1 of every scan
    input the sequence; batch entry ``b`` runs the opset-9 scan over its first
    ``sequence_lens[b]`` steps (all without it; a compile-time value), and its scan outputs are
    padded with zeros to the longest sequence."""
    m = ctx.attr("num_scan_inputs")
    lens = ctx.const_ints(0, "sequence_lens")
    ins = ctx.inputs[1:]
    states, scans = ins[:len(ins) - m], ins[len(ins) - m:]
    dirs = ctx.attr("directions", [0] * m)
    batch = {x.shape[0] for x in scans} | {x.shape[0] for x in states}
    longest = {x.shape[1] for x in scans}
    if len(batch) != 1 or len(longest) != 1:
        raise ShapeError(f"states and scan inputs disagree in batch {sorted(batch)} or scan inputs "
                         f"in length {sorted(longest)}")
    n, longest = batch.pop(), longest.pop()
    lens = lens or [longest] * n
    if len(lens) != n or not all(0 <= k <= longest for k in lens):
        raise ShapeError(f"sequence_lens {lens} must give one length in [0, {longest}] per batch "
                         f"entry ({n})")
    finals, outs = [], []
    for b in range(n):
        take = [x.slice([b], [b + 1], [0]).squeeze([0]) for x in states + scans]
        st, per_step = _unrolled_scan(ctx, take[:len(states)], take[len(states):], [0] * m, dirs,
                                      lens[b])
        finals.append(st)
        outs.append(per_step)
    # one element of each scan output (its shape and dtype): from a batch entry that ran a step,
    # else from a step on zeros that nothing reads (a zero-size batch)
    n_out = len(ctx.attr("body").output) - len(states)
    ran = [p for p in outs if p and p[0]]
    if not n_out or ran:
        elems = [seq[0] for seq in ran[0]] if ran else []
    else:
        zeros = [Tensor.full(x.shape[1:], 0, x.dtype) for x in states] + \
            [Tensor.full((1,) + x.shape[2:], 0, x.dtype) for x in scans]
        _, probe = _unrolled_scan(ctx, zeros[:len(states)], zeros[len(states):], [0] * m, dirs, 1)
        elems = [seq[0] for seq in probe]
    scanned = []
    for e, per_entry in zip(elems, zip(*outs) if outs else [()] * len(elems)):
        rows = [(stack(seq, 0) if seq else Tensor.full((0,) + e.shape, 0, e.dtype))
                .pad([(0, longest - len(seq))] + [(0, 0)] * e.ndim) for seq in per_entry]
        scanned.append(stack(rows, 0) if rows else Tensor.full((0, longest) + e.shape, 0, e.dtype))
    final = [stack([f[i] for f in finals], 0) if finals else Tensor.full(x.shape, 0, x.dtype)
             for i, x in enumerate(states)]
    return final + scanned


_MAX_UNROLL = 4096


@handler("Loop")
def _loop(ctx: OpContext):
    """Unrolled: the trip count and every step's condition must be known at import time (a
    condition computed from runtime data is unsupported). Scan outputs stack along a new axis 0."""
    body = ctx.attr("body")
    trips = ctx.const_scalar(0, "trip count") if ctx.has_input(0) else None
    cond = bool(ctx.const_scalar(1, "condition")) if ctx.has_input(1) else True
    carried = list(ctx.inputs[2:])
    names = [i.name for i in body.input]
    n_out = len(body.output) - 1 - len(carried)
    per_step: list[list[Tensor]] = [[] for _ in range(n_out)]
    i = 0
    while cond and (trips is None or i < trips):
        if i >= _MAX_UNROLL:
            raise UnsupportedOpError(f"Loop runs more than {_MAX_UNROLL} steps; lumc unrolls loops")
        binds = dict(zip(names, [constant(np.array(i, np.int64)), constant(np.array(cond))]
                         + carried))
        outs = ctx.run_subgraph(body, binds)
        c = ctx.importer.folder.value(outs[0])
        if c is None:
            raise UnsupportedOpError("the loop condition depends on runtime data")
        cond = bool(np.asarray(c).reshape(-1)[0])
        carried = outs[1:1 + len(carried)]
        for k in range(n_out):
            per_step[k].append(outs[1 + len(carried) + k])
        i += 1
    if n_out and not per_step[0]:
        raise UnsupportedOpError("a Loop that runs zero steps has scan outputs of unknown shape")
    return carried + [stack(p, 0) for p in per_step]
