"""Stored plans for PyTorch modules: a recompile of the same module reuses the earlier result.

The ONNX path keys a stored plan by the model's bytes; a module has none, and capturing it
(``torch.export``, then lowering) costs more than the whole reuse should. So the key is taken
before capture, from what determines the result:

* every submodule: its class (qualified name, the bytes of the file defining each class of its
  MRO outside torch, and the classes' own attributes: a class-level flag, a patched ``forward``),
  its ``training`` flag, its hooks, its plain attributes (flags such as ``causal``, a config
  through its ``to_dict``, a stored function through its code, closure and, for the user's own
  code, the globals it names; a module held in a plain list in full), and every parameter and
  buffer, the non-persistent ones too (name, dtype, shape, bytes); the module's ``repr``;
* the example inputs' structure, shapes, dtypes, devices and non-tensor values, the devices of
  the module's tensors, and ``dynamic_shapes``;
* torch's default dtype and device (``torch.ones(3)`` in ``forward`` is float64 under
  ``torch.set_default_dtype(torch.float64)``);
* the device name and the versions lumc keys timings by (lumc's source hash, Triton, torch,
  driver: ``lumc.compiler.runtime.targets.versions``).

A hit loads the stored artifact (the plan, its report, the numerics recorded when it was chosen)
and the capture's interface (input slots, pytree specs, output names; no graph), and re-times
nothing. Only static-shape compiles are stored: with ``dynamic_shapes`` a new shape needs the
captured graph to lower again. The pipeline's reuse rule applies (``plan_reuse._reuse_plan``): a plan whose
search stopped at its budget is reused only for a budget no larger. The interface is stored as
JSON (pytree specs through ``torch.utils._pytree.treespec_dumps``, constant outputs as ``.npy``
bytes read with ``allow_pickle=False``): nothing lumc reads is ever unpickled, so a damaged or
hostile cache file is data, not code. The file carries the sha256 of its content, and a reuse
checks it against the plan it stands beside and the call (:func:`matches`). One that does not load
or match (another torch, a damaged or edited file) is ignored and overwritten.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import inspect
import io
import json
import logging
import sys
import sysconfig
import types
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("lumc.torch")

SHELL_FIELDS = ("inputs", "dims", "in_spec", "out_spec", "output_index", "output_names", "source",
                "warnings", "grad_outputs")


def module_key(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes, device: str,
               ver: dict, digests: dict | None = None, values: bool = False) -> str:
    """A hex key of everything a compile of ``module`` on these inputs depends on (see the module
    docstring); about 1 s per GB of weights (sha256). ``digests``, where given, receives
    ``{id(tensor): tensor_digest(tensor)}`` of the tensors it hashed. ``values``: the example
    inputs' values too (a reduced precision: its quality gate, which decides the plan's
    precision, runs on them)."""
    h = hashlib.sha256()
    h.update(repr(module).encode())
    h.update(module_fingerprint(module, digests).encode())
    leaves, spec = torch.utils._pytree.tree_flatten((tuple(args), dict(kwargs)))
    h.update(repr(spec).encode())
    for x in leaves:   # the device too: the outputs go where the inputs (or weights) are
        h.update(repr((tuple(x.shape), str(x.dtype), str(x.device)) if isinstance(x, torch.Tensor)
                      else ("value", repr(x))).encode())
        if values and isinstance(x, torch.Tensor):
            h.update(tensor_digest(x).encode())
    h.update(repr(sorted({str(t.device) for t in list(module.parameters())
                          + list(module.buffers())})).encode())
    # torch's default dtype and device decide what torch.ones(3) / torch.arange(3) / 3 in
    # forward make
    h.update(repr((repr(dynamic_shapes), device, sorted(ver.items()), sys.version,
                   str(torch.get_default_dtype()), str(torch.get_default_device()))).encode())
    return h.hexdigest()[:32]


# module state that is not a tensor but decides what forward computes (``self.causal``, a config)
_SKIPPED_ATTRS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                            "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                            "_load_state_dict_post_hooks", "_backward_hooks", "_backward_pre_hooks",
                            "_is_full_backward_hook", "_compiled_call_impl"})
_SKIPPED_CLASS_ATTRS = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                                  "__annotations__", "__slots__", "__firstlineno__",
                                  "__static_attributes__", "__orig_bases__", "__parameters__"})
_TORCH_DIR = str(Path(torch.__file__).parent)
_MAX_DEPTH = 64            # nesting of plain values followed (cycles are cut by identity)
_MAX_VALUES = 200_000      # values visited per fingerprint; past it the key is never reused


_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def _installed(path: str) -> bool:
    """A file of an installed package (torch, transformers ...) or of Python's standard library,
    not the user's own code; also frozen or builtin code (``<frozen ...>``, no path). Code typed
    at a REPL (``<stdin>``) or run by ``python -c`` or ``exec`` (``<string>``) is the user's: with
    no file to hash, its constants, closures and globals are all the key has of it (``x / 3`` and
    ``x / 7`` are one bytecode)."""
    return (not path or path.startswith("<frozen") or path.startswith(_TORCH_DIR)
            or path.startswith(_STDLIB) or "site-packages" in path or "dist-packages" in path)


def _library_class(cls: type, path: str) -> bool:
    """A class of an installed package, not the user's: by its file, or, for a class with none
    (defined at a REPL, by ``python -c`` or ``exec``), by its methods' code."""
    if path:
        return _installed(path)
    return not any(isinstance(f, types.FunctionType) and not _installed(f.__code__.co_filename)
                   for f in vars(cls).values())


