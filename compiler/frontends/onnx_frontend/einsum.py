"""ONNX ``Einsum`` as views, one broadcast product and one sum.

Each operand's labels are aligned to one common label order (output labels, then contracted
ones) by a permute + reshape + expand view; repeated labels inside an operand take the diagonal
(a strided slice of the flattened pair of axes). The operands are multiplied and the contracted
axes summed, so a two-operand contraction is exactly the ``SumReduce(Mul)`` pattern the backends
recognize as a matmul-like kernel.
"""
from __future__ import annotations

import functools

from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, broadcast_shapes


def _labels(term: str, rank: int, n_ell: int) -> list[str]:
    """Labels of one operand term; the ellipsis expands to ``n_ell`` labels ``.0 .. .k`` (right
    aligned, so operands with fewer ellipsis dims broadcast)."""
    if "..." in term:
        head, tail = term.split("...")
        k = rank - len(head) - len(tail)
        if k < 0:
            raise ShapeError(f"term {term!r} has more labels than rank {rank}")
        return list(head) + [f".{n_ell - k + i}" for i in range(k)] + list(tail)
    if len(term) != rank:
        raise ShapeError(f"term {term!r} has {len(term)} labels for rank {rank}")
    return list(term)


def _diagonal(x: Tensor, labels: list[str]) -> tuple[Tensor, list[str]]:
    """Collapse repeated labels of one operand onto their diagonal."""
    while True:
        seen = {}
        dup = None
        for i, lab in enumerate(labels):
            if lab in seen:
                dup = (seen[lab], i)
                break
            seen[lab] = i
        if dup is None:
            return x, labels
        i, j = dup
        n = x.shape[i]
        if x.shape[j] != n:
            raise ShapeError(f"label {labels[i]!r} has sizes {n} and {x.shape[j]}")
        rest = [k for k in range(x.ndim) if k not in (i, j)]
        y = x.permute(rest + [i, j]).reshape([x.shape[k] for k in rest] + [n * n])
        y = y.slice([0], [n * n], [-1], [n + 1])
        # the diagonal takes the place of the first occurrence
        perm_labels = [labels[k] for k in rest] + [labels[i]]
        back = list(range(len(rest)))
        back.insert(sum(1 for k in rest if k < i), len(rest))
        x = y.permute(back)
        labels = [perm_labels[k] for k in back]


def einsum(equation: str, xs: list[Tensor]) -> Tensor:
    """Evaluate an ONNX/numpy einsum ``equation`` over ``xs``.

    Raises:
        ShapeError: malformed equation, a repeated output label, label sizes that disagree, or
            mixed dtypes.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        raise ShapeError(f"equation {equation!r} has {len(terms)} operands, got {len(xs)}")
    n_ell = max((x.ndim - len(t.replace("...", "")) for t, x in zip(terms, xs) if "..." in t),
                default=0)
    ops, labs, counts = [], [], {}
    for t, x in zip(terms, xs):
        written = _labels(t, x.ndim, n_ell)
        for c in written:          # before the diagonal: a label repeated in one term is summed
            counts[c] = counts.get(c, 0) + 1
        x, lab = _diagonal(x, written)
        ops.append(x)
        labs.append(lab)
    ell = [f".{i}" for i in range(n_ell)]
    if arrow:
        out = _labels(rhs, len(rhs.replace("...", "")) + (n_ell if "..." in rhs else 0), n_ell)
    else:
        out = ell + sorted(c for c, k in counts.items() if k == 1 and not c.startswith("."))
    every = []
    for lab in labs:
        every += [c for c in lab if c not in every]
    repeated = sorted({c for c in out if out.count(c) > 1})
    if repeated:
        raise ShapeError(f"output labels {repeated} are repeated (an output label appears once)")
    missing = [c for c in out if c not in every]
    if missing:
        raise ShapeError(f"output labels {missing} appear in no operand")
    order = out + [c for c in every if c not in out]
    sizes: dict[str, list[int]] = {}
    for x, lab in zip(ops, labs):
        for c, d in zip(lab, x.shape):
            sizes.setdefault(c, []).append(d)
    full = [broadcast_shapes(*[(d,) for d in sizes[c]])[0] for c in order]
    aligned = []
    for x, lab in zip(ops, labs):
        perm = sorted(range(len(lab)), key=lambda k: order.index(lab[k]))
        y = x.permute(perm) if perm else x
        shape = [x.shape[lab.index(c)] if c in lab else 1 for c in order]
        aligned.append(y.reshape(shape).expand(full))
    prod_ = functools.reduce(Tensor.mul, aligned)
    contracted = list(range(len(out), len(order)))
    return prod_.sum(contracted) if contracted else prod_
