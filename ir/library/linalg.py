"""Linear algebra on small static matrices: ONNX ``Det``.

The determinant is the product of the pivots of an LU factorization with partial pivoting, the
method of LAPACK's ``getrf`` (``numpy.linalg.det``, onnxruntime's Eigen ``PartialPivLU``),
unrolled over the matrix size: step ``k`` picks the row of largest ``|a|`` in column ``k`` (the
first on ties), swaps it to the top (flipping the sign) and eliminates the column below it.
"""
from __future__ import annotations

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.library.indexing import gather_elements
from lumc.ir.library.reduce import argmax
from lumc.ir.tensor import Tensor


def det(x: Tensor) -> Tensor:
    """ONNX ``Det``: the determinants of ``x`` ``[..., n, n]`` (float), shape ``[...]``, dtype of
    ``x``, computed in ``x``'s dtype.

    A zero pivot (an exactly singular matrix: its whole remaining column is zero) eliminates
    nothing, as in ``getrf``, so the determinant is a signed zero, never NaN; NaN or inf in the
    matrix gives what the elimination gives (NaN, as numpy). ``n = 0`` gives 1. Work: ``n``
    unrolled steps of ``O(n^2)`` elementwise operations per matrix.

    Raises:
        ShapeError: a rank below 2, a non-square matrix or a non-float dtype.
    """
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"Det needs [..., n, n], got {list(x.shape)}", op="Det")
    if not x.dtype.is_float:
        raise ShapeError(f"Det needs a float input, got {x.dtype}", op="Det")
    n, batch = x.shape[-1], x.shape[:-2]
    prod = Tensor.full(batch, 1, x.dtype)
    odd = Tensor.full(batch, False, dt.bool_)            # an odd number of row swaps so far
    a = x                                                # [..., m, m]: the rows and columns left
    for m in range(n, 0, -1):
        col = a.slice([0], [1], [-1]).squeeze([-1])      # [..., m]
        p = argmax(col.abs(), axis=-1, keepdims=True)    # [..., 1]
        pivot_row = gather_elements(a, p.unsqueeze([-1]).expand(batch + (1, m)), axis=-2)
        piv = pivot_row.slice([0], [1], [-1]).reshape(batch)
        prod = prod.mul(piv)
        odd = odd.logical_xor(p.squeeze([-1]).ne(p.scalar_like(0).squeeze([-1])))
        if m == 1:
            break
        # rows 1..m-1 after the swap: row p takes the old top row
        rest = a.slice([1], [m], [-2])
        row_no = Tensor.iota(batch + (m - 1, m), -2).add(Tensor.full(batch + (m - 1, m), 1, dt.i64))
        moved = row_no.eq(p.unsqueeze([-1]).expand(batch + (m - 1, m)))
        rest = moved.where(a.slice([0], [1], [-2]).expand(batch + (m - 1, m)), rest)
        zero = piv.eq(piv.scalar_like(0))
        factor = rest.slice([0], [1], [-1]).div(zero.where(piv.scalar_like(1), piv)
                                                .reshape(batch + (1, 1)))
        factor = zero.reshape(batch + (1, 1)).expand(factor.shape).where(factor.scalar_like(0),
                                                                         factor)
        a = rest.slice([1], [m], [-1]).sub(factor.mul(pivot_row.slice([1], [m], [-1])))
    return odd.where(prod.neg(), prod)
