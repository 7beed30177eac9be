"""Split (two-stage) reductions: few, very long rows spread over many programs.

A looped row kernel gives each row one program; a global sum over ``2**24`` elements (``M = 1``)
would leave all but one SM of a GPU idle. The ``split`` variant cuts each row's ``K`` elements into
``SPLIT`` contiguous chunks of ``CHUNK = ceil(ceil(K / SPLIT) / BLOCK_K) * BLOCK_K`` elements:

* stage 1 (grid ``cdiv(M, BLOCK_M) x SPLIT``): each program reduces its chunk of ``BLOCK_M`` rows in
  ``BLOCK_K`` steps (every reduction of the kernel in one loop; fp sums Kahan-compensated across
  steps) and writes one partial per row and reduction, in the accumulator dtype, to a workspace
  ``[M, SPLIT]``; free per-element outputs are stored in the same loop;
* stage 2 (grid ``cdiv(M, BLOCK_M)``, ``KERNEL_finish``): each program loads its rows' ``SPLIT``
  partials, reduces them (a tree over at most 1024 values), rounds once to the reduction's dtype,
  and computes the epilogue and the per-row outputs.

Bytes: the inputs once, plus ``2 * M * SPLIT`` accumulator values (a few KiB). Sums reassociate
(``reassociating`` in DESIGN.md's classes: block trees, Kahan across steps, a tree over partials);
max keeps NaN and is exact. Integer sums wrap as the reference's (two's complement is associative).

Applies when every reduction is at level 0 (nothing reduces a value that depends on another
reduction: softmax and the norms need their row statistics first) and no per-element output
depends on a reduction.
"""
from __future__ import annotations

from lumc.ir.kernels import Kernel
from lumc.backends.row_moments import find_means
from lumc.backends.triton import exprs
from lumc.backends.triton.chan import ShiftedSum, kahan_add, quotient
from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.launch import _TORCH_NAMES
from lumc.backends.triton.rowplan import RowPlan
from lumc.backends.triton.source import KernelParts, Workspace

SPLIT_MAX_ROWS = 256       # fewer rows than this (about 2 per H100/H200 SM) leave SMs idle
SPLIT_MIN_K = 1 << 16      # rows at least this long: every chunk keeps >= 4096 elements at SPLIT 16


def split_refusal(kernel: Kernel, plan: RowPlan) -> str | None:
    """Why ``kernel`` cannot be rendered as a split reduction, or None when it can."""
    if plan.prologue:
        return "a row statistic of the input is formed first (a normalization on load)"
    if any(plan.level[r] != 0 for r in plan.reduces):
        return "a reduction depends on another reduction (row statistics are needed first)"
    for name, o in kernel.meaning.outputs.items():
        if plan.outputs[name] == "full" and plan.kind.get(o) == "full":
            return f"output {name} is per element and depends on a reduction"
    return None


def prefers_split(kernel: Kernel, plan: RowPlan) -> bool:
    """The size rule: few rows, each long enough to feed many programs (at the sizes the kernel
    serves, ``indexing.served_size``)."""
    from lumc.backends.triton.indexing import served_size
    return (served_size(plan.M) < SPLIT_MAX_ROWS and served_size(plan.K) >= SPLIT_MIN_K
            and split_refusal(kernel, plan) is None)


