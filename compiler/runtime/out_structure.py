"""A torch module's output structure, kept with its compiled plan and stored in its artifact.

``lumc.compile(module, ...)`` returns what the module returns (a dict, nested tuples, a list, a
constant ``3`` or ``None`` beside the tensors); the plan itself computes a flat set of named
outputs. :class:`OutputStructure` maps one to the other: the pytree spec of the module's outputs
and, per leaf, the plan output it is or the constant it was traced as. An artifact saved from such
a callable stores it as the part ``structure.json`` (the spec through
``torch.utils._pytree.treespec_dumps``: JSON, never unpickled; constants only as JSON scalars), so
``lumc.load`` returns the same structure as the callable it was saved from.

A namedtuple, or a class torch's pytree registered without a serialized type name (a dataclass
through ``torch.export.register_dataclass(Out)``), is stored by its qualified name
(``lumc:namedtuple:`` / ``lumc:class:`` + ``module.QualName``, with its fields) and rebuilt at load
from the class of that name in a module the loading process has already imported (never importing
one: an artifact runs no code); a registered class must be registered there too. A structure
with a non-scalar constant leaf is not stored: the saved artifact returns one value for one output,
else a tuple in output order, and ``save`` warns once saying so. A stored structure whose type this
process does not have (a transformers ``ModelOutput`` before ``import transformers``, a script's
own dataclass loaded by another script) loads flat with a warning naming what to import.
"""
from __future__ import annotations

import json
import warnings

from lumc.ir.errors import ArtifactError

PART = "structure.json"
_SCALARS = (type(None), bool, int, float, str)


class OutputStructure:
    """``spec``: the torch pytree spec of the outputs; ``leaves``: per leaf in flatten order,
    ``("output", name)`` (a plan output) or ``("const", value)``."""

    def __init__(self, spec, leaves: list[tuple[str, object]]):
        self.spec = spec
        self.leaves = list(leaves)
        # the module's call interface (lumc.compiler.runtime.in_structure), stored beside it
        self.inputs = None

    @classmethod
    def of_capture(cls, out_spec, output_names, output_index, flat_outputs, graph_outputs):
        """From a capture's interface: a leaf whose name the plan computes is that output, any
        other the traced value (``flat_outputs[index]``). None for a flat capture (no spec)."""
        if out_spec is None:
            return None
        leaves = [("output", n) if n in graph_outputs else ("const", flat_outputs[i])
                  for n, i in zip(output_names, output_index)]
        return cls(out_spec, leaves)

    def build(self, values: dict):
        """The module's outputs from ``{plan output name: value}``."""
        import torch.utils._pytree as pytree
        flat = [values[v] if kind == "output" else v for kind, v in self.leaves]
        return pytree.tree_unflatten(flat, self.spec)

    # ---- the artifact part ------------------------------------------------------------------------
    def to_bytes(self, what: str = "the output structure") -> bytes | None:
        """The ``structure.json`` part; None (and one warning) when it cannot be stored."""
        from torch.utils._pytree import treespec_dumps
        bad = next((v for kind, v in self.leaves if kind == "const"
                    and not isinstance(v, _SCALARS)), None)
        why = None
        if bad is not None:
            why = f"a constant {type(bad).__name__} output"
        else:
            try:
                spec = treespec_dumps(self.spec)
            except Exception:       # a namedtuple or class without a serialized name: by its name
                try:
                    spec = _dumps_named(self.spec)
                except Exception as e:
                    why = str(e).split(". ")[0].split("\n")[0]
        if why is not None:
            warnings.warn(f"lumc: {what} is not stored ({why}); the loaded artifact returns one "
                          "value for one output, else a tuple in output order", stacklevel=3)
            return None
        doc = {"spec": spec, "leaves": [[k, v] for k, v in self.leaves]}
        ins = self.inputs.to_json() if self.inputs is not None else None
        return json.dumps({**doc, **(ins or {})}).encode()

    @classmethod
    def from_bytes(cls, path, data: bytes, outputs) -> OutputStructure | None:
        """The stored structure over the plan's ``outputs`` (names). None, with a warning, when
        this process cannot rebuild its types.

        Raises:
            ArtifactError: a malformed part, or one naming outputs the plan does not have.
        """
        try:
            doc = json.loads(data)
            spec_text, leaves = doc["spec"], doc["leaves"]
            if not isinstance(spec_text, str) or not isinstance(leaves, list) or not all(
                    isinstance(x, list) and len(x) == 2 and x[0] in ("output", "const")
                    and isinstance(x[1], _SCALARS) for x in leaves):
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ArtifactError(f"{path}: part {PART!r} is malformed") from None
        names = [v for k, v in leaves if k == "output"]
        if not set(names) <= set(outputs) or any(not isinstance(n, str) for n in names):
            raise ArtifactError(f"{path}: part {PART!r} names outputs the plan does not compute")
        try:
            from torch.utils._pytree import treespec_loads
            spec = _loads_named(spec_text) if _LUMC_TYPE in spec_text else treespec_loads(spec_text)
        except ImportError:
            warnings.warn(f"lumc: {path}: torch is not installed, so the module's output structure "
                          "is not rebuilt; outputs are returned in output order", stacklevel=3)
            return None
        except Exception as e:
            warnings.warn(f"lumc: {path}: the module's output structure is not rebuilt ({e}; "
                          "import the module that defines its output type first); outputs are "
                          "returned in output order", stacklevel=3)
            return None
        if spec.num_leaves != len(leaves):
            raise ArtifactError(f"{path}: part {PART!r} has {len(leaves)} leaves for a structure "
                                f"of {spec.num_leaves}")
        out = cls(spec, [(k, v) for k, v in leaves])
        from lumc.compiler.runtime.in_structure import InputStructure
        out.inputs = InputStructure.from_json(path, doc)
        return out


