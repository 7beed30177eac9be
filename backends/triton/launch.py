"""Host side: calling a rendered kernel on torch tensors.

:class:`TritonKernel` renders a :class:`~lumc.ir.kernels.Kernel` once, imports its module from the
cache, and launches it with one config. Inputs are checked against the kernel's placeholders (shape
and dtype), made contiguous when they are not (lumc's own buffers always are: views live in the
meaning and are read in place), and outputs are allocated unless given.

Without a GPU, kernels run under the Triton interpreter (``TRITON_INTERPRET=1``) on CPU tensors:
:func:`interpreter_mode` says which, and callers print it.
"""
from __future__ import annotations

import os

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import InputError
from lumc.ir.kernels import Kernel
from lumc.backends.triton import cache, configs
from lumc.backends.triton.render import render

_TORCH_NAMES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u64": "uint64",
                "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool",
                "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}
# 1-byte numpy types torch.from_numpy refuses (ml_dtypes float8): moved as their uint8 bit patterns
_BYTE_VIEWED = {dt.f8e4m3fn.np: "float8_e4m3fn", dt.f8e5m2.np: "float8_e5m2"}


def torch_dtype(d: dt.DType):
    import torch
    return getattr(torch, _TORCH_NAMES[d.name])


def lumc_dtype(td) -> dt.DType:
    name = str(td).replace("torch.", "")
    for k, v in _TORCH_NAMES.items():
        if v == name:
            return dt.BY_NAME[k]
    raise KeyError(f"unsupported torch dtype {td}")


