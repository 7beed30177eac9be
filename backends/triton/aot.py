"""Ahead-of-time compiles for Hopper (``cuda:90``) without a GPU.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs the whole Triton pipeline
(TTIR -> TTGIR -> LLVM -> PTX -> cubin through the bundled ``ptxas``) on the CPU. The compiled
metadata gives the shared memory one block needs; a config fits when that is at most
``configs.SMEM_LIMIT`` (227 KiB on H100/H200). Pointer arguments are marked 16-byte aligned, as
Triton specializes them at a real launch on torch's allocations.

Each compile also reports what the hardware would run (``sass.py``): registers per thread, spill
stores and loads, stack frame and static shared memory from the ``ptxas -v`` log of the PTX (Triton
runs the bundled ``ptxas`` with ``-v``; the child sets ``TRITON_DUMP_PTXAS_LOG`` and captures the
log, and runs ``ptxas -v`` itself on the PTX when the kernel came from Triton's cache), and the
tensor-core opcodes of the SASS (``cuobjdump -sass`` of the cubin, also bundled).

Compiles run in a child process (``python -m lumc.backends.triton.aot``), because the parent may be
running the Triton interpreter (``TRITON_INTERPRET=1``), under which ``@triton.jit`` functions cannot
be compiled. One child compiles a whole batch; each job reports its own error instead of failing the
batch.

The child can compile with another Triton than the parent's: ``triton_dir`` (default: the
environment variable ``LUMC_AOT_TRITON``) names a folder holding one (``pip install --no-deps
--target DIR triton==3.6.0``), put first on the child's ``PYTHONPATH``. ``make install`` puts the
GPU image's Triton (3.6; the GPU machine has no other) in ``.venv/triton-gpu-image``, so that a
kernel form using Triton API that version lacks fails here, not on the GPU (an mlp kernel's
``tl.static_assert`` of a ``tl.cdiv`` did). Each result names the Triton version that compiled it.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from lumc.backends.triton import cache
from lumc.backends.triton.configs import SMEM_LIMIT, Config
from lumc.backends.triton.exprs import SIGNATURE_TYPE
from lumc.backends.triton.source import RenderedKernel

TARGET = ("cuda", 90, 32)


@dataclass
class AotResult:
    """One compile: the kernel, the config, shared memory in bytes, and the error if it failed.

    Attributes:
        shared_bytes: dynamic shared memory one block requests (Triton's ``metadata.shared``),
            the largest over a multi-kernel module's kernels.
        registers: 32-bit registers per thread (``ptxas -v``; the largest over the module).
        spill_stores, spill_loads: bytes spilled to local memory per thread (summed over the
            module's kernels).
        stack_bytes: the stack frame per thread (largest); static_shared_bytes: ``ptxas``'s static
            shared memory (largest; Triton's tiles are dynamic and counted in ``shared_bytes``).
        tensor_core: tensor-core opcodes of the SASS, shape dropped, with counts
            (``{"HGMMA.F32.BF16": 64}``; empty on CUDA cores, see ``sass.py``).
        sass_instructions: the number of SASS instructions (all kernels of the module).
        triton_version: the version of the Triton that compiled it (``triton.__version__``).
    """
    kernel: str
    form: str
    config: Config
    shared_bytes: int | None
    seconds: float
    error: str | None = None
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack_bytes: int | None = None
    static_shared_bytes: int | None = None
    tensor_core: dict[str, int] = field(default_factory=dict)
    sass_instructions: int | None = None
    triton_version: str | None = None

    @property
    def fits(self) -> bool:
        return self.error is None and self.shared_bytes is not None and self.shared_bytes <= SMEM_LIMIT

    @property
    def spills(self) -> bool:
        """True when the compiled code spills registers to local memory."""
        return bool(self.spill_stores or self.spill_loads)


def _job(rk: RenderedKernel, cfg: Config) -> dict:
    ptrs = rk.pointer_signature
    n_params = len(rk.params)
    sig = {name: "*" + SIGNATURE_TYPE[d.name] for name, d in ptrs[:n_params]}
    sig.update({a: "i32" for a in rk.size_args})     # a size-generic kernel's runtime sizes
    sig.update({name: "*" + SIGNATURE_TYPE[d.name] for name, d in ptrs[n_params:]})
    consts = {**dict(cfg.blocks), **rk.fixed_constexprs}
    for k in (*rk.constexprs, *rk.fixed_constexprs):
        sig[k] = "constexpr"
    # a multi-kernel module (split reduction) compiles each of its kernels; they share a signature
    return {"path": str(cache.write_source(rk)), "names": list(rk.kernel_names or (rk.name,)),
            "signature": sig, "constexprs": consts, "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages,
            "pointers": [i for i, k in enumerate(sig) if sig[k].startswith("*")]}


_RESOURCE_KEYS = ("registers", "spill_stores", "spill_loads", "stack_bytes", "static_shared_bytes")


def compile_many(jobs: list[tuple[RenderedKernel, Config]], timeout: float = 900.0,
                 triton_dir: str | None = None) -> list[AotResult]:
    """Compile every ``(kernel, config)`` for ``cuda:90`` in one child process (identical jobs
    are compiled once).

    Args:
        timeout: seconds the child may take for the whole batch.
        triton_dir: a folder holding the Triton to compile with (first on the child's
            ``PYTHONPATH``); default ``$LUMC_AOT_TRITON``, else the parent's Triton.
    Returns:
        one :class:`AotResult` per job, in order (failures carry ``error``), with registers, spills
        and tensor-core opcodes (see :class:`AotResult`).
    Raises:
        RuntimeError: when the child process itself dies (not for a kernel that fails to compile).
        FileNotFoundError: ``triton_dir`` holds no ``triton`` package.
    """
    if not jobs:
        return []
    specs = [_job(rk, cfg) for rk, cfg in jobs]
    keys = [json.dumps(j, sort_keys=True) for j in specs]
    unique = list(dict.fromkeys(keys))
    payload = json.dumps([specs[keys.index(k)] for k in unique])
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DUMP_PTXAS_LOG="1")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    triton_dir = triton_dir or os.environ.get("LUMC_AOT_TRITON") or None
    if triton_dir:
        triton_dir = os.path.abspath(triton_dir)
        if not os.path.isfile(os.path.join(triton_dir, "triton", "__init__.py")):
            raise FileNotFoundError(f"no triton package in {triton_dir} (LUMC_AOT_TRITON, or "
                                    "triton_dir): pip install --no-deps --target DIR triton==X")
        env["PYTHONPATH"] = os.pathsep.join([triton_dir] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, "-m", "lumc.backends.triton.aot"], input=payload,
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"AOT compile worker failed ({proc.returncode}): {proc.stderr[-2000:]}")
    done = dict(zip(unique, json.loads(proc.stdout.strip().splitlines()[-1])))
    out = []
    for (rk, cfg), k in zip(jobs, keys):
        r = done[k]
        out.append(AotResult(rk.name, rk.form, cfg, r["shared"], r["seconds"], r["error"],
                             **{n: r.get(n) for n in _RESOURCE_KEYS},
                             tensor_core=dict(r.get("tensor_core") or {}),
                             sass_instructions=r.get("sass_instructions"),
                             triton_version=r.get("triton")))
    return out


def compile_aot(rk: RenderedKernel, cfg: Config) -> AotResult:
    """Compile one kernel at one config for ``cuda:90`` (see :func:`compile_many`)."""
    return compile_many([(rk, cfg)])[0]


def _ptxas_log(ck, name: str, captured: str) -> dict:
    """The ``ptxas -v`` resources of kernel ``name`` of compiled kernel ``ck``: from the log Triton
    printed while compiling (``captured``), else (a Triton cache hit prints none) from running the
    bundled ``ptxas -v`` on its PTX with the flags Triton uses (``make_cubin``)."""
    from lumc.backends.triton.sass import ptxas_resources
    res = ptxas_resources(captured)
    if name in res:
        return res[name]
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ck.asm["ptx"])
        proc = subprocess.run([get_ptxas(TARGET[1]).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
                               f"--gpu-name={sm_arch_from_capability(TARGET[1])}", src, "-o",
                               os.path.join(d, "k.o")], capture_output=True, text=True, check=True)
    res = ptxas_resources(proc.stderr + proc.stdout)
    if name not in res:
        raise RuntimeError(f"ptxas -v reported no resources for {name}")
    return res[name]


def _worker() -> None:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lumc.backends.triton.sass import sass_opcodes, tensor_core_ops

    jobs = json.loads(sys.stdin.read())
    out = []
    for j in jobs:
        t0 = time.perf_counter()
        try:
            spec = importlib.util.spec_from_file_location(f"lumc_aot.{j['names'][0]}", j["path"])
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            attrs = {(i,): [["tt.divisibility", 16]] for i in j["pointers"]}
            shared = 0
            res = dict.fromkeys(_RESOURCE_KEYS, 0)
            tc: dict[str, int] = {}
            n_sass = 0
            for name in j["names"]:
                src = ASTSource(fn=getattr(mod, name), signature=j["signature"],
                                constexprs=j["constexprs"], attrs=attrs)
                log = io.StringIO()
                with contextlib.redirect_stdout(log):     # TRITON_DUMP_PTXAS_LOG prints the log
                    ck = triton.compile(src, target=GPUTarget(*TARGET), options={
                        "num_warps": j["num_warps"], "num_stages": j["num_stages"]})
                shared = max(shared, int(ck.metadata.shared))
                r = _ptxas_log(ck, ck.metadata.name, log.getvalue())
                for k in _RESOURCE_KEYS:
                    res[k] = res[k] + r[k] if k.startswith("spill") else max(res[k], r[k])
                ops = sass_opcodes(ck.asm["sass"])
                n_sass += sum(ops.values())
                for op, n in tensor_core_ops(ops).items():
                    tc[op] = tc.get(op, 0) + n
            out.append({"shared": shared, "error": None, "seconds": time.perf_counter() - t0,
                        **res, "tensor_core": tc, "sass_instructions": n_sass,
                        "triton": triton.__version__})
        except Exception as e:  # noqa: BLE001 - one failed kernel must not hide the others
            msg = [ln for ln in f"{type(e).__name__}: {e}".splitlines() if ln.strip()]
            # the first line says where, the last lines say what
            text = " | ".join(msg[:1] + msg[-6:]) if len(msg) > 7 else " | ".join(msg)
            out.append({"shared": None, "error": text[:2000],
                        "seconds": time.perf_counter() - t0, "triton": triton.__version__})
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    _worker()
