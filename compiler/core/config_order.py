"""The configs a kernel is searched over, in the order the search tries them
(``lumc.compiler.core.measure.KernelMeasurer`` asks for them): each Triton config at every operand
precision the compile's policy allows, the default first, then the rest by simulated time with
Triton's known-good tiles in every other place.
"""
from __future__ import annotations

import itertools

from lumc.backends.simulator import simulate_kernel_time
from lumc.ir.kernels import Kernel


def precision_variants(cfgs: list, tk, spec) -> list:
    """Triton contraction configs at every operand precision the compile's policy allows
    (``spec.dot_precisions``; the first allowed precision is the default), the default config's
    variants first; configs of kernels without a ``tl.dot`` are returned as they are. fp8 needs
    ``BLOCK_K >= 32`` (the e4m3 MMA's K step on Hopper)."""
    from lumc.backends.triton import configs as cf
    problem = tk.rendered.problem if tk is not None else {}
    d = problem.get("dot_dtype")
    if not cfgs or d is None:
        return cfgs
    from lumc.backends.triton.dot_precision import ATTENTION_RENDERABLE, RENDERABLE
    table = ATTENTION_RENDERABLE if tk.rendered.config_space == "attention" else RENDERABLE
    allowed = [p for p in spec.dot_precisions.get(d, (cf.DEFAULT_PRECISION[d],)) if p in table[d]]
    allowed = allowed or [cf.DEFAULT_PRECISION[d]]

    def ok(c, p):
        return p != "fp8" or dict(c.blocks).get("BLOCK_K", 32) >= 32

    first = [cf.with_precision(cfgs[0], problem, p) for p in allowed if ok(cfgs[0], p)]
    rest = [cf.with_precision(c, problem, p) for c in cfgs[1:] for p in allowed if ok(c, p)]
    return list(dict.fromkeys(first + rest)) or [cf.with_precision(cfgs[0], problem, allowed[0])]


def ordered_configs(kernel: Kernel, tk, spec) -> list:
    """A kernel's Triton configs in the order the search tries them: the default, then the
    others by their simulated time on ``spec`` (fastest first; the simulator as a cost model, as
    Inductor's and Luminal's searches rank by an analytical model before timing), with the
    known-good configs of Triton's tutorials for the form (``configs.known_good``, themselves by
    simulated time) taking every other place until they run out: the model's best and the
    tutorials' tiles are both tried early. The known-good ones used to come all first: nine
    tutorial tiles without split-K for GPT-2's down-projection (M 128, K 3072, N 768; 12 output
    tiles on 132 SMs), 59-137 us simulated, spent the search's patience (``search.PATIENCE``
    tries in a row without a better time) before its first split-K config (15.3 us) was tried."""
    from lumc.backends.triton import configs as cf
    space = tk.config_space()
    default = tk.default_config()
    good = [c for c in cf.known_good(tk.rendered.config_space, tk.rendered.problem) if c in space]

    def sim(c) -> float:
        try:
            return simulate_kernel_time(kernel, c.kwargs(), spec)
        except ValueError:              # cannot run (shared memory): last
            return float("inf")
    rest = sorted((c for c in space if c != default and c not in good), key=sim)
    good = sorted(good, key=sim)
    mixed = [c for pair in itertools.zip_longest(rest, good) for c in pair if c is not None]
    return list(dict.fromkeys([default, *mixed]))
