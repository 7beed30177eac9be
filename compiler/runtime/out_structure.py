"""A torch module's output structure, kept with its compiled plan and stored in its artifact.

``lumc.compile(module, ...)`` returns what the module returns (a dict, nested tuples, a list, a
constant ``3`` or ``None`` beside the tensors); the plan itself computes a flat set of named
outputs. :class:`OutputStructure` maps one to the other: the pytree spec of the module's outputs
and, per leaf, the plan output it is or the constant it was traced as. An artifact saved from such
a callable stores it as the part ``structure.json`` (the spec through
``torch.utils._pytree.treespec_dumps``: JSON, never unpickled; constants only as JSON scalars), so
``lumc.load`` returns the same structure as the callable it was saved from.

A structure the JSON form cannot hold (a namedtuple or a class torch's pytree registered without a
serialized type name, a non-scalar constant leaf) is not stored: the saved artifact returns one
value for one output, else a tuple in output order, and ``save`` warns once saying so. A stored
structure whose type this process has not registered (a transformers ``ModelOutput`` before
``import transformers``) loads flat with a warning naming what to import.
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
            except Exception as e:       # a namedtuple or class without a serialized name
                why = str(e).split(". ")[0].split("\n")[0]
        if why is not None:
            warnings.warn(f"lumc: {what} is not stored ({why}); the loaded artifact returns one "
                          "value for one output, else a tuple in output order", stacklevel=3)
            return None
        return json.dumps({"spec": spec, "leaves": [[k, v] for k, v in self.leaves]}).encode()

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
            spec = treespec_loads(spec_text)
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
        return cls(spec, [(k, v) for k, v in leaves])
