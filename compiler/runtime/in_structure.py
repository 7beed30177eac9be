"""A torch module's call interface, kept beside its output structure and stored in its artifact.

``lumc.compile(module, example_inputs=(x, {"a": a, "b": b}, 2.5))`` captures the module's
arguments as a pytree: nested dicts, lists and tuples of tensors, keyword arguments, and non-tensor
arguments that ``torch.export`` traced as constants. The plan takes the flat tensor inputs
(``x``, ``d_a``, ``d_b``). :class:`InputStructure` maps a call in the module's own form to those
inputs, so the callable a size-range compile returns, and ``lumc.load`` of the artifact of any
torch module, take ``f(x, {"a": a, "b": b}, 2.5)`` as the module does; the flat inputs, by
position or name, are still taken too. It is stored in the part ``structure.json`` beside the
output structure (``lumc.compiler.runtime.out_structure``), the spec as JSON, never unpickled.
"""
from __future__ import annotations

from lumc.ir.errors import ArtifactError, InputError

_SCALARS = (type(None), bool, int, float, str)


def same_constant(a, b) -> bool:
    """Whether a call's non-tensor argument is the value the graph was traced with: of the same
    type and the same value, so ``2.0`` is not ``2`` (an int tensor times 2.0 is a float tensor),
    ``True`` is not ``1``, ``-0.0`` is not ``0.0`` and NaN is NaN."""
    return type(a) is type(b) and repr(a) == repr(b)


class InputStructure:
    """``spec``: the torch pytree spec of the module's ``(args, kwargs)``; ``leaves``: per leaf in
    flatten order, ``(name, "input", None)`` (a tensor input of the plan, or one it does not
    read) or ``(name, "const", value)`` (a non-tensor argument, traced as that value)."""

    def __init__(self, spec, leaves: list[tuple[str, object]]):
        self.spec = spec
        self.leaves = list(leaves)

    @classmethod
    def of_capture(cls, in_spec, slots) -> InputStructure | None:
        """From a capture's ``in_spec`` and its flat input slots (``name``, ``dims``: None for a
        non-tensor argument, ``value``). None for a flat capture (no spec)."""
        if in_spec is None or in_spec.num_leaves != len(slots):
            return None
        return cls(in_spec, [(s.name, "const", s.value) if s.dims is None
                             else (s.name, "input", None) for s in slots])

    def named(self, args, kwargs, inputs) -> dict | None:
        """``{input name: value}`` of a call in the module's own form (its nesting, keyword
        arguments in any order), for the plan's ``inputs`` (names); None for a call of another
        form (the flat inputs by position or name, which the caller binds as before).

        Raises:
            InputError: a non-tensor argument other than the value it was traced as.
        """
        import torch.utils._pytree as pytree
        if self.spec.num_children == 2 and kwargs:
            kw_spec = self.spec.child(1)      # keywords in the captured order
            if kw_spec.type is dict and set(kw_spec.context or ()) == set(kwargs):
                kwargs = {k: kwargs[k] for k in kw_spec.context}
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self.spec:
            return None
        out = {}
        for (name, kind, v), leaf in zip(self.leaves, leaves):
            if kind == "input":
                if name in inputs:
                    out[name] = leaf
            elif not same_constant(leaf, v):
                raise InputError(f"input {name!r} was traced as the constant {v!r}; got "
                                 f"{leaf!r} (compile again for another value)", node=name)
        return out

    # ---- the artifact part ------------------------------------------------------------------------
    def to_json(self) -> dict | None:
        """``{"in_spec": JSON text, "in_leaves": [...]}`` for ``structure.json``; None where a
        constant is no JSON scalar or the spec has a type that cannot be written (the artifact
        then takes the flat inputs only)."""
        if any(k == "const" and not isinstance(v, _SCALARS) for _, k, v in self.leaves):
            return None
        try:
            from torch.utils._pytree import treespec_dumps
            text = treespec_dumps(self.spec)
        except Exception:
            return None
        return {"in_spec": text, "in_leaves": [list(x) for x in self.leaves]}

    @classmethod
    def from_json(cls, path, doc: dict) -> InputStructure | None:
        """The structure :meth:`to_json` wrote (None where ``doc`` has none, or torch is missing).

        Raises:
            ArtifactError: a malformed entry.
        """
        if "in_spec" not in doc:
            return None
        text, leaves = doc.get("in_spec"), doc.get("in_leaves")
        if not isinstance(text, str) or not isinstance(leaves, list) or not all(
                isinstance(x, list) and len(x) == 3 and isinstance(x[0], str)
                and x[1] in ("input", "const") and isinstance(x[2], _SCALARS) for x in leaves):
            raise ArtifactError(f"{path}: part 'structure.json' has a malformed input structure")
        try:
            from torch.utils._pytree import treespec_loads
        except ImportError:
            return None
        try:
            spec = treespec_loads(text)
        except Exception:
            raise ArtifactError(f"{path}: part 'structure.json' has a malformed input "
                                "structure") from None
        if spec.num_leaves != len(leaves):
            raise ArtifactError(f"{path}: part 'structure.json' has {len(leaves)} input leaves "
                                f"for a structure of {spec.num_leaves}")
        return cls(spec, [tuple(x) for x in leaves])


def module_call(structure, inputs, args, kwargs) -> tuple[tuple, dict]:
    """A call's ``(args, kwargs)``: one in the torch module's own form (``structure``: an
    :class:`~lumc.compiler.runtime.out_structure.OutputStructure` whose ``inputs`` is set) as
    ``((), {input name: value})`` for the plan's ``inputs`` (names); any other as given.

    Raises:
        InputError: as :meth:`InputStructure.named`.
    """
    ins = getattr(structure, "inputs", None)
    named = ins.named(args, kwargs, inputs) if ins is not None else None
    return (tuple(args), dict(kwargs)) if named is None else ((), named)