class _Fingerprint:
    """Text of what a module tree computes beyond its registered tensors' values.

    Follows plain values (flags, configs through ``to_dict``, containers, objects' ``__dict__``
    and their classes' attributes), functions by their code, closures and, for the user's own
    code, the globals they name (a module-level flag, a helper in another file), tensors by their
    bytes, and modules held outside the tree in full. Installed packages' code is taken at its
    file's bytes (torch at its version, in the key): their globals are not followed."""

    def __init__(self):
        self.files: dict[str, str] = {}
        self.memo: dict[int, tuple] = {}      # id -> (object kept alive, text)
        self.active: set[int] = set()
        self.classes: dict = {}
        self.visited = 0
        self.exhausted = False

    def file(self, path: str | None) -> str:
        if not path or path.startswith(_TORCH_DIR):
            return ""
        if path not in self.files:
            try:
                self.files[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
            except OSError:
                self.files[path] = "?"
        return self.files[path]

    def code(self, code: types.CodeType, globs: dict | None, depth: int) -> str:
        """A code object: bytecode, constants (nested code too), names, file; for the user's own
        code, the values of the globals it names."""
        consts = [self.code(c, globs, depth + 1) if isinstance(c, types.CodeType)
                  else self.value(c, depth + 1) for c in code.co_consts]   # sets sorted
        named = ""
        if globs is not None and not _installed(code.co_filename):
            named = ",".join(f"{n}={self._global(globs[n], code.co_names, depth + 1)}"
                             for n in code.co_names if n in globs)
        return repr((code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
                     code.co_code.hex(), consts, code.co_names, self.file(code.co_filename), named))

    def _global(self, g, names: tuple, depth: int) -> str:
        """A global the user's code names: its value, or for a module (``helpers.act``), the
        module's file and the values of the attributes the code also names (installed packages:
        their name; their versions are not followed)."""
        if not isinstance(g, types.ModuleType):
            return self.value(g, depth)
        path = getattr(g, "__file__", None) or ""
        if not path or _installed(path):
            return g.__name__
        attrs = {n: getattr(g, n) for n in names if hasattr(g, n) and not isinstance(getattr(g, n), types.ModuleType)}
        return f"module({g.__name__},{self.file(path)},{self.value(attrs, depth)})"

    def function(self, fn, depth: int) -> str:
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        if code is None:   # a builtin (torch.tanh): its module and name
            return (f"{type(fn).__qualname__}:{getattr(fn, '__module__', None)}."
                    f"{getattr(fn, '__qualname__', getattr(fn, '__name__', ''))}")
        if _installed(code.co_filename):   # a library's function: its code and file, not its state
            return (f"fn({getattr(fn, '__module__', '')}.{fn.__qualname__},{code.co_code.hex()},"
                    f"{self.file(code.co_filename)})")
        cells = [self.value(c.cell_contents, depth + 1) if c.cell_contents is not fn else "self"
                 for c in (fn.__closure__ or ())]
        defaults = self.value((fn.__defaults__, fn.__kwdefaults__), depth + 1)
        return (f"fn({getattr(fn, '__module__', '')},{self.code(code, fn.__globals__, depth)},"
                f"{cells},{defaults})")

    def klass(self, cls: type, depth: int) -> str:
        """A class: its name, its file, and its own attributes (methods by code) down the MRO,
        stopping at torch's classes (as a digest, once per class)."""
        if ("class", cls) in self.classes:
            return self.classes[("class", cls)]
        self.classes[("class", cls)] = f"<class {cls.__qualname__}>"   # a class naming itself
        parts = []
        for c in cls.__mro__:
            if c is object or c.__module__.startswith("torch"):
                parts.append(c.__qualname__)
                continue
            try:
                path = inspect.getsourcefile(c) or ""
            except (TypeError, OSError):   # a class of `python -c`, stdin or a REPL: no file
                path = ""
            src = self.file(path) if path else "builtin"
            own = {k: v for k, v in vars(c).items() if k not in _SKIPPED_CLASS_ATTRS}
            if _library_class(c, path):   # a library's: its file and plain class-level flags
                own = {k: v for k, v in own.items()
                       if v is None or isinstance(v, (bool, int, float, str))}
            parts.append(f"{c.__module__}.{c.__qualname__}@{src}{self.value(own, depth + 1)}")
        text = f"{cls.__qualname__}:" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]
        self.classes[("class", cls)] = text
        return text

    def tensor(self, x) -> str:
        hit = self.memo.get(id(x))
        if hit is not None and hit[0] is x:   # a tied weight (GPT-2's embedding and LM head): once
            return hit[1]
        text = self._tensor(x)
        self.memo[id(x)] = (x, text)
        return text

    def _tensor(self, x) -> str:
        a = x.detach().cpu().contiguous()
        h = hashlib.sha256()
        if a.numel():   # the bytes in place (a copy of GPT-2's 500 MB cost 0.3 s per recompile)
            h.update(memoryview(a.reshape(-1).view(torch.uint8).numpy()))
        return repr((str(a.dtype), tuple(a.shape), h.hexdigest()))

    def module(self, m: torch.nn.Module, depth: int = 0) -> str:
        """A module tree: per submodule its name, class, training flag, plain attributes (hooks by
        value: their keys are a process-wide counter), and every parameter and buffer (the
        non-persistent ones too) by name, dtype, shape and bytes."""
        parts = []
        for name, sub in m.named_modules(remove_duplicate=False):
            attrs = {k: v for k, v in vars(sub).items() if k not in _SKIPPED_ATTRS}
            for k in [k for k in attrs if "hooks" in k and isinstance(attrs[k], dict)]:
                attrs[k] = list(attrs[k].values())
            tensors = [(n, self.tensor(t)) for n, t in
                       list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False))]
            parts.append(repr((name, self.klass(type(sub), depth + 1), self.value(attrs, depth + 1),
                               tensors)))
        return "\n".join(parts)

    def value(self, x, depth: int = 0) -> str:
        """A stable text of a value: what it is, never where it lives in memory."""
        self.visited += 1
        if depth > _MAX_DEPTH or self.visited > _MAX_VALUES:
            self.exhausted = True
            return "..."
        if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
            return repr(x)
        if isinstance(x, (torch.dtype, torch.device, torch.Size, types.ModuleType)):
            return str(x)
        if isinstance(x, torch.Tensor):   # an unregistered tensor attribute is a graph constant
            return self.tensor(x)
        if isinstance(x, np.ndarray):
            return repr((str(x.dtype), x.shape,
                         hashlib.sha256(np.ascontiguousarray(x).reshape(-1).view(np.uint8)).hexdigest()))
        if isinstance(x, types.CodeType):
            return self.code(x, None, depth)
        key = id(x)
        if key in self.memo:
            return self.memo[key][1]
        if key in self.active:            # a cycle: the object is already being written
            return f"<cycle {type(x).__qualname__}>"
        self.active.add(key)
        try:
            # a digest, not the text: a value shared down a deep structure is written once
            text = hashlib.sha256(self._compound(x, depth).encode()).hexdigest()[:20]
        finally:
            self.active.discard(key)
        self.memo[key] = (x, text)       # x held: its id is not reused while the memo lives
        return text

    def _compound(self, x, depth: int) -> str:
        if isinstance(x, torch.nn.Module):   # held outside the tree (a plain list): in full
            return f"module[{self.module(x, depth + 1)}]"
        if isinstance(x, type):
            return f"class[{self.klass(x, depth + 1)}]"
        if isinstance(x, (list, tuple, set, frozenset)):
            items = [self.value(v, depth + 1) for v in x]
            if isinstance(x, (set, frozenset)):
                items.sort()
            return f"{type(x).__name__}[{','.join(items)}]"
        if isinstance(x, dict):
            return "{" + ",".join(sorted(f"{self.value(k, depth + 1)}:{self.value(v, depth + 1)}"
                                         for k, v in x.items())) + "}"
        if isinstance(x, functools.partial):
            return f"partial({self.value(x.func, depth + 1)},{self.value((x.args, x.keywords), depth + 1)})"
        if isinstance(x, (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                          types.BuiltinMethodType)):
            own = self.value(x.__self__, depth + 1) if isinstance(x, types.MethodType) else ""
            return self.function(x, depth) + own
        to_dict = getattr(x, "to_dict", None)
        if callable(to_dict) and not isinstance(x, type):   # a transformers config
            try:
                return f"{self.klass(type(x), depth + 1)}{self.value(to_dict(), depth + 1)}"
            except Exception:
                pass
        if isinstance(x, property):
            return f"property{self.value((x.fget, x.fset, x.fdel), depth + 1)}"
        state = dict(vars(x)) if hasattr(x, "__dict__") else {}
        for c in type(x).__mro__:   # __slots__ values (an object may have both)
            slots = c.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and hasattr(x, name):
                    state[name] = getattr(x, name)
        if state or hasattr(x, "__dict__"):
            return f"{self.klass(type(x), depth + 1)}{self.value(state, depth + 1)}"
        text = repr(x)
        if " at 0x" in text:             # an object whose identity is all its repr shows
            return self.klass(type(x), depth + 1)
        return text