def render_split(kernel: Kernel, plan: RowPlan) -> KernelParts:
    """Render the two stages (see module docstring).

    Raises:
        RenderError: when the kernel's structure does not allow a split (``split_refusal``).
    """
    from lumc.backends.triton.render_reduction import RowKernel, acc_dtype
    why = split_refusal(kernel, plan)
    if why is not None:
        raise RenderError(f"no split reduction: {why}")
    M, K = plan.M, plan.K
    # ---- stage 1: partials ----------------------------------------------------------------------
    s1 = RowKernel(kernel, plan, one_pass=False)
    w = s1.w
    idx = "tl.int64" if s1.big else "tl.int32"
    s1.setup_rows()
    w.line(f"pid_s = tl.program_id(1).to({idx})")
    w.line(f"CHUNK = (({K} + SPLIT - 1) // SPLIT + BLOCK_K - 1) // BLOCK_K * BLOCK_K")
    w.line("k_lo = pid_s * CHUNK                # this program's chunk of every row")
    wss, accs = [], []
    for i, r in enumerate(plan.reduces):
        ad = acc_dtype(r)
        kind = "sum" if r.op == "SumReduce" else "max"
        acc, comp = w.fresh("acc"), w.fresh("comp")
        w.line(f"{acc} = tl.full([BLOCK_M], {exprs.neutral(kind, ad)}, {exprs.tl_dtype(ad)})")
        if kind == "sum" and ad.is_float:
            w.line(f"{comp} = tl.zeros([BLOCK_M], {exprs.tl_dtype(ad)})   # Kahan compensation")
        wss.append(Workspace(f"ws{i}_ptr", f"({M}, SPLIT)", ad))
        accs.append((acc, comp))
    # a row mean ``SumReduce(x) * (1/K)`` (a LayerNorm's first statistic, its variance in another
    # kernel) on shifted data as the row kernels compute it (``lumc.backends.row_moments``): every
    # program takes the same shift, the mean of the row's first chunk, and sums ``x - shift``
    means = []
    for r, mean, _ in find_means(kernel.meaning.nodes()):
        if r not in plan.reduces or plan.kind.get(mean) != "row" or r.op != "SumReduce":
            continue
        ad = acc_dtype(r)
        shifted = ShiftedSum(w, *s1.first_chunk(r.srcs[0]), exprs.tl_dtype(ad), False)
        n = len(wss)
        wss += [Workspace(f"ws{n}_ptr", f"({M}, SPLIT)", ad),
                Workspace(f"ws{n + 1}_ptr", f"({M}, SPLIT)", ad)]
        means.append((r, mean, shifted, n))
    w.open("for k_off in range(0, CHUNK, BLOCK_K):")
    w.line("k_start = k_lo + k_off")
    s1.setup_k("k_start")
    for r, _, shifted, _ in means:
        shifted.add(s1.operand_tile(r, 1), "mask2")
    for i, r in enumerate(plan.reduces):
        ad = acc_dtype(r)
        tile = s1.operand_tile(r, 1)
        acc, comp = accs[i]
        if r.op == "SumReduce" and ad.is_float:
            kahan_add(w, acc, comp, w.bind(f"tl.sum({tile}, axis=1)", "t", 1))
        elif r.op == "SumReduce":
            w.line(f"{acc} += tl.sum({tile}, axis=1)")
        else:
            w.line(f"{acc} = _max_nan({acc}, {s1.reduce_tile(r, tile, 1)}).to({exprs.tl_dtype(ad)})")
    s1.store_outputs(("full",), 1)
    w.close()
    for i, (acc, _) in enumerate(accs):
        w.line(f"tl.store(ws{i}_ptr + rm * SPLIT + pid_s, {acc}, mask=rmask)")
    for _, _, shifted, n in means:
        w.line(f"tl.store(ws{n}_ptr + rm * SPLIT + pid_s, {shifted.sum}, mask=rmask)")
        w.line(f"tl.store(ws{n + 1}_ptr + rm * SPLIT + pid_s, {shifted.shift}, mask=rmask)")
    # ---- stage 2: merge the partials, then the epilogue -----------------------------------------
    s2 = RowKernel(kernel, plan, one_pass=False)
    w2 = s2.w
    s2.setup_rows()
    w2.line("rs = tl.arange(0, SPLIT)")
    for i, r in enumerate(plan.reduces):
        ad = acc_dtype(r)
        kind = "sum" if r.op == "SumReduce" else "max"
        part = w2.bind(f"tl.load(ws{i}_ptr + rm2 * SPLIT + rs[None, :], mask=rmask2, "
                       f"other={exprs.neutral(kind, ad)})", "p")
        s2.finish(r, w2.bind(s2.reduce_tile(r, part), "merged"))
    for r, mean, _, n in means:
        tad = exprs.tl_dtype(acc_dtype(r))
        part = w2.bind(f"tl.load(ws{n}_ptr + rm2 * SPLIT + rs[None, :], mask=rmask2, other=0.0)",
                       "p")
        shift = w2.bind(f"tl.load(ws{n + 1}_ptr + rm * SPLIT, mask=rmask, other=0.0)", "p")
        q = quotient(f"tl.sum({part}, axis=1)", f"tl.full([BLOCK_M], {K}, {tad})", tad)
        s2.finish_value(mean, w2.bind(f"{shift} + {q}", "merged"))
    s2.store_outputs(("row",), 0)
    itemsize = max(n.dtype.itemsize for n in kernel.inputs) if kernel.inputs else 4
    problem = {"M": M, "K": K, "itemsize": itemsize, "reduces": len(plan.reduces)}
    notes = [f"rows M={M}, reduced K={K} over axes {plan.axes} of {plan.shape}; split in two "
             "stages (partials per chunk, then a merge)"]
    if s1.big:
        notes.append("int64 indexing (a tensor or address passes 2**31)")
    args = ", ".join([p.name for p in s1.params] + [x.name for x in wss])
    cfg = "BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, SPLIT=SPLIT, num_warps=num_warps"
    anchor = next(p.name for p in s1.params if p.role == "out")
    alloc = "\n".join(f"    {x.name} = torch.empty({x.shape}, dtype=torch.{_TORCH_NAMES[x.dtype.name]}, "
                      f"device={anchor}.device)" for x in wss)
    launcher = (f"{alloc}\n"
                f"    KERNEL_NAME[(triton.cdiv({M}, BLOCK_M), SPLIT)]({args}, {cfg}, "
                "num_stages=num_stages)\n"
                f"    KERNEL_NAME_finish[(triton.cdiv({M}, BLOCK_M),)]({args}, {cfg}, num_stages=1)")
    return KernelParts(
        form=kernel.form, variant="split", params=s1.params,
        constexprs=("BLOCK_M", "BLOCK_K", "SPLIT"), body=w.body(),
        grid=f"triton.cdiv({M}, BLOCK_M), SPLIT", problem=problem, config_space="split",
        constants=s1.consts, notes=notes, workspaces=wss, extra_kernels={"finish": w2.body()},
        launcher=launcher)
