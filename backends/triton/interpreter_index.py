"""A one-element Triton tensor used as a Python integer in the interpreter, under numpy 2.

Triton 3.6's interpreter (the GPU image's Triton; ``triton/runtime/interpreter.py``,
``_patch_lang_tensor``) gives ``tl.tensor`` an ``__index__`` of ``int(self.handle.data)``. A scalar
the kernel computed (``hi = tl.minimum(...)``, a causal attention's key-loop bound) is held there
as a one-element array of rank 1, and numpy 2 refuses ``int()`` of an array of rank above 0
("only 0-dimensional arrays can be converted to Python scalars": deprecated in numpy 1.25, an
error in the numpy 2.4 lumc installs): every interpreted kernel with a computed loop bound
failed. Triton 3.9 reads ``int(self.handle.data.squeeze())``; :func:`install` makes the older
interpreter do the same. A GPU compile never runs this code.
"""
from __future__ import annotations

INSTALLED: bool | str = False


def _index(self) -> int:
    """The Python integer a one-element interpreter tensor holds (any rank)."""
    data = self.handle.data
    return int(data.reshape(-1)[0]) if getattr(data, "size", 1) == 1 else int(data)


def install() -> bool | str:
    """Wrap the interpreter's ``_patch_lang_tensor`` so that the ``__index__`` it sets reads a
    one-element array of any rank. Returns :data:`INSTALLED`: True, or why nothing was patched
    (a Triton without that function, whose interpreter is then used as it is)."""
    global INSTALLED
    if INSTALLED:
        return INSTALLED
    try:
        from triton.runtime import interpreter as itp
    except ImportError as e:
        INSTALLED = f"no Triton interpreter: {e}"
        return INSTALLED
    original = getattr(itp, "_patch_lang_tensor", None)
    if original is None:
        INSTALLED = "this Triton's interpreter sets no tensor __index__ there: not patched"
        return INSTALLED

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    itp._patch_lang_tensor = patch_lang_tensor
    INSTALLED = True
    return INSTALLED
