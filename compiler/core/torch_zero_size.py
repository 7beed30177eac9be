"""Size 0 of a ``torch.export.Dim`` whose ``min`` is 0 (``Dim("b", max=8)``'s default too).

A size range is searched and probed from 1 (its buckets, probes and checks need a size that
holds elements), and a Dim's ``min=0`` was raised to 1 without a word: a call at size 0 was
refused. :func:`serve_zero_sizes` widens the smallest bucket down to 0 where its plan, re-sized to
0, computes what the module lowered at that size computes on the reference executor (shapes,
values: an empty sum is 0, an empty mean NaN), so a call at 0 returns eager's empty results (the
eager check then runs the module there too); where the lowering or that check fails, one warning
says that size 0 is not compiled and why, and a call at 0 is refused naming the range.
"""
from __future__ import annotations

import warnings

import numpy as np


def serve_zero_sizes(vm, zero: list[str], frontend, examples: dict | None) -> list[str]:
    """Widen ``vm``'s smallest buckets to size 0 in the dims ``zero`` (names); returns those
    widened. ``frontend``: the range compile's (``(None, {dim: size}) -> Frontend``)."""
    if not zero or not vm._ranged:
        return []
    lows = {k: min(key.ranges[k][0] for key, _ in vm._ranged) for k in vm._ranged[0][0].ranges}
    widened = []
    for k in zero:
        try:
            _check_at_zero(vm, frontend, {**lows, k: 0}, lows, examples)
        except Exception as e:      # a lowering that cannot take 0 too: said, not raised
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            warnings.warn(f"lumc: dim {k!r}: size 0 (the Dim's min) is not compiled (its plan at "
                          f"0 against the module lowered there: {reason}); a call at size 0 is "
                          "refused", stacklevel=4)
            continue
        for key, _ in vm._ranged:
            lo, hi, st = key.ranges[k]
            if lo == lows[k]:
                key.ranges[k] = (0, hi, st)
        widened.append(k)
    return widened


def _check_at_zero(vm, frontend, sizes: dict, lows: dict, examples) -> None:
    """The smallest bucket's plan re-sized to ``sizes`` against the graph lowered there, on the
    reference executor, on drawn inputs (raises ValueError naming the first output that
    differs)."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.frontends.models import random_inputs
    fe = frontend(None, sizes)
    graph = fe.graph
    feed = random_inputs({n: tuple(v.shape) for n, v in graph.inputs.items()},
                         {n: v.dtype.np for n, v in graph.inputs.items()}, seed=0,
                         examples=examples)
    want = ReferenceExecutor(graph)(feed)
    key, cm = next((kc for kc in vm._ranged if kc[0].holds(lows)), vm._ranged[0])
    got = vm.instance(key, cm, sizes).run(feed)
    for name in graph.outputs:
        a, b = np.asarray(got[name]), np.asarray(want[name])
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"output {name!r} is {a.dtype}{list(a.shape)} there, the module's "
                             f"{b.dtype}{list(b.shape)}")
        if a.size and not np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-5,
                                      atol=1e-6, equal_nan=True):
            raise ValueError(f"output {name!r} differs from the module lowered there")
