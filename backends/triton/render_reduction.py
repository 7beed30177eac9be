"""Row kernels: reductions (sum, max over any axes) with a fused prologue and epilogue, and the
normalizations built on them (softmax, layer norm, RMS norm).

Each program owns ``BLOCK_M`` rows (see ``rowplan``). An element of a row tile is addressed by the
row index ``rm`` (unravelled over the kept dims) and the reduction index ``rk`` (unravelled over the
reduced axes), so any axes can be reduced, not only the last. Three variants:

* ``one-pass``: the row fits in one ``BLOCK_K`` tile (``K <= ROW_FIT``): each input element is loaded
  once, every reduction and every output is computed from registers. Bytes: inputs once, outputs once.
* ``looped``: the row is walked in ``BLOCK_K`` chunks, one loop per reduction level, and one more loop
  for full-size outputs. Online forms (``render_norm``) merge softmax's max and sum, and layer norm's
  mean and centered sum of squares (Chan/Welford), into one loop, so softmax and layer norm read
  their input twice and RMS norm twice.
* ``split`` (``render_split``): few rows (``M < 256``) of ``K >= 2**16`` elements, single-level
  reductions only: the rows are cut into ``SPLIT`` chunks reduced by separate programs, then merged
  by a second kernel, so a global sum fills the GPU instead of one SM.

fp16/bf16 sums accumulate in fp32 and are rounded once to the node's dtype (what the reference does);
integer sums narrower than 32 bits accumulate in int32 and wrap on the final cast, as the reference.
Max propagates NaN. Masked lanes hold the reduction's identity (0, or -inf / the integer minimum).
"""
from __future__ import annotations

from lumc.ir import dtypes as dt
from lumc.ir.graph import Node
from lumc.ir.kernels import Kernel
from lumc.backends.triton import exprs
from lumc.backends.triton.codegen import Evaluator, RenderError, SourceWriter, reads_of
from lumc.backends.triton.configs import ROW_FIT, next_pow2
from lumc.backends.triton.indexing import (flat_index, needs_int64, reshape_index, served_size,
                                           unravel)
from lumc.backends.triton.rowplan import RowPlan, plan_rows
from lumc.backends.triton.source import KernelParts, make_params


def acc_dtype(r: Node) -> dt.DType:
    """The accumulator dtype of a reduction node."""
    d = r.dtype
    if r.op == "MaxReduce":
        return d
    if d.is_int and d.itemsize < 4:
        return dt.i32
    return d.accumulator


