"""Stored plans for PyTorch modules: a recompile of the same module reuses the earlier result.

The ONNX path keys a stored plan by the model's bytes; a module has none, and capturing it
(``torch.export``, then lowering) costs more than the whole reuse should. So the key is taken
before capture, from what determines the result:

* the module's class (qualified name and the source of its ``forward``) and ``repr`` (its
  structure and hyperparameters), every parameter and buffer (name, dtype, shape, bytes);
* the example inputs' structure, shapes, dtypes and non-tensor values, and ``dynamic_shapes``;
* the device name and the versions lumc keys timings by (lumc's source hash, Triton, torch,
  driver: ``lumc.compiler.runtime.targets.versions``).

A hit loads the stored artifact (the plan, its report, the numerics recorded when it was chosen)
and the capture's interface (input slots, pytree specs, output names; no graph), and re-times
nothing. Only static-shape compiles are stored: with ``dynamic_shapes`` a new shape needs the
captured graph to lower again. The pipeline's reuse rule applies (``plan_reuse._reuse_plan``): a plan whose
search stopped at its budget is reused only for a budget no larger. The interface is stored as
JSON (pytree specs through ``torch.utils._pytree.treespec_dumps``, constant outputs as ``.npy``
bytes read with ``allow_pickle=False``): nothing lumc reads is ever unpickled, so a damaged or
hostile cache file is data, not code. One that does not load (another torch, a damaged file) is
ignored and overwritten.
"""
from __future__ import annotations

import base64
import hashlib
import inspect
import io
import json
import logging
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
        blob = json.dumps(_encode_shell(shell)).encode()
        _decode_shell(json.loads(blob))   # what cannot come back is not stored
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
        return _decode_shell(json.loads(p.read_bytes()))
    except Exception as e:   # unreadable or from another torch: recompile (and overwrite it)
        log.info("torch plan not reused: %r", e)
        return None


# ---- the JSON form of a capture interface ----------------------------------------------------------
def _encode_value(x):
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, torch.Tensor):
        from lumc.backends.triton.launch import to_numpy
        buf = io.BytesIO()
        a = to_numpy(x)
        np.save(buf, a.view(np.uint16) if a.dtype.name == "bfloat16" else a, allow_pickle=False)
        return {"npy": base64.b64encode(buf.getvalue()).decode(), "bf16": a.dtype.name == "bfloat16"}
    if isinstance(x, (list, tuple)):
        return {"seq": [_encode_value(v) for v in x], "tuple": isinstance(x, tuple)}
    raise TypeError(f"cannot store a {type(x).__name__} in a torch plan")


def _decode_value(x):
    if isinstance(x, dict) and "npy" in x:
        a = np.load(io.BytesIO(base64.b64decode(x["npy"])), allow_pickle=False)
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.view(torch.bfloat16) if x.get("bf16") else t
    if isinstance(x, dict) and "seq" in x:
        vals = [_decode_value(v) for v in x["seq"]]
        return tuple(vals) if x.get("tuple") else vals
    return x


def _encode_shell(shell: dict) -> dict:
    from torch.utils._pytree import treespec_dumps
    if shell["dims"]:
        raise TypeError("dynamic dims are not stored")
    inputs = []
    for slot in shell["inputs"]:
        if slot.dims is not None and not all(isinstance(d, int) for d in slot.dims):
            raise TypeError("symbolic input dims are not stored")
        inputs.append({"name": slot.name, "dims": None if slot.dims is None else list(slot.dims),
                       "dtype": None if slot.dtype is None else slot.dtype.name,
                       "value": _encode_value(slot.value)})
    key = [[list(k[0]), str(k[1]).replace("torch.", "")] if k[0] != "value" else list(k)
           for k in shell["key"]]
    return {"inputs": inputs, "in_spec": None if shell["in_spec"] is None else
            treespec_dumps(shell["in_spec"]),
            "out_spec": None if shell["out_spec"] is None else treespec_dumps(shell["out_spec"]),
            "output_index": [int(i) for i in shell["output_index"]],
            "output_names": [str(n) for n in shell["output_names"]], "source": shell["source"],
            "warnings": [str(w) for w in shell["warnings"]], "device": shell["device"], "key": key,
            "op_counts": {str(k): int(v) for k, v in shell["op_counts"].items()},
            "seconds": float(shell["seconds"]), "capture_s": float(shell["capture_s"]),
            "flat_outputs": [_encode_value(v) for v in shell["flat_outputs"]]}


def _decode_shell(d: dict) -> dict:
    from torch.utils._pytree import treespec_loads
    from lumc.compiler.frontends.torch_frontend.capture import InputSlot
    from lumc.ir import dtypes as dt
    inputs = [InputSlot(i["name"], None if i["dims"] is None else tuple(int(x) for x in i["dims"]),
                        None if i["dtype"] is None else dt.BY_NAME[i["dtype"]],
                        _decode_value(i["value"])) for i in d["inputs"]]
    key = tuple((tuple(k[0]), getattr(torch, k[1])) if k[0] != "value" else tuple(k)
                for k in d["key"])
    return {"inputs": inputs, "dims": {},
            "in_spec": None if d["in_spec"] is None else treespec_loads(d["in_spec"]),
            "out_spec": None if d["out_spec"] is None else treespec_loads(d["out_spec"]),
            "output_index": list(d["output_index"]), "output_names": list(d["output_names"]),
            "source": d["source"], "warnings": list(d["warnings"]), "device": str(d["device"]),
            "key": key, "op_counts": dict(d["op_counts"]), "seconds": float(d["seconds"]),
            "capture_s": float(d["capture_s"]),
            "flat_outputs": [_decode_value(v) for v in d["flat_outputs"]]}
