"""The budget of ``torch.compile(..., backend="lumc")`` is one deadline for the first call's
whole compile: a range compile that fails late leaves its fallback only what is left (each had a
budget and a grace of its own: a 10 s budget's first call took 39.5 s)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from lumc.compiler.core import pipeline
from lumc.compiler.core import torch_backend as tb
from lumc.compiler.core.budget import grace_seconds, parse_duration
from lumc.ir.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    tb.counters.clear()
    yield
    torch._dynamo.reset()


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(self.lin(x), -1) * x


def test_a_late_range_failure_leaves_its_fallback_only_the_rest(monkeypatch):
    spent = 3.0

    def late_failure(self, ranges, deadline=None):     # a bucket's check failing at its end
        time.sleep(spent)
        raise InputError("a bucket failed its numerics check (test)")
    monkeypatch.setattr(tb.DynamoGraph, "_compile_range", late_failure)
    got = {}
    real = pipeline.compile_graph

    def spy(*args, **kwargs):
        dl = kwargs.get("deadline")
        got["left"] = dl.remaining() if dl is not None else parse_duration(kwargs["budget"])
        return real(*args, **kwargs)
    monkeypatch.setattr(pipeline, "compile_graph", spy)
    torch.manual_seed(0)
    m = Small().eval()
    h = torch.compile(m, backend="lumc", dynamic=True, options={"budget": "6s"})
    x = torch.randn(5, 8)
    t0 = time.monotonic()
    with torch.no_grad():
        y = h(x)
        torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-5)
    took = time.monotonic() - t0
    assert tb.counters["per_shape_fallbacks"] == 1
    assert got["left"] <= 6.0 - spent          # the fallback's compile got what was left
    # the whole first call within the budget and one grace (Dynamo's own capture aside, ~2 s)
    assert took < 6.0 + grace_seconds(6.0) + 5.0, took
