"""Assembling one generated module: header comment, helpers, the ``@triton.jit`` kernel, a launcher.

Every renderer fills a :class:`KernelParts`; :func:`assemble` turns it into readable source and a
:class:`RenderedKernel` (the source plus what the host needs to call it). The kernel name carries a
hash of the source without the ``# covers model nodes`` comment, so the cache file name and the
function name identify the code, and identical kernels of repeated layers share one module.
"""
from __future__ import annotations

import hashlib
import textwrap
from dataclasses import dataclass, field

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.graph import Node
from lumc.ir.kernels import Kernel
from lumc.backends.triton import exprs


@dataclass(frozen=True)
class Param:
    """One pointer argument: ``role`` is ``in`` (a placeholder), ``out`` or ``const`` (a weight
    tensor living inside the meaning, passed by the launcher)."""
    name: str
    role: str
    key: str            # placeholder/output name (in0, out0) or the constant's index
    shape: tuple[int, ...]
    dtype: dt.DType


@dataclass
class KernelParts:
    """What a form renderer produces (the launcher and header are added by :func:`assemble`)."""
    form: str
    variant: str                      # e.g. "one-pass", "looped", "online-softmax", "dot"
    params: list[Param]
    constexprs: tuple[str, ...]       # config keys, e.g. ("BLOCK_M", "BLOCK_N", "BLOCK_K")
    body: str                         # indented kernel body
    grid: str                         # a Python expression over the constexpr names
    problem: dict[str, int]           # sizes the config space is pruned by
    config_space: str                 # which space of lumc.backends.triton.configs applies
    notes: list[str] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    extra_constexprs: dict[str, object] = field(default_factory=dict)  # fixed, not tuned
    # tuned knobs a config may omit (a config stored before the knob existed): their launch default
    knob_defaults: dict[str, object] = field(default_factory=dict)
    # multi-kernel forms (the split reduction): scratch buffers the launcher allocates, more
    # ``@triton.jit`` bodies with the same signature (``{suffix: body}``), and the launcher's body
    workspaces: list["Workspace"] = field(default_factory=list)
    extra_kernels: dict[str, str] = field(default_factory=dict)
    launcher: str | None = None


@dataclass(frozen=True)
class Workspace:
    """A scratch buffer the launcher allocates per launch (``torch.empty(shape)``); ``shape`` is a
    Python expression over the config's constexprs (``"(3, SPLIT)"``)."""
    name: str
    shape: str
    dtype: dt.DType


@dataclass
class RenderedKernel:
    """A kernel's generated module and its calling convention."""
    name: str
    form: str
    variant: str
    source: str
    params: list[Param]
    constexprs: tuple[str, ...]
    problem: dict[str, int]
    config_space: str
    constants: dict[str, np.ndarray]
    digest: str
    fixed_constexprs: dict[str, object] = field(default_factory=dict)
    workspaces: list[Workspace] = field(default_factory=list)
    kernel_names: tuple[str, ...] = ()     # every @triton.jit function of the module, main first
    size_args: tuple[str, ...] = ()     # runtime int sizes after the pointers (size_generic.py)

    @property
    def inputs(self) -> list[Param]:
        return [p for p in self.params if p.role == "in"]

    @property
    def outputs(self) -> list[Param]:
        return [p for p in self.params if p.role == "out"]

    @property
    def pointer_signature(self) -> list[tuple[str, dt.DType]]:
        """``(name, element dtype)`` of each pointer argument of the jitted kernels, in order."""
        return [(p.name, p.dtype) for p in self.params] + [(w.name, w.dtype) for w in self.workspaces]


