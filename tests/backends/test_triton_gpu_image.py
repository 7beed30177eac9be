"""The GPU image's Triton, installed beside the one here: it compiles every kernel form.

The GPU machine runs Triton 3.6 (with Python 3.12 and torch 2.11) and nothing else; the
development install takes a newer Triton. A kernel using API that 3.6 lacks compiled here and
would fail there: the fp32 mlp kernel's ``tl.static_assert(tl.cdiv(N, BLOCK_N) <= 8)``, which 3.6
does not fold at compile time ("Assertion condition could not be determined at compile-time").
``make install`` puts Triton 3.6 in ``.venv/triton-gpu-image`` (``pip install --no-deps
--target``) and ``compile_many(triton_dir=...)`` compiles in a child process that imports it:
``test_triton_aot.py`` compiles every form at its default and largest config with it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lumc.backends.triton import configs, render
from lumc.backends.triton.aot import compile_many
from triton_cases import every_form_kernels, make_kernel
from lumc.ir import dtypes as dt

GPU_IMAGE_TRITON = "3.6.0"       # the GPU machine's Triton (the project brief; gpu_check.sh)
DIR = Path(__file__).resolve().parents[2] / ".venv" / "triton-gpu-image"


def gpu_image_triton(required: bool = True) -> Path | None:
    """The folder holding the GPU image's Triton. Missing: a failure under CI (which ran
    ``make install``: a check must not pass by skipping), else a skip, or ``None`` where not
    ``required`` (the caller then compiles with the Triton here)."""
    if (DIR / "triton" / "__init__.py").is_file():
        return DIR
    why = f"no Triton {GPU_IMAGE_TRITON} in {DIR} (make install puts it there)"
    if os.environ.get("CI"):
        pytest.fail(why)
    if required:
        pytest.skip(why)
    return None


def test_a_folder_without_triton_is_refused(tmp_path):
    k = make_kernel("pointwise", lambda a: a.sigmoid(), [((64,), dt.f32)])
    rk = render(k)
    with pytest.raises(FileNotFoundError, match="no triton package"):
        compile_many([(rk, configs.default_config(rk.config_space, rk.problem))],
                      triton_dir=str(tmp_path))


def test_its_interpreter_runs_a_kernel_with_a_computed_loop_bound():
    """Causal attention's key loop stops at a bound the kernel computes (``range(0, n_end, ..)``):
    Triton 3.6's interpreter read that one-element tensor with ``int()``, which numpy 2 refuses
    (``interpreter_index``). Run in a child that imports that Triton, as on a machine with it."""
    d = gpu_image_triton()
    here = Path(__file__).resolve().parent
    code = ("import triton; assert triton.__version__ == %r, triton.__version__\n"
            "from lumc.ir import dtypes as dt\n"
            "from triton_cases import attention, check, make_kernel\n"
            "k = make_kernel('attention', attention(0.25, causal=True), [((1, 2, 48, 16), dt.f32)]"
            " * 3)\n"
            "check(k, config=None)\nprint('ok')\n") % GPU_IMAGE_TRITON
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(d), str(here)]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
