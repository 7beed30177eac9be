"""Trial 4: the README's and docs' claims, checked as a user would use them (one test per defect
found; each builds its own small model).
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import lumc

pytestmark = pytest.mark.usefixtures("cache_dir")


# ------------------------------------------- 1: lumc.LumcNumericsWarning, named by the README


def test_the_numerics_warning_the_readme_names_is_public_and_filterable():
    # README: "a mismatch warns (`LumcNumericsWarning`)"; a user filters it by that name
    assert issubclass(lumc.LumcNumericsWarning, UserWarning)
    assert "LumcNumericsWarning" in lumc.__all__
    from lumc.compiler.core.eager_check import LumcNumericsWarning
    assert LumcNumericsWarning is lumc.LumcNumericsWarning   # the one eager_check raises
    with warnings.catch_warnings():
        warnings.simplefilter("error", lumc.LumcNumericsWarning)
        with pytest.raises(lumc.LumcNumericsWarning):
            warnings.warn("x", LumcNumericsWarning)


# ------------------------------- 2: a module whose class has no source file (python -c, stdin)


_NO_SOURCE = """
import torch, lumc
class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2
x = torch.randn(2, 3)
g = lumc.compile(Double(), budget="10s", example_inputs=(x,))
assert torch.equal(g(x), x * 2)
print("ok")
"""


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_module_defined_in_python_c_or_stdin_compiles(how, cache_dir):
    # its class has no source file: inspect.getsourcefile raised OSError (torch patches getfile)
    # from the stored-plan key, a traceback out of lumc.compile
    env = dict(os.environ, LUMC_CACHE_DIR=str(cache_dir))
    args = [sys.executable, "-c", _NO_SOURCE] if how == "-c" else [sys.executable, "-"]
    r = subprocess.run(args, input=None if how == "-c" else _NO_SOURCE, capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("ok")


# ----------------------------------- 3: the CI example's baseline and the figures its README gives


def test_the_ci_readme_states_what_its_committed_baseline_records():
    # examples/ci/README.md said the baseline held 18 kernels and 122.5 us; the file held 132.48 us
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "examples" / "ci"
    base = json.loads((root / "baselines" / "minilm-l3-sim-h200.json").read_text())
    text = " ".join((root / "README.md").read_text().split())
    m = re.search(r"`baselines/minilm-l3-sim-h200\.json` was written .*? \((\d+) kernels, "
                  r"([\d.]+) us", text)
    assert m, "the README no longer states the baseline's figures"
    assert int(m.group(1)) == base["end_to_end"]["kernel_count"] == len(base["kernels"])
    assert float(m.group(2)) == pytest.approx(base["end_to_end"]["time_s"] * 1e6, abs=0.05)


# ------------------------------------ 4: lumc run --random's integers, as its help text states


def test_run_random_draws_an_index_within_its_table_as_the_help_says(tmp_path, cache_dir):
    # `lumc run --help` and the README said "integers uniformly from [0, 8)"; an index of a
    # 100-row table is drawn from [0, 100) (and one of a 4-row table from [0, 4)), as compile's
    from onnx import TensorProto, helper, numpy_helper
    import onnx
    from click.testing import CliRunner
    from lumc.compiler.tools.cli import cli
    tab = numpy_helper.from_array(np.arange(300, dtype=np.float32).reshape(100, 3), "tab")
    g = helper.make_graph([helper.make_node("Gather", ["tab", "i"], ["y"], axis=0)], "g",
                          [helper.make_tensor_value_info("i", TensorProto.INT64, [64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 3])], [tab])
    model = tmp_path / "g.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    out = tmp_path / "y.npz"
    r = CliRunner().invoke(cli, ["run", str(model), "--random", "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = np.load(out)["y"][:, 0] / 3
    assert rows.min() >= 0 and rows.max() < 100 and rows.max() >= 8   # not [0, 8)
    help_text = " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())
    assert "integers uniformly from the range of the table they index" in help_text
