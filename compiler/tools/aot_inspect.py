"""Tensor-core evidence without a GPU: every kernel of a program compiled ahead of time for Hopper.

``lumc inspect ART.lumc --aot cuda:90`` (and :func:`aot_rows` from Python) compiles each kernel of a
compiled model at its chosen config for ``cuda:90`` (``lumc.backends.triton.aot``: the Triton
pipeline down to the cubin, in one child process, identical kernels once) and reports, per kernel,
what the hardware would run: registers per thread, spill stores and loads, the stack frame and
shared memory (``ptxas -v``), and the tensor-core opcodes of the SASS (``cuobjdump -sass``; see
``lumc.backends.triton.sass`` for the Hopper mnemonics), next to the config's operand precision.

A kernel whose config names an ``IMPL`` other than ``triton`` is a vendor kernel run through torch
(cuBLAS, SDPA): it has no lumc code to compile, and its row says so.
"""
from __future__ import annotations

import re

from lumc.ir.errors import LumcError

AOT_TARGETS = ("cuda:90",)       # what backends/triton/aot.py compiles for (sm_90a, 32-thread warps)
CONTRACTION_FORMS = ("matmul", "attention", "mlp")
# the tensor-core operand type a PRECISION asks for (sass.mma_input_type names); a row whose SASS
# has tensor-core opcodes of other types only is marked: Triton lowers an fp8 tl.dot on the
# warp-level mma.sync path (tiles too small for a warpgroup MMA) to fp16 HMMA
MMA_TYPE_OF_PRECISION = {"tf32x3": "tf32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16",
                         "fp8": "fp8"}


def check_aot_target(target: str) -> str:
    """The target of ``--aot`` (``cuda:90``), normalized.

    Raises:
        LumcError: for any other target (one line naming the supported ones).
    """
    t = str(target).strip().lower().replace("sm_", "cuda:").replace("sm", "cuda:")
    if re.fullmatch(r"cuda:90a?", t):
        return "cuda:90"
    raise LumcError(f"--aot {target}: unsupported target; supported: {', '.join(AOT_TARGETS)} "
                    "(Hopper, compiled with the ptxas inside the Triton wheel)")


def _config_object(kernel, rk, cfg):
    """A plan's config dict (or a Triton ``Config``, or None: the default) as a Triton ``Config``
    with its ``PRECISION`` set."""
    from lumc.backends.triton import configs
    if cfg is None:
        c = configs.default_config(rk.config_space, rk.problem)
    elif isinstance(cfg, configs.Config):
        c = cfg
    else:
        from lumc.compiler.runtime.extern import config_from_dict
        c = config_from_dict(cfg)
    return configs.with_precision(c, rk.problem)


def kernel_aot_rows(items: list, target: str = "cuda:90", timeout: float = 1800.0) -> list[dict]:
    """Compile kernels at given configs for ``target`` and describe each.

    Args:
        items: ``(kernel, config)`` pairs; a config is a plan dict (``{"BLOCK_M": 64, ...,
            "PRECISION": "bf16"}``, or ``{"IMPL": "cublas", ...}`` for a vendor kernel), a Triton
            ``Config``, or None for the kernel's default config.
        target: ``cuda:90`` (see :func:`check_aot_target`).
        timeout: seconds for the whole batch (one child process).
    Returns:
        one dict per item, in order: ``index``, ``form``, ``kernel`` (module name), ``impl``,
        ``precision`` (the config's ``PRECISION``, None without a ``tl.dot``), ``config`` (text),
        ``contraction`` (the kernel has a ``tl.dot``, or a vendor GEMM), ``compiled``; for compiled
        kernels ``registers``, ``spill_stores``, ``spill_loads`` (bytes per thread), ``stack_bytes``,
        ``shared_bytes`` (dynamic + static, per block), ``tensor_core`` (``{opcode: count}``),
        ``mma_types`` (operand types of those opcodes: ``tf32``, ``bf16``, ``fp16``, ``fp8``),
        ``compile_s``; ``note`` says why a kernel was not compiled, ``error`` why a compile failed.
    Raises:
        LumcError: an unsupported target; RuntimeError: the compile worker process died.
    """
    from lumc.backends.extern import impl_of, vendor_contractions
    from lumc.backends.triton import aot, render
    from lumc.backends.triton.sass import mma_input_type

    check_aot_target(target)
    rows, jobs, where = [], [], []
    for i, (kernel, cfg) in enumerate(items):
        impl = impl_of(cfg) if isinstance(cfg, dict) else "triton"
        row = {"index": i, "form": kernel.form, "kernel": "", "impl": impl, "precision": None,
               "config": "", "contraction": bool(vendor_contractions(kernel)), "compiled": False}
        rows.append(row)
        if impl != "triton":
            row["precision"] = cfg.get("PRECISION")
            row["config"] = " ".join(f"{k}={v}" for k, v in cfg.items())
            row["note"] = f"vendor kernel ({impl} through torch), not compiled"
            continue
        try:
            rk = render(kernel)
            c = _config_object(kernel, rk, cfg)
        except Exception as e:  # noqa: BLE001 - one kernel that cannot render must not hide others
            row["error"] = f"render: {type(e).__name__}: {e}".splitlines()[0][:300]
            continue
        row.update(kernel=rk.name, precision=dict(c.blocks).get("PRECISION"), config=str(c))
        row["contraction"] = row["contraction"] or rk.problem.get("dot_dtype") is not None
        jobs.append((rk, c))
        where.append(row)
    for row, r in zip(where, aot.compile_many(jobs, timeout=timeout) if jobs else []):
        row["compile_s"] = round(r.seconds, 2)
        if r.error:
            row["error"] = r.error
            continue
        row.update(compiled=True, registers=r.registers, spill_stores=r.spill_stores,
                   spill_loads=r.spill_loads, stack_bytes=r.stack_bytes,
                   shared_bytes=(r.shared_bytes or 0) + (r.static_shared_bytes or 0),
                   tensor_core=dict(r.tensor_core),
                   mma_types=sorted({mma_input_type(op) for op in r.tensor_core}))
    return rows


