"""The ONNX frontend stage of a compile: load, check and import a model at the sizes asked
(``stage_frontend``), dim names resolved to whole-input shapes, size ranges recognized
(``with_ranges``), inputs bound to constants (``bind_model``). The pipeline
(``lumc.compiler.core.pipeline``) runs every stage after it on the :class:`Frontend` it returns.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from lumc.compiler.core.buckets import DimRange
from lumc.ir.errors import InputError
from lumc.ir.graph import Graph

@dataclass
class Frontend:
    graph: Graph
    source_onnx: bytes | None
    model_name: str
    warnings: list[str] = field(default_factory=list)
    known_model: object = None
    # {input name: array}: the user's example values of integer and bool inputs, at the example's
    # sizes; inputs drawn at other sizes (a range's buckets) follow them (models.like_example)
    examples: dict | None = None


SOURCE_NAME_KEY = "lumc.source_name"   # a bound model's file name (ONNX metadata_props)


def stage_frontend(model, shapes: dict | None, example_inputs: dict | None) -> Frontend:
    """Load, check and import an ONNX model (path, bytes or ``onnx.ModelProto``).

    Raises:
        ModelError, UnsupportedOpError, InputError: one line each (see ``lumc.compiler.frontends.onnx_frontend``).
    """
    from lumc.compiler.frontends.onnx_frontend import check_supported, import_onnx, load_model
    from lumc.compiler.frontends.models import identify_bytes
    m = load_model(model)
    check_supported(m)
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            src = f.read()               # the file's own bytes: artifacts keep the model as given
        if _names_external_data(src):
            # ... but not its weights' file names: an artifact holds the model with its weights,
            # so that --check and the onnxruntime rival run it anywhere, the files gone too
            try:
                src = m.SerializeToString()
            except ValueError:           # over protobuf's 2 GB: only the file's bytes can be kept
                pass
    elif isinstance(model, (bytes, bytearray)):
        src = bytes(model)
    else:
        src = m.SerializeToString()
    info = identify_bytes(src)
    input_shapes = dict(shapes or {})
    if example_inputs:
        check_example_names(m, example_inputs)
        for k, v in example_inputs.items():
            input_shapes.setdefault(k, tuple(np.shape(v)))
    imported = import_onnx(m, resolve_dim_names(m, input_shapes))
    name = os.path.basename(str(model)) if isinstance(model, (str, os.PathLike)) else next(
        (p.value for p in m.metadata_props if p.key == SOURCE_NAME_KEY), "model")
    return Frontend(imported.graph, src, name, list(imported.warnings), info)


def _names_external_data(src: bytes) -> bool:
    """Whether the serialized model keeps some tensor's data in an external file."""
    if b"location" not in src:
        return False
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data
    try:
        return any(uses_external_data(t) for t in _get_all_tensors(onnx.load_from_string(src)))
    except Exception:
        return False


def check_example_names(m, example_inputs: dict) -> None:
    """Every key of ``example_inputs`` names an input of the model ``m`` (``onnx.ModelProto``).

    Raises:
        InputError: a key that is no input (a dynamic dim's name was taken as that dim's size and
            its values dropped; any other was reported as an unknown ``shapes=`` key), naming the
            inputs, and saying so where the model gives it a default value (an initializer).
    """
    from lumc.compiler.frontends.onnx_frontend import model_input_specs
    from lumc.compiler.runtime.compiled import unknown_input_note
    names = [s.name for s in model_input_specs(m)]
    unknown = [k for k in example_inputs if k not in names]
    if unknown:
        raise InputError(f"example_inputs={{{unknown[0]!r}: ...}}: no input of that name; inputs: "
                         f"{', '.join(names) or 'none'}" + unknown_input_note(m, unknown[0]),
                         node=str(unknown[0]))


def resolve_dim_names(m, shapes: dict, shown: dict | None = None) -> dict:
    """Turn ``{dim name: n}`` entries (``batch_size=2``) into whole-input shapes. ``shown``: the
    dims as the user gave them, for the message (a range's text, not the size probed).

    Raises:
        InputError: a key that is neither an input nor a dynamic dim of the model (named, with
            the ones there are), or a dim that some input needs left out.
    """
    from lumc.compiler.frontends.onnx_frontend import model_input_specs
    specs = model_input_specs(m)
    names = {s.name for s in specs}
    symbols = {d for s in specs for d in s.shape if isinstance(d, str)}
    unknown = [k for k in shapes if k not in names and k not in symbols]
    if unknown:
        raise InputError(f"shapes={{{unknown[0]!r}: ...}}: no input or dynamic dim of that name; "
                         f"inputs: {', '.join(sorted(names))}; dynamic dims: "
                         f"{', '.join(sorted(symbols)) or 'none'}")
    dims = {k: v for k, v in shapes.items() if k not in names}
    out = {k: _input_shape(k, v) for k, v in shapes.items() if k in names}
    partial: dict[str, list[str]] = {}    # input -> the dims it still needs
    for s in specs:
        if s.name in out:
            continue
        named = list(dict.fromkeys(d for d in s.shape if isinstance(d, str)))
        missing = [d for d in named if d not in dims]
        if named and not missing:
            out[s.name] = tuple(_scalar_dim(dims[d], d) if isinstance(d, str) else d for d in s.shape)
        elif named and len(missing) < len(named):
            partial[s.name] = missing
    if partial:
        miss = list(dict.fromkeys(d for ds in partial.values() for d in ds))
        given = ", ".join(f"{k}={(shown or {}).get(k, v)}" for k, v in dims.items())
        raise InputError("; ".join(f"input {k!r} also needs {ds}" for k, ds in partial.items())
                         + f" (given {given}): give " + ", ".join(miss) + " too (shapes={"
                         + ", ".join(f"{d!r}: <size>" for d in miss) + "} in Python, "
                         + " ".join(f"--shape {d}=<size>" for d in miss) + " at the CLI)")
    return out