def tensor_digest(x: torch.Tensor) -> str:
    """A tensor's dtype, shape and the sha256 of its bytes, as the plan key takes them."""
    return _Fingerprint()._tensor(x)


def module_fingerprint(module: torch.nn.Module, digests: dict | None = None) -> str:
    """What the module tree computes, as text (see :class:`_Fingerprint`), with the global
    forward hooks. A tree too large or deep to follow gets a text no other call gives, so it is
    never reused. Not covered: state read through a module-level object of an installed package
    (a library's global setting); ``reuse_plan=False`` compiles afresh."""
    fp = _Fingerprint()
    hooks = torch.nn.modules.module
    parts = [fp.value(list(getattr(hooks, g, {}).values()))
             for g in ("_global_forward_hooks", "_global_forward_pre_hooks")]
    parts.append(fp.module(module))
    if digests is not None:
        digests.update({k: text for k, (x, text) in fp.memo.items() if isinstance(x, torch.Tensor)})
    if fp.exhausted:
        import uuid
        log.info("torch plan key: the module's state is too large to fingerprint; not reused")
        parts.append(uuid.uuid4().hex)
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
        body = _encode_shell(shell)
        blob = json.dumps({"sha256": _digest(body), "shell": body}).encode()
        _decode_shell(body)               # what cannot come back is not stored
        from lumc.compiler.core.plan_reuse import stamp_plan_key
        stamp_plan_key(spec.compiled, plans / f"{key}.lumc")
        spec.compiled.save(plans / f"{key}.lumc")
        from lumc.compiler.runtime.artifact import write_atomic
        write_atomic(plans / f"{key}.torch", blob)   # a temp name of its own: two compiles of
        # one module at once each store whole files (a shared '.torch.tmp' was truncated under
        # the other's rename, and failed it), and a killed one leaves no temp file
        from lumc.compiler.runtime.tuning_db import evict_plans
        evict_plans(plans, plans / f"{key}.lumc")
        return True
    except Exception as e:   # a stored plan is an optimization: never fail the compile for it
        log.info("torch plan not stored: %r", e)
        spec.compiled._report.setdefault("warnings", []).append(
            f"plan cache: the plan was not stored for reuse in {plans} ({type(e).__name__}: "
            f"{' '.join(str(e).split())}); a recompile searches again")
        return False


