"""How a call's arguments differ from those a torch module was captured with, in the user's words
(``lumc.compile(module)``'s callable refuses another structure in one line naming where)."""
from __future__ import annotations


def call_shape(spec) -> str:
    """``2 positional arguments and keyword arguments scale, bias`` for an ``(args, kwargs)``
    pytree spec."""
    try:
        pos, kw = spec.child(0), spec.child(1)
        n = pos.num_children
        text = f"{n} positional argument{'s' if n != 1 else ''}"
        names = list(kw.context or []) if kw.num_children else []
        return text + (f" and keyword arguments {', '.join(map(str, names))}" if names
                       else " and no keyword arguments")
    except (AttributeError, IndexError, TypeError):
        return " ".join(str(spec).split())


def _children(spec) -> list:
    """A pytree spec's children (``children_specs`` is deprecated in newer PyTorch)."""
    return [spec.child(i) for i in range(spec.num_children)]


def nested_difference(want, got) -> str:
    """Where two ``(args, kwargs)`` pytree specs of the same counts and names first differ:
    ``argument 0['w']: expected a tuple of 2, got a leaf (a tensor or value)``."""
    def describe(spec) -> str:
        if spec.is_leaf():
            return "a leaf (a tensor or value)"
        name = getattr(spec.type, "__name__", str(spec.type))
        if isinstance(spec.context, (list, tuple)) and spec.type is not None and \
                issubclass(spec.type, dict):
            return f"a {name} with keys {', '.join(map(repr, spec.context)) or 'none'}"
        return f"a {name} of {spec.num_children}"

    def walk(a, b, where: str) -> str | None:
        if a.is_leaf() and b.is_leaf():
            return None
        if a.is_leaf() or b.is_leaf() or a.type != b.type or a.context != b.context or \
                a.num_children != b.num_children:
            return f"{where}: expected {describe(a)}, got {describe(b)}"
        keys = a.context if isinstance(a.context, (list, tuple)) and \
            len(a.context) == a.num_children else range(a.num_children)
        for k, ca, cb in zip(keys, _children(a), _children(b)):
            found = walk(ca, cb, f"{where}[{k!r}]")
            if found:
                return found
        return None
    try:
        for k, (a, b) in enumerate(zip(_children(want.child(0)), _children(got.child(0)))):
            found = walk(a, b, f"argument {k}")
            if found:
                return found
        kw = want.child(1).context or []
        for k, a, b in zip(kw, _children(want.child(1)), _children(got.child(1))):
            found = walk(a, b, f"keyword argument {k!r}")
            if found:
                return found
    except (AttributeError, IndexError, TypeError):
        pass
    return f"expected {' '.join(str(want).split())}, got {' '.join(str(got).split())}"
