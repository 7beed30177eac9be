"""``lumc run`` on artifacts saved from ``lumc.compile(torch_module)``: ``--check`` compares with
the float64 evaluation of the artifact's graph (there is no ONNX model for onnxruntime; it was
refused in one line), the outputs written with ``-o`` are the module's (against PyTorch eager),
and a size left unset names the input once with a hint that shows the input's shape."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import lumc
from lumc.ir.errors import InputError, ShapeError

from hostile import lumc_cli, one_line_error

pytestmark = [pytest.mark.usefixtures("cache_dir"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(self.norm(x))
        return {"h": nn.functional.gelu(h), "gate": torch.sigmoid(h) * x}


@pytest.fixture
def block():
    torch.manual_seed(3)
    return Block().eval()


def test_check_on_a_torch_artifact_compares_with_its_graph(block, tmp_path):
    x = torch.randn(2, 5, 8)
    f = lumc.compile(block, budget="20s", example_inputs=(x,), device="sim:h200")
    f.save(tmp_path / "b.lumc")
    xs = torch.randn(2, 5, 8)
    np.save(tmp_path / "x.npy", xs.numpy())
    res = lumc_cli("run", tmp_path / "b.lumc", "--input", f"x={tmp_path / 'x.npy'}", "--check",
                   "-o", tmp_path / "out.npz")
    assert res.exit_code == 0, res.output
    assert "check: all 2 outputs match lumc's float64 evaluation of the artifact's graph" \
        in res.output, res.output
    assert "at compile the lowering matched PyTorch eager" in res.output, res.output
    out = np.load(tmp_path / "out.npz")
    with torch.no_grad():
        want = block(xs)
    for name, key in (("h", "h"), ("gate", "gate")):
        np.testing.assert_allclose(out[name], want[key].numpy(), rtol=1e-4, atol=1e-5)


def test_check_on_a_torch_range_artifact_at_a_size_of_its_range(block, tmp_path):
    x = torch.randn(2, 5, 8)
    f = lumc.compile(block, budget="20s", example_inputs=(x,), device="sim:h200",
                     dynamic_shapes=({1: Dim("seq", max=16)},))
    f.save(tmp_path / "r.lumc")
    res = lumc_cli("run", tmp_path / "r.lumc", "--random", "--shape", "seq=7", "--check")
    assert res.exit_code == 0, res.output
    assert "x [2, 7, 8] float32 (random)" in res.output and "check: all 2 outputs match" \
        in res.output, res.output
    # no size: one line naming the input once, and a hint that cannot be misread
    line = one_line_error(lumc_cli("run", tmp_path / "r.lumc", "--random"),
                          "input 'x' has shape [2, seq, 8] with dynamic dims seq unset "
                          "(compiled for seq in 0..16); give --shape seq=<size> (or the whole "
                          "input: --shape x=2x<seq>x8)")
    assert "node 'x'" not in line, line


def test_an_error_names_its_node_once():
    assert str(InputError("input 'x' has dtype int64", node="x")) == "input 'x' has dtype int64"
    assert str(InputError("has dtype int64", node="x")) == "node 'x': has dtype int64"
    assert str(ShapeError("input 'x' is rank 2", node="x", op="Conv")) == \
        "op Conv: input 'x' is rank 2"
    # another node's name in the reason keeps the prefix
    assert str(InputError("reads 'y'", node="x")) == "node 'x': reads 'y'"


@pytest.mark.parametrize("how", ["torch.save", "torch.export.save", "torch.jit.save"])
def test_a_pytorch_file_is_named_as_one(tmp_path, how):
    """``lumc compile model.pt`` said 'model.pt is a compiled .lumc artifact, not an ONNX model'
    (a torch.save file is a zip archive too), and run/inspect 'damaged .lumc artifact'. Each says
    what the file is and how lumc takes a module."""
    m = nn.Linear(4, 2).eval()
    path = tmp_path / "model.pt"
    if how == "torch.save":
        torch.save(m, path)
    elif how == "torch.export.save":
        torch.export.save(torch.export.export(m, (torch.randn(1, 4),)), path)
    else:
        torch.jit.save(torch.jit.script(m), path)
    hint = "lumc.compile(module, example_inputs=...)"
    one_line_error(lumc_cli("compile", path, "--budget", "5s"),
                   f"model.pt is a PyTorch file ({how}), not an ONNX model", hint)
    for cmd in ("run", "inspect"):
        one_line_error(lumc_cli(cmd, path, *(["--random"] if cmd == "run" else [])),
                       f"model.pt: a PyTorch file ({how}), not a .lumc artifact or an ONNX model",
                       hint)
    with pytest.raises(lumc.ModelError, match=rf"is a PyTorch file \({how}\), not an ONNX model"):
        lumc.compile(str(path), budget="5s")
    assert not (tmp_path / "model.lumc").exists()
