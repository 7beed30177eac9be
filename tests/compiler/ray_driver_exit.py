"""pytest plugin for the Ray driver tests' child process (``test_workers_ray.test_in_a_driver_process``):
once the session is over and reported, the process ends with ``os._exit`` and the session's status.

A Ray driver's gRPC and log threads can deadlock the interpreter's exit (ray-project/ray#29431,
#44836); the cluster belongs to the parent's fixture, so nothing of the child needs its atexit.
"""
from __future__ import annotations

import os
import sys

_status = {"code": 1}


def pytest_sessionfinish(session, exitstatus):
    _status["code"] = int(exitstatus)


def pytest_unconfigure(config):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_status["code"])