def aot_rows(cm, target: str = "cuda:90") -> list[dict]:
    """:func:`kernel_aot_rows` for every kernel call of a compiled model (a ``CompiledModel`` or
    the path of a ``.lumc`` artifact) at the config its plan chose.

    Raises:
        ArtifactError: a path that is not a loadable artifact; LumcError: an unsupported target.
    """
    if not hasattr(cm, "program"):
        import lumc
        cm = lumc.load(cm, device="cpu")
    return kernel_aot_rows([(c.kernel, cfg) for c, cfg in zip(cm.program.calls, cm.configs)], target)


def tensor_core_problems(rows: list[dict]) -> list[str]:
    """One line per compiled Triton contraction kernel (matmul, attention) that has no tensor-core
    instruction (``ieee`` precision excepted: CUDA-core FMA is what it asks for) or that spills,
    and per kernel that failed to compile."""
    out = []
    for r in rows:
        name = f"#{r['index']} {r['form']} {r['kernel']} [{r['config']}]"
        if r.get("error"):
            out.append(f"{name}: {r['error']}")
            continue
        if not r["compiled"] or not (r["contraction"] and r["form"] in CONTRACTION_FORMS):
            continue
        if not r["tensor_core"] and r["precision"] != "ieee":
            out.append(f"{name}: no tensor-core instruction at PRECISION={r['precision']}")
        if r["spill_stores"] or r["spill_loads"]:
            out.append(f"{name}: spills {r['spill_stores']} B stored / {r['spill_loads']} B loaded "
                       "per thread")
    return out


def format_aot_table(rows: list[dict], title: str) -> str:
    """The ``--aot`` table: one line per kernel (registers, spills, stack and shared memory,
    tensor-core opcodes), vendor kernels marked as not compiled."""
    lines = [title, f"{'#':>3} {'form':<10} {'impl':<7} {'prec':<7} {'regs':>4} {'spill st/ld B':>13} "
                    f"{'stack B':>7} {'smem KiB':>8}  {'tensor cores (SASS)':<34} config"]
    for r in rows:
        head = f"{r['index']:>3} {r['form']:<10} {r['impl']:<7} {str(r['precision'] or '-'):<7}"
        if not r["compiled"]:
            why = r.get("note") or f"ERROR {r.get('error')}"
            lines.append(f"{head} {why}" + (f"  [{r['config']}]" if r["config"] else ""))
            continue
        tc = ", ".join(f"{op} x{n}" for op, n in r["tensor_core"].items()) or (
            "none (CUDA cores)" if r["contraction"] else "-")
        want = MMA_TYPE_OF_PRECISION.get(r["precision"])
        if r["tensor_core"] and want and want not in r["mma_types"]:
            tc += f" (not {want})"
        lines.append(f"{head} {r['registers']:>4} {r['spill_stores']:>6}/{r['spill_loads']:<6} "
                     f"{r['stack_bytes']:>7} {r['shared_bytes'] / 1024:>8.1f}  {tc:<34} {r['config']}")
    return "\n".join(lines)


def aot_summary(rows: list[dict]) -> str:
    """One line: how many contraction kernels run on tensor cores and how many spill."""
    mm = [r for r in rows if r["compiled"] and r["contraction"] and r["form"] in CONTRACTION_FORMS]
    tc = sum(1 for r in mm if r["tensor_core"])
    sp = sum(1 for r in rows if r["compiled"] and (r["spill_stores"] or r["spill_loads"]))
    vendor = sum(1 for r in rows if r["impl"] != "triton")
    bad = sum(1 for r in rows if r.get("error"))
    return (f"contraction kernels: {tc} of {len(mm)} on tensor cores; kernels spilling: {sp} of "
            f"{sum(1 for r in rows if r['compiled'])} compiled; vendor kernels: {vendor}"
            + (f"; failed: {bad}" if bad else ""))