def load_shell(plans: Path, key: str) -> dict | None:
    """The stored capture interface for ``key``, or None."""
    p = plans / f"{key}.torch"
    if not p.exists() or not (plans / f"{key}.lumc").exists():
        return None
    try:
        doc = json.loads(p.read_bytes())
        # a file edited or damaged into other valid JSON (a renamed output, another dtype) would
        # be believed: its digest says whether it is the one stored
        if not isinstance(doc, dict) or doc.get("sha256") != _digest(doc.get("shell")):
            raise ValueError("the stored interface does not match its digest")
        return _decode_shell(doc["shell"])
    except Exception as e:   # unreadable or from another torch: recompile (and overwrite it)
        log.info("torch plan not reused: %r", e)
        return None


def matches(shell: dict, graph, leaves: list, call_key: tuple) -> str | None:
    """Why a stored interface cannot serve this compile's plan and inputs, or None: the call's
    flat arguments (``leaves``, in the stored ``in_spec``'s order; ``call_key`` their shapes), and
    the stored plan's ``graph`` (its inputs by name, shape and dtype; every output it computes
    named by the interface, each name once)."""
    from lumc.compiler.core.torch_compile import same_constant
    slots = shell["inputs"]
    if shell["key"] != call_key or len(slots) != len(leaves):
        return "the stored interface was captured for other arguments"
    tensor_slots = {}
    for slot, leaf in zip(slots, leaves):
        if slot.dims is None:
            if isinstance(leaf, torch.Tensor) or not same_constant(leaf, slot.value):
                return f"input {slot.name!r} was stored as another constant"
        else:
            tensor_slots[slot.name] = slot
    if set(tensor_slots) != set(graph.inputs):
        return "the stored interface names other inputs than the plan"
    for name, slot in tensor_slots.items():
        node = graph.inputs[name]
        if tuple(node.shape) != tuple(slot.dims) or node.dtype != slot.dtype:
            return f"input {name!r} has another shape or dtype in the plan"
    names, index, flat = shell["output_names"], shell["output_index"], shell["flat_outputs"]
    if len(names) != len(index) or len(set(names)) != len(names) or \
            not set(graph.outputs) <= set(names) or any(not 0 <= i < len(flat) for i in index):
        return "the stored outputs do not match the plan's"
    spec = shell["out_spec"]
    if (spec.num_leaves if spec is not None else len(names)) != len(names):
        return "the stored output structure does not match the plan's"
    return None


def _digest(body) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


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
            "grad_outputs": None if shell["grad_outputs"] is None else
            [bool(g) for g in shell["grad_outputs"]],
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
            "grad_outputs": d.get("grad_outputs"),
            "key": key, "op_counts": dict(d["op_counts"]), "seconds": float(d["seconds"]),
            "capture_s": float(d["capture_s"]),
            "flat_outputs": [_decode_value(v) for v in d["flat_outputs"]]}