def interpreter_mode() -> bool:
    """True when kernels run in the Triton interpreter (``TRITON_INTERPRET=1``, set by
    :mod:`lumc.backends.triton` at import when no CUDA device is present)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_device() -> str:
    return "cpu" if interpreter_mode() else "cuda"


def to_torch(x, device: str):
    """A torch tensor on ``device`` from a numpy array (bf16 and float8 via their bit patterns) or
    a tensor."""
    import torch
    if isinstance(x, torch.Tensor):
        return x.to(device)
    a = np.asarray(x)
    if a.dtype == dt.bf16.np:
        bits = torch.from_numpy(np.array(a, order="C").view(np.int16))   # keeps rank 0
        return bits.view(torch.bfloat16).to(device)
    if a.dtype in _BYTE_VIEWED:
        bits = torch.from_numpy(np.array(a, order="C").view(np.uint8))
        return bits.view(getattr(torch, _BYTE_VIEWED[a.dtype])).to(device)
    return torch.from_numpy(np.array(a, order="C")).to(device)   # a copy; keeps rank 0


def to_numpy(t) -> np.ndarray:
    import torch
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dt.bf16.np)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().view(lumc_dtype(t.dtype).np)
    return t.numpy()


def input_to_numpy(t, name: str, convert=None) -> np.ndarray:
    """:func:`to_numpy` (or ``convert``) of a caller's input tensor; one that holds no readable dense data (on the
    ``meta`` device, sparse, quantized) is an ``InputError`` naming the input, not torch's error.

    Raises:
        InputError: the tensor cannot be read as an array.
    """
    from lumc.ir.errors import InputError
    try:
        return (convert or to_numpy)(t)
    except (RuntimeError, NotImplementedError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputError(f"input {name!r} is a {t.dtype} tensor on {t.device} with layout "
                         f"{t.layout} that cannot be read ({first}); give a dense tensor with "
                         "data", node=name) from None


class TritonKernel:
    """A kernel ready to launch.

    Args:
        kernel: the kernel (form + meaning).
        variant: forced render variant (see :func:`lumc.backends.triton.render.render`).
    Raises:
        RenderError: when the meaning does not fit the form.
    """

    def __init__(self, kernel: Kernel, variant: str | None = None):
        from lumc.backends import triton as pkg
        if pkg.MODE_PROBLEM:
            raise RuntimeError(pkg.MODE_PROBLEM)
        self.kernel = kernel
        self.rendered = render(kernel, variant)
        self.interpret = interpreter_mode()
        self._module = None
        self._consts: dict[str, object] = {}

    @property
    def module(self):
        if self._module is None:
            self._module = cache.load_module(self.rendered)
        return self._module

    @property
    def source(self) -> str:
        return self.rendered.source

    def config_space(self) -> list[configs.Config]:
        return configs.config_space(self.rendered.config_space, self.rendered.problem)

    def default_config(self) -> configs.Config:
        """The untuned GPU config (in the config space where the space is not empty), also under
        the interpreter: a search on a simulated device picks among configs a GPU can run."""
        return configs.default_config(self.rendered.config_space, self.rendered.problem)

    def run_config(self) -> configs.Config:
        """The config a launch without one uses: the GPU default, or big tiles under the
        interpreter (whose cost is per program and per op, not per element)."""
        if self.interpret:
            return configs.interpreter_config(self.rendered.config_space, self.rendered.problem)
        return self.default_config()

    def check_config(self, precision: str | None = None) -> configs.Config:
        """The config of a numerics check at ``precision`` (default: the problem's): under the
        interpreter :func:`~lumc.backends.triton.configs.check_config` (big tiles; a large
        contraction's tiles sized for a sampled check), else the GPU default."""
        if self.interpret:
            return configs.check_config(self.rendered.config_space, self.rendered.problem,
                                        precision)
        return configs.with_precision(self.default_config(), self.rendered.problem, precision)

    def _const(self, name: str, device: str):
        key = f"{name}@{device}"
        t = self._consts.get(key)
        if t is None:
            t = to_torch(self.rendered.constants[name], device).contiguous()
            self._consts[key] = t
        return t

    def bound_launch(self, inputs: list, outputs: list, config: configs.Config):
        """A zero-argument callable that launches on these exact tensors (for timing loops: the
        checks and conversions of :meth:`__call__` are done once, here)."""
        config = configs.with_precision(config, self.rendered.problem)
        self(*inputs, outputs=outputs, config=config)
        args = [t.contiguous() for t in inputs]
        dev = str(args[0].device) if args else default_device()
        args += [self._const(p.name, dev) for p in self.rendered.params if p.role == "const"]
        launch, kw = self.module.launch, config.kwargs()
        return lambda: launch(*args, *outputs, **kw)

    def __call__(self, *inputs, outputs=None, config: configs.Config | None = None):
        """Run the kernel.

        Args:
            inputs: one torch tensor (or numpy array) per placeholder ``in0, in1, ...`` in order.
            outputs: preallocated contiguous output tensors, or None to allocate.
            config: the launch config; None uses :meth:`run_config`.
        Returns:
            list of output tensors, in ``out0, out1, ...`` order.
        Raises:
            InputError: on a wrong number of inputs or a wrong shape or dtype.
        """
        import torch
        rk = self.rendered
        ins = rk.inputs
        if len(inputs) != len(ins):
            raise InputError(f"kernel {rk.name} takes {len(ins)} inputs, got {len(inputs)}")
        device = "cpu" if self.interpret else None
        args = []
        for p, x in zip(ins, inputs):
            if device is None:
                device = x.device if isinstance(x, torch.Tensor) and x.is_cuda else "cuda"
            t = to_torch(x, device)
            if tuple(t.shape) != tuple(p.shape):
                raise InputError(f"input {p.key} has shape {tuple(t.shape)}, expected {p.shape}",
                                 node=p.key)
            if t.dtype != torch_dtype(p.dtype):
                raise InputError(f"input {p.key} has dtype {t.dtype}, expected {p.dtype}",
                                 node=p.key)
            args.append(t if t.is_contiguous() else t.contiguous())
        device = device or default_device()
        for p in rk.params:
            if p.role == "const":
                args.append(self._const(p.name, str(device)))
        outs = []
        for i, p in enumerate(rk.outputs):
            o = outputs[i] if outputs is not None else torch.empty(p.shape, dtype=torch_dtype(p.dtype),
                                                                   device=device)
            outs.append(o)
        if all(int(np.prod(p.shape)) > 0 for p in rk.outputs):
            cfg = configs.with_precision(config, rk.problem) if config else self.run_config()
            # the interpreter evaluates with numpy, which warns on the inf/NaN IEEE arithmetic makes
            with np.errstate(all="ignore"):
                self.module.launch(*args, *outs, **cfg.kwargs())
        return outs
