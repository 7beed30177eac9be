"""Tensor-core evidence without a GPU: ``lumc inspect ART --aot cuda:90`` and the contraction
kernels of the MODELS.md models compiled ahead of time for Hopper.

The readers of ``ptxas -v`` and SASS text are checked on real tool output (lines copied from
Triton 3.9 / ptxas 12.x compiles of lumc kernels). The model walk takes the contraction kernels
(matmul and attention forms) a compile considers, the greedy program of the imported graph (plus,
under ``slow``, the e-graph candidates') and MiniLM's attention as one kernel, at their default configs
and at ``PRECISION`` tf32x3 (the fp32 default), bf16 and fp8 (attention has no fp8 branch: bf16),
compiles them for ``cuda:90`` in one child process, identical kernels once, and fails when one has
no tensor-core instruction or spills. MiniLM runs in the default suite; all four models under
``slow``.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import lumc.compiler.tools.cli_bench  # noqa: F401  (registers inspect)
from lumc.backends.triton import configs, render
from lumc.backends.triton.sass import (mma_input_type, ptxas_resources, sass_opcodes,
                                       tensor_core_ops)
from lumc.compiler.tools.aot_inspect import (aot_rows, check_aot_target, format_aot_table,
                                       kernel_aot_rows, tensor_core_problems)
from lumc.compiler.tools.cli import cli
from lumc.ir.errors import LumcError

PTXAS_LOG = """\
ptxas-blackwell info    : 0 bytes gmem
ptxas-blackwell info    : Compiling entry function 'lumc_matmul_37222d9c0326d259' for 'sm_90a'
ptxas-blackwell info    : Function properties for lumc_matmul_37222d9c0326d259
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas-blackwell info    : Used 56 registers, used 1 barriers, 8 bytes cumulative stack size
ptxas-blackwell info    : Compile time = 69.169 ms
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]
"""

# Triton's layout (CompiledKernel.asm["sass"]) and cuobjdump's own
SASS_TRITON = """Function:lumc_attention_9dd91ea4967d3e08
--:-:1:-:1\tLDC R1, c[0x0][0x28];
--:-:-:-:1\tHGMMA.64x64x8.F32.TF32 R24, gdesc[UR8], RZ, !UPT;
--:-:-:-:1\tHGMMA.64x64x8.F32.TF32 R24, gdesc[UR8], R24, gsb0;
--:-:-:-:1\t@P0 HMMA.16816.F32.BF16 R4, R8, R12, R4;
--:-:-:Y:6\tIMAD.MOV.U32 R3, RZ, RZ, 0x10;
"""
SASS_CUOBJDUMP = """
        code for sm_90a
                Function : lumc_matmul_x
        /*5bc0*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, R104, gdesc[UR12], RZ, !UPT ;     /* 0x01e0000c68187df3 */
        /*5f00*/              @!PT QGMMA.64x128x32.F32.E4M3.E4M3 R24, R108, gdesc[UR12], R24, gsb0 ;    /* 0x01e0000c6c187df3 */
        /*5f10*/                   FFMA R2, R3, R4, R2 ;  /* 0x0000000403027223 */
        /*5f20*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], R24 ;  /* 0x0000000403027223 */
