"""``layout``: where tensors live in memory, and how kernels read them.

``Contiguous`` is a copy; these rules offer the strided read in its place (the view over the
source is folded into the consumer's index expression, as every view is), and the cost model
picks. Transposed matmul operands need no rule of their own: a ``Permute`` under a ``MatMul``
operand is read in place with swapped strides (the kernel cutter folds it into the load).
"""
from __future__ import annotations

from lumc.rewrites.patterns import Rule


def rules() -> list[Rule]:
    return [
        # a copy holds the same values: read the source in place instead
        Rule("layout/Contiguous: contiguous(x) -> x", "exact", "(Contiguous ?x)", "?x",
             cases=({"x": ("in", (3, 5), "f32")}, {"x": ("in", (0, 5), "f32")})),
        # a view of a copy reads the same elements of the source
        Rule("layout/View: view(contiguous(x)) -> view(x)", "exact", "(View (Contiguous ?x) ?st)",
             "(View ?x ?st)", ("(= ?rs (shape ?root))",), sets=("(set (shape (View ?x ?st)) ?rs)",),
             cases=({"x": ("in", (3, 5), "f32"), "st": ("Permute", (1, 0))},
                    {"x": ("in", (3, 5), "f32"), "st": ("Reshape", (5, 3))})),
    ]
