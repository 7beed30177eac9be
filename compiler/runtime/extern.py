"""Running a kernel through its extern (vendor) implementation: torch ops on cuBLAS and friends.

:class:`ExternKernel` is the host side of an ``IMPL`` config (``lumc.backends.extern`` says which
apply and prices them on ``sim:*``). It replays the kernel's meaning with torch
(``lumc.compiler.runtime.graph_torch.graph_module``): every contraction ``SumReduce(Mul(a, b))`` is one
``torch.einsum`` over the operands with their broadcast dims dropped, which torch runs as
``mm``/``bmm`` (cuBLAS on a GPU, oneDNN/BLAS on the CPU), and the prologue and epilogue are torch
ops. It has :class:`~lumc.backends.triton.launch.TritonKernel`'s calling convention (inputs in
placeholder order, optional preallocated outputs, a config), so the measurer, the CPU executor and
the GPU plan run either the same way.

Numerics follow the reference executor: f16/bf16 contractions multiply in their own dtype and
accumulate in fp32 (cuBLAS's default for half types; the reference sums in fp32 and rounds once), and
fp32 contractions are IEEE fp32 (``allow_tf32`` off) unless the config's ``PRECISION`` is ``tf32``;
``PRECISION`` ``bf16``/``fp16`` rounds fp32 operands to that type first, and ``fp8`` runs the
contraction as a row-wise scaled e4m3 GEMM (``torch._scaled_mm`` on a GPU, :func:`_fp8_scaled`).
Impl ``cudnn`` replays the same way with each convolution one ``F.conv{n}d`` call
(``lumc.compiler.runtime.extern_conv``), under the same precision rules.
"""
from __future__ import annotations

import contextlib

import weakref

import numpy as np

from lumc.backends.extern import IMPLS, extern_impls, impl_of
from lumc.backends.extern import _contractions as contractions_of
from lumc.ir.errors import InputError
from lumc.ir.kernels import Kernel

_HALF_PRECISIONS = {"bf16": "bfloat16", "fp16": "float16"}


def _fp8_scaled(spec: str, ca, cb):
    """``einsum(spec, ca, cb)`` as a row-wise scaled fp8 GEMM (``torch._scaled_mm``, cuBLASLt):
    each operand quantized to e4m3 with one fp32 scale per output row of A and per output column of
    B (``amax / 448`` over the contracted letters, at least ``FP8_MIN_SCALE``, RNE, clamped to
    +-448), the products summed in fp32 and the sum times both scales. A 2-D ``mk,kn->mn`` on a GPU
    with K and N multiples of 16 runs ``torch._scaled_mm``; anything else (the CPU executor, batched
    products) computes the same quantized operands' sum in fp32, scaled after the sum as
    ``_scaled_mm`` does."""
    import torch
    from lumc.backends.precision import FP8_MAX, FP8_MIN_SCALE
    ins, out = spec.split("->")
    la, lb = ins.split(",")
    kdims = [c for c in la if c in lb and c not in out]

    def quant(x, letters):
        axes = tuple(i for i, c in enumerate(letters) if c in kdims)
        x = x.float()
        amax = x.abs().amax(dim=axes, keepdim=True) if axes else x.abs()
        sc = torch.where(amax > 0, (amax / FP8_MAX).clamp(min=FP8_MIN_SCALE),
                         torch.ones_like(amax))
        return (x / sc).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), sc
    qa, sa = quant(ca, la)
    qb, sb = quant(cb, lb)
    M, K = qa.shape if qa.ndim == 2 else (0, 0)
    if (qa.is_cuda and spec == "ab,bc->ac" and K % 16 == 0 and qb.shape[1] % 16 == 0
            and hasattr(torch, "_scaled_mm")):
        return torch._scaled_mm(qa, qb.t().contiguous().t(), scale_a=sa.reshape(M, 1),
                                scale_b=sb.reshape(1, -1), out_dtype=torch.float32)
    r = torch.einsum(spec, qa.float(), qb.float())
    # both scales are constant along the contracted letters: as einsum over the kept letters
    ra = "".join(c for c in la if c not in kdims)
    rb = "".join(c for c in lb if c not in kdims)
    sa_k = sa.reshape([d for d, c in zip(sa.shape, la) if c not in kdims])
    sb_k = sb.reshape([d for d, c in zip(sb.shape, lb) if c not in kdims])
    return r * torch.einsum(f"{ra},{rb}->{out}", sa_k, sb_k)


