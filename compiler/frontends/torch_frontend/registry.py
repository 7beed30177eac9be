"""The ATen handler table of the PyTorch frontend, the dtype map, and PyTorch type promotion.

A handler turns one ATen op application into IR through :class:`~lumc.ir.tensor.Tensor` methods and
``lumc.ir.library`` functions. It is called as ``fn(ctx, *args, **kwargs)`` with the FX node's
arguments resolved: tensors are :class:`Tensor`, symbolic sizes are plain ints (the graph is
specialized to concrete shapes), lists stay lists. Handlers are registered with :func:`aten`; an op
whose library function is missing, or whose arguments a ``check`` rejects, is reported by
``check_supported`` before any lowering work.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

# one handler record and library lookup for both frontends (an ATen handler's check takes the fx node)
from lumc.compiler.frontends.onnx_frontend.registry import Handler, lib, library, missing_requirements  # noqa: F401
from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError, UnsupportedOpError
from lumc.ir.tensor import Tensor

TORCH_TO_DTYPE: dict[torch.dtype, dt.DType] = {
    torch.float64: dt.f64,
    torch.float32: dt.f32,
    torch.float16: dt.f16,
    torch.bfloat16: dt.bf16,
    torch.int64: dt.i64,
    torch.int32: dt.i32,
    torch.int8: dt.i8,
    torch.uint8: dt.u8,
    torch.bool: dt.bool_,
}
DTYPE_TO_TORCH: dict[dt.DType, torch.dtype] = {v: k for k, v in TORCH_TO_DTYPE.items()}


def lumc_dtype(td: torch.dtype) -> dt.DType:
    """The lumc dtype of a torch dtype.

    Raises:
        UnsupportedOpError: for a dtype lumc cannot hold (complex, int16, float8, quantized...).
    """
    try:
        return TORCH_TO_DTYPE[td]
    except KeyError:
        raise UnsupportedOpError(f"dtype {td} is not supported") from None


# (fx node) -> reason the node is unsupported, or None
CheckFn = Callable[[torch.fx.Node], "str | None"]


HANDLERS: dict[str, Handler] = {}


def aten(*overloads: str, requires: Sequence[str] = (), check: CheckFn | None = None):
    """Register ``fn`` as the builder of ATen overloads such as ``"add.Tensor"``.

    Args:
        requires: library functions the builder calls, as ``"module.function"`` under
            ``lumc.ir.library`` (``"norm.softmax"``); the op is unsupported while one is missing.
        check: ``(fx node) -> reason | None`` for argument values the builder cannot handle.
    """
    def deco(fn):
        for o in overloads:
            HANDLERS[f"aten.{o}"] = Handler(fn, tuple(requires), check)
        return fn
    return deco


def rank0_as_1d(fn):
    """Wrap the handler of an op that takes a ``dim``: PyTorch reads a 0-d tensor as one element
    along dim 0 (``-1``) there (``softmax(x, 0)``, ``flip(x, [0])``, ``gather(x, 0, i)``,
    ``var(x, 0)``), so 0-d tensor arguments become shape ``(1,)`` and each tensor result takes the
    shape PyTorch traced for it (``()``: the one element)."""
    import functools

    @functools.wraps(fn)
    def wrapped(ctx, *args, **kwargs):
        if not any(isinstance(a, Tensor) and a.ndim == 0 for a in args):
            return fn(ctx, *args, **kwargs)
        out = fn(ctx, *(a.reshape((1,)) if isinstance(a, Tensor) and a.ndim == 0 else a
                        for a in args), **kwargs)
        vals = ctx.node.meta.get("val")
        if isinstance(out, Tensor):
            return _traced_shape(out, vals, ctx.sym_env)
        return type(out)(_traced_shape(o, v, ctx.sym_env) for o, v in zip(out, vals))
    return wrapped


def _traced_shape(t, val, env: dict):
    if not isinstance(t, Tensor) or not isinstance(val, torch.Tensor):
        return t
    shape = tuple(int(d.node.expr.xreplace(env)) if isinstance(d, torch.SymInt) and env else
                  int(d) for d in val.shape)
    return t.reshape(shape) if shape != t.shape and int(np.prod(shape)) == t.numel else t


def op_name(target) -> str:
    """``aten.add.Tensor`` for an ATen overload, ``operator.add`` for a Python function."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    mod = getattr(target, "__module__", None) or "builtins"
    return f"{mod}.{getattr(target, '__name__', repr(target))}"


