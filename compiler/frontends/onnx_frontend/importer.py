"""``import_onnx``: an ONNX model to a lumc primitive graph with concrete shapes.

The importer walks the graph once, in order. Each node's handler builds IR from the node's input
tensors; every result that does not depend on a graph input is folded to a constant on the spot
(:mod:`.folding`), so shape arithmetic is resolved before the handlers that need it. ``If`` nodes
with a constant condition are replaced by the chosen branch, imported inline with the outer scope
visible. Declared output shapes are compared with the inferred ones (the inferred shape wins; each
mismatch is a warning); a declared dtype that differs is a ModelError.
"""
from __future__ import annotations

import os
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import onnx

from lumc.compiler.frontends.onnx_frontend.folding import ConstantFolder
from lumc.compiler.frontends.onnx_frontend.loader import (TensorSpec, default_opset, has_shape,
                                                initializer_names, load_model, tensor_array,
                                                value_spec)
from lumc.compiler.frontends.onnx_frontend.registry import HANDLERS, OpContext, constant
from lumc.compiler.frontends.onnx_frontend.support import check_supported
from lumc.compiler.frontends.onnx_frontend.type_constraints import check_input_types
from lumc.ir.errors import InputError, LumcError, ModelError
from lumc.ir.graph import Graph, input_node
from lumc.ir.provenance import record
from lumc.ir.tensor import Tensor


@dataclass
class ImportedModel:
    """The result of :func:`import_onnx`.

    Attributes:
        graph: the primitive graph; inputs keyed by ONNX input name (initializers excluded),
            outputs keyed by ONNX output name.
        inputs: the concrete input specs used.
        outputs: the inferred output specs.
        opset: the model's default-domain opset.
        warnings: one line per declared output shape that disagreed with the inferred one.
    """
    graph: Graph
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: int
    warnings: list[str] = field(default_factory=list)


class GraphImporter:
    """Imports the nodes of one model (and its inlined subgraphs) into Tensors.

    Attributes:
        opset: the default-domain opset.
        folder: the constant folder shared by every scope.
        env: the current scope, ``{ONNX value name: Tensor}`` (a ChainMap inside subgraphs).
    """

    def __init__(self, opset: int, base_dir: str | None = None):
        self.opset = opset
        self.folder = ConstantFolder()
        self.env: ChainMap = ChainMap()
        self.base_dir = base_dir

    def add_initializers(self, graph: onnx.GraphProto) -> None:
        for t in graph.initializer:
            self.env[t.name] = constant(tensor_array(t, self.base_dir))

    def run_nodes(self, nodes: Sequence[onnx.NodeProto]) -> None:
        for node in nodes:
            self.run_node(node)

    def run_node(self, node: onnx.NodeProto) -> None:
        ins: list[Tensor | None] = []
        for name in node.input:
            if not name:
                ins.append(None)
                continue
            if name not in self.env:
                raise ModelError(f"input {name!r} is not produced by any earlier node",
                                 node=node.name or None, op=node.op_type, opset=self.opset)
            ins.append(self.env[name])
        check_input_types(node, ins, self.opset)
        ctx = OpContext(node, self.opset, ins, self)
        h = HANDLERS.get(node.op_type)
        if h is None:
            raise ModelError("no handler (check_supported should have caught this)",
                             node=ctx.name, op=node.op_type, opset=self.opset)
        try:
            outs = h.fn(ctx)
            outs = [outs] if isinstance(outs, Tensor) else list(outs)
            produced = {}
            for k, name in enumerate(node.output):
                if not name:
                    continue
                if k >= len(outs) or outs[k] is None:
                    raise ModelError(f"output {k} ({name!r}) is not produced by lumc's handler")
                produced[name] = self.folder.fold(outs[k])
        except LumcError as e:
            if e.node is not None and e.op is not None:
                raise
            err = type(e).__new__(type(e))
            err.__dict__.update(e.__dict__)     # keeps subclass fields (NeedsConstantError.inputs)
            LumcError.__init__(err, e.reason, node=ctx.name, op=node.op_type, opset=self.opset)
            raise err from e
        except (ValueError, IndexError, TypeError, KeyError, AttributeError, ZeroDivisionError,
                OverflowError) as e:
            # malformed attributes or inputs surface as Python errors in the builders; folding
            # raises IndexError for an out-of-range constant gather index
            raise ModelError(f"{type(e).__name__}: {e}", node=ctx.name, op=node.op_type,
                             opset=self.opset) from e
        # run-time errors at these primitives (an index outside its table) name this node
        record((t.node for t in produced.values() if isinstance(t, Tensor)),
               (t.node for t in ins if isinstance(t, Tensor)), ctx.name, node.op_type)
        self.env.update(produced)

    def run_subgraph(self, graph: onnx.GraphProto,
                     bindings: dict[str, Tensor] | None = None) -> list[Tensor]:
        """Import ``graph`` in a child scope of the current one, its formal inputs bound to
        ``bindings`` (loop bodies); returns its outputs in order."""
        outer = self.env
        self.env = outer.new_child()
        try:
            self.env.update(bindings or {})
            self.add_initializers(graph)
            self.run_nodes(graph.node)
            missing = [o.name for o in graph.output if o.name not in self.env]
            if missing:
                raise ModelError(f"subgraph {graph.name!r} outputs {missing} are never produced")
            return [self.env[o.name] for o in graph.output]
        finally:
            self.env = outer