class RowKernel:
    """Writes one row kernel from a :class:`RowPlan`."""

    def __init__(self, kernel: Kernel, plan: RowPlan, one_pass: bool):
        self.kernel = kernel
        self.plan = plan
        self.one_pass = one_pass
        nodes = kernel.meaning.nodes()
        self.reads = reads_of(nodes)
        self.params, ptrs, self.consts = make_params(kernel, self.reads)
        self.big = needs_int64(nodes, (plan.M * plan.K,))
        self.w = SourceWriter()
        self.ev = Evaluator(self.w, ptrs, self._resolve, "tl.int64" if self.big else "tl.int32")
        self.row_vals: dict[Node, str] = {}      # reduction -> its value per row (level 0 name)
        self.row_idx: list[str] = []
        self.full_idx: list[str] = []
        self.mask2 = "mask2"
        self.overrides: dict[Node, str] = {}     # broadcast view -> a per-row value inside a loop

    # ---- resolve hook: reductions and row values seen from a full tile ---------------------------
    def _resolve(self, ev: Evaluator, n: Node, idx, mask, level):
        plan = self.plan
        if n in self.overrides:
            return self.w.bind(f"{self.overrides[n]}[:, None]", "b", level)
        if n in self.row_vals:
            return self.row_vals[n]
        if n.op in ("SumReduce", "MaxReduce"):
            raise RenderError(f"node {n!r}: reduction used before it is computed")
        if n.op == "View" and plan.kind.get(n) == "full" and plan.kind.get(n.srcs[0]) == "row":
            src = n.srcs[0]
            rv = ev.value(src, reshape_index(self.row_idx, plan.reduced_shape, src.shape), "rmask", 0)
            return self.w.bind(f"{rv}[:, None]", "b", level)
        return None

    # ---- index setup ---------------------------------------------------------------------------
    def setup_rows(self) -> None:
        w, plan = self.w, self.plan
        pid = "tl.program_id(0).to(tl.int64)" if self.big else "tl.program_id(0)"
        w.line(f"rm = {pid} * BLOCK_M + tl.arange(0, BLOCK_M)      # this program's rows")
        w.line(f"rmask = rm < {plan.M}")
        w.line("rm2 = rm[:, None]")
        w.line("rmask2 = rmask[:, None]")
        kept = [e if e == "0" else w.bind(e, "r") for e in unravel("rm", plan.kept_shape)]
        kept2 = [e if e == "0" else w.bind(e, "r") for e in unravel("rm2", plan.kept_shape)]
        self.row_idx = self._merge(kept, ["0"] * len(plan.axes))
        self._kept2 = kept2

    def setup_k(self, start: str) -> None:
        """Define ``rk`` (this chunk's reduction indices) and the full-tile index and mask."""
        w, plan = self.w, self.plan
        rk = "tl.arange(0, BLOCK_K)" if start == "0" else f"{start} + tl.arange(0, BLOCK_K)"
        if self.big:
            rk = f"({rk}).to(tl.int64)"
        w.line(f"rk = {rk}")
        w.line("rk2 = rk[None, :]")
        w.line(f"mask2 = rmask2 & (rk2 < {plan.K})")
        red = [e if e == "0" else w.bind(e, "k") for e in unravel("rk2", plan.red_shape)]
        self.full_idx = self._merge(self._kept2, red)
        # rows-major contiguous position of a tile element, when the reduced axes are trailing
        if plan.axes == tuple(range(len(plan.kept), len(plan.shape))):
            self.ev.flat_aliases[(tuple(self.full_idx), plan.shape)] = (
                f"rm2 * {plan.K} + rk2" if plan.K != 1 else "rm2")

    def _merge(self, kept: list[str], red: list[str]) -> list[str]:
        out = ["0"] * len(self.plan.shape)
        for e, k in zip(kept, self.plan.kept):
            out[k] = e
        for e, k in zip(red, self.plan.axes):
            out[k] = e
        return out

    # ---- pieces ---------------------------------------------------------------------------------
    def operand_tile(self, r: Node, level: int) -> str:
        """The masked, accumulator-typed operand tile of reduction ``r``."""
        v = self.ev.value(r.srcs[0], self.full_idx, self.mask2, level)
        acc = acc_dtype(r)
        if r.srcs[0].dtype != acc:
            v = self.w.bind(f"{v}.to({exprs.tl_dtype(acc)})", "a", level)
        kind = "sum" if r.op == "SumReduce" else "max"
        return self.w.bind(f"tl.where(mask2, {v}, {exprs.neutral(kind, acc)})", "a", level)

    def reduce_tile(self, r: Node, tile: str, level: int = 0) -> str:
        """Reduce a tile along its row axis (max keeps NaN: ``tl.max`` alone drops it on GPU)."""
        if r.op == "SumReduce":
            return f"tl.sum({tile}, axis=1)"
        if not r.dtype.is_float:
            # tl.max widens int1/int8/int16 to int32: back to the reduction's dtype (a bool
            # result is a tl.where condition, which must be int1)
            return f"tl.max({tile}, axis=1).to({exprs.tl_dtype(acc_dtype(r))})"
        m = self.w.bind(f"tl.max({tile}, axis=1)", "m", level)
        nan = self.w.bind(f"tl.max(({tile} != {tile}).to(tl.int8), axis=1) > 0", "nan", level)
        return f"tl.where({nan}, float('nan'), {m})"

    def finish(self, r: Node, acc: str) -> None:
        """Bind the row value of ``r`` (rounded to its dtype) at function level."""
        v = acc if acc_dtype(r) == r.dtype else f"{acc}.to({exprs.tl_dtype(r.dtype)})"
        self.row_vals[r] = self.w.bind(v, "red", 0)

    def finish_value(self, n: Node, value: str) -> None:
        """Bind a row value the kernel computes itself (a moments pair's shifted mean), read in
        place of ``n``'s own expression."""
        v = value if acc_dtype(n) == n.dtype else f"{value}.to({exprs.tl_dtype(n.dtype)})"
        self.row_vals[n] = self.w.bind(v, "red", 0)

    def first_chunk(self, x: Node) -> tuple[str, str]:
        """``(tile, mask)``: ``x`` (of the plan's shape) over each row's first ``BLOCK_K``
        positions, at level 0, under index names of its own (the loop's ``rk``/``mask2`` are
        rebound per chunk, and a level-0 value under those names would be reused inside it)."""
        w, plan = self.w, self.plan
        rk, mask = w.fresh("rk_first"), w.fresh("mask_first")
        w.line(f"{rk} = tl.arange(0, BLOCK_K)" + (".to(tl.int64)" if self.big else ""), 0)
        w.line(f"{mask} = rmask2 & ({rk}[None, :] < {plan.K})", 0)
        red = [e if e == "0" else w.bind(e, "k", 0)
               for e in unravel(f"{rk}[None, :]", plan.red_shape)]
        return self.ev.value(x, self._merge(self._kept2, red), mask, 0), mask

    def loop_reduce(self, r: Node, mean: Node | None = None) -> None:
        """Reduce ``r`` in a loop over the row; with ``mean`` (``r * (1/K)``, ``lone_means``) also
        that mean, on data shifted by the mean of the row's first chunk."""
        from lumc.backends.triton.chan import ShiftedSum, kahan_add
        acc = self.w.fresh("acc")
        ad = acc_dtype(r)
        kind = "sum" if r.op == "SumReduce" else "max"
        self.w.line(f"{acc} = tl.full([BLOCK_M], {exprs.neutral(kind, ad)}, {exprs.tl_dtype(ad)})")
        shifted = None if mean is None else ShiftedSum(self.w, *self.first_chunk(r.srcs[0]),
                                                       exprs.tl_dtype(ad), False)
        self.w.open(f"for k_start in range(0, {self.plan.K}, BLOCK_K):")
        self.setup_k("k_start")
        tile = self.operand_tile(r, 1)
        if shifted is not None:
            shifted.add(tile, "mask2")
        if r.op == "SumReduce" and ad.is_float:
            # Kahan-compensated across blocks: block sums are trees, the running sum is not
            comp = self.w.fresh("comp")
            self.w.line(f"{comp} = tl.zeros([BLOCK_M], {exprs.tl_dtype(ad)})", 0)
            kahan_add(self.w, acc, comp, self.w.bind(f"tl.sum({tile}, axis=1)", "t", 1))
        elif r.op == "SumReduce":
            self.w.line(f"{acc} += tl.sum({tile}, axis=1)")
        else:
            red = self.reduce_tile(r, tile, 1)
            # loop-carried: keep the dtype (maximum of bf16 comes back as fp32)
            self.w.line(f"{acc} = _max_nan({acc}, {red}).to({exprs.tl_dtype(ad)})")
        self.w.close()
        self.finish(r, acc)
        if shifted is not None:
            self.finish_value(mean, shifted.mean(
                self.w.bind(f"tl.zeros([BLOCK_M], {exprs.tl_dtype(ad)}) + {self.plan.K}", "t", 0)))

    def prologue_statistics(self) -> None:
        """The row statistics of the main rows' normalized input (``RowPlan.prologue``), first:
        each as the same reduction over the main tile, of its operand read through the view that
        reads the normalized input (one value per main row, kept as a ``[BLOCK_M, 1]`` column for
        the full tiles that normalize on load). A layer norm's mean and variance sums are one
        moments pair, its mean on shifted data (``render_norm``), as in the main rows."""
        from lumc.ir.graph import node
        from lumc.backends.row_moments import Moments, find_moments
        from lumc.backends.triton.render_norm import ChanMoments, one_pass_mean
        stats = [r for r in self.kernel.meaning.nodes() if r in self.plan.prologue]
        same = {r: node(r.op, [node("View", [r.srcs[0]], self.plan.prologue[r])], self.plan.axes)
                for r in stats}
        pairs = {mo.s1: mo for mo in find_moments(stats) if mo.s2 in same}
        second = {mo.s2 for mo in pairs.values()}
        for r in stats:
            mo = pairs.get(r)
            if r in second and not self.one_pass:
                continue                          # computed with its pair's sum, below
            if mo is not None and not self.one_pass:
                ChanMoments(Moments(same[r], same[mo.s2], mo.mean, mo.length)).write(self)
                done = (r, mo.s2)
            else:
                if self.one_pass:
                    self.finish(same[r], self.reduce_tile(same[r], self.operand_tile(same[r], 0)))
                else:
                    self.loop_reduce(same[r])
                if mo is not None:
                    one_pass_mean(self, Moments(same[r], same[mo.s2], mo.mean, mo.length))
                done = (r,)
            for x in done:
                self.row_vals[x] = self.w.bind(f"{self.row_vals.pop(same[x])}[:, None]", "b", 0)
            if mo is not None:
                self.row_vals[mo.mean] = self.w.bind(f"{self.row_vals[mo.mean]}[:, None]", "b", 0)

    def store_outputs(self, kinds: tuple[str, ...], level: int) -> None:
        plan = self.plan
        for name, o in self.kernel.meaning.outputs.items():
            kind = plan.outputs[name]
            if kind not in kinds:
                continue
            if kind == "row":
                oidx = reshape_index(self.row_idx, plan.reduced_shape, o.shape)
                v = self.ev.value(o, oidx, "rmask", 0)
                self.w.line(f"tl.store({name}_ptr + rm, {v}, mask=rmask)", 0)
            else:
                oidx = reshape_index(self.full_idx, plan.shape, o.shape)
                v = self.ev.value(o, oidx, self.mask2, level)
                addr = (self.ev.flat_aliases.get((tuple(self.full_idx), plan.shape))
                        or flat_index(self.full_idx, plan.shape))
                self.w.line(f"tl.store({name}_ptr + ({addr}), {v}, mask=mask2)", level)

    # ---- the two variants -----------------------------------------------------------------------
    def write_one_pass(self) -> None:
        self.setup_rows()
        self.setup_k("0")
        self.prologue_statistics()
        from lumc.backends.triton.render_norm import lone_means, one_pass_mean, pair_moments
        moments = pair_moments(self.plan)
        moments.update(lone_means(self.kernel.meaning.nodes(), self.plan, moments))
        for r in self.plan.reduces:
            self.finish(r, self.reduce_tile(r, self.operand_tile(r, 0)))
            if r in moments:
                one_pass_mean(self, moments[r])
        self.store_outputs(("full",), 0)
        self.store_outputs(("row",), 0)

    def write_looped(self) -> None:
        from lumc.backends.triton.render_norm import find_online_merges, lone_means, pair_moments
        self.setup_rows()
        self.prologue_statistics()
        merges = find_online_merges(self.plan)
        means = lone_means(self.kernel.meaning.nodes(), self.plan, pair_moments(self.plan))
        done: set[Node] = set()
        for group in self.plan.levels:
            for r in group:
                if r in done:
                    continue
                merge = merges.get(r)
                if merge is not None:
                    merge.write(self)
                    done.update(merge.covers)
                else:
                    self.loop_reduce(r, means[r].mean if r in means else None)
                    done.add(r)
        if "full" in self.plan.outputs.values():
            self.w.open(f"for k_start in range(0, {self.plan.K}, BLOCK_K):")
            self.setup_k("k_start")
            self.store_outputs(("full",), 1)
            self.w.close()
        self.store_outputs(("row",), 0)


