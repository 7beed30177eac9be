"""Back-to-back contractions in one kernel: an MLP's up-projection, activation and down-projection;
and side-by-side ones: two contractions of one left operand as one paired kernel
(:meth:`ChainFusion._pairs`).

A transformer's feed-forward block is ``act(LN(x) @ W1 + b1) @ W2 + b2 + r``. Fused greedily it is
two kernels, and the intermediate ``h = act(x @ W1 + b1)`` (``M x F``, four times the hidden size in
BERT and GPT-2) is written by the first and read back by the second. With ``mlp`` (the ``+mlp``
candidates) the second contraction's kernel computes ``h`` itself: the ``mlp`` form
(``lumc.backends.triton.render_mlp``), whose programs each compute one ``BLOCK_M x BLOCK_F`` block
of ``h`` on chip, over the whole ``K``, and multiply it into fp32 partial products of the output
that a second kernel sums in a fixed order (a split over ``F``, the way split-K splits ``K``).

The fusion applies to a contraction ``C1`` whose elementwise epilogue's exit ``b`` is read only as
the left operand of one other contraction ``C2``, when (:meth:`ChainFusion._chainable`):

* neither has batch dims, both run on tensor cores (``tl.dot``), and ``C1`` is not paired;
* ``C2`` reads ``b`` as ``[M, F]`` rows (``reads_operand_rows``) and ``C1`` writes its product
  rows before columns (``_row_plannable``): the ``h`` block a program computes is the operand tile
  it multiplies, position for position;
* ``C1.N == C2.K`` and ``C1.M == C2.M > 1`` (one row is a GEMV, which the matmul kernels run
  as row kernels); ``F > 1`` (a first product without a column dim is elementwise over its left
  operand); operands of the ``tl.dot`` dtypes (``DOT_DTYPES``: no fp64); ``C2.N`` at most
  ``MLP_ACCS`` column tiles of the largest ``BLOCK_N`` (2048: a program accumulates every column
  of its rows); and ``C1`` is not itself the end of another chain.

Without the flag the decision is noted (:data:`MLP_REFUSAL`), which is what makes
``egraph_pipeline`` decode the ``+mlp`` twin; the search times both.
"""
from __future__ import annotations

from lumc.ir.graph import Node

from lumc.backends.triton.configs import MLP_MAX_N
from lumc.backends.triton.contraction import (as_contraction, as_contraction_squeezed,
                                              is_tensor_core, same_iteration)
from lumc.backends.triton.norm_prologue import reads_operand_rows
from lumc.backends.triton.render_matmul import DOT_DTYPES
from lumc.compiler.core.fusion_norms import _chain, _row_plannable

MLP_REFUSAL = ("chained contractions: the intermediate is the next contraction's left operand "
               "(the +mlp candidate computes it in that kernel)")


