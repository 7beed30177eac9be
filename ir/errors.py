"""The one error hierarchy of lumc.

Every error names what went wrong in one line: the node, the op (and opset where it applies) and the
reason. The CLI prints ``str(err)`` and exits 2; it never shows a traceback for a ``LumcError``.
"""
from __future__ import annotations


class LumcError(Exception):
    """Base of every error lumc raises on purpose.

    Args:
        reason: what is wrong, in one sentence.
        node: the node (ONNX node name or IR node id) the error is about, if any.
        op: the op type (``Conv``, ``SumReduce``...), if any.
        opset: the ONNX opset in force, if any.
    """

    def __init__(self, reason: str, *, node: str | None = None, op: str | None = None,
                 opset: int | None = None):
        self.reason = reason
        self.node = node
        self.op = op
        self.opset = opset
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        # a reason that names the node already ("input 'x' has shape ...") is not prefixed with
        # it again ("node 'x': input 'x' has shape ...")
        if self.node is not None and repr(str(self.node)) not in self.reason:
            where.append(f"node {self.node!r}")
        if self.op is not None:
            where.append(f"op {self.op}" + (f" (opset {self.opset})" if self.opset is not None else ""))
        elif self.opset is not None:
            where.append(f"opset {self.opset}")
        head = ", ".join(where)
        return f"{head}: {self.reason}" if head else self.reason


class ShapeError(LumcError):
    """Shapes or dtypes of an op's operands do not fit its rule."""


class ModelError(LumcError):
    """The model file is malformed, truncated or inconsistent."""


class UnsupportedOpError(LumcError):
    """The model uses ops lumc does not implement (all of them are listed at once)."""


class RuntimeIfError(UnsupportedOpError):
    """An ``If`` whose condition is known only at run time and whose branches cannot both be one
    graph (a branch does not import at these shapes, or their outputs differ in shape or dtype).

    ``if_output`` (the If's first output name, unique in its graph) and ``cond`` (the condition's
    tensor name) let the compiler build one variant per branch and select between them at run
    time (``lumc.compiler.core.variants``); without that, it is the one-line error it says.
    """

    def __init__(self, reason: str, *, if_output: str = "", cond: str = "", **kw):
        self.if_output = if_output
        self.cond = cond
        super().__init__(reason, **kw)


class KernelWriteError(LumcError):
    """A generated kernel's source could be written neither to the kernel cache nor to the
    private fallback folder (a full disk, ``ulimit -f``): the compile cannot check or run its
    kernels. Never a verdict on the kernel: the search must not drop it as a failed candidate."""


class InputError(LumcError):
    """Inputs given at run time are missing, unknown, or of the wrong shape or dtype."""


class BudgetError(LumcError):
    """A compile budget is malformed, zero or negative."""


class ArtifactError(LumcError):
    """A saved artifact or cache is corrupt, foreign, or from an incompatible version."""


class IndexRangeError(InputError, ModelError):
    """An index (``Gather``'s) lies outside its axis at run time. It comes from an input or from
    a model constant (then it is found while folding, at import): both an input and a model error.
    """


class DivisionByZeroError(InputError, ModelError):
    """An integer divisor of the ``Mod`` primitive (torch ``fmod`` and ``remainder``) is 0 at run
    time, which eager torch refuses too (ONNX ``Mod`` gives 0 there instead, the ONNX reference's
    value). Like :class:`IndexRangeError` it comes from an input or from a model constant: both an
    input and a model error.
    """


class LumcNumericsWarning(UserWarning):
    """The compiled module's outputs differ from PyTorch eager's on the example inputs (a compile
    of a torch module runs the module itself and compares, ``lumc.compiler.core.eager_check``).
    Exported as ``lumc.LumcNumericsWarning`` so that ``warnings.filterwarnings`` can name it."""