def resolve_input_specs(model: onnx.ModelProto,
                        input_shapes: dict[str, Sequence[int]] | None) -> list[TensorSpec]:
    """Concrete input specs: declared static dims, with dynamic ones taken from ``input_shapes``.

    Raises:
        InputError: a dynamic dim is not given (every such input is named in one message, with
            the ``--shape`` syntax to give it), a given shape contradicts a static dim or the rank,
            or ``input_shapes`` names an unknown input.
    """
    given = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    inits = initializer_names(model.graph)
    real = [vi for vi in model.graph.input if vi.name not in inits]
    unknown = sorted(set(given) - {vi.name for vi in real})
    if unknown:
        raise InputError(f"unknown input{'s' if len(unknown) > 1 else ''} {unknown} in the given "
                         f"shapes; the model's inputs are {[vi.name for vi in real]}")
    out, problems = [], []
    for vi in real:
        spec = value_spec(vi)
        if vi.name in given:
            shape = given[vi.name]
            if any(d < 0 for d in shape):
                raise InputError(f"input {vi.name!r}: negative dim in given shape {shape}",
                                 node=vi.name)
            if has_shape(vi):
                if len(shape) != len(spec.shape):
                    raise InputError(f"input {vi.name!r} has rank {len(spec.shape)} "
                                     f"({_fmt_dims(spec.shape)}), given shape {_fmt_dims(shape)}",
                                     node=vi.name)
                for k, (d, g) in enumerate(zip(spec.shape, shape)):
                    if isinstance(d, int) and d != g:
                        raise InputError(f"input {vi.name!r} dim {k} is {d} in the model, given "
                                         f"{g}", node=vi.name)
            out.append(TensorSpec(vi.name, shape, spec.dtype))
            continue
        if not has_shape(vi):
            problems.append(f"input {vi.name!r} has no declared shape; give it with "
                            f"--shape {vi.name}=<d0>x<d1>... (shapes={{{vi.name!r}: (d0, d1, ...)}} "
                            "in Python)")
            continue
        dyn = [d for d in spec.shape if isinstance(d, str)]
        if dyn:
            hint = "x".join(str(d) if isinstance(d, int) else f"<{d}>" for d in spec.shape)
            py = ", ".join(f"{d!r}: <size>" for d in dict.fromkeys(dyn))
            problems.append(f"input {vi.name!r} has dynamic dims {dyn}; give them with "
                            f"--shape {vi.name}={hint} (shapes={{{py}}} in Python)")
            continue
        out.append(spec)
    if problems:
        raise InputError("; ".join(problems))
    return out