# ---- types stored by their qualified name ------------------------------------------------------
_LUMC_TYPE = '"lumc:'       # how such a type's name starts in the JSON text


def _qualname(cls, check: bool = False) -> str:
    """``module.QualName``; ``check``: that this very class is found by that name (one defined in
    a function, or replaced since, is not: ValueError)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if check:
        try:
            found = _defined_class(name)
        except LookupError:
            found = None
        if found is not cls:
            raise ValueError(f"{name} cannot be found by its name (define it at a module's top "
                             "level)")
    return name


def _dumps_named(spec) -> str:
    """``treespec_dumps``'s JSON, a namedtuple or a class registered without a serialized name
    written as ``lumc:namedtuple:NAME`` / ``lumc:class:NAME`` (context: its fields)."""
    import collections

    import torch.utils._pytree as pytree

    def node(sp) -> dict:
        if sp.is_leaf():
            return {"type": None, "context": None, "children_spec": []}
        kids = [node(c) for c in sp.children()]
        if sp.type is collections.namedtuple:
            cls = sp._context
            return {"type": "lumc:namedtuple:" + _qualname(cls, check=True),
                    "context": json.dumps(list(cls._fields)), "children_spec": kids}
        entry = pytree.SUPPORTED_SERIALIZED_TYPES.get(sp.type)
        if entry is not None and entry.serialized_type_name == pytree.NO_SERIALIZED_TYPE_NAME_FOUND:
            return {"type": "lumc:class:" + _qualname(sp.type, check=True),
                    "context": json.dumps(sp._context), "children_spec": kids}
        shallow = pytree.TreeSpec(sp.type, sp._context, [pytree.treespec_leaf()] * len(kids))
        doc = json.loads(pytree.treespec_dumps(shallow))[1]
        return dict(doc, children_spec=kids)
    return json.dumps([pytree.DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL, node(spec)])


def _defined_class(name: str):
    """The class ``module.QualName`` of a module this process has imported (read from the
    modules' namespaces, never importing or calling anything); raises LookupError without it."""
    import sys
    for i in range(len(name), 0, -1):
        if i < len(name) and name[i] != ".":
            continue
        mod = sys.modules.get(name[:i])
        if mod is None or i == len(name):
            continue
        obj = mod
        for part in name[i + 1:].split("."):
            obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        if isinstance(obj, type):
            return obj
    raise LookupError(f"{name} is not defined in this process")


def _loads_named(text: str):
    """A spec from :func:`_dumps_named`'s JSON."""
    import collections

    import torch.utils._pytree as pytree

    def node(doc):
        kids = [node(c) for c in doc["children_spec"]]
        t = doc["type"]
        if t is None:
            return pytree.treespec_leaf()
        fields = json.loads(doc["context"]) if str(t).startswith("lumc:") else None
        if str(t).startswith("lumc:namedtuple:"):
            cls = _defined_class(t[len("lumc:namedtuple:"):])
            if getattr(cls, "_fields", None) != tuple(fields) or not issubclass(cls, tuple):
                raise LookupError(f"{_qualname(cls)} is not a namedtuple of fields {fields}")
            return pytree.TreeSpec(collections.namedtuple, cls, kids)
        if str(t).startswith("lumc:class:"):
            cls = _defined_class(t[len("lumc:class:"):])
            if cls not in pytree.SUPPORTED_NODES:
                raise LookupError(f"{_qualname(cls)} is not registered with torch's pytree "
                                  "(torch.export.register_dataclass)")
            return pytree.TreeSpec(cls, fields, kids)
        shallow = dict(doc, children_spec=[{"type": None, "context": None, "children_spec": []}]
                       * len(kids))
        sp = pytree.treespec_loads(json.dumps([pytree.DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL,
                                               shallow]))
        return pytree.TreeSpec(sp.type, sp._context, kids)
    proto, root = json.loads(text)
    return node(root)
