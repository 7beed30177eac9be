"""A size range over an ONNX model that indexes a flattened ``[B, L]`` tensor at row offsets
``arange(B) * L + arange(L)`` (transformers 5's padding-mask lookup, exported with a fixed batch):
``arange(B) * L`` folded at import to ``[0, 61]`` at the probe ``L = 61``, an array no re-size
reads as the size it holds, and the range was refused ("Constant: [0, 61] vs [0, 59]"). Such an
array stays the computation (``symbolic.held_values``), at import and in the e-graph's folding."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import lumc


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))


class RowLookup(nn.Module):
    def forward(self, x, am):
        b, n = am.shape
        idx = torch.arange(b)[:, None] * n + torch.arange(n)[None, :]
        return x * am.reshape(-1)[idx][..., None]


def test_row_offsets_of_a_flattened_tensor_over_a_range(tmp_path):
    path = str(tmp_path / "rows.onnx")
    torch.onnx.export(RowLookup().eval(), (torch.randn(2, 16, 4), torch.rand(2, 16)), path,
                      input_names=["x", "am"], output_names=["y"],
                      dynamic_axes={"x": {1: "L"}, "am": {1: "L"}}, dynamo=False)
    f = lumc.compile(path, budget="20s", device="sim:h200", shapes={"L": (2, 64)})
    rng = np.random.default_rng(0)
    for n in (2, 3, 28, 33, 63, 64):
        x = rng.standard_normal((2, n, 4)).astype(np.float32)
        am = rng.random((2, n)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, am)), x * am[..., None], rtol=1e-6)


def test_row_offsets_with_a_ranged_batch_too(tmp_path):
    """With the batch ranged too (1..3, probed above its range at 1009), ``arange(B) * L`` has a
    probed shape and was kept, but over a view of the ``Shape`` array ``[1009, 61]`` read at its
    element 1: an array that does not re-size ("Constant: [1009, 61] vs [1013, 59]")."""
    path = str(tmp_path / "rows.onnx")
    torch.onnx.export(RowLookup().eval(), (torch.randn(2, 16, 4), torch.rand(2, 16)), path,
                      input_names=["x", "am"], output_names=["y"],
                      dynamic_axes={"x": {0: "B", 1: "L"}, "am": {0: "B", 1: "L"}}, dynamo=False)
    f = lumc.compile(path, budget="20s", device="sim:h200", shapes={"B": (1, 3), "L": (2, 64)})
    rng = np.random.default_rng(0)
    for b, n in ((1, 2), (3, 64), (2, 33), (3, 5), (1, 63)):
        x = rng.standard_normal((b, n, 4)).astype(np.float32)
        am = rng.random((b, n)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, am)), x * am[..., None], rtol=1e-6)
