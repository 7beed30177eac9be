"""Outputs of a lumc plan that refuse a backward: lumc compiles for inference.

A plan computes its outputs outside autograd. Without this, a call with an input that requires
gradients returned detached outputs, so ``loss.backward()`` through them silently left that input
(and whatever produced it) without their share of the gradient. Eager semantics instead: an output
that reads such an input requires gradients, and its backward raises in one line
(:class:`InferenceOnly`). Used by every callable that returns torch tensors: ``CompiledModel``
(ONNX files, artifacts, a torch module's size ranges) and the torch paths in ``compiler.core``.
"""
from __future__ import annotations

from typing import Callable

import torch

from lumc.ir.graph import Graph, toposort


class InferenceOnly(torch.autograd.Function):
    """The outputs of a lumc-compiled graph whose inputs require gradients: computed by lumc, with
    a backward that raises, so ``loss.backward()`` through them fails in one line instead of
    leaving the graph's parameters without gradients."""

    @staticmethod
    def forward(ctx, run, *args):
        return tuple(run(*args))

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("lumc: this graph was compiled for inference and has no backward; "
                           "train with another torch.compile backend (or none), and compile "
                           "for lumc under torch.no_grad() or torch.inference_mode()")


def output_reads(graph: Graph) -> dict[str, set[str]]:
    """``{output name: names of the graph inputs it reads}`` (a walk of each output's sub-graph)."""
    return {k: {m.arg.name for m in toposort([out]) if m.op == "Input"}
            for k, out in graph.outputs.items()}


def refuse_backward(reads: Callable[[], dict[str, set[str]]], inputs: dict, outputs: dict) -> dict:
    """``outputs`` (``{name: torch tensor}``) with those that read an input requiring gradients
    through :class:`InferenceOnly` when grad mode is on; floating-point outputs only (an integer
    or boolean output never requires gradients in eager). ``inputs``: ``{name: tensor or array}``;
    ``reads()``: :func:`output_reads` of the graph, called only when an input requires gradients.
    Returns ``outputs`` itself when nothing needs a gradient."""
    if not torch.is_grad_enabled():
        return outputs
    needs = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    if not needs:
        return outputs
    r = reads()
    names = [k for k, t in outputs.items() if isinstance(t, torch.Tensor) and
             t.is_floating_point() and r.get(k, set()) & set(needs)]
    if not names:
        return outputs
    guarded = InferenceOnly.apply(lambda *_: tuple(outputs[k] for k in names),
                                  *(inputs[k] for k in needs))
    return {**outputs, **dict(zip(names, guarded))}
