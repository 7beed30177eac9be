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
