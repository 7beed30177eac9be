"""The ONNX frontend: load, check, and import ONNX models into lumc primitive graphs.

Opsets 9-21 are the target; the opset-dependent forms of older exporters (opset 6-8: attribute
forms of Slice/Pad/Split/Reshape/Upsample, legacy broadcasting) are read too, and ops of opsets
22-28 follow their current definitions (checked by the ONNX conformance cases).

    model = load_model("model.onnx")              # ModelError on a missing/corrupt file
    check_supported(model)                        # UnsupportedOpError listing every unsupported op
    imported = import_onnx(model, {"x": (1, 3, 224, 224)})
    imported.graph                                # lumc.ir.graph.Graph with concrete shapes

Modules: ``loader`` (files, dtypes, specs), ``support`` (the up-front check), ``registry`` (the
handler table and the context a handler sees), ``folding`` (import-time constant folding),
``importer`` (the walk over the graph, output checks) and one ``handlers_*`` module per family of
ops (``handlers_control``: ``If`` inlined, ``Loop``/``Scan`` unrolled).
"""
from __future__ import annotations

# handler modules register themselves on import
from lumc.compiler.frontends.onnx_frontend import (handlers_attention, handlers_bits,  # noqa: F401
                                         handlers_control, handlers_index, handlers_loss,
                                         handlers_math, handlers_nn, handlers_quant,
                                         handlers_recurrent, handlers_reduce, handlers_sample,
                                         handlers_select, handlers_shape, handlers_state,
                                         handlers_trig)
from lumc.compiler.frontends.onnx_frontend.importer import ImportedModel, bind_inputs, import_onnx
from lumc.compiler.frontends.onnx_frontend.loader import (TensorSpec, load_model, model_input_specs,
                                                model_output_specs)
from lumc.compiler.frontends.onnx_frontend.registry import HANDLERS, NeedsConstantError
from lumc.compiler.frontends.onnx_frontend.support import check_supported, unsupported_nodes

__all__ = ["ImportedModel", "TensorSpec", "bind_inputs", "check_supported", "import_onnx", "load_model",
           "model_input_specs", "model_output_specs", "unsupported_nodes", "HANDLERS",
           "NeedsConstantError"]