def _native_contraction(precision: str | None):
    """``graph_torch.contraction_op`` multiplying in the operands' own dtype (see module doc)."""
    def op(a, b, spec, a_index, b_index, scale, keep_shape, out_shape, acc_name, out_name):
        import torch
        ca, cb = a[a_index], b[b_index]
        out_dt = getattr(torch, out_name)
        if precision == "fp8" and ca.dtype.is_floating_point:
            r = _fp8_scaled(spec, ca, cb)
            if scale != 1:
                r = r * scale
            full = tuple(d for d in out_shape if d is not None)
            r = r.reshape(keep_shape).expand(full)
            return r.reshape(tuple(1 if d is None else d for d in out_shape)).to(out_dt)
        if precision in _HALF_PRECISIONS and ca.dtype == torch.float32:
            half = getattr(torch, _HALF_PRECISIONS[precision])
            ca, cb = ca.to(half), cb.to(half)
        if ca.dtype in (torch.float16, torch.bfloat16) and ca.device.type == "cpu":
            # CPU half matmuls may round partial sums; accumulate in fp32 as the reference does
            ca, cb = ca.float(), cb.float()
        elif not ca.dtype.is_floating_point:
            ca, cb = ca.to(getattr(torch, acc_name)), cb.to(getattr(torch, acc_name))
        r = torch.einsum(spec, ca, cb)
        if scale != 1:
            r = r * scale
        full = tuple(d for d in out_shape if d is not None)
        r = r.reshape(keep_shape).expand(full)
        return r.reshape(tuple(1 if d is None else d for d in out_shape)).to(out_dt)
    return op


@contextlib.contextmanager
def _tf32(allow: bool):
    import torch
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


class ExternKernel:
    """A kernel run through torch (see module docstring).

    Args:
        kernel: the kernel (form + meaning).
        impl: the implementation (``cublas``).
    Raises:
        ValueError: when ``impl`` does not apply to the kernel's meaning.
    """

    def __init__(self, kernel: Kernel, impl: str = "cublas"):
        if impl not in extern_impls(kernel):
            if impl not in IMPLS or impl == "triton" or not contractions_of(kernel):
                raise ValueError(f"implementation {impl!r} does not apply to this {kernel.form} "
                                 "kernel")
            # A plan chosen for a size range and re-sized to a small size of it: its contractions
            # can degenerate there (K = 1 at size 1, or M = N = 1), where no vendor call applies
            # (backends/extern.py: vendor_contractions). The kernel's meaning is the same, so it
            # runs as the torch replay (cublas's path, each contraction one einsum).
            impl = "cublas"
        self.kernel = kernel
        self.impl = impl
        self._modules: dict[tuple, object] = {}
        self._sdpa = None
        if impl == "sdpa":
            from lumc.compiler.runtime.extern_sdpa import SdpaAttention
            self._sdpa = SdpaAttention(kernel)       # ValueError where the scores are not affine

    def _module(self, device: str, precision: str | None):
        key = (device, precision)
        mod = self._modules.get(key)
        if mod is None:
            from lumc.compiler.runtime import graph_torch
            replace = None
            if self.impl == "cudnn":    # each proven convolution one F.conv call (cuDNN)
                from lumc.compiler.runtime.extern_conv import conv_replacements
                replace = conv_replacements(self.kernel, precision)
            mod = graph_torch.graph_module(self.kernel.meaning, replace)
            native = _native_contraction(precision)
            for node in mod.graph.nodes:
                if node.op == "call_function" and node.target is graph_torch.contraction_op:
                    node.target = native
            mod.recompile()
            mod = mod.to(device)
            self._modules[key] = mod
        return mod

    def _args(self, inputs):
        import torch
        from lumc.backends.triton.launch import to_torch, torch_dtype
        phs = self.kernel.inputs
        if len(inputs) != len(phs):
            raise InputError(f"extern {self.impl} kernel takes {len(phs)} input"
                             f"{'s' * (len(phs) != 1)}, got {len(inputs)}")
        device = next((str(x.device) for x in inputs if isinstance(x, torch.Tensor)), "cpu")
        args = []
        for ph, x in zip(phs, inputs):
            t = to_torch(x, device)
            if tuple(t.shape) != tuple(ph.shape) or t.dtype != torch_dtype(ph.dtype):
                raise InputError(f"input {ph.arg.name} is {t.dtype}{list(t.shape)}, expected "
                                 f"{ph.dtype}{list(ph.shape)}", node=ph.arg.name)
            args.append(t)
        return args, device

    def bound_launch(self, inputs: list, outputs: list, config=None):
        """A zero-argument callable that runs on these exact tensors and writes ``outputs``."""
        args, device = self._args(inputs)
        prec = _precision(config)
        compute = self._compute(device, prec)

        def run():
            for o, r in zip(outputs, compute(args)):
                o.copy_(r)
        return run

    def _compute(self, device: str, prec: str | None):
        """``args -> list of output tensors`` for this implementation on ``device``."""
        allow = prec == "tf32"
        if self._sdpa is not None:
            names = [ph.arg.name for ph in self.kernel.inputs]

            def sdpa(args):
                with _tf32(allow):
                    return self._sdpa(dict(zip(names, args)), device, prec)
            return sdpa
        mod = self._module(device, prec)
        from lumc.compiler.runtime.extern_conv import cudnn_tf32

        def replay(args):
            with _tf32(allow), cudnn_tf32(allow, device):
                return list(mod(*args))
        return replay

    def __call__(self, *inputs, outputs=None, config=None):
        """Run on torch tensors (or numpy arrays, run on the CPU); returns the output tensors in
        ``out0, out1, ...`` order (``outputs`` when given, filled in place).

        Raises:
            InputError: on a wrong number of inputs or a wrong shape or dtype.
        """
        args, device = self._args(inputs)
        res = self._compute(device, _precision(config))(args)
        if outputs is None:
            return [r.contiguous() for r in res]
        for o, r in zip(outputs, res):
            o.copy_(r)
        return list(outputs)