def _describe(kernel: Kernel, limit: int = 40) -> list[str]:
    lines = kernel.meaning.dump().splitlines()
    if len(lines) > limit:
        lines = lines[:limit // 2] + [f"... ({len(lines) - limit} more nodes)"] + lines[-limit // 2:]
    return lines


def assemble(kernel: Kernel, parts: KernelParts, size_args: tuple[str, ...] = ()) -> RenderedKernel:
    """The full module source of a rendered kernel. ``size_args`` are runtime int arguments (the
    sizes of a size-generic kernel, ``lumc.backends.triton.size_generic``): after the pointers in
    every jitted function and kernel launch, keywords of ``launch``."""
    sig = ", ".join([p.name for p in parts.params] + list(size_args)
                    + [w.name for w in parts.workspaces]
                    + [f"{c}: tl.constexpr" for c in (*parts.constexprs, *parts.extra_constexprs)])
    args = ", ".join(p.name for p in parts.params)
    sized = "".join(f"{a}, " for a in size_args)
    cfg_kw = ", ".join(f"{c}={c}" for c in parts.constexprs)
    covers = ", ".join(map(str, kernel.covers)) if kernel.covers else "(standalone kernel)"
    covers_lines = [("# covers model nodes: " if i == 0 else "#   ") + part
                    for i, part in enumerate(textwrap.wrap(covers, 96) or [covers])]
    head = [
        f"# lumc generated kernel: form {parts.form} ({parts.variant})",
        *covers_lines,
        "# meaning (primitive graph over placeholders in0.. producing out0..):",
        *[f"#   {ln}" for ln in _describe(kernel)],
    ]
    for note in parts.notes:
        head.append(f"# note: {note}")
    params_doc = "\n".join(f"        {p.name}: {p.role} {p.key} {p.dtype}{list(p.shape)}"
                           for p in parts.params)
    params_doc += "".join(f"\n        {w.name}: workspace {w.dtype}{w.shape}" for w in parts.workspaces)
    fixed = "".join(f", {k}={v!r}" for k, v in parts.extra_constexprs.items())
    kernels = [("KERNEL_NAME", "", parts.body)] + [(f"KERNEL_NAME_{k}", f", {k}", b)
                                                   for k, b in parts.extra_kernels.items()]
    jitted = "\n\n".join(f'''@triton.jit
def {fn}({sig}):
    """lumc {parts.form} kernel ({parts.variant}{label}).

    Pointers (role, placeholder, dtype, shape):
{params_doc}
    """
{body}
''' for fn, label, body in kernels)
    launcher = parts.launcher or (f"    grid = ({parts.grid},)\n    KERNEL_NAME[grid]({args},\n"
                                  f"        {cfg_kw}{fixed},\n"
                                  "        num_warps=num_warps, num_stages=num_stages)")
    if size_args:   # every launch passes the sizes right after the pointers
        launcher = launcher.replace(f"]({args},", f"]({args}, {sized.rstrip(', ')},")
    torch_import = "import torch\n" if parts.workspaces else ""
    knobs = ", ".join(c if c not in parts.knob_defaults else f"{c}={parts.knob_defaults[c]!r}"
                      for c in parts.constexprs)
    src = "\n".join(head) + f'''
{torch_import}import triton
import triton.language as tl
{exprs.HELPERS}

{jitted}

def launch({args}, *, {sized}{knobs}, num_warps=4, num_stages=2):
    """Launch on contiguous tensors with one kernel config."""
{launcher}
'''
    # the name hashes the signature and body, not the model nodes covered: identical kernels of
    # repeated layers share one module, one file and one Triton compile
    body_src = src.replace("\n".join(covers_lines) + "\n", "", 1)
    digest = hashlib.blake2b(body_src.encode(), digest_size=8).hexdigest()
    name = f"lumc_{parts.form}_{digest}"
    src = src.replace("KERNEL_NAME", name)
    names = (name,) + tuple(f"{name}_{k}" for k in parts.extra_kernels)
    return RenderedKernel(name, parts.form, parts.variant, src, parts.params, parts.constexprs,
                          parts.problem, parts.config_space, parts.constants, digest,
                          dict(parts.extra_constexprs), list(parts.workspaces), names,
                          tuple(size_args))


def make_params(kernel: Kernel, reads: list[Node]) -> tuple[list[Param], dict[Node, str],
                                                           dict[str, np.ndarray]]:
    """Pointer params for the inputs (in placeholder order), read constants, then outputs."""
    params: list[Param] = []
    ptrs: dict[Node, str] = {}
    consts: dict[str, np.ndarray] = {}
    for name, n in kernel.meaning.inputs.items():
        p = f"{name}_ptr"
        params.append(Param(p, "in", name, n.shape, n.dtype))
        ptrs[n] = p
    k = 0
    for n in reads:
        if n.op == "Constant":
            p = f"const{k}_ptr"
            params.append(Param(p, "const", str(k), n.shape, n.dtype))
            consts[p] = n.arg.value
            ptrs[n] = p
            k += 1
    for name, n in kernel.meaning.outputs.items():
        params.append(Param(f"{name}_ptr", "out", name, n.shape, n.dtype))
    return params, ptrs, consts