def bind_inputs(model: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs in ``values`` are constants (initializers): the
    compile specializes on them, so an ``If`` on such an input (a sample-rate switch,
    ``if sr == 16000``) folds to the branch that applies (``--bind sr=16000``, ``bind=``).

    Args:
        values: ``{input name: number or array}``, converted to the input's declared dtype (and
            to its declared shape when it has as many elements).
    Raises:
        InputError: an unknown input, or a value that does not fit its shape or dtype.
    """
    from onnx import numpy_helper
    inits = initializer_names(model.graph)
    real = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    arrays = {}
    for name, v in values.items():
        if name not in real:
            raise InputError(f"--bind {name}: no input of that name; inputs: "
                             f"{', '.join(real) or 'none'}", node=name)
        spec = value_spec(real[name])
        try:
            with np.errstate(over="raise"):    # 1e40 into a float32 input: not silently inf
                a = np.asarray(v, dtype=spec.dtype.np)
        except FloatingPointError:
            raise InputError(f"--bind {name}={v!r}: not a {spec.dtype.np} value (beyond its "
                             f"largest finite value, {float(np.finfo(spec.dtype.np).max):g}; "
                             "an infinity is given as inf)", node=name) from None
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"--bind {name}={v!r}: not a {spec.dtype.np} value", node=name) from None
        src = np.asarray(v)
        if a.dtype.kind in "iub" and not np.array_equal(a.astype(src.dtype), src):
            # numpy truncates 1.5 to an int64 1 and makes 5 a bool True: a value the input's
            # type cannot hold is refused, not silently changed
            raise InputError(f"--bind {name}={v!r}: not a {spec.dtype.np} value", node=name)
        static = all(isinstance(d, int) for d in spec.shape)
        whole = static and a.size == int(np.prod(spec.shape))
        if has_shape(real[name]) and not whole:
            # a value for every element of a static shape, else nothing fits: a scalar is not
            # broadcast over a tensor input (its import would fail deep inside an op)
            kind = (f"a tensor input [{', '.join(str(d) for d in spec.shape)}]" if spec.shape
                    else "a scalar input")
            got = "1 value" if a.size == 1 else f"{a.size} values"
            raise InputError(f"--bind {name}: {name} is {kind}, got {got}; "
                             "--bind fixes a scalar (rank-0) input (sr=16000), or a "
                             "static-shaped one given all its elements comma-separated",
                             node=name)
        if static and has_shape(real[name]):
            a = a.reshape(tuple(int(d) for d in spec.shape))
        arrays[name] = a
    keep = [vi for vi in out.graph.input if vi.name not in arrays]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    for name, a in arrays.items():
        out.graph.initializer.append(numpy_helper.from_array(a, name))
    return out


def _fmt_dims(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def import_onnx(model, input_shapes: dict[str, Sequence[int]] | None = None) -> ImportedModel:
    """Import an ONNX model into a primitive graph with concrete shapes.

    Args:
        model: a ``ModelProto``, a path or serialized bytes (see :func:`load_model`).
        input_shapes: ``{input name: shape}`` for inputs with dynamic (or undeclared) dims; may
            also restate static dims.
    Returns:
        the imported model (graph, concrete input specs, inferred output specs, opset, warnings).
    Raises:
        UnsupportedOpError: unsupported ops or dtypes (all listed at once, before any work), or a
            value lumc needs at compile time that depends on runtime data.
        InputError: missing or contradicting input shapes.
        ModelError: a malformed model, or a declared output dtype that differs from the computed one.
        ShapeError: operand shapes that do not fit an op (named by node).
    """
    base_dir = os.path.dirname(os.path.abspath(os.fspath(model))) \
        if isinstance(model, (str, os.PathLike)) else None
    model = load_model(model)
    check_supported(model)
    opset = default_opset(model)
    specs = resolve_input_specs(model, input_shapes)
    imp = GraphImporter(opset, base_dir)
    imp.add_initializers(model.graph)
    inputs = {}
    for s in specs:
        t = Tensor(input_node(s.name, tuple(int(d) for d in s.shape), s.dtype))
        imp.env[s.name] = t
        inputs[s.name] = t.node
    imp.run_nodes(model.graph.node)
    outputs, out_specs, warnings = {}, [], []
    for vi in model.graph.output:
        if vi.name not in imp.env:
            raise ModelError(f"graph output {vi.name!r} is never produced")
        t = imp.env[vi.name]
        if vi.name in outputs:
            times = sum(o.name == vi.name for o in model.graph.output)
            note = (f"graph output {vi.name!r} is listed {times} times: lumc returns it once "
                    f"(onnxruntime returns it {times} times)")
            if note not in warnings:
                warnings.append(note)
            continue
        outputs[vi.name] = t.node
        out_specs.append(TensorSpec(vi.name, t.shape, t.dtype))
        _check_declared(vi, t, warnings)
    graph = Graph(inputs, outputs)
    return ImportedModel(graph, specs, out_specs, opset, warnings)


def _check_declared(vi: onnx.ValueInfoProto, t: Tensor, warnings: list[str]) -> None:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None:
        return
    if tt.elem_type:
        declared = value_spec(vi)
        if declared.dtype != t.dtype:
            raise ModelError(f"output {vi.name!r} is declared {declared.dtype} but computes "
                             f"{t.dtype}")
    if not tt.HasField("shape"):
        return
    declared = value_spec(vi).shape
    inferred = t.shape
    if len(declared) != len(inferred) or any(isinstance(d, int) and d != i
                                             for d, i in zip(declared, inferred)):
        warnings.append(f"output {vi.name!r} is declared {_fmt_dims(declared)} but computes "
                        f"{_fmt_dims(inferred)}; using {_fmt_dims(inferred)}")


__all__ = ["ImportedModel", "GraphImporter", "import_onnx", "resolve_input_specs"]
