"""Defects a new user found from the outside (trial 5), one test each."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.usefixtures("cache_dir")   # a private LUMC_CACHE_DIR per test


def _python(*args: str) -> subprocess.CompletedProcess:
    def pre():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=pre, env=os.environ.copy())


def test_python_dash_m_lumc_is_the_cli(tmp_path):
    """``python -m lumc`` failed: "No module named lumc.__main__" (status 1)."""
    res = _python("-m", "lumc", "--help")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("Usage: lumc ") and "compile" in res.stdout
    res = _python("-m", "lumc", "run", str(tmp_path / "missing.lumc"))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [f"lumc: error: {tmp_path / 'missing.lumc'}: no such file"]


# a signal while ``python -m lumc`` imports the CLI: one line, status 2, as the console script
_DURING_IMPORT = textwrap.dedent("""
    import importlib.abc, os, runpy, signal, sys
    SIG = getattr(signal, sys.argv[1])
    class Hit(importlib.abc.MetaPathFinder):
        fired = False
        def find_spec(self, name, path=None, target=None):
            if name in ("click", "numpy") and not Hit.fired:
                Hit.fired = True
                os.kill(os.getpid(), SIG)
            return None
    sys.meta_path.insert(0, Hit())
    sys.argv[1:] = ["cache", "info"]
    runpy.run_module("lumc", run_name="__main__", alter_sys=True)
""")


@pytest.mark.parametrize("sig,what", [("SIGINT", "interrupted (Ctrl-C)"),
                                      ("SIGTERM", "terminated (SIGTERM)")])
def test_a_signal_while_python_dash_m_lumc_starts_is_one_line(sig, what, cache_dir):
    res = _python("-c", _DURING_IMPORT, sig)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.splitlines() == [f"lumc: error: {what} while starting; nothing was done"]
    assert not cache_dir.exists()
