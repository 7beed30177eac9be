"""What a compiled kernel costs in registers and which instructions it runs: ``ptxas -v`` and SASS.

Two readers of text the CUDA tools print, used on ahead-of-time compiles (``aot.py``) so a CPU-only
machine can show that a contraction runs on tensor cores and does not spill:

* :func:`ptxas_resources` reads the ``ptxas -v`` log (the bundled ``ptxas`` in
  ``triton/backends/nvidia/bin``): registers per thread, spill stores and loads, the stack frame and
  static shared memory, per entry function.
* :func:`sass_opcodes` counts the opcodes of a SASS listing (``cuobjdump -sass`` of the cubin, or
  Triton's reformatting of it, ``CompiledKernel.asm["sass"]``); :func:`tensor_core_ops` keeps the
  tensor-core ones.

Tensor-core opcodes (Hopper, sm_90a; confirmed by compiling lumc's matmul and attention kernels with
Triton 3.9 at each ``PRECISION``, see ``tests/backends/test_triton_aot.py``):

==============  ===============================================================================
``HGMMA``       warpgroup MMA (``wgmma.mma_async``), fp16/bf16/tf32 inputs:
                ``HGMMA.64x128x16.F32.BF16``, ``.F32.TF32`` (tf32 and each of tf32x3's three),
                ``.F32`` (fp16 inputs: no input-type suffix)
``QGMMA``       warpgroup MMA on fp8: ``QGMMA.64x128x32.F32.E4M3.E4M3``
``IGMMA``       warpgroup MMA on int8 (``.S32.S8.S8``)
``HMMA``        warp-level ``mma.sync`` (Ampere's instruction, also on Hopper for tiles too small
                for a warpgroup): ``HMMA.16816.F32.BF16``, ``HMMA.1688.F32.TF32``, ``HMMA.16816.F32``
                (fp16; Triton also lowers an fp8 ``tl.dot`` on this path to fp16 ``HMMA``)
``IMMA``        ``mma.sync`` on int8/int4; ``QMMA`` (fp8 ``mma.sync``, sm_89/sm_120), ``DMMA``
                (fp64), ``BMMA``/``BGMMA`` (1-bit), ``UTC*MMA`` (Blackwell ``tcgen05.mma``)
==============  ===============================================================================

A kernel on CUDA cores has none of them (an IEEE fp32 ``tl.dot`` is ``FFMA`` loops).
"""
from __future__ import annotations

import re
from collections import Counter

# base opcodes (before the first '.') of tensor-core instructions (see the module table)
TENSOR_CORE_OPS = frozenset({"HGMMA", "QGMMA", "IGMMA", "BGMMA", "HMMA", "IMMA", "QMMA", "DMMA",
                             "BMMA", "OMMA", "UTCHMMA", "UTCQMMA", "UTCIMMA", "UTCOMMA", "UTCMMA"})
# the input type an MMA opcode's suffix names (fp16 has none: HGMMA.64x64x16.F32 is f16 x f16)
_INPUT_TYPES = (("E4M3", "fp8"), ("E5M2", "fp8"), ("TF32", "tf32"), ("BF16", "bf16"), ("S8", "int8"),
                ("U8", "int8"), ("S4", "int4"), ("U4", "int4"), ("F64", "fp64"))

_FUNC = re.compile(r"Function properties for (\S+)")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_COMMENT = re.compile(r"/\*.*?\*/")
_PRED = re.compile(r"^@!?U?P[T0-9]+\s+")


def ptxas_resources(log: str) -> dict[str, dict[str, int]]:
    """Per-function resources from a ``ptxas -v`` log.

    Args:
        log: the text ``ptxas -v`` writes to stderr (``ptxas info    : Used 128 registers, ...``).
    Returns:
        ``{function: {"registers", "spill_stores", "spill_loads", "stack_bytes",
        "static_shared_bytes"}}``; registers are 32-bit registers per thread, the rest bytes.
        Functions the log names without a ``Used ... registers`` line are left out.
    """
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        m = _ENTRY.search(line) or _FUNC.search(line)
        if m:
            cur = out.setdefault(m.group(1), {"registers": 0, "spill_stores": 0, "spill_loads": 0,
                                              "stack_bytes": 0, "static_shared_bytes": 0})
            continue
        if cur is None:
            continue
        m = _FRAME.search(line)
        if m:
            cur["stack_bytes"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
        m = _USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            cur["static_shared_bytes"] = int(s.group(1)) if s else 0
    return {k: v for k, v in out.items() if v["registers"]}


def sass_opcodes(sass: str) -> Counter:
    """Count the full opcodes (``HMMA.16816.F32.BF16``) of a SASS listing, in either the
    ``cuobjdump -sass`` layout (``/*0090*/  HMMA... ;``) or Triton's (``ctrl<TAB>HMMA... ;``);
    predicates (``@P0``, ``@!PT``) are dropped."""
    ops: Counter = Counter()
    for line in sass.splitlines():
        text = _COMMENT.sub(" ", line)
        if "\t" in text and ":" in text.split("\t", 1)[0]:
            text = text.split("\t", 1)[1]         # Triton's control-code column
        text = _PRED.sub("", text.strip())
        if not text or ";" not in text:
            continue
        op = text.split(None, 1)[0].rstrip(";")
        if re.fullmatch(r"[A-Z][A-Z0-9_]*(\.[A-Za-z0-9_]+)*", op):
            ops[op] += 1
    return ops


def is_tensor_core(opcode: str) -> bool:
    """True for a tensor-core opcode (:data:`TENSOR_CORE_OPS`, by the part before the first dot)."""
    return opcode.split(".", 1)[0] in TENSOR_CORE_OPS


def tensor_core_ops(ops: Counter | dict) -> dict[str, int]:
    """The tensor-core opcodes of ``ops`` (:func:`sass_opcodes`) with their shape field dropped
    (``HGMMA.64x128x16.F32.BF16`` -> ``HGMMA.F32.BF16``), counted; sorted by name."""
    out: Counter = Counter()
    for op, n in ops.items():
        if is_tensor_core(op):
            parts = [p for p in op.split(".") if not re.fullmatch(r"\d+(x\d+x\d+)?", p)]
            out[".".join(parts)] += n
    return dict(sorted(out.items()))


def mma_input_type(opcode: str) -> str:
    """The operand type of a tensor-core opcode: ``fp8``, ``tf32``, ``bf16``, ``int8``, ``int4``,
    ``fp64``, or ``fp16`` when the suffix names none (``HGMMA.F32``, ``HMMA.16816.F32``)."""
    fields = opcode.split(".")
    for key, name in _INPUT_TYPES:
        if key in fields:
            return name
    return "fp16"
