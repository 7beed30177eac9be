"""Stored plans for PyTorch modules: a recompile of the same module reuses the earlier result.

The ONNX path keys a stored plan by the model's bytes; a module has none, and capturing it
(``torch.export``, then lowering) costs more than the whole reuse should. So the key is taken
before capture, from what determines the result:

* every submodule: its class (qualified name, and the bytes of the file defining each class of
  its MRO outside torch, so an edit to a helper function there counts too), its ``training``
  flag, its hooks, and every plain attribute (flags such as ``causal``, a config object through
  its ``to_dict``, a stored function through its code), and the module's ``repr``; every
  parameter and buffer (name, dtype, shape, bytes);
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
import functools
import hashlib
import inspect
import io
import json
import logging
import types
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
    h.update(repr(module).encode())
    h.update(module_fingerprint(module).encode())
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


# module state that is not a tensor but decides what forward computes (``self.causal``, a config)
_SKIPPED_ATTRS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                            "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                            "_load_state_dict_post_hooks", "_backward_hooks", "_backward_pre_hooks",
                            "_is_full_backward_hook", "_compiled_call_impl"})
_TORCH_DIR = str(Path(torch.__file__).parent)
_MAX_DEPTH = 6


def _file_digest(path: str | None, files: dict) -> str:
    """sha256 of a source file's bytes (memoized in ``files``); files inside torch are covered by
    torch's version in the key."""
    if not path or path.startswith(_TORCH_DIR):
        return ""
    if path not in files:
        try:
            files[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
        except OSError:
            files[path] = "?"
    return files[path]


def _code_text(fn, files: dict) -> str:
    """A function by its code (bytecode, constants, names, closure values) and its file."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:   # a builtin (torch.tanh): its module and name
        return (f"{type(fn).__qualname__}:{getattr(fn, '__module__', None)}."
                f"{getattr(fn, '__qualname__', getattr(fn, '__name__', ''))}")
    cells = tuple(_value_text(c.cell_contents, files, 1) if c.cell_contents is not fn else "self"
                  for c in (fn.__closure__ or ()))
    return repr((getattr(fn, "__module__", ""), fn.__qualname__, code.co_code.hex(),
                 repr(code.co_consts), code.co_names, cells,
                 _file_digest(code.co_filename, files)))


def _value_text(x, files: dict, depth: int = 0) -> str:
    """A stable text of a plain attribute value: what it is, never where it lives in memory."""
    if depth > _MAX_DEPTH:
        return "..."
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        return repr(x)
    if isinstance(x, (torch.dtype, torch.device, torch.Size)):
        return str(x)
    if isinstance(x, torch.Tensor):   # an unregistered tensor attribute is a constant of the graph
        a = x.detach().cpu().contiguous()
        return repr((str(a.dtype), tuple(a.shape), hashlib.sha256(
            a.reshape(-1).view(torch.uint8).numpy().tobytes() if a.numel() else b"").hexdigest()))
    if isinstance(x, np.ndarray):
        return repr((str(x.dtype), x.shape, hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()))
    if isinstance(x, torch.nn.Module):   # fingerprinted as a submodule of its own
        return f"module:{type(x).__qualname__}"
    if isinstance(x, (list, tuple, set, frozenset)):
        items = [_value_text(v, files, depth + 1) for v in x]
        return f"{type(x).__name__}[{','.join(sorted(items) if isinstance(x, (set, frozenset)) else items)}]"
    if isinstance(x, dict):
        return "{" + ",".join(sorted(f"{_value_text(k, files, depth + 1)}:{_value_text(v, files, depth + 1)}"
                                     for k, v in x.items())) + "}"
    if isinstance(x, functools.partial):
        return f"partial({_code_text(x.func, files)},{_value_text((x.args, x.keywords), files, depth + 1)})"
    if isinstance(x, (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                      types.BuiltinMethodType)) or (callable(x) and not hasattr(x, "__dict__")):
        return _code_text(x, files)
    memo = files.setdefault(None, {})   # one text per object (a config shared by every layer)
    if id(x) in memo:
        return memo[id(x)][1]
    text = None
    to_dict = getattr(x, "to_dict", None)
    if callable(to_dict):   # a transformers config (its repr is JSON of the same)
        try:
            text = f"{type(x).__qualname__}{_value_text(to_dict(), files, depth + 1)}"
        except Exception:
            text = None
    if text is None and hasattr(x, "__dict__") and not isinstance(x, type):
        text = f"{type(x).__qualname__}{_value_text(vars(x), files, depth + 1)}"
    if text is not None:
        memo[id(x)] = (x, text)   # x held: its id is not reused while the memo lives
        return text
    text = repr(x)
    return type(x).__qualname__ if " at 0x" in text else text


def module_fingerprint(module: torch.nn.Module) -> str:
    """What the module tree computes beyond its tensors, as text (see the module docstring).

    Not covered: a function called by ``forward`` that lives in a file defining none of the
    tree's classes, and global state read at trace time; ``reuse_plan=False`` compiles afresh."""
    files: dict = {}
    parts = []
    hooks = torch.nn.modules.module
    for g in ("_global_forward_hooks", "_global_forward_pre_hooks"):
        parts.extend(_code_text(fn, files) for fn in getattr(hooks, g, {}).values())
    for name, m in module.named_modules(remove_duplicate=False):
        cls = type(m)
        mro = [c for c in cls.__mro__ if c not in (torch.nn.Module, object)]
        srcs = []
        for c in mro:
            try:
                srcs.append(_file_digest(inspect.getsourcefile(c), files))
            except TypeError:
                srcs.append("builtin")
        attrs = {k: v for k, v in vars(m).items() if k not in _SKIPPED_ATTRS}
        for k in [k for k in attrs if "hooks" in k]:   # keyed by a process-wide counter: values only
            attrs[k] = [_value_text(v, files) for v in attrs[k].values()] if isinstance(attrs[k], dict) else attrs[k]
        parts.append(repr((name, cls.__module__, cls.__qualname__, srcs,
                           _value_text(attrs, files))))
    return "\n".join(parts)


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
