"""Whether a graph imported at a size range's probe sizes re-sizes to the model imported at
another size (``lumc.compiler.core.buckets``): node for node, or by value on drawn inputs where an
import away from the probes folds what the probed one holds (a position table)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from lumc.backends.reference import ReferenceExecutor, TooLargeError, refuse_too_large
from lumc.ir.errors import InputError, ShapeError
from lumc.ir.provenance import origin
from lumc.ir.symbolic import NotSymbolic, Resizer, same_graph


def values_differ(fe_p, probe, at, table, fe, ranges) -> str | None:
    """None when the probed graph re-sized to ``at`` (units of each dim's step) computes what
    ``fe``, the model imported there, computes (the same outputs on the same drawn inputs), else
    the difference in words."""
    from lumc.compiler.core.errors import max_rel_error
    from lumc.compiler.core.pipeline import example_inputs_for
    where = ", ".join(f"{k}={ranges[k].step * at[k]}" for k in ranges)
    try:
        g = Resizer({probe[k]: at[k] for k in ranges}, table).graph(fe_p.graph)
        if [n.shape for n in g.inputs.values()] != [n.shape for n in fe.graph.inputs.values()]:
            return f"at {where} the inputs re-size to other shapes"
        refuse_too_large(fe.graph, where)
        ins = example_inputs_for(fe.graph, fe)
        want = ReferenceExecutor(fe.graph)(ins)
        got = ReferenceExecutor(g)(ins)
    except TooLargeError:
        raise
    except (InputError, ShapeError, NotSymbolic, IndexError) as e:
        return f"at {where}: {e}"
    for k, ref in want.items():
        y = got[k]
        if y.shape != ref.shape:
            return f"at {where} output {k!r} re-sizes to {list(y.shape)}, not {list(ref.shape)}"
        if fe.graph.outputs[k].dtype.is_float:
            err = max_rel_error(y, ref)
            if not err <= 1e-4:
                return f"at {where} output {k!r} differs (max rel error {err:.3g})"
        elif not np.array_equal(y, ref):
            return f"at {where} output {k!r} differs"
    return None


def resizes_to(fe_p, sub: dict, table: dict, fe) -> str | None:
    """None when the probed graph re-sized to ``sub`` (with ``table``) is ``fe``'s graph, node for
    node, else the first difference in words."""
    try:
        return same_graph(Resizer(sub, table).graph(fe_p.graph), fe.graph)
    except (NotSymbolic, ShapeError) as e:     # a value that does not re-size, or a bad shape
        return str(e)


def grows_with_size(fe_p, probe, fe_c, check, ranges) -> str | None:
    """None when the graphs imported at the ``probe`` and ``check`` sizes (units of each dim's
    step) hold as many primitive nodes, else the difference in words, naming the model node whose
    lowering grew (a recurrence unrolled over the size: an LSTM over a ranged sequence). No size
    substitution re-sizes one such graph to the other, at any probe."""
    a, b = fe_p.graph.nodes(), fe_c.graph.nodes()
    if len(a) == len(b):
        return None
    at_p = ", ".join(f"{k}={ranges[k].step * probe[k]}" for k in ranges)
    at_c = ", ".join(f"{k}={ranges[k].step * check[k]}" for k in ranges)
    na, nb = Counter(map(origin, a)), Counter(map(origin, b))
    grown = sorted((k for k in na.keys() | nb.keys() if k is not None and na[k] != nb[k]),
                   key=lambda k: -abs(na[k] - nb[k]))
    if not grown:
        return f"{len(a)} primitive ops at {at_p}, {len(b)} at {at_c}"
    name, op = grown[0]
    return (f"node {name!r}, op {op} lowers to {na[grown[0]]} primitive ops at {at_p}, "
            f"{nb[grown[0]]} at {at_c}: it unrolls over the size")
