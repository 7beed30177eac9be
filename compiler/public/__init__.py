"""lumc: a tensor-graph compiler for neural-network inference.

The public API lives here; everything else is in the subpackages ``lumc.ir``, ``lumc.rewrites``,
``lumc.backends`` and ``lumc.compiler``. Every error lumc raises on purpose derives from
:class:`LumcError`; the subclasses say what kind of input was wrong.
"""
from __future__ import annotations

__version__ = "0.1.0"

import os as _os


def _no_nvidia_device() -> bool:
    return not (_os.path.exists("/dev/nvidiactl") or _os.path.exists("/proc/driver/nvidia/version"))


# Without an NVIDIA device, generated kernels run in Triton's CPU interpreter. Decide at `import
# lumc`, cheaply (no torch import); Triton 3.x reads the variable when a kernel is defined, so it
# holds even when torch.export or transformers imported Triton first.
if "TRITON_INTERPRET" not in _os.environ and _no_nvidia_device():
    _os.environ["TRITON_INTERPRET"] = "1"

from lumc.ir.errors import (  # noqa: E402
    ArtifactError, BudgetError, InputError, LumcError, LumcNumericsWarning, ModelError, ShapeError,
    UnsupportedOpError,
)

__all__ = ["LumcError", "ModelError", "UnsupportedOpError", "InputError", "ShapeError",
           "BudgetError", "ArtifactError", "LumcNumericsWarning", "__version__"]


def compile(model, *, budget, device=None, example_inputs=None, shapes=None, **kwargs):
    """Compile ``model`` (an ONNX path, ``onnx.ModelProto`` or bytes; or a ``torch.nn.Module`` with
    ``example_inputs``) into the fastest correct program lumc finds within ``budget``.

    See :func:`lumc.compiler.core.pipeline.compile_model` for the arguments (``precision=``,
    ``weights=``, ``tolerance=``, ``max_kl=``, ``logits=``: the precision policy and its quality
    gate, :mod:`lumc.compiler.core.precision`; ``workers="local:N"``, ``"ray"`` or
    ``"ray://HOST:PORT"``: where work units run, :mod:`lumc.compiler.core.workers`). Returns a
    :class:`~lumc.compiler.runtime.compiled.CompiledModel`; for a torch module,
    :func:`lumc.compiler.core.torch_compile.compile_module` (extra ``dynamic_shapes=``), a callable on
    torch tensors; with ``dynamic_shapes={axis: torch.export.Dim(name, min=, max=)}`` per input,
    one compile serving every size of each Dim's range (a ``VariantModel``, re-sized per call).
    """
    if type(model).__module__.startswith("torch") or _is_torch_module(model):
        from lumc.compiler.core.torch_compile import compile_module
        if example_inputs is None:
            raise InputError("compiling a torch module needs example_inputs=(tensor, ...)")
        if shapes is not None:
            kwargs["shapes"] = shapes
        _refuse_unknown(compile_module, kwargs, "a torch module", "dynamic_shapes= sets its "
                        "sizes; use_egraph=, fast_math=, bind= and shapes= apply to ONNX models")
        return compile_module(model, example_inputs, budget=budget, device=device, **kwargs)
    from lumc.compiler.core.pipeline import compile_model
    _refuse_unknown(compile_model, kwargs, "an ONNX model", "")
    if example_inputs is not None and not isinstance(example_inputs, dict):
        raise InputError("lumc.compile: example_inputs= of an ONNX model is a dict {input name: "
                         f"array}}, got a {type(example_inputs).__name__}")
    from lumc.compiler.runtime.artifact import model_files
    sources = tuple(model_files(model))          # the model's files: f.save never replaces them
    compiled = compile_model(model, budget=budget, device=device, example_inputs=example_inputs,
                             shapes=shapes, **kwargs)
    compiled.source_files = sources
    return compiled


def _refuse_unknown(fn, kwargs: dict, what: str, hint: str) -> None:
    """An ``InputError`` naming the first keyword ``fn`` does not take (a typo, or an option of the
    other frontend), instead of Python's ``TypeError``; and one naming an on/off option (whose
    default is ``True`` or ``False``) given anything but a bool: ``fast_math="no"`` is truthy,
    and was taken as on."""
    import inspect
    known = inspect.signature(fn).parameters
    bad = [k for k in kwargs if k not in known]
    if bad:
        raise InputError(f"lumc.compile: {bad[0]}= is not an option for {what}"
                         + (f" ({hint})" if hint else "") + "; options: "
                         + ", ".join(k for k, p in known.items() if p.kind == p.KEYWORD_ONLY
                                     or p.default is not inspect.Parameter.empty))
    for k, v in kwargs.items():
        if isinstance(known[k].default, bool) and not _is_bool(v):
            raise InputError(f"lumc.compile: {k}={v!r}: expected True or False")


def _is_bool(v) -> bool:
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in (
        "bool", "bool_")) or (type(v) is int and v in (0, 1))     # numpy's too; 0 and 1


def _is_torch_module(model) -> bool:
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def load(path, device=None):
    """Load a ``.lumc`` artifact as a :class:`~lumc.compiler.runtime.compiled.CompiledModel`."""
    from lumc.compiler.runtime.compiled import load as _load
    return _load(path, device)
