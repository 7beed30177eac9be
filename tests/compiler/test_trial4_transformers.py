"""Breadth checks from transformers architectures (small random configs): what they found."""
from __future__ import annotations

import pytest
import torch

import lumc
from lumc.ir.errors import ModelError


class _DataDependentBranch(torch.nn.Module):
    """A branch on a tensor's value (EnCodec's padding arithmetic, Longformer's, Llama's dynamic
    RoPE): torch.export fails with GuardOnDataDependentSymNode."""

    def forward(self, x):
        if (x > 0).sum() == 1:
            return x * 2
        return x + 1


def test_a_failed_export_prints_no_partial_fx_graph(capfd):
    """torch.export prints the partial FX graph of a failed trace to stderr (torch 2.x
    ``_trace.py``: ``print(e.partial_fx_graph, file=sys.stderr)``); only stdout was held back,
    so an EnCodec encoder's refusal came with two dumps of its whole graph (45 lines) before
    the one-line error."""
    capfd.readouterr()
    with pytest.raises(ModelError, match="torch.export failed"):
        lumc.compile(_DataDependentBranch().eval(), budget="20s", example_inputs=(torch.randn(8),),
                     device="sim:h200")
    out, err = capfd.readouterr()
    assert "def forward" not in out and "def forward" not in err, (out[-2000:], err[-2000:])
