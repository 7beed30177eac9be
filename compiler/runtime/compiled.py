"""CompiledModel: the optimized callable lumc returns, and its artifact form.

A compiled model holds the primitive graph (weights included), the chosen program (kernel calls
with their configs), the device it was tuned for, the compile report and the source ONNX model.
Calling it runs the plan: generated Triton kernels on a CUDA GPU, or, without one, the same kernels'
meanings on the CPU executor (numpy), with the same outputs.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from lumc.compiler.runtime.artifact import (check_npz, load_artifact, memory_bytes,
                                            refuse_source_files, save_artifact)
from lumc.compiler.runtime.program import KernelCall, Program, run_program_reference
from lumc.ir import dtypes as dt
from lumc.ir.errors import ArtifactError, InputError
from lumc.ir.graph import Graph
from lumc.ir.kernels import Kernel
from lumc.ir.serialize import graph_from_bytes, graph_to_bytes
from lumc.compiler.runtime.source_refs import SharedWeights, SourceWeights


# bf16, float8, int4... arrays (ml_dtypes, numpy kind 'V') are numeric too
_EXTRA_NP = frozenset(d.np for d in (dt.bf16, *dt.STORAGE_DTYPES))


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of a compiled model's input or output."""
    name: str
    shape: tuple[int, ...]
    dtype: dt.DType

    def __repr__(self) -> str:
        return f"{self.name}: {self.dtype}{list(self.shape)}"


def _jsonable(v):
    if isinstance(v, tuple):
        return {"t": [_jsonable(x) for x in v]}
    return v


def _from_jsonable(v):
    if isinstance(v, dict) and "t" in v:
        return tuple(_from_jsonable(x) for x in v["t"])
    return v


def name_args(names: list[str], args, kwargs) -> dict:
    """A call's inputs by name: one dict, or positional arguments in input order plus keywords.

    Raises:
        InputError: more positional arguments than inputs, or one input given twice.
    """
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        return dict(args[0])
    if len(args) > len(names):
        raise InputError(f"takes {len(names)} input{'s' * (len(names) != 1)} "
                         f"({', '.join(names)}), got {len(args)}")
    given = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in given:
            raise InputError(f"input {k!r} given twice")
        given[k] = v
    return given


def unknown_input_note(source, name: str) -> str:
    """Why ``name`` is no input of the model (``source``: its bytes or ``onnx.ModelProto``):
    ``; --bind NAME=V fixed it at compile time ...`` where the compile bound it (the artifact's
    source model holds it as a constant), ``; the model gives it a default value ...`` where the
    model lists it as an input with an initializer (lumc takes that as a constant), else ``''``."""
    if not source:
        return ""
    import onnx
    from onnx import numpy_helper
    g = (onnx.load_from_string(source) if isinstance(source, bytes) else source).graph
    init = next((t for t in g.initializer if t.name == name), None)
    if init is None:
        return ""
    if name in {i.name for i in g.input}:
        return ("; the model lists it as an input with a default value (an initializer), which "
                "lumc compiles as a constant: it cannot be given")
    v = numpy_helper.to_array(init)
    text = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in np.ravel(v).tolist())
    return f"; --bind {name}={text} fixed it at compile time (compile without it to give it per run)"