def _input_shape(name: str, v) -> tuple:
    """The whole shape ``shapes={name: v}`` gives input ``name``: a tuple or list of sizes, or
    the CLI's text ``"1x3x224x224"``.

    Raises:
        InputError: anything else (a bare int, a size that is not an integer >= 0).
    """
    given = v
    if isinstance(v, str):
        try:
            v = tuple(int(d) for d in v.strip().split("x")) if v.strip() else ()
        except ValueError:
            v = None
    if not isinstance(v, (tuple, list)) or any(
            isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in v):
        raise InputError(f"shapes={{{name!r}: {given!r}}}: {name!r} is an input: give its whole "
                         "shape as a tuple of sizes, e.g. (4, 32) (or the text '4x32'), or name "
                         "its dynamic dims")
    return tuple(int(d) for d in v)


def input_shapes_as_tuples(model, shapes: dict | None) -> dict | None:
    """``shapes`` with a flat list of sizes or ``"AxB"`` text given for an *input* (not a dim)
    taken as that input's shape tuple: ``shapes={"x": [4, 32]}`` is x's shape, where under a
    dim name a list is several sizes to compile (``lumc.compiler.core.variants.size_lists``)."""
    def flat(v):
        return (isinstance(v, list) and v and not any(isinstance(e, (list, tuple)) for e in v)) \
            or (isinstance(v, str) and "x" in v)
    if not shapes or not any(flat(v) for v in shapes.values()):
        return shapes
    from lumc.compiler.frontends.onnx_frontend import load_model, model_input_specs
    names = {s.name for s in model_input_specs(load_model(model))}
    return {k: _input_shape(k, v) if k in names and flat(v) else v for k, v in shapes.items()}


def with_ranges(model, shapes: dict | None) -> dict | None:
    """``shapes`` with the API's ``(lo, hi)`` 2-tuples and ``"A..B[:STEP][@AT]"`` strings (the
    CLI's range syntax: a range in steps, or tuned around a traffic point) under a dim name (not
    an input's) as :class:`~lumc.compiler.core.buckets.DimRange`."""
    if not shapes or not any((isinstance(v, tuple) and len(v) == 2) or isinstance(v, str)
                             or isinstance(v, DimRange) for v in shapes.values()):
        return shapes
    from lumc.compiler.core.buckets import parse_range
    from lumc.compiler.frontends.onnx_frontend import load_model, model_input_specs
    m = load_model(model)
    names = {s.name for s in model_input_specs(m)}
    out = {}
    for k, v in shapes.items():
        if isinstance(v, tuple) and len(v) == 2 and k not in names:
            if any(isinstance(e, bool) or not isinstance(e, (int, np.integer)) for e in v):
                raise InputError(f"shapes={{{k!r}: {v!r}}}: a range of sizes is (lo, hi), two "
                                 "integers")
            v = DimRange(int(v[0]), int(v[1]))
        elif isinstance(v, str) and k not in names:
            try:
                r = parse_range(v)
            except InputError as e:
                raise InputError(f"shapes={{{k!r}: {v!r}}}: {e}") from None
            if r is None:
                raise InputError(f"shapes={{{k!r}: {v!r}}}: a range of sizes as text is "
                                 "'A..B', 'A..B:STEP' or 'A..B@AT'")
            v = r
        out[k] = v
    # a dim the inputs need and no entry gives is named now, with the ranges as given (found
    # later, at a probed size, the message said 'given sequence_length=61')
    first = {k: v.lo if isinstance(v, DimRange) else
             (v[0] if isinstance(v, list) and v and k not in names else v) for k, v in out.items()}
    resolve_dim_names(m, first, shown={k: v.describe() for k, v in out.items()
                                       if isinstance(v, DimRange)})
    return out


def _scalar_dim(v, name: str = "") -> int:
    """One size for dynamic dim ``name``: an int, or a 1-tuple (the CLI's ``batch_size=2``).

    Raises:
        InputError: a 2-tuple (a range ``(lo, hi)``, which ``lumc.compiler.core.buckets``
            compiles before this is reached) or anything else that is not one size.
    """
    if isinstance(v, (tuple, list)):
        if len(v) == 2 and isinstance(v, tuple):
            raise InputError(f"--shape {name}={v[0]}..{v[1]}: a range of sizes where this step "
                             "takes one size (a range is compiled by lumc compile and lumc.compile "
                             "into size buckets)")
        if len(v) != 1:
            raise InputError(f"--shape {name}: a dynamic dim takes one size, got {v!r}")
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InputError(f"shapes={{{name!r}: {v!r}}}: a dynamic dim's size is an integer (or "
                         "(lo, hi) for a range of sizes, [a, b, ...] for a list)")
    return int(v)


def bind_model(model, bind: dict):
    """``model`` (a path, bytes or ``onnx.ModelProto``) with the inputs in ``bind`` made constants
    (``--bind``, ``lumc.compiler.frontends.onnx_frontend.bind_inputs``); a path's file name is kept
    in its metadata, so the report and the artifact name the model as given."""
    from lumc.compiler.frontends.onnx_frontend import bind_inputs, load_model
    bound = bind_inputs(load_model(model), bind)
    if isinstance(model, (str, os.PathLike)):
        bound.metadata_props.add(key=SOURCE_NAME_KEY, value=os.path.basename(str(model)))
    return bound
