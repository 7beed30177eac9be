"""Inputs for a kernel's numerics check where the example's say nothing.

A kernel is checked on the values the model's example inputs give at its boundary
(``measure.Measurer._run_check``). Where none of its float outputs holds a finite reference value
there (all-NaN or all-inf example inputs, a mask row the example fills with -inf throughout), the
comparison is vacuous: a kernel that computes garbage but propagates NaN, or writes nothing, passes
it (``max_rel_error`` requires only that NaN and inf meet NaN and inf). :func:`drawn_check_inputs`
replaces its float inputs by a seeded N(0, 1) draw of the same shapes and dtypes (its integer
inputs, which may index tables, are kept as captured; constants are kept) and gives the reference
values of the kernel's meaning on them (``ReferenceExecutor``), which the check then uses.
"""
from __future__ import annotations

import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.ir.kernels import Kernel


def vacuous(refs: list, outputs: list) -> bool:
    """True when the kernel has float outputs and none of them holds a finite reference value
    (an empty output counts as saying nothing too).

    Args:
        refs: the reference value of each output (numpy arrays, any float dtype incl. bf16).
        outputs: the output nodes (``KernelCall.outputs``), for their dtypes.
    """
    floats = [np.asarray(r) for r, n in zip(refs, outputs) if n.dtype.is_float]
    return bool(floats) and not any(
        np.isfinite(r.astype(np.float64)).any() for r in floats if r.size)


def drawn_check_inputs(kernel: Kernel, call, ins: list, seed: int = 0) -> tuple[list, list]:
    """``(inputs, references)`` for the check: ``ins`` with each float input that is not a
    ``Constant`` redrawn from N(0, 1) (seeded; same shape and dtype), and the kernel meaning's
    outputs on them, in ``call.outputs`` order.

    Raises:
        whatever the reference executor raises on these inputs (an index out of range cannot
        come from a float draw: integer inputs are kept).
    """
    rng = np.random.default_rng(seed)
    drawn = []
    for x, n in zip(ins, call.inputs):
        a = np.asarray(x)
        if n.op != "Constant" and n.dtype.is_float:
            a = rng.standard_normal(a.shape).astype(a.dtype)
        drawn.append(a)
    feed = {ph.arg.name: a for ph, a in zip(kernel.inputs, drawn)}
    out = ReferenceExecutor(kernel.meaning)(feed)
    return drawn, [out[k] for k in kernel.meaning.outputs]