"""


def test_ptxas_log_gives_registers_spills_stack_and_static_smem():
    res = ptxas_resources(PTXAS_LOG)
    assert res == {
        "lumc_matmul_37222d9c0326d259": {"registers": 56, "spill_stores": 4, "spill_loads": 4,
                                         "stack_bytes": 8, "static_shared_bytes": 0},
        "k2": {"registers": 168, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0,
               "static_shared_bytes": 1024}}


def test_sass_tensor_core_opcodes_in_both_layouts():
    t = sass_opcodes(SASS_TRITON)
    assert t["HGMMA.64x64x8.F32.TF32"] == 2 and t["HMMA.16816.F32.BF16"] == 1
    assert t["LDC"] == 1 and sum(t.values()) == 5 and "Function:lumc_attention_9dd91ea4967d3e08" not in t
    assert tensor_core_ops(t) == {"HGMMA.F32.TF32": 2, "HMMA.F32.BF16": 1}
    c = sass_opcodes(SASS_CUOBJDUMP)
    assert c["QGMMA.64x128x32.F32.E4M3.E4M3"] == 2 and c["FFMA"] == 1 and sum(c.values()) == 4
    assert tensor_core_ops(c) == {"HGMMA.F32": 1, "QGMMA.F32.E4M3.E4M3": 2}
    assert [mma_input_type(o) for o in ("QGMMA.F32.E4M3.E4M3", "HGMMA.F32", "HMMA.F32.BF16",
                                        "HGMMA.F32.TF32", "IMMA.16832.S32.S8.S8")] == \
        ["fp8", "fp16", "bf16", "tf32", "int8"]


def test_aot_target_names():
    assert check_aot_target("cuda:90") == "cuda:90" == check_aot_target("sm_90a")
    with pytest.raises(LumcError, match="supported: cuda:90"):
        check_aot_target("cuda:75")


# ---- the model walk --------------------------------------------------------------------------

# MiniLM at the demo's shape (make demo: batch 1, sequence 128); the others at their test shapes
SHAPES = {"minilm-l3": {"input_ids": (1, 128), "attention_mask": (1, 128)}}
PRECISIONS = {"matmul": ("tf32x3", "bf16", "fp8"), "attention": ("tf32x3", "bf16")}


def _contraction_kernels(name, model_path, egraph: bool):
    """The distinct matmul/attention kernels (by generated module) of the greedy program and, with
    ``egraph``, of the e-graph candidates of model ``name``."""
    from lumc.compiler.frontends import models
    from lumc.compiler.core.fusion import greedy_program
    from lumc.compiler.core.pipeline import stage_frontend
    shapes = SHAPES.get(name, models.MODEL_INFO[name].test_shapes[0])
    graph = stage_frontend(str(model_path(name)), shapes, None).graph
    programs = [greedy_program(graph)]
    if egraph:
        from lumc.compiler.core.egraph_pipeline import egraph_candidates
        from lumc.rewrites.schedule import Limits
        programs += list(egraph_candidates(graph, "h200", k=2, limits=Limits(seconds=2.0)).candidates)
    out = {}
    for p in programs:
        for c in p.calls:
            if c.kernel.form in PRECISIONS:
                rk = render(c.kernel)
                if rk.problem.get("dot_dtype") is not None:
                    out.setdefault(rk.name, c.kernel)
    return list(out.values())


def minilm_attention_kernel():
    """MiniLM-L3's attention at the demo's shape as one attention kernel: 12 heads of 32, sequence
    128, scores scaled by 1/sqrt(32) plus the additive mask, softmax, times V (fp32). The e-graph
    forms attention kernels only where its limits allow, so the walk always includes this one."""
    from lumc.ir import dtypes as dt
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.kernels import Kernel
    from lumc.ir.library.norm import softmax
    from lumc.ir.tensor import Tensor
    ins = {f"in{i}": input_node(f"in{i}", (1, 12, 128, 32), dt.f32) for i in range(3)}
    ins["in3"] = input_node("in3", (1, 1, 1, 128), dt.f32)
    q, k, v, m = (Tensor(n) for n in ins.values())
    out = softmax((q @ k.transpose(-1, -2)) * (32 ** -0.5) + m, -1) @ v
    return Kernel("attention", Graph(ins, {"out0": out.node}), ())


def _walk(names, model_path, egraph: bool, extra=()):
    items, where = list(extra), ["extra"] * len(extra)
    for name in names:
        kernels = _contraction_kernels(name, model_path, egraph)
        if name == "minilm-l3":
            kernels.append(minilm_attention_kernel())
        assert kernels, f"{name}: no contraction kernel"
        for k in kernels:
            rk = render(k)
            default = configs.default_config(rk.config_space, rk.problem)
            for p in PRECISIONS[k.form]:
                items.append((k, configs.with_precision(default, rk.problem, p)))
                where.append(name)
    rows = kernel_aot_rows(items)
    for n, r in zip(where, rows):
        r["index"] = f"{n}:{r['index']}"
    print(format_aot_table(rows, f"{', '.join(names)}: contraction kernels, cuda:90"))
    return rows


def _assert_on_tensor_cores(rows):
    assert all(r["compiled"] for r in rows), [r.get("error") for r in rows if not r["compiled"]]
    problems = tensor_core_problems(rows)
    assert not problems, "\n".join(problems)
    for r in rows:
        # the operand type of the MMA follows the precision (fp8 may run as fp16 mma.sync, see sass.py)
        want = {"tf32x3": {"tf32"}, "bf16": {"bf16"}, "fp8": {"fp8", "fp16"}}[r["precision"]]
        assert set(r["mma_types"]) <= want and r["mma_types"], (r["index"], r["mma_types"])
        assert r["registers"] <= 255 and 0 < r["shared_bytes"] <= configs.SMEM_LIMIT


@pytest.mark.models
def test_minilm_contractions_run_on_tensor_cores_without_spills(model_path):
    # the detectors discriminate: MiniLM's FFN-up matmul (128x1536x384) at IEEE precision runs
    # FFMA on CUDA cores, and at the 64x256x32 tf32x3 4-warp tile a 60 s compile once chose
    # (before configs.FP32_REGS_PER_THREAD made it illegal) it spills
    ffn = next(k for k in _contraction_kernels("minilm-l3", model_path, False)
               if render(k).problem.get("N") == 1536 and render(k).problem.get("K") == 384)
    rk = render(ffn)
    ieee = configs.with_precision(configs.default_config(rk.config_space, rk.problem), rk.problem,
                                  "ieee")
    big = configs.make(4, 4, BLOCK_M=64, BLOCK_N=256, BLOCK_K=32, GROUP_M=8, PRECISION="tf32x3")
    assert big not in configs.config_space(rk.config_space, rk.problem)
    rows = _walk(["minilm-l3"], model_path, egraph=False, extra=[(ffn, ieee), (ffn, big)])
    r_ieee, r_big, rows = rows[0], rows[1], rows[2:]
    assert r_ieee["compiled"] and r_ieee["tensor_core"] == {} and r_ieee["mma_types"] == []
    assert r_big["compiled"] and r_big["spill_stores"] > 0 and r_big["registers"] == 255
    assert any("spills" in p for p in tensor_core_problems([r_big]))
    assert {r["precision"] for r in rows} == {"tf32x3", "bf16", "fp8"}
    assert {r["form"] for r in rows} == {"matmul", "attention"}
    assert len(rows) >= 12
    _assert_on_tensor_cores(rows)


@pytest.mark.slow
@pytest.mark.models
def test_every_model_contraction_runs_on_tensor_cores_without_spills(model_path):
    rows = _walk(["minilm-l3", "magika", "silero-vad", "ppocr-det"], model_path, egraph=True)
    assert {r["form"] for r in rows} == {"matmul", "attention"}
    _assert_on_tensor_cores(rows)


# ---- the CLI ---------------------------------------------------------------------------------

def _artifact(tmp_path):
    """A two-call artifact without a search: x @ w at a Triton config (bf16 operands), then the
    same product through cuBLAS (a vendor kernel)."""
    from lumc.compiler.runtime.compiled import CompiledModel
    from lumc.compiler.core.fusion import greedy_program
    from lumc.ir import dtypes as dt
    from lumc.ir.graph import Graph, const_node, input_node
    from lumc.ir.tensor import Tensor
    x = input_node("x", (256, 128), dt.f32)
    w = Tensor(const_node(np.random.default_rng(0).standard_normal((128, 192)).astype(np.float32)))
    h = Tensor(x) @ w
    y = h.sigmoid() @ w.transpose(-1, -2)
    ins = {"x": x}
    graph = Graph(ins, {"y": y.node})
    prog = greedy_program(graph)
    mm = [i for i, c in enumerate(prog.calls) if c.kernel.form == "matmul"]
    assert len(mm) == 2, prog.dump()
    cfgs = [None] * len(prog.calls)
    cfgs[mm[0]] = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "PRECISION": "bf16",
                   "num_warps": 4, "num_stages": 3}
    cfgs[mm[1]] = {"IMPL": "cublas", "PRECISION": "tf32"}
    report = {"model": "two-matmuls", "per_kernel": []}
    cm = CompiledModel(graph, prog, cfgs, "sim:h200", True, report)
    path = tmp_path / "m.lumc"
    cm.save(path)
    return path, mm


def test_inspect_aot_prints_registers_spills_and_tensor_cores(tmp_path):
    path, mm = _artifact(tmp_path)
    rows = aot_rows(str(path))
    tri, ven = rows[mm[0]], rows[mm[1]]
    assert tri["compiled"] and tri["precision"] == "bf16" and tri["impl"] == "triton"
    assert tri["tensor_core"] and set(tri["mma_types"]) == {"bf16"}
    assert tri["spill_stores"] == 0 and 0 < tri["registers"] <= 255
    # 3 stages of a 64x32 and a 32x64 bf16 tile: 24 KiB of the 227 KiB a block may use
    assert 3 * 2 * 64 * 32 * 2 <= tri["shared_bytes"] <= configs.SMEM_LIMIT
    assert not ven["compiled"] and ven["impl"] == "cublas" and "not compiled" in ven["note"]
    res = CliRunner().invoke(cli, ["inspect", str(path), "--aot", "cuda:90"])
    assert res.exit_code == 0, res.output
    assert "ahead-of-time compile for cuda:90" in res.output
    assert "GMMA.F32.BF16 x" in res.output or "HMMA.F32.BF16 x" in res.output
    assert "vendor kernel (cublas through torch), not compiled" in res.output
    assert "contraction kernels: 1 of 1 on tensor cores; kernels spilling: 0" in res.output
    bad = CliRunner().invoke(cli, ["inspect", str(path), "--aot", "cuda:75"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "supported: cuda:90" in bad.output
    json.dumps(rows)      # rows are plain data
