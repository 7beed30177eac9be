"""The compiled module against PyTorch eager, on the example inputs, once per compile.

Every kernel lumc chooses is checked against the reference executor's values of the lowered graph;
that cannot see a lowering that means something other than the module does (SDPA's fully masked
rows once came back NaN where PyTorch gives 0, and every check passed). So a compile of a module
also runs the module itself on the example inputs and compares outputs:

* ``max_rel_error``: over tensor outputs, ``max |got - want| / max |want|`` on the positions both
  hold finite values (float64 arithmetic);
* ``nonfinite_mismatch``: positions where one side is NaN or +-inf and the other is not the same
  (NaN matches NaN, inf its own sign);
* ``passed``: no mismatch and ``max_rel_error`` within the precision policy's tolerance
  (``PrecisionPolicy.rtol``: 1e-4 for fp32, larger for reduced precision, whose quality the gate
  measures separately).

A failure is reported (``report_dict()["eager_check"]``, ``f.report()``) and warned about
(``LumcNumericsWarning``); the compiled module is still returned, since the example may exercise a
case the user accepts (a module that is not deterministic). Outputs that are not tensors are
skipped. The module runs under ``torch.no_grad`` in whatever train/eval mode it was given.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch.utils import _pytree as pytree


class LumcNumericsWarning(UserWarning):
    """The compiled module's outputs differ from PyTorch eager's on the example inputs."""


def compare(want, got, rtol: float) -> dict:
    """The check of ``got`` (the compiled outputs) against ``want`` (eager's), same structure.

    Returns ``{"max_rel_error", "nonfinite_mismatch", "outputs", "passed", "rtol"}``; an output
    whose shape differs counts all its positions as mismatched."""
    wl, gl = pytree.tree_leaves(want), pytree.tree_leaves(got)
    worst, bad, n = 0.0, 0, 0
    for w, g in zip(wl, gl):
        if not isinstance(w, torch.Tensor) or not (w.dtype.is_floating_point or w.dtype.is_complex):
            continue
        n += 1
        w = w.detach().cpu().to(torch.float64)
        g = torch.as_tensor(g).detach().cpu().to(torch.float64)
        if w.shape != g.shape:
            bad += max(w.numel(), 1)
            continue
        fw, fg = torch.isfinite(w), torch.isfinite(g)
        same = (torch.isnan(w) & torch.isnan(g)) | (~fw & ~fg & (w == g))
        bad += int(((fw != fg) | (~fw & ~fg & ~same)).sum())
        both = fw & fg
        if both.any():
            scale = float(w[both].abs().max())
            err = float((w[both] - g[both]).abs().max())
            worst = max(worst, err / scale if scale > 0 else err)
    return {"max_rel_error": worst, "nonfinite_mismatch": bad, "outputs": n, "rtol": rtol,
            "passed": bad == 0 and worst <= rtol}


def check_against_eager(module: torch.nn.Module, args: tuple, kwargs: dict, got, rtol: float,
                        source: str = "") -> dict:
    """Run ``module`` eagerly, compare (:func:`compare`), warn on a failure; never raises for a
    module that fails to run eagerly a second time (``{"skipped": reason}``)."""
    try:
        with torch.no_grad():
            want = module(*args, **kwargs)
    except Exception as e:   # the module ran when captured; a second run may consume state
        return {"skipped": f"the module did not run eagerly again: {type(e).__name__}: {e}"}
    res = compare(want, got, rtol)
    if not res["passed"]:
        warnings.warn(f"lumc: {source or type(module).__name__}: the compiled module differs from "
                      f"PyTorch eager on the example inputs: max rel error "
                      f"{res['max_rel_error']:.3g} (tolerance {rtol:g}), "
                      f"{res['nonfinite_mismatch']} positions NaN/inf on one side only",
                      LumcNumericsWarning, stacklevel=_outside_lumc())
    return res


def _outside_lumc() -> int:
    """The ``stacklevel`` of the first caller outside lumc (the user's ``lumc.compile`` line)."""
    root = Path(__file__).resolve().parents[2]
    ours = tuple(str(root / d) + "/" for d in ("compiler", "ir", "rewrites", "backends"))
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(ours):
        frame, level = frame.f_back, level + 1
    return level
