"""``LSTM``, ``GRU`` and ``RNN``: inputs in ONNX order and attributes as keyword arguments to
``lumc.ir.library.recurrent``, which unrolls the static sequence length."""
from __future__ import annotations

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib
from lumc.ir.errors import ModelError

_COMMON = ("hidden_size", "direction", "activations", "activation_alpha", "activation_beta", "clip",
           "layout")
_EXTRA = {"LSTM": ("input_forget",), "GRU": ("linear_before_reset",), "RNN": ()}
_N_INPUTS = {"LSTM": 8, "GRU": 6, "RNN": 6}


@handler("LSTM", "GRU", "RNN", requires=["recurrent.lstm", "recurrent.gru", "recurrent.rnn"])
def _recurrent(ctx: OpContext):
    op = ctx.node.op_type
    args = [ctx.opt(i) for i in range(_N_INPUTS[op])]
    kw = {k: ctx.attr(k) for k in _COMMON + _EXTRA[op] if k in ctx.attrs}
    if "hidden_size" not in kw:   # optional in the schema, required by onnxruntime: refused alike
        raise ModelError("attribute 'hidden_size' is missing (onnxruntime requires it)",
                         node=ctx.node.name or None, op=op)
    return list(lib(f"recurrent.{op.lower()}")(*args, **kw))
