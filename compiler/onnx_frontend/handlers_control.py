"""Control flow: ``If``. A constant condition inlines the chosen branch (outer names visible); a
runtime condition imports both branches and selects with ``Where`` when their outputs agree in
shape and dtype (both sides are side-effect free, so computing both is only a cost)."""
from __future__ import annotations

import onnx

from lumc.compiler.onnx_frontend.registry import OpContext, handler
from lumc.ir.errors import UnsupportedOpError


def _check_if(node: onnx.NodeProto, opset: int) -> str | None:
    for a in node.attribute:
        if a.name in ("then_branch", "else_branch"):
            for o in a.g.output:
                if o.type.WhichOneof("value") not in (None, "tensor_type"):
                    return f"{o.type.WhichOneof('value').replace('_type', '')} branch output"
    return None


@handler("If", check=_check_if)
def _if(ctx: OpContext):
    cond = ctx.input(0)
    v = ctx.importer.folder.value(cond)
    if v is not None:
        if v.size != 1:
            raise UnsupportedOpError(f"condition has {v.size} elements, expected 1")
        branch = ctx.attr("then_branch") if bool(v.reshape(-1)[0]) else ctx.attr("else_branch")
        return ctx.run_subgraph(branch)
    then = ctx.run_subgraph(ctx.attr("then_branch"))
    other = ctx.run_subgraph(ctx.attr("else_branch"))
    c = cond.reshape(())
    outs = []
    for k, (a, b) in enumerate(zip(then, other)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise UnsupportedOpError(f"runtime condition with branch output {k} of different shapes "
                                     f"or dtypes ({a.dtype}{list(a.shape)} vs "
                                     f"{b.dtype}{list(b.shape)})")
        outs.append(c.where(a, b))
    return outs
