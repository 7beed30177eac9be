"""Run a whole program (kernel calls bound to a model's nodes) with every kernel in Triton.

The program is duck-typed (``lumc.compiler.runtime.program.Program``: ``calls`` with ``kernel``, ``inputs``,
``outputs`` node lists, and ``outputs`` ``{name: node}``) so that ``backends`` does not import
``compiler``. Values live in a dict keyed by model node; model inputs are found by their ``Input``
name, weights are uploaded once, and a program output that is a free reshape of a value is a view.

On a machine without a GPU the kernels run in the Triton interpreter on CPU tensors
(:func:`~lumc.backends.triton.launch.interpreter_mode`); the result is the same numerics, slower.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from lumc.backends.reference import checked_input
from lumc.ir.graph import Node
from lumc.backends.triton.launch import (TritonKernel, default_device, interpreter_mode, to_numpy,
                                         to_torch, torch_dtype)


@dataclass
class RunStats:
    """What :func:`run_program` did: kernels launched per form, seconds, and the execution mode."""
    mode: str
    kernels: int = 0
    per_form: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def execution_mode() -> str:
    """``"gpu"`` or ``"interpreter (TRITON_INTERPRET=1, CPU tensors)"``."""
    return "interpreter (TRITON_INTERPRET=1, CPU tensors)" if interpreter_mode() else "gpu"


def run_program(program, inputs: dict[str, np.ndarray], device: str | None = None,
                stats: RunStats | None = None, launchers: list | None = None
                ) -> dict[str, np.ndarray]:
    """Launch every call of ``program`` in order and return the program's outputs.

    Args:
        program: kernel calls bound to model nodes (see module docstring).
        inputs: ``{model input name: array}``.
        device: torch device; default ``cuda``, or ``cpu`` in interpreter mode.
        stats: filled with counts and time when given.
        launchers: one ``(launcher, config)`` per call (a compiled plan's kernels at its chosen
            configs: a ``TritonKernel`` or vendor kernel called with ``outputs=`` and
            ``config=``); None launches a ``TritonKernel`` of each call at its run config.
    Returns:
        ``{output name: numpy array}`` in the nodes' dtypes.
    Raises:
        InputError: a model input the program reads is missing or has the wrong shape or dtype.
        UnsupportedOpError: a kernel that does not render (its meaning does not fit its form, a
            dtype Triton has no type for: the fnuz float8s), named by position and form.
    """
    device = device or default_device()
    t0 = time.perf_counter()
    env: dict[Node, object] = {}

    def value_of(n: Node):
        got = env.get(n)
        if got is not None:
            return got
        if n.op == "Input":
            t = to_torch(checked_input(n, inputs), device)
        elif n.op == "Constant":
            t = to_torch(n.arg.value, device)
        elif n.op == "View" and n.arg.is_contiguous:    # a reshape or a prefix
            t = value_of(n.srcs[0]).reshape(-1)[:n.numel].reshape(n.shape)
        else:
            raise KeyError(f"%{n.id} ({n.op}) is read before any kernel writes it")
        env[n] = t
        return t

    if launchers is None:
        def launch(c, args, outs):
            TritonKernel(c.kernel)(*args, outputs=outs)
    else:
        by_call = {id(c): lc for c, lc in zip(program.calls, launchers, strict=True)}

        def launch(c, args, outs):
            launcher, config = by_call[id(c)]
            launcher(*args, outputs=outs, config=config)
    return _launch_all(program, env, value_of, launch, lambda n: n.shape, device, stats, t0)


def _launch_all(program, env, value_of, launch, shape, device, stats, t0) -> dict:
    """Launch every call in order (``launch(call, inputs, outputs)``), outputs allocated at
    ``shape(node)``; returns the program's outputs as numpy arrays."""
    import torch
    from lumc.backends.triton.codegen import RenderError
    from lumc.ir.errors import UnsupportedOpError
    for i, call in enumerate(program.calls):
        outs = [torch.empty(shape(n), dtype=torch_dtype(n.dtype), device=device)
                for n in call.outputs]
        try:
            launch(call, [value_of(n) for n in call.inputs], outs)
        except RenderError as e:
            raise UnsupportedOpError(f"kernel {i} ({call.kernel.form}) does not render in "
                                     f"Triton: {e}; the reference executor runs it") from None
        for n, o in zip(call.outputs, outs):
            env[n] = o
        if stats is not None:
            stats.kernels += 1
            stats.per_form[call.kernel.form] = stats.per_form.get(call.kernel.form, 0) + 1
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
    # np.array, not ascontiguousarray: that one makes a rank-0 output shape (1,)
    result = {name: np.array(to_numpy(value_of(n)), order="C") for name, n in program.outputs.items()}
    if stats is not None:
        stats.seconds = time.perf_counter() - t0
    return result