def _precision(config) -> str | None:
    if config is None:
        return None
    d = config if isinstance(config, dict) else config.kwargs()
    p = d.get("PRECISION")
    return None if p is None else str(p)


_EXTERN: "weakref.WeakKeyDictionary[Kernel, dict]" = weakref.WeakKeyDictionary()


def run_extern_numpy(kernel: Kernel, config: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run ``kernel``'s extern implementation ``config["IMPL"]`` on the CPU (torch CPU) on numpy
    inputs; returns numpy outputs in ``out0..`` order (the CPU executor's path for extern configs)."""
    from lumc.backends.triton.launch import to_numpy, to_torch
    impl = impl_of(config)
    per_kernel = _EXTERN.setdefault(kernel, {})
    ek = per_kernel.get(impl)
    if ek is None:          # built once per kernel: its torch modules and probes are reused
        ek = per_kernel[impl] = ExternKernel(kernel, impl)
    outs = ek(*[to_torch(np.asarray(x), "cpu") for x in inputs], config=config)
    return [to_numpy(o) for o in outs]


class ExternConfig:
    """The config of an extern implementation: ``IMPL`` (and ``PRECISION`` when set); it travels as
    the plain dict :meth:`kwargs` returns, like a Triton :class:`~lumc.backends.triton.configs.Config`."""

    __slots__ = ("impl", "precision")

    def __init__(self, impl: str, precision: str | None = None):
        self.impl = impl
        self.precision = precision

    def kwargs(self) -> dict:
        d = {"IMPL": self.impl}
        if self.precision is not None:
            d["PRECISION"] = self.precision
        return d

    def __eq__(self, other) -> bool:
        return isinstance(other, ExternConfig) and other.kwargs() == self.kwargs()

    def __hash__(self) -> int:
        return hash((self.impl, self.precision))

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.kwargs().items())

    __repr__ = __str__


def config_from_dict(cfg: dict | None):
    """The config object of a plan's config dict: an :class:`ExternConfig` for an ``IMPL`` config, a
    Triton ``Config`` otherwise, None for None."""
    if cfg is None:
        return None
    if impl_of(cfg) != "triton":
        return ExternConfig(impl_of(cfg), cfg.get("PRECISION"))
    from lumc.backends.triton.configs import make
    rest = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages", "IMPL")}
    return make(cfg.get("num_warps", 4), cfg.get("num_stages", 2), **rest)


def launcher_for(kernel: Kernel, cfg: dict | None):
    """What runs ``kernel`` at plan config ``cfg``: an :class:`ExternKernel` for an ``IMPL`` config,
    else a ``TritonKernel``."""
    if impl_of(cfg) != "triton":
        return ExternKernel(kernel, impl_of(cfg))
    from lumc.backends.triton.launch import TritonKernel
    return TritonKernel(kernel)
