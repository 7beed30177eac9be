"""Defects found using lumc's state between runs and the tools around it (plan cache, artifacts,
run, bench, size ranges), one test each. Models are built here; compiles are few and small."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from hostile import lumc_cli, one_line_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


@pytest.mark.parametrize("shape,given", [("n=1..8", "n=1..8"), ("n=2,4", "n=2,4"),
                                         ("x=2x3,4x3", "x=2x3,4x3"), ("x=1..3", "x=1..3")])
def test_run_of_a_model_with_several_sizes_is_one_line(tiny_path, shape, given):
    # a range reached len() of a DimRange (TypeError traceback, exit 1); a list said "got 2x4"
    res = lumc_cli("run", tiny_path, "--random", "--shape", shape)
    one_line_error(res, f"--shape {given}", "one size", "lumc compile")