def run_program_sized(program, inputs: dict[str, np.ndarray], probes: dict[int, str],
                      sizes: dict[str, int], device: str | None = None,
                      stats: RunStats | None = None, table: dict | None = None,
                      largest: dict | None = None, configs: list | None = None,
                      launchers: list | None = None) -> dict[str, np.ndarray]:
    """:func:`run_program` for a program stored at probe sizes (a range bucket's plan,
    ``lumc.ir.symbolic``), with every kernel one size-generic module
    (:class:`~lumc.backends.triton.size_generic.SizedKernel`) launched at ``sizes``
    (``{argument name: size}`` for the ``probes`` ``{prime: argument name}``; ``table``: the
    range's affine values, ``lumc.ir.symbolic.learn_table``; ``largest``: ``{prime: units}`` of
    the bucket's largest sizes, where int32/int64 indexing is decided; ``configs``: one Triton
    config (or None: the run config) per call, the plan's; ``launchers``: per call None, or a
    ``(launcher, config)`` that runs it instead, as in :func:`run_program`: a vendor kernel of the
    plan re-sized to ``sizes``).

    Raises:
        InputError: an input whose shape is not the program's at these sizes, or a wrong dtype.
    """
    from lumc.backends.triton.size_generic import SizedKernel
    from lumc.ir.errors import InputError
    from lumc.ir.symbolic import resize_int
    device = device or default_device()
    from lumc.ir.symbolic import Substitution
    sub = Substitution({p: sizes[name] for p, name in probes.items()}, table)
    t0 = time.perf_counter()
    env: dict[Node, object] = {}

    def shape(n: Node) -> tuple:
        return tuple(resize_int(d, sub) for d in n.shape)

    def value_of(n: Node):
        got = env.get(n)
        if got is not None:
            return got
        if n.op == "Input":
            a = inputs.get(n.arg.name)
            if a is None:
                raise InputError(f"missing input {n.arg.name!r}", node=n.arg.name)
            a = np.asarray(a)
            if tuple(a.shape) != shape(n) or a.dtype != n.dtype.np:
                raise InputError(f"input {n.arg.name!r} is {a.dtype}{list(a.shape)}, expected "
                                 f"{n.dtype.np}{list(shape(n))}", node=n.arg.name)
            t = to_torch(a, device)
        elif n.op == "Constant":
            t = to_torch(n.arg.value, device)
        elif n.op == "View" and n.arg.is_contiguous:    # a reshape or a prefix
            s = shape(n)
            t = value_of(n.srcs[0]).reshape(-1)[:int(np.prod(s))].reshape(s)
        else:
            raise KeyError(f"%{n.id} ({n.op}) is read before any kernel writes it")
        env[n] = t
        return t

    modules: dict[int, SizedKernel] = {}

    config_of = {id(c): cfg for c, cfg in zip(program.calls, configs or [None] * len(program.calls),
                                               strict=True)}

    instead = {id(c): lc for c, lc in zip(program.calls, launchers or [None] * len(program.calls),
                                          strict=True) if lc is not None}

    def launch(call, args, outs):
        if id(call) in instead:
            launcher, config = instead[id(call)]
            launcher(*args, outputs=outs, config=config)
            return
        sk = modules.get(id(call.kernel)) or SizedKernel(call.kernel, probes, table, largest)
        modules[id(call.kernel)] = sk
        sk(*args, sizes=sizes, outputs=outs, config=config_of[id(call)])
    return _launch_all(program, env, value_of, launch, shape, device, stats, t0)
