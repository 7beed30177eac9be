"""Walks the primitive-op table and fails where any op lacks a column."""
import dataclasses

import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.ir.graph import input_node, node
from lumc.ir.ops import OPS, OpDef

COLUMNS = [f.name for f in dataclasses.fields(OpDef)]
DESIGN_OPS = {"Input", "Constant", "Iota", "Exp2", "Log2", "Sin", "Sqrt", "Recip", "Cast", "Add",
              "Mul", "Div", "Mod", "LessThan", "Where", "SumReduce", "MaxReduce", "Gather", "View",
              "Contiguous"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_column_present(name):
    row = OPS[name]
    for col in COLUMNS:
        val = getattr(row, col)
        assert val is not None and val != "", f"{name} lacks column {col}"
        if col in ("dtype_rule", "shape_rule", "reference", "flops"):
            assert callable(val), f"{name}.{col} is not callable"
    assert row.name == name
    assert row.group in {"leaf", "unary", "binary", "ternary", "reduce", "gather", "movement"}


def test_table_is_the_design_set():
    assert set(OPS) == DESIGN_OPS


def test_egglog_constructors_unique():
    names = [r.egglog for r in OPS.values()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", sorted(n for n, r in OPS.items() if r.group in ("unary", "binary")))
def test_reference_and_flops_run(name):
    row = OPS[name]
    x = input_node("x", (2, 3), dt.f32)
    arg = dt.f16 if name == "Cast" else None
    srcs = (x,) * row.arity
    n = node(name, srcs, arg)
    a = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    out = row.reference([a] * row.arity, arg)
    assert out.shape == n.shape
    assert out.dtype == n.dtype.np
    assert row.flops(tuple(s.shape for s in srcs), n.shape, arg) in (0, 6)