class ChainFusion:
    """The chain decision for :class:`~lumc.compiler.core.fusion.GreedyFusion` (module
    docstring). State: ``chain_root`` (``{id(C1): id(C2)}``: ``C1``'s exit is never written)."""

    def _chain_contraction(self, b: Node, mul: Node, exits: dict) -> bool:
        """Fuse ``b`` (a contraction kernel's exit) into the contraction that ``mul`` (its
        product) feeds, when :meth:`_chainable`; with ``mlp`` off, note that it could."""
        r2 = self._chainable(b, mul, exits)
        if r2 is None:
            return False
        if not self.mlp:
            self._refuse(b, mul, MLP_REFUSAL)
            return False
        self.chain_root[self.group[id(b)]] = id(r2)
        self._refuse(b, mul, "chained contractions: computed on chip in the next contraction's "
                             "kernel (mlp form)")
        return True

    def _chainable(self, b: Node, mul: Node, exits: dict) -> Node | None:
        """``C2`` (the sum over ``mul``) when ``b`` may be computed in its kernel, else None."""
        g = self.group.get(id(b))
        r1 = self.byid.get(g) if g is not None else None
        if r1 is None or g in self.forms or g in self.row_groups or exits.get(g) is not b \
                or id(b) in self.outputs:
            return None
        if r1.op != "SumReduce" or g in self.chain_root.values() or g in self.chain_root:
            return None
        sums_in_group = sum(1 for k, gg in self.group.items()
                            if gg == g and self.byid[k].op == "SumReduce")
        if sums_in_group != 1:
            return None             # a paired kernel (two products) or a statistic inside
        uses = self.uses.get(id(b), [])
        if len(uses) != 1 or uses[0][0] is not mul or id(mul) in self.group:
            return None
        sums = self._sums_of(mul)
        if not sums or len(sums) != 1 or id(sums[0]) in self.group:
            return None
        r2 = sums[0]
        # the product summed directly: the mlp kernel keeps its views where the model wrote
        # them, so a batch-of-one reshape between product and sum (``as_contraction_squeezed``)
        # would reach the renderer as it is
        c1, c2 = as_contraction(r1), as_contraction(r2)
        if c1 is None or c2 is None or not (is_tensor_core(c1) and is_tensor_core(c2)):
            return None
        if c1.batch_dims or c2.batch_dims or _chain(c2.a)[0] is not b:
            return None
        if c1.N != c2.K or c1.M != c2.M or c1.M < 2 or c1.K == 0 or c2.N == 0:
            return None
        if not c1.n_dims:
            return None         # F = 1: the first product is elementwise over its left operand
        #                         (a producer's kernel may write it) and has no column index
        if c1.a.dtype not in DOT_DTYPES or c2.a.dtype not in DOT_DTYPES:
            return None         # the renderer's tl.dot operands (fp64, ints: two kernels)
        if c2.N > MLP_MAX_N:
            return None         # a program holds every column tile of the output
        if c1.node.dtype != c2.node.dtype or b.dtype != c1.a.dtype:
            return None
        if not _row_plannable(r1, True) or not reads_operand_rows(c2):
            return None
        return r2

    def _kernel_root(self, g: int) -> int:
        """The group whose kernel computes group ``g``: ``C2`` for a chained ``C1``."""
        return self.chain_root.get(g, g)

    def _pairs(self) -> dict[int, Node]:
        """``{id(first): second}`` for contractions that one paired matmul kernel computes: the same
        left operand over the same iteration space (``same_iteration``: a gated MLP's gate and up
        projections of one normalized input) whose elementwise epilogues meet (``silu(g) * u``).
        The kernel loads each left tile once for both products and never writes either one; the
        first in topological order claims the second when its epilogue closes over both."""
        by_key: dict[tuple, list] = {}
        for n in self.order:
            c = as_contraction_squeezed(n) if id(n) not in self.group else None
            if c is not None and is_tensor_core(c) and id(n) not in self.outputs:
                by_key.setdefault((id(c.a), c.full), []).append(c)
        pairs: dict[int, Node] = {}
        for cs in by_key.values():
            if len(cs) < 2:
                continue
            reach = {id(c.node): {id(u) for u in self._fusible_descendants([c.node])} for c in cs}
            taken: set[int] = set()
            for i, c in enumerate(cs):
                for c2 in cs[i + 1:]:
                    if taken & {id(c.node), id(c2.node)} or not same_iteration(c, c2):
                        continue
                    if c.M == 1 and not _same_row_spelling(c.node, c2.node):
                        continue     # one GEMV row kernel needs one operand shape and axes
                    if reach[id(c.node)] & reach[id(c2.node)]:
                        pairs[id(c.node)] = c2.node
                        taken |= {id(c.node), id(c2.node)}
        return pairs


def _same_row_spelling(r1: Node, r2: Node) -> bool:
    """Two sums reduce operands of one shape over the same axes (what a row kernel computing
    both needs, ``rowplan.plan_rows``)."""
    return tuple(r1.srcs[0].shape) == tuple(r2.srcs[0].shape) and \
        tuple(sorted(r1.arg)) == tuple(sorted(r2.arg))