# ---- PyTorch type promotion ------------------------------------------------------------------------
def _promotion_probe(x):
    """A stand-in with the promotion category of ``x``: dimensioned tensor, 0-d tensor or scalar."""
    if isinstance(x, Tensor):
        return torch.empty((1,) if x.ndim else (), dtype=DTYPE_TO_TORCH[x.dtype])
    return x


def result_dtype(*operands) -> dt.DType:
    """The dtype PyTorch computes ``op(*operands)`` in (``torch.result_type`` rules: tensors with
    dims over 0-d tensors over Python scalars, within a category bool < int < float).

    Args:
        operands: :class:`Tensor` s and Python scalars, at least one tensor.
    """
    probes = [_promotion_probe(x) for x in operands if x is not None]
    if not any(isinstance(p, torch.Tensor) for p in probes):
        # only scalars: float beats int beats bool, as in Python arithmetic
        if any(isinstance(p, float) for p in probes):
            return dt.f32
        return dt.bool_ if all(isinstance(p, bool) for p in probes) else dt.i64
    _, res = elementwise_dtypes(*probes, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return TORCH_TO_DTYPE[res]


def int_scalar(x: int, dtype: dt.DType, wrap: bool = False) -> np.ndarray:
    """The Python int ``x`` as a 0-d array of the integer ``dtype``, converted as eager converts a
    scalar: wrapping around with ``wrap`` (arithmetic and comparisons: ``int8 + 1000`` adds -24,
    ``uint8 >= -1`` compares with 255), else only a value the type holds, or for an unsigned type
    a negative one down to ``-max`` (``full(2, -1, dtype=uint8)`` is 255), as c10's overflow check
    allows.

    Raises:
        ModelError: a value eager refuses ("value cannot be converted to type int8_t without
            overflow": ``clamp``, ``masked_fill``, ``full``, ``where``).
    """
    lo, hi = int(np.iinfo(dtype.np).min), int(np.iinfo(dtype.np).max)
    ok = (-(1 << 63) <= x < (1 << 64)) if wrap else \
        (lo <= x <= hi) or (lo == 0 and -hi <= x < 0)
    if not ok:
        raise ModelError(f"value {x} cannot be converted to {dtype.np} without overflow")
    return np.array(x & ((1 << 64) - 1), dtype=np.uint64).astype(dtype.np)


def to_tensor(x, dtype: dt.DType, wrap: bool = False) -> Tensor:
    """``x`` (a Tensor or a Python scalar) as a Tensor of ``dtype``; an integer scalar in an
    integer ``dtype`` as :func:`int_scalar` converts it."""
    if isinstance(x, Tensor):
        return x.cast(dtype)
    if isinstance(x, int) and not isinstance(x, bool) and dtype.is_int:
        return Tensor.const(int_scalar(x, dtype, wrap))
    return Tensor.const(np.array(x, dtype=dtype.np))


def promote(*operands, wrap: bool = True) -> list[Tensor]:
    """Every operand as a Tensor of the operands' :func:`result_dtype` (scalars become 0-d; an
    integer scalar outside an integer result dtype wraps around in it, as in eager's arithmetic,
    unless ``wrap`` is False: refused, see :func:`to_tensor`)."""
    d = result_dtype(*operands)
    return [to_tensor(x, d, wrap) for x in operands]


def float_of(x: Tensor) -> Tensor:
    """``x`` as a float tensor: integers and bools go to f32, PyTorch's default dtype."""
    return x if x.dtype.is_float else x.cast(dt.f32)


class LoweringContext:
    """What a handler sees besides its arguments: the node's name, op and declared result dtype.

    Attributes:
        name: the FX node name (``addmm_3``).
        op: the op name (``aten.addmm.default``).
        out_dtype: the lumc dtype of the node's (first) tensor result as traced by PyTorch, or None
            when the trace carries no metadata.
        sym_env: ``{sympy symbol: int}``, the sizes the traced metadata's symbols take here.
    """

    def __init__(self, node: torch.fx.Node, sym_env: dict | None = None):
        self.node = node
        self.sym_env = sym_env or {}     # {sympy symbol: int}: the traced metadata's sizes
        self.name = node.name
        self.op = op_name(node.target)
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)) and val:
            val = val[0]
        self.out_dtype = TORCH_TO_DTYPE.get(val.dtype) if isinstance(val, torch.Tensor) else None

    def unsupported(self, reason: str) -> UnsupportedOpError:
        return UnsupportedOpError(reason, node=self.name, op=self.op)


def arg(node: torch.fx.Node, index: int, name: str, default=None):
    """The raw (unresolved) argument ``name`` at position ``index`` of an FX node, for checks."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)