def live_tiles(plan: RowPlan) -> int:
    """Full ``BLOCK_M x BLOCK_K`` tiles a row kernel keeps live at once, for the register budget of
    its config space (``configs._legal``): one, plus one per further product summed over the same
    tile (a paired gate/up GEMV: two weight tiles) and one for an input normalized on load (its
    statistics' operand and the normalized tile). Measured on sm_90 AOT at K = 4096 fp32: a GEMV
    with an RMSNorm on load at one warp and one row (128 values per thread) spills 1072 bytes, and
    a paired one 172; at a quarter of that per thread neither spills."""
    from lumc.backends.triton.contraction import as_contraction_squeezed, is_tensor_core
    products = [c for c in map(as_contraction_squeezed, plan.reduces)
                if c is not None and is_tensor_core(c)]
    return 1 + max(len(products) - 1, 0) + (1 if plan.prologue else 0)


def render_row(kernel: Kernel, variant: str | None = None) -> KernelParts:
    """Render a reduction / softmax / layer norm / RMS norm kernel (or a matmul through the row
    engine when ``variant == "generic"``).

    Raises:
        RenderError: when the meaning has no row structure the engine can render.
    """
    from lumc.backends.triton.render_pointwise import render_pointwise
    plan = plan_rows(kernel)
    if plan is None or plan.K == 1:
        # nothing to reduce (every reduced axis has size 1): a pointwise kernel
        return render_pointwise(kernel)
    for name, o in kernel.meaning.outputs.items():
        if plan.outputs[name] == "row" and o.numel != plan.M:
            raise RenderError(f"output {name} ({o.shape}) is neither per row nor per element")
        if plan.outputs[name] == "full" and o.numel != plan.M * plan.K:
            raise RenderError(f"output {name} ({o.shape}) is neither per row nor per element")
    from lumc.backends.triton.render_split import prefers_split, render_split
    if variant in (None, "generic"):     # by the rows' sizes the kernel serves (a bucket's top)
        variant = ("one-pass" if next_pow2(served_size(plan.K)) <= ROW_FIT else
                   "split" if prefers_split(kernel, plan) else "looped")
    if variant == "split":
        return render_split(kernel, plan)
    if variant not in ("one-pass", "looped"):
        raise ValueError(f"unknown row-kernel variant {variant!r}")
    rk = RowKernel(kernel, plan, variant == "one-pass")
    if rk.one_pass:
        rk.write_one_pass()
    else:
        rk.write_looped()
    itemsize = max(n.dtype.itemsize for n in kernel.inputs) if kernel.inputs else 4
    problem = {"M": plan.M, "K": plan.K, "one_pass": rk.one_pass,
               "BLOCK_K_FIXED": next_pow2(plan.K), "itemsize": itemsize,
               "LIVE_TILES": live_tiles(plan)}
    notes = [f"rows M={plan.M}, reduced K={plan.K} over axes {plan.axes} of {plan.shape}"]
    if rk.big:
        notes.append("int64 indexing (a tensor or address passes 2**31)")
    return KernelParts(
        form=kernel.form, variant=variant, params=rk.params, constexprs=("BLOCK_M", "BLOCK_K"),
        body=rk.w.body(), grid=f"triton.cdiv({plan.M}, BLOCK_M)", problem=problem,
        config_space="row", constants=rk.consts, notes=notes)