class CompiledModel:
    """An optimized callable.

    Attributes:
        graph: the primitive graph (concrete shapes).
        program: the chosen kernel calls, in launch order.
        configs: one kernel config (dict, or None for an untuned kernel) per call.
        device: the device it was tuned for (``sim:h200``, ``cuda:0 NVIDIA H200``).
        simulated: True when its times are simulated.
        source_onnx: the source model's bytes (None when compiled from a torch module).
        source_files: ``(path, what)`` of the files the model was compiled from (set by
            ``lumc.compile`` of a path; see :func:`~lumc.compiler.runtime.artifact.model_files`):
            :meth:`save` never replaces them.
    """
    source_files: tuple = ()

    def __init__(self, graph: Graph, program: Program, configs: list, device: str, simulated: bool,
                 report: dict, source_onnx: bytes | None = None, torch_device: str = "cpu"):
        self.graph = graph
        self.program = program
        self.configs = list(configs)
        self.device = device
        self.simulated = simulated
        self._report = report
        self.source_onnx = source_onnx
        self.torch_device = torch_device
        self._gpu_plan = None
        # {input: "(2, seq, 16) with seq in 2..64"}: a size-range plan's inputs, for its shape
        # errors (set by ``lumc.compiler.runtime.variants``; a fixed-size plan's shapes are its own)
        self.shape_text: dict[str, str] = {}
        # a torch module's output structure, which a call returns (None: one value for one
        # output, else a tuple in output order; ``lumc.compiler.runtime.out_structure``)
        self.structure = None

    # ---- specs -----------------------------------------------------------------------------------
    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo(k, n.shape, n.dtype) for k, n in self.graph.inputs.items()]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo(k, n.shape, n.dtype) for k, n in self.graph.outputs.items()]

    # ---- running ---------------------------------------------------------------------------------
    def _bind(self, args, kwargs, keep_torch: bool = False) -> tuple[dict, bool]:
        """``({input name: array}, whether torch tensors came in)``, checked against the compiled
        inputs (names, shapes, dtypes, index ranges). With ``keep_torch`` a dense torch tensor
        stays one (no host copy of a GPU tensor)."""
        from lumc.backends.triton.launch import torch_dtype
        names = list(self.graph.inputs)
        given = name_args(names, args, kwargs)
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; inputs are {names}"
                             + unknown_input_note(self.source_onnx, unknown[0]))
        is_torch = any(type(v).__module__.startswith("torch") for v in given.values())
        arrays = {}
        for k, v in given.items():
            if keep_torch and dense_tensor(v):
                arrays[k] = v
                continue
            if type(v).__module__.startswith("torch"):
                from lumc.backends.triton.launch import input_to_numpy
                v = input_to_numpy(v, k)
            a = np.asarray(v) if isinstance(v, (np.ndarray, np.generic, list, tuple, int, float,
                                                bool)) else None
            if a is None:
                raise InputError(f"input {k!r} is a {type(v).__name__}, not a numeric array", node=k)
            if a.dtype.kind not in "biuf" and a.dtype not in _EXTRA_NP:
                want = self.graph.inputs[k].dtype.np if k in self.graph.inputs else None
                raise InputError(f"input {k!r} has dtype {a.dtype}, not a number type lumc runs"
                                 + (f"; compiled for {want}" if want is not None else ""), node=k)
            arrays[k] = dt.native_order(a)
        for k, n in self.graph.inputs.items():
            if k not in arrays:
                raise InputError(f"missing input {k!r} ({n.dtype}{list(n.shape)})", node=k)
            a = arrays[k]
            if tuple(a.shape) != n.shape:
                raise InputError(f"input {k!r} has shape {tuple(a.shape)}, compiled for "
                                 f"{self.shape_text.get(k, n.shape)}", node=k)
            numpy_in = isinstance(a, np.ndarray)
            if (a.dtype != n.dtype.np) if numpy_in else (a.dtype != torch_dtype(n.dtype)):
                # in the caller's own words: torch.int64 for a tensor, int64 for an array
                raise InputError(f"input {k!r} has dtype {a.dtype}, compiled for "
                                 f"{n.dtype.np if numpy_in else torch_dtype(n.dtype)}", node=k)
        from lumc.compiler.runtime.index_ranges import check_index_inputs
        check_index_inputs(self._index_uses(), arrays)   # a GPU kernel would read out of bounds
        return arrays, is_torch

    def _index_uses(self) -> dict:
        """The inputs that index a table, from the source model (``lumc.compiler.runtime.index_ranges``)."""
        if getattr(self, "_uses", None) is None:
            self._uses = {}
            if self.source_onnx and any(n.dtype.is_int for n in self.graph.inputs.values()):
                import onnx
                from lumc.compiler.runtime.index_ranges import index_uses
                self._uses = index_uses(onnx.load_from_string(self.source_onnx),
                                        {k: n.shape for k, n in self.graph.inputs.items()})
            elif not self.source_onnx:     # a torch module's graph: from lumc's own Gathers
                from lumc.compiler.runtime.index_ranges import graph_index_uses
                self._uses = graph_index_uses(self.graph)
        return self._uses

    def run(self, inputs: dict) -> dict[str, np.ndarray]:
        """Run on ``{input name: numpy array}``; returns ``{output name: numpy array}``.

        Raises:
            InputError: on a missing or unknown input, or a wrong shape or dtype.
        """
        arrays, _ = self._bind((inputs,), {})
        if self.torch_device.startswith("cuda"):
            return self._plan().run_numpy(arrays)
        return self._execute(arrays)

    def _plan(self):
        """The CUDA buffer plan (made on the first call), its device current."""
        from lumc.compiler.runtime.gpu_plan import GpuPlan
        from lumc.compiler.runtime.targets import set_current_device
        set_current_device(self.torch_device)     # cuda:N: its kernels launch there
        if self._gpu_plan is None:
            self._gpu_plan = GpuPlan(self)
        return self._gpu_plan

    def _execute(self, arrays: dict) -> dict[str, np.ndarray]:
        """The CPU executor on checked numpy inputs."""
        out = run_program_reference(self.program, self.graph, arrays, configs=self.configs)
        return own_outputs(out, arrays)

    def __call__(self, *args, **kwargs):
        """Run on numpy arrays (or torch tensors), positionally in input order or by name.

        Returns one array for a single-output model, else a tuple in output order (a torch
        module's artifact: the module's output structure, and it takes the module's own
        arguments too, nested or not: ``lumc.compiler.runtime.in_structure``); torch tensors
        in give torch tensors out (on the input's device). With grad mode on, a float output that
        reads an input requiring gradients requires them too, and its backward raises
        (``no_backward``: lumc plans are for inference).
        """
        from lumc.compiler.runtime.in_structure import module_call
        args, kwargs = module_call(self.structure, self.graph.inputs, args, kwargs)
        arrays, is_torch = self._bind(args, kwargs, keep_torch=True)
        if is_torch:
            out = self.run_tensors(arrays, checked=True)
            # an output reading an input that requires gradients refuses a backward, as no
            # lumc plan has one (detached, a loss through it silently left the input without)
            from lumc.compiler.runtime.no_backward import refuse_backward
            out = refuse_backward(self._output_reads, arrays, out)
        else:
            out = self.run(arrays)
        if self.structure is not None:
            return self.structure.build(out)
        vals = [out[k] for k in self.graph.outputs]
        return vals[0] if len(vals) == 1 else tuple(vals)

    def _output_reads(self) -> dict[str, set[str]]:
        if getattr(self, "_reads", None) is None:
            from lumc.compiler.runtime.no_backward import output_reads
            self._reads = output_reads(self.graph)
        return self._reads

    def run_tensors(self, tensors: dict, checked: bool = False) -> dict:
        """Run on ``{input name: torch tensor (or array)}``; returns ``{output name: torch
        tensor}`` on the device of the first tensor input. On a CUDA plan the tensors go to the
        plan's input buffers device to device and the outputs stay on the GPU, with no host copy
        or synchronization (:meth:`GpuPlan.run_tensors`); elsewhere through :meth:`run`.

        Raises:
            InputError: as :meth:`run`.
        """
        import torch
        from lumc.backends.triton.launch import to_numpy, to_torch
        if not checked:
            tensors, _ = self._bind((tensors,), {}, keep_torch=True)
        dev = next((str(v.device) for v in tensors.values() if isinstance(v, torch.Tensor)), "cpu")
        if self.torch_device.startswith("cuda"):
            out = self._plan().run_tensors({k: to_torch(v, self.torch_device)
                                            for k, v in tensors.items()})
            return {k: v if str(v.device) == dev else v.to(dev) for k, v in out.items()}
        # checked already: the executor directly (run would check again)
        arrays = {k: to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
        return {k: to_torch(v, dev) for k, v in self._execute(arrays).items()}

    # ---- report ----------------------------------------------------------------------------------
    def report_dict(self) -> dict:
        """The compile report (the JSON ``--report`` writes)."""
        return json.loads(json.dumps(self._report))

    def report(self) -> str:
        """A per-kernel table (form, time, bound, % of bound, FLOPs, bytes, config), then the
        precision the plan runs at, its measured quality and the notes of the compile summary
        (a fallback to a higher precision: ``lumc.compiler.runtime.report_text``)."""
        r = self._report
        unit = "simulated" if self.simulated else "measured"
        lines = [f"lumc compiled model on {self.device} ({unit} times)",
                 f"{'#':>3} {'form':<10} {'time us':>10} {'bound us':>10} {'% bound':>8} "
                 f"{'GFLOP':>9} {'MB':>9}  config"]
        for i, k in enumerate(r.get("per_kernel", [])):
            t = k.get("time_s")
            ts = f"{t * 1e6:10.2f}" if t is not None else f"{'untimed':>10}"
            pct = f"{k['pct_of_bound']:7.1f}%" if k.get("pct_of_bound") is not None else f"{'-':>8}"
            cfg = " ".join(f"{a}={b}" for a, b in (k.get("config") or {}).items())
            lines.append(f"{i:>3} {k['form']:<10} {ts} {k['bound_s'] * 1e6:10.2f} {pct} "
                         f"{k['flops'] / 1e9:9.4f} {k['bytes'] / 1e6:9.3f}  {cfg}")
        bt = r.get("best_time_s")
        nk = len(r.get("per_kernel", []))
        lines.append(f"total: {nk} kernel{'s' * (nk != 1)}, "
                     f"time {bt * 1e6:.2f} us" if bt is not None else "total: untimed")
        lines[-1] += f", bound {r.get('bound_time_s', 0) * 1e6:.2f} us"
        from lumc.compiler.runtime.report_text import precision_lines, sampled_text
        if sampled_text(r):
            lines.append(sampled_text(r)[2:])
        lines += precision_lines(r, exact=True)
        if r.get("unused_inputs"):
            lines.append("unused inputs (accepted, read by nothing): " + ", ".join(r["unused_inputs"]))
        return "\n".join(lines)

    # ---- artifacts -------------------------------------------------------------------------------
    def save(self, path, structure=None) -> str:
        """Write a self-contained ``.lumc`` artifact atomically; returns its hash. ``structure``:
        the outputs' :class:`~lumc.compiler.runtime.out_structure.OutputStructure` to store (default:
        this model's own)."""
        from lumc import __version__
        refuse_source_files(path, self.source_files)
        return save_artifact(path, self._saved_parts(structure), __version__)

    def _saved_parts(self, structure=None) -> dict[str, bytes]:
        parts = self.parts()
        data = structure_bytes(structure or self.structure)
        if data is not None:
            parts[STRUCTURE_PART] = data
        return parts

    def __reduce__(self):
        """Pickled (and deep-copied) as its artifact: what ``save`` and ``lumc.load`` give."""
        return pickled_artifact(self._saved_parts(), self.torch_device)

    def parts(self, shared: SharedWeights | None = None) -> dict[str, bytes]:
        """The artifact's parts (member name -> bytes): graph, weights, plan, report, source.
        ``shared``: the source model's :class:`SharedWeights` when the caller has it (one per
        artifact); a weight that is a source initializer is stored there only."""
        # the program may be bound to a rewritten graph (e-graph candidates): index every node any
        # call touches, plus the model outputs
        touched = {f"__n{i}_{j}": n for i, c in enumerate(self.program.calls)
                   for j, n in enumerate((*c.inputs, *c.outputs))}
        # a weight that is one of the source model's initializers is stored there only
        if shared is None and self.source_onnx:
            shared = SharedWeights(self.source_onnx)
        doc, npz, index = graph_to_bytes(Graph(self.graph.inputs, {**touched, **self.program.outputs}),
                                         shared)
        calls = []
        for c, cfg in zip(self.program.calls, self.configs):
            mdoc, mnpz, _ = graph_to_bytes(c.kernel.meaning)
            calls.append({"form": c.kernel.form, "attrs": [[k, _jsonable(v)] for k, v in c.kernel.attrs],
                          "covers": list(c.kernel.covers), "meaning": mdoc.decode(),
                          "meaning_consts": mnpz.hex(),
                          "inputs": [index[id(n)] for n in c.inputs],
                          "outputs": [index[id(n)] for n in c.outputs], "config": cfg})
        plan = {"device": self.device, "simulated": self.simulated, "calls": calls,
                "outputs": {k: index[id(n)] for k, n in self.program.outputs.items()},
                "label": self.program.label}
        parts = {"graph.json": doc, "consts.npz": npz, "plan.json": json.dumps(plan).encode(),
                 "report.json": json.dumps(self._report, indent=1).encode()}
        if self.source_onnx is not None:
            parts["source.onnx"] = self.source_onnx
        return parts


def _check_node_sizes(path, nodes, sub=None) -> None:
    """A hostile graph may declare values larger than memory: refuse before running it (an
    executor would otherwise be killed for memory half-way instead of failing in one line).
    ``sub``: a range bucket's :class:`~lumc.ir.symbolic.Substitution` to its largest sizes (its
    plan is stored at probe sizes, which no call runs at)."""
    mem = memory_bytes()
    if mem is None:
        return
    from lumc.ir.symbolic import resize_int
    for n in nodes:
        shape = n.shape if sub is None else tuple(resize_int(d, sub) for d in n.shape)
        nbytes = int(np.prod(shape, dtype=object)) * n.dtype.itemsize if sub is not None \
            else n.nbytes
        if nbytes > mem:
            raise ArtifactError(f"{path}: part 'graph.json' declares a {n.op} value of shape "
                                f"{list(shape)} ({nbytes} bytes), more than this machine's "
                                f"{mem} bytes of memory")


def own_outputs(out: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The outputs as arrays of the caller's own, as onnxruntime returns them: an output that is an
    input or a view of one (a graph output that is an input, an ``Identity``, ``Squeeze`` or
    ``Reshape`` of one) or that shares memory with another output (two outputs of one value) is
    copied, so writing into one output changes neither the caller's inputs nor other outputs; so
    is one that is not writeable (a reshape or prefix of a value served as a read-only view of
    its buffer: ``Reshape(y)`` returned before ``y``, a ``Slice`` of a row sum)."""
    seen = list(inputs.values())
    for k, v in out.items():
        if not v.flags.writeable or any(np.may_share_memory(v, s) for s in seen):
            out[k] = v = v.copy()
        seen.append(v)
    return out


def pickled_artifact(parts: dict[str, bytes], torch_device: str):
    """``__reduce__``'s value for a compiled model whose artifact holds ``parts``: unpickling loads
    those bytes as :func:`load` loads a file (checked the same way), on the same device."""
    from lumc import __version__
    from lumc.compiler.runtime.artifact import artifact_bytes
    return _unpickle, (artifact_bytes(parts, __version__)[0], torch_device)


def _unpickle(data: bytes, torch_device: str):
    from lumc.compiler.runtime.targets import _cuda_available
    if torch_device.startswith("cuda") and not _cuda_available():
        torch_device = None        # pickled where a GPU ran it: here, the CPU
    return load("<pickled lumc model>", torch_device, data)


def load(path, device: str | None = None, data: bytes | None = None) -> CompiledModel:
    """Load a ``.lumc`` artifact.

    Args:
        path: the artifact file.
        device: where to execute (``cuda:N`` or ``cpu``); None: a CUDA GPU when the artifact was
            tuned on one and one is present, else the CPU.
        data: the artifact's bytes, read instead of the file (``path`` then names them).
    Raises:
        ArtifactError: a corrupt, foreign or incompatible artifact (one line).
    """
    from lumc import __version__
    from lumc.compiler.runtime.targets import run_device
    device = run_device(device)
    if not isinstance(path, (str, os.PathLike)):
        raise ArtifactError(f"lumc.load: expected the path of a .lumc artifact, got a "
                            f"{type(path).__name__}")
    manifest, parts = load_artifact(path, __version__, data)
    if "variants.json" in parts:     # several plans and the choice between them
        from lumc.compiler.runtime.variants import load_variants
        return load_variants(path, parts, device)
    return from_parts(path, parts, device)


def from_parts(path, parts: dict[str, bytes], device: str | None = None,
               prefix: str = "", sized_at=None,
               weights: SourceWeights | None = None) -> CompiledModel:
    """The compiled model stored in ``parts`` (member name -> verified bytes) under ``prefix``
    (``""``, or a variant's ``v0/``...). ``sized_at``: for a range bucket's plan (stored at its
    probe sizes), the :class:`~lumc.ir.symbolic.Substitution` to the largest sizes it serves,
    where its values' sizes are checked against memory. ``weights``: the source model's
    :class:`SourceWeights`, shared by the plans of one artifact (one parse of ``source.onnx``).

    Raises:
        ArtifactError: a missing or corrupt part (one line, naming it).
    """
    for need in ("graph.json", "consts.npz", "plan.json", "report.json"):
        if prefix + need not in parts:
            raise ArtifactError(f"{path}: artifact lacks {prefix + need}")
    try:
        source = parts.get(prefix + "source.onnx", parts.get("source.onnx"))
        full, nodes = graph_from_bytes(parts[prefix + "graph.json"], parts[prefix + "consts.npz"],
                                       weights or SourceWeights(source))
    except ArtifactError as e:
        raise ArtifactError(f"{path}: part '{prefix}graph.json'/'{prefix}consts.npz': "
                            f"{e.reason}") from None
    from lumc.backends.reference import unallocated
    unread = unallocated(full)        # views, fused products, a prefix sum's [L, L] mask
    _check_node_sizes(path, [n for n in nodes if id(n) not in unread], sized_at)
    graph = Graph(full.inputs, {k: v for k, v in full.outputs.items() if not k.startswith("__n")})
    try:
        plan = json.loads(parts[prefix + "plan.json"])
        report = json.loads(parts[prefix + "report.json"])
        calls, configs = [], []
        meanings: dict = {}    # a repeated layer's kernels share one meaning: read it once
        for i, c in enumerate(plan["calls"]):
            key = (c["meaning"], c["meaning_consts"])
            if key not in meanings:
                mnpz = bytes.fromhex(c["meaning_consts"])
                check_npz(path, mnpz, f"plan.json calls[{i}].meaning_consts")
                meanings[key] = graph_from_bytes(c["meaning"].encode(), mnpz)[0]
            meaning = meanings[key]
            k = Kernel(c["form"], meaning, tuple((a, _from_jsonable(v)) for a, v in c["attrs"]),
                       tuple(c["covers"]))
            calls.append(KernelCall(k, [nodes[i] for i in c["inputs"]], [nodes[i] for i in c["outputs"]]))
            configs.append(c["config"])
        program = Program(calls, {k: nodes[i] for k, i in plan["outputs"].items()}, plan.get("label", ""))
        program.validate()
    except ArtifactError:
        raise
    except Exception as e:
        raise ArtifactError(f"{path}: artifact plan is corrupt ({type(e).__name__}: {e})") from None
    torch_device = "cpu"
    if device is not None:
        torch_device = device
    elif not plan["simulated"]:
        from lumc.compiler.runtime.targets import _cuda_available
        torch_device = "cuda:0" if _cuda_available() else "cpu"
    cm = CompiledModel(graph, program, configs, plan["device"], plan["simulated"], report,
                       parts.get(prefix + "source.onnx", parts.get("source.onnx")), torch_device)
    if prefix + STRUCTURE_PART in parts:
        from lumc.compiler.runtime.out_structure import OutputStructure
        cm.structure = OutputStructure.from_bytes(path, parts[prefix + STRUCTURE_PART],
                                                  list(graph.outputs))
    return cm


STRUCTURE_PART = "structure.json"


def structure_bytes(structure) -> bytes | None:
    """The ``structure.json`` part of an output structure (None: none, or one that cannot be
    stored, which it warns about)."""
    return None if structure is None else structure.to_bytes()


def dense_tensor(v) -> bool:
    """A torch tensor whose data a kernel can read as it is (strided, not meta or quantized)."""
    if not type(v).__module__.startswith("torch"):
        return False
    import torch
    return isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_quantized \
        and v.device.type != "meta"

