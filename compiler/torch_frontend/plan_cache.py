"""Stored plans for PyTorch modules: a recompile of the same module reuses the earlier result.

The ONNX path keys a stored plan by the model's bytes; a module has none, and capturing it
(``torch.export``, then lowering) costs more than the whole reuse should. So the key is taken
before capture, from what determines the result:

* the module's class (qualified name and the source of its ``forward``) and ``repr`` (its
  structure and hyperparameters), every parameter and buffer (name, dtype, shape, bytes);
* the example inputs' structure, shapes, dtypes and non-tensor values, and ``dynamic_shapes``;
* the device name and the versions lumc keys timings by (lumc's source hash, Triton, torch,
  driver: ``lumc.compiler.targets.versions``).

A hit loads the stored artifact (the plan, its report, the numerics recorded when it was chosen)
and the capture's interface (input slots, pytree specs, output names; no graph), and re-times
nothing. Only static-shape compiles are stored: with ``dynamic_shapes`` a new shape needs the
captured graph to lower again. The pipeline's reuse rule applies (``_reuse_plan``): a plan whose
search stopped at its budget is reused only for a budget no larger. The interface is a pickle
in the user's cache dir, trusted as the tuning database beside it is; one that does not load
(another torch, a damaged file) is ignored and overwritten.
"""
from __future__ import annotations

import hashlib
import inspect
import logging
import pickle
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("lumc.torch")

SHELL_FIELDS = ("inputs", "dims", "in_spec", "out_spec", "output_index", "output_names", "source",
                "warnings")


def module_key(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes, device: str,
               ver: dict) -> str:
    """A hex key of everything a compile of ``module`` on these inputs depends on (see the module
    docstring); about 1 s per GB of weights (sha256)."""
    h = hashlib.sha256()
    cls = type(module)
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        src = ""
    h.update(repr((cls.__module__, cls.__qualname__, src, repr(module))).encode())
    for name, t in list(module.state_dict(keep_vars=False).items()):
        a = t.detach()
        h.update(repr((name, str(a.dtype), tuple(a.shape))).encode())
        if a.numel():
            h.update(memoryview(np.ascontiguousarray(a.cpu().reshape(-1).view(torch.uint8).numpy())))
    leaves, spec = torch.utils._pytree.tree_flatten((tuple(args), dict(kwargs)))
    h.update(repr(spec).encode())
    for x in leaves:
        h.update(repr((tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor)
                      else ("value", repr(x))).encode())
    h.update(repr((repr(dynamic_shapes), device, sorted(ver.items()))).encode())
    return h.hexdigest()[:32]


def _storable(x):
    """A flat output as stored: graph outputs (lumc tensors) are recomputed, so not kept."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    return None if type(x).__module__.startswith("lumc") else x


def store(plans: Path, key: str, compiled, spec) -> bool:
    """Write the plan of ``compiled`` (a :class:`~.compiled.CompiledTorchModule`) and
    specialization ``spec`` under ``plans``; False (logged) when anything cannot be written."""
    try:
        plans.mkdir(parents=True, exist_ok=True)
        shell = {f: getattr(compiled.program, f) for f in SHELL_FIELDS}
        shell.update(device=str(compiled.program.device), key=spec.key,
                     op_counts=spec.op_counts, seconds=spec.seconds,
                     flat_outputs=[_storable(x) for x in spec.flat_outputs],
                     capture_s=compiled.capture_s)
        blob = pickle.dumps(shell)
        pickle.loads(blob)   # what cannot come back is not stored
        spec.compiled.save(plans / f"{key}.lumc")
        tmp = plans / f"{key}.torch.tmp"
        tmp.write_bytes(blob)
        tmp.replace(plans / f"{key}.torch")
        return True
    except Exception as e:   # a stored plan is an optimization: never fail the compile for it
        log.info("torch plan not stored: %r", e)
        return False


def load_shell(plans: Path, key: str) -> dict | None:
    """The stored capture interface for ``key``, or None."""
    p = plans / f"{key}.torch"
    if not p.exists() or not (plans / f"{key}.lumc").exists():
        return None
    try:
        return pickle.loads(p.read_bytes())
    except Exception as e:   # unreadable or from another torch: recompile (and overwrite it)
        log.info("torch plan not reused: %r", e)
        return None
