"""The PyTorch frontend: capture a module with ``torch.export`` and lower its core-ATen graph into
lumc primitive graphs.

    imported = import_torch(model.eval(), (x,))          # ImportedModel at x's shapes
    f = compile_module(model.eval(), (x,), dynamic_shapes=({1: Dim("seq")},))
    y = f(x2)                                           # torch in, torch out; re-specializes by shape
    print(f.report())

Modules: ``registry`` (the ATen handler table, dtype map, PyTorch type promotion), ``lowering``
(the walk over an FX graph at concrete shapes, the up-front support check), ``capture``
(``torch.export`` to a :class:`CapturedProgram`) and one ``handlers_*`` module per family of
ops. The compiled callable (``compile_module``, ``DEFAULT_BUDGET``) calls the pipeline, so it lives
in the compile core, ``lumc.compiler.core.torch_compile``. ``torch.compile(model, backend="lumc")`` lives in
``lumc.compiler.core.torch_backend``.
"""
from __future__ import annotations

# handler modules register themselves on import
from lumc.compiler.frontends.torch_frontend import (handlers_math, handlers_nn, handlers_reduce,  # noqa: F401
                                          handlers_select, handlers_shape)
from lumc.compiler.frontends.torch_frontend.capture import (CapturedProgram, capture_module,
                                                  decomposition_table, import_torch)
from lumc.compiler.frontends.torch_frontend.lowering import check_supported, unsupported_nodes
from lumc.compiler.frontends.torch_frontend.registry import HANDLERS

from lumc.compiler.frontends.onnx_frontend import ImportedModel, TensorSpec  # noqa: E402  (shared result types)


def supported_ops() -> list[str]:
    """Every ATen overload of this PyTorch build with a handler whose library functions are all
    available, sorted (``aten.add.Tensor``...)."""
    import torch
    from lumc.compiler.frontends.torch_frontend.registry import missing_requirements

    def exists(key: str) -> bool:
        _, op, overload = key.split(".")
        packet = getattr(torch.ops.aten, op, None)
        return packet is not None and overload in packet.overloads()
    return sorted(k for k, h in HANDLERS.items() if not missing_requirements(h) and exists(k))


__all__ = ["CapturedProgram", "CompiledTorchModule", "DEFAULT_BUDGET", "HANDLERS", "ImportedModel",
           "TensorSpec", "capture_module", "check_supported", "compile_module",
           "decomposition_table", "import_torch", "supported_ops", "unsupported_nodes"]
