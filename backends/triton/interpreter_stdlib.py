"""Triton's own ``@triton.jit`` library functions interpreted, when Triton was imported first.

``triton.jit`` chooses at decoration time: under ``TRITON_INTERPRET=1`` it returns an
``InterpretedFunction``, otherwise a ``JITFunction`` (``triton/runtime/jit.py``, ``jit``). lumc sets
the variable at ``import lumc`` on a machine without a GPU, which holds for every kernel lumc
generates later. But ``triton.language``'s library functions written in Triton (``tl.max``,
``tl.sum``, ``tl.argmax``, ``tl.cumsum``, ``tl.sigmoid``, ``tl.rand``, their combine functions
and their ``tensor`` methods) are decorated when ``triton.language`` is first imported. A process
that imported Triton before lumc (``import torch._inductor``, a ``torch.compile`` call, PyTorch's
OpInfo database) keeps them as ``JITFunction`` objects, and an interpreted kernel calling one
failed with ``InterpreterError: RuntimeError("Cannot call @triton.jit'd outside of the scope of a
kernel")`` (an int64 ``tl.max`` in a scatter's reduction, for one).

:func:`install` replaces each such ``JITFunction`` in the loaded ``triton.language`` modules and on
``triton.language.tensor`` by an ``InterpretedFunction`` of the same Python function, one object per
function, so the interpreter's identity checks (``combine_fn is tl.standard._elementwise_max``,
``triton/runtime/interpreter.py``, ``ReduceOps``) hold. It does nothing where Triton was imported
under ``TRITON_INTERPRET=1`` (every library function is already interpreted) and nothing on a GPU.
"""
from __future__ import annotations

import sys


def install() -> int:
    """Re-makes the ``JITFunction`` objects of the loaded ``triton.language`` modules (and the
    ``tensor`` class's methods) as ``InterpretedFunction`` objects; returns how many it replaced
    (0 when Triton was imported in interpreter mode). Call only in interpreter mode."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    import triton.language as tl

    made: dict[int, InterpretedFunction] = {}

    def interpreted(obj):
        if not isinstance(obj, JITFunction) or isinstance(obj, InterpretedFunction):
            return None
        new = made.get(id(obj))
        if new is None:
            new = made[id(obj)] = InterpretedFunction(obj.fn)
        return new

    owners = [m for name, m in list(sys.modules.items())
              if m is not None and (name == "triton.language" or name.startswith("triton.language."))]
    owners.append(tl.tensor)
    for owner in owners:
        for name, value in list(vars(owner).items()):
            new = interpreted(value)
            if new is not None:
                setattr(owner, name, new)
    return len(made)
