"""Ahead-of-time compiles for Hopper (``cuda:90``) without a GPU.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs the whole Triton pipeline
(TTIR -> TTGIR -> LLVM -> PTX -> cubin through the bundled ``ptxas``) on the CPU. The compiled
metadata gives the shared memory one block needs; a config fits when that is at most
``configs.SMEM_LIMIT`` (227 KiB on H100/H200). Pointer arguments are marked 16-byte aligned, as
Triton specializes them at a real launch on torch's allocations.

Compiles run in a child process (``python -m lumc.backends.triton.aot``), because the parent may be
running the Triton interpreter (``TRITON_INTERPRET=1``), under which ``@triton.jit`` functions cannot
be compiled. One child compiles a whole batch; each job reports its own error instead of failing the
batch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from lumc.backends.triton import cache
from lumc.backends.triton.configs import SMEM_LIMIT, Config
from lumc.backends.triton.exprs import SIGNATURE_TYPE
from lumc.backends.triton.source import RenderedKernel

TARGET = ("cuda", 90, 32)


@dataclass
class AotResult:
    """One compile: the kernel, the config, shared memory in bytes, and the error if it failed."""
    kernel: str
    form: str
    config: Config
    shared_bytes: int | None
    seconds: float
    error: str | None = None

    @property
    def fits(self) -> bool:
        return self.error is None and self.shared_bytes is not None and self.shared_bytes <= SMEM_LIMIT


def _job(rk: RenderedKernel, cfg: Config) -> dict:
    ptrs = rk.pointer_signature
    sig = {name: "*" + SIGNATURE_TYPE[d.name] for name, d in ptrs}
    consts = {**dict(cfg.blocks), **rk.fixed_constexprs}
    for k in (*rk.constexprs, *rk.fixed_constexprs):
        sig[k] = "constexpr"
    # a multi-kernel module (split reduction) compiles each of its kernels; they share a signature
    return {"path": str(cache.write_source(rk)), "names": list(rk.kernel_names or (rk.name,)),
            "signature": sig, "constexprs": consts, "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages, "pointers": len(ptrs)}


def compile_many(jobs: list[tuple[RenderedKernel, Config]], timeout: float = 900.0) -> list[AotResult]:
    """Compile every ``(kernel, config)`` for ``cuda:90`` in one child process.

    Returns:
        one :class:`AotResult` per job, in order (failures carry ``error``).
    Raises:
        RuntimeError: when the child process itself dies (not for a kernel that fails to compile).
    """
    payload = json.dumps([_job(rk, cfg) for rk, cfg in jobs])
    env = dict(os.environ, TRITON_INTERPRET="0")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-m", "lumc.backends.triton.aot"], input=payload,
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"AOT compile worker failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [AotResult(rk.name, rk.form, cfg, r["shared"], r["seconds"], r["error"])
            for (rk, cfg), r in zip(jobs, rows)]


def compile_aot(rk: RenderedKernel, cfg: Config) -> AotResult:
    """Compile one kernel at one config for ``cuda:90`` (see :func:`compile_many`)."""
    return compile_many([(rk, cfg)])[0]


def _worker() -> None:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jobs = json.loads(sys.stdin.read())
    out = []
    for j in jobs:
        t0 = time.perf_counter()
        try:
            spec = importlib.util.spec_from_file_location(f"lumc_aot.{j['names'][0]}", j["path"])
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            attrs = {(i,): [["tt.divisibility", 16]] for i in range(j["pointers"])}
            shared = 0
            for name in j["names"]:
                src = ASTSource(fn=getattr(mod, name), signature=j["signature"],
                                constexprs=j["constexprs"], attrs=attrs)
                ck = triton.compile(src, target=GPUTarget(*TARGET), options={
                    "num_warps": j["num_warps"], "num_stages": j["num_stages"]})
                shared = max(shared, int(ck.metadata.shared))
            out.append({"shared": shared, "error": None, "seconds": time.perf_counter() - t0})
        except Exception as e:  # noqa: BLE001 - one failed kernel must not hide the others
            msg = [ln for ln in f"{type(e).__name__}: {e}".splitlines() if ln.strip()]
            # the first line says where, the last lines say what
            text = " | ".join(msg[:1] + msg[-6:]) if len(msg) > 7 else " | ".join(msg)
            out.append({"shared": None, "error": text[:2000],
                        "seconds": time.perf_counter() - t0})
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    _worker()
