"""An ``onnx.backend.base.Backend`` over lumc: import with the ONNX frontend, run with the reference
executor. It is what the official ONNX backend conformance suite drives (``tests/conformance``),
and a quick way to check a model end to end::

    rep = LumcBackend.prepare(model)          # UnsupportedOpError / ModelError / InputError
    (y,) = rep.run([x])

Models whose declared input shapes are all static are imported in ``prepare``; otherwise the import
happens at the first ``run`` with the shapes of the arrays given (and again for new shapes). A
model where a compile-time value (a ``Reshape`` shape, ``Resize`` scales, reduction axes, a ``TopK``
k...) is computed from graph inputs is specialized on those inputs' values: each ``run`` binds
them as initializers and re-imports when they change (``LumcBackendRep.constant_inputs``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import (ImportedModel, NeedsConstantError, check_supported,
                                         import_onnx, load_model, unsupported_nodes)
from lumc.compiler.frontends.onnx_frontend.loader import initializer_names, value_spec
from lumc.ir.errors import InputError, LumcError


class LumcBackendRep(BackendRep):
    """A prepared model: runs on numpy arrays through the reference executor.

    Attributes:
        model: the ONNX model.
        input_names: the real (non-initializer) inputs, in model order.
        output_names: the model outputs, in model order.
        constant_inputs: inputs whose *values* lumc needs at compile time (they feed a shape, axes,
            a trip count...). The model is specialized on them: each run binds them as
            initializers and re-imports for values not seen before.
    """

    def __init__(self, model: onnx.ModelProto, imported: ImportedModel | None = None,
                 constant_inputs: Sequence[str] = ()):
        self.model = model
        inits = initializer_names(model.graph)
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        self.output_names = [vi.name for vi in model.graph.output]
        self.constant_inputs = list(constant_inputs)
        self._cache: dict[tuple, tuple[ImportedModel, ReferenceExecutor]] = {}
        if imported is not None:
            key = tuple(tuple(s.shape) for s in imported.inputs)
            self._cache[key] = (imported, ReferenceExecutor(imported.graph))

    def _prepared(self, feeds: dict[str, np.ndarray]):
        while True:
            fixed = {n: feeds[n] for n in self.constant_inputs}
            key = tuple(tuple(np.shape(feeds[n])) for n in self.input_names) + tuple(
                (n, v.dtype.str, v.tobytes()) for n, v in sorted(fixed.items()))
            if key in self._cache:
                return self._cache[key]
            model = _bind_inputs(self.model, fixed) if fixed else self.model
            try:
                imported = import_onnx(model, {n: np.shape(feeds[n]) for n in self.input_names
                                               if n not in fixed})
            except NeedsConstantError as e:
                new = [n for n in e.inputs if n in feeds and n not in self.constant_inputs]
                if not new:
                    raise
                self.constant_inputs += new
                continue
            self._cache[key] = (imported, ReferenceExecutor(imported.graph))
            return self._cache[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run on ``inputs`` (a list in model input order, or a ``{name: array}`` dict).

        Returns:
            the outputs as numpy arrays, in model output order.
        Raises:
            InputError: missing inputs, or arrays of the wrong shape or dtype.
            NeedsConstantError: a compile-time value depends on something other than inputs.
        """
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if len(inputs) != len(self.input_names):
                raise InputError(f"expected {len(self.input_names)} input"
                                 f"{'s' * (len(self.input_names) != 1)} "
                                 f"{self.input_names}, got {len(inputs)}")
            feeds = {n: np.asarray(v) for n, v in zip(self.input_names, inputs)}
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing inputs {missing}")
        imported, run = self._prepared(feeds)
        out = run({s.name: feeds[s.name] for s in imported.inputs})
        return tuple(out[n] for n in self.output_names)


def _bind_inputs(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` where the graph inputs in ``values`` are initializers."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    keep = [vi for vi in bound.graph.input if vi.name not in values]
    del bound.graph.input[:]
    bound.graph.input.extend(keep)
    for name, v in values.items():
        bound.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(v), name))
    return bound


class LumcBackend(Backend):
    """The lumc backend for ``onnx.backend`` (CPU only: the reference executor)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether every op and dtype of ``model`` is supported (and its inputs are tensors)."""
        try:
            if unsupported_nodes(model):
                return False
            inits = initializer_names(model.graph)
            for vi in list(model.graph.input) + list(model.graph.output):
                if vi.name not in inits:
                    value_spec(vi)
        except LumcError:
            return False
        return True

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes, device: str = "CPU",
                **kwargs: Any) -> LumcBackendRep:
        """Check and (when input shapes are static) import ``model``.

        Raises:
            UnsupportedOpError: unsupported ops or dtypes. ModelError: a malformed model.
            ValueError: a device other than CPU.
        """
        if not cls.supports_device(device):
            raise ValueError(f"lumc's ONNX backend runs on CPU only, not {device!r}")
        model = load_model(model)
        check_supported(model)
        inits = initializer_names(model.graph)
        specs = [value_spec(vi) for vi in model.graph.input if vi.name not in inits]
        static = all(isinstance(d, int) for s in specs for d in s.shape) and all(
            vi.type.tensor_type.HasField("shape") for vi in model.graph.input if vi.name not in inits)
        if not static:
            return LumcBackendRep(model)
        try:
            return LumcBackendRep(model, import_onnx(model))
        except NeedsConstantError as e:
            if not e.inputs or not set(e.inputs) <= {s.name for s in specs}:
                raise
            # specialize on those inputs' values at run time
            return LumcBackendRep(model, constant_inputs=e.inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU",
                 outputs_info=None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node on ``inputs`` (opset from ``kwargs['opset_version']``, default latest)."""
        from lumc.compiler.frontends.onnx_frontend.loader import DTYPE_TO_ONNX
        from lumc.ir import dtypes as dt
        ins = []
        for name, x in zip([n for n in node.input if n], inputs):
            x = np.asarray(x)
            ins.append(onnx.helper.make_tensor_value_info(name, DTYPE_TO_ONNX[dt.from_numpy(x.dtype)],
                                                          x.shape))
        outs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = onnx.helper.make_graph([node], "run_node", ins, outs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        return cls.prepare(model, device).run(list(inputs))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")


prepare = LumcBackend.prepare
run_model = LumcBackend.run_model
run_node = LumcBackend.run_node
supports_device = LumcBackend.supports_device
