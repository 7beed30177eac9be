"""``NegativeLogLikelihoodLoss`` and ``SoftmaxCrossEntropyLoss``, following the ONNX reference
(``onnx/reference/ops/op_negative_log_likelihood_loss.py``) including its treatment of
``ignore_index`` and class weights: ignored positions contribute 0 and, with ``reduction="mean"``,
the sum is divided by the total weight of the positions that count."""
from __future__ import annotations

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor


def _nll(logp: Tensor, target: Tensor, weight: Tensor | None, ignore_index, reduction: str,
         mean_counts_ignored: bool) -> Tensor:
    """Loss from log-probabilities ``logp`` [N, C, d...] and class indices ``target`` [N, d...]."""
    if logp.ndim < 2 or target.shape != (logp.shape[0],) + logp.shape[2:]:
        raise ShapeError(f"input {logp.shape} and target {target.shape} do not fit [N, C, ...] / "
                         "[N, ...]")
    c = logp.shape[1]
    t = target.cast(dt.i64)
    valid = None
    if ignore_index is not None:
        valid = t.ne(t.scalar_like(int(ignore_index)))
        t = valid.where(t, t.scalar_like(0))         # ignored targets may be out of range
    # range-checked: a class index past C read the next position's row through the flat index
    picked = lib("indexing.gather_elements")(logp, t.unsqueeze([1]), axis=1,
                                             check_range=True).squeeze([1])
    loss = picked.neg()
    zero = loss.scalar_like(0.0)
    if valid is not None:
        loss = valid.where(loss, zero)
    w = None
    if weight is not None:
        w = lib("indexing.gather")(weight, t.clip(t.scalar_like(0), t.scalar_like(c - 1)), axis=0)
        if valid is not None:
            w = valid.where(w, zero)
    elif valid is not None and not mean_counts_ignored:
        w = valid.where(loss.scalar_like(1.0), zero)
    if w is not None and weight is not None:
        loss = loss.mul(w)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction != "mean":
        raise ShapeError(f"unknown reduction {reduction!r}")
    if w is not None:
        return loss.sum().div(w.sum())
    return loss.mean()


@handler("NegativeLogLikelihoodLoss", requires=["indexing.gather_elements", "indexing.gather"])
def _nll_loss(ctx: OpContext):
    ii = ctx.attr("ignore_index")
    # the reference divides by every position when ignore_index is -1 and there are no weights
    return _nll(ctx.input(0), ctx.input(1), ctx.opt(2), ii, ctx.attr("reduction", "mean"),
                mean_counts_ignored=(ii == -1 or ii is None))


@handler("SoftmaxCrossEntropyLoss", requires=["indexing.gather_elements", "indexing.gather",
                                              "norm.log_softmax"])
def _softmax_cross_entropy(ctx: OpContext):
    x = ctx.input(0)
    logp = lib("norm.log_softmax")(x, axis=1)
    loss = _nll(logp, ctx.input(1), ctx.opt(2), ctx.attr("ignore_index"),
                ctx.attr("reduction", "mean"), mean_counts_ignored=ctx.attr("ignore_index") is None)
    return [loss, logp]
