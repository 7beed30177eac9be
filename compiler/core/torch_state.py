"""A Dynamo graph's state, for ``torch_backend.DynamoGraph``: writes to its inputs made pure, and
outputs that refuse a backward.

lumc compiles pure functions for inference. A graph that writes its inputs in place (a buffer's
running mean, a KV cache row set by index) is functionalized by ``torch.func.functionalize``,
which ends it with ``copy_(input, new value)``; :func:`lift_input_writes` turns those into extra
outputs that the caller copies back after each call, as eager mode leaves the inputs. A graph
whose inputs require gradients runs through :class:`InferenceOnly`, so ``loss.backward()`` through
its outputs fails in one line instead of silently giving its parameters no gradient.
"""
from __future__ import annotations

import torch


def lift_input_writes(gm: torch.fx.GraphModule, arg_index: list[int]) -> list[tuple[int, str]]:
    """Turn the functionalized graph's in-place writes into its inputs (``copy_(input, new)`` at
    the end: a buffer updated in ``forward``, a KV cache row set by index) into extra outputs, last,
    so the compiled graph is a pure function; returns ``[(argument index, placeholder name)]`` in
    output order (``arg_index[k]``: the Dynamo argument of the k-th placeholder)."""
    places = [p for p in gm.graph.nodes if p.op == "placeholder"]
    out_node = next(p for p in reversed(gm.graph.nodes) if p.op == "output")
    writes, values = [], []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0] in places and not node.users:
            writes.append((arg_index[places.index(node.args[0])], node.args[0].name))
            values.append(node.args[1])
            gm.graph.erase_node(node)
    if writes:
        outs = out_node.args[0]
        out_node.args = ((tuple(outs) if isinstance(outs, (tuple, list)) else (outs,))
                         + tuple(values),)
        gm.recompile()
    return writes


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
