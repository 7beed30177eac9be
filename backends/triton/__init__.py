"""The Triton backend: every kernel form rendered to readable Triton source, launched, compiled AOT.

Entry points: :func:`render` (Kernel -> generated module source), :class:`TritonKernel` (launch on
torch tensors), :func:`compile_aot` (ahead-of-time compile for ``cuda:90``, in a child process) and
:func:`run_program` (a whole model's kernels in order).

Without a CUDA device the kernels run in the Triton interpreter on CPU tensors: this package sets
``TRITON_INTERPRET=1`` (unless the user set it). Triton 3.x reads it through ``triton.knobs`` when a
``@triton.jit`` function is defined, so this works even if Triton was imported first (torch.export
and transformers import it; ``interpreter_stdlib`` re-makes Triton's own library functions, decorated
at that import, as interpreted ones); older Triton read it once at import, which is then reported.
:func:`interpreter_mode` reports the choice. The interpreter computes bfloat16 on bit patterns;
``interpreter_bf16`` makes it compute their values, as the GPU does.
"""
import os as _os
import sys as _sys


MODE_PROBLEM: str | None = None


def _choose_mode() -> None:
    global MODE_PROBLEM
    if "TRITON_INTERPRET" in _os.environ:
        return
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    if "triton" in _sys.modules and not hasattr(_sys.modules["triton"], "knobs"):
        MODE_PROBLEM = ("no GPU is present and Triton was imported before lumc.backends.triton "
                        "without TRITON_INTERPRET=1; set TRITON_INTERPRET=1 in the environment")
        return
    _os.environ["TRITON_INTERPRET"] = "1"


_choose_mode()
if _os.environ.get("TRITON_INTERPRET") == "1":
    from lumc.backends.triton.interpreter_bf16 import install as _install_bf16
    from lumc.backends.triton.interpreter_index import install as _install_index
    from lumc.backends.triton.interpreter_stdlib import install as _install_stdlib
    _install_bf16()   # bf16 arithmetic in the interpreter as on the GPU (see that module)
    _install_stdlib()  # tl.max and the like interpreted where Triton was imported before lumc
    _install_index()   # a one-element tensor as a loop bound under numpy 2 (Triton 3.6)

from lumc.backends.triton.codegen import RenderError  # noqa: E402
from lumc.backends.triton.configs import Config, config_space, default_config  # noqa: E402
from lumc.backends.triton.launch import TritonKernel, interpreter_mode  # noqa: E402
from lumc.backends.triton.render import render  # noqa: E402

__all__ = ["RenderError", "Config", "config_space", "default_config", "TritonKernel",
           "interpreter_mode", "render"]
