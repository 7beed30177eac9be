"""Ctrl-C and SIGTERM while the ``lumc`` console script starts: importing lumc takes two seconds
(more on a loaded machine) before ``main`` installs its handler. A Ctrl-C there printed the
KeyboardInterrupt traceback of whatever import it hit, a SIGTERM killed the process (status -15, no
line); now one line and status 2. And a signal the parent set to be ignored (a shell's background
job ignores Ctrl-C at the terminal) stays ignored, as Python leaves it: ``main`` replaced it, so a
Ctrl-C meant for the foreground job stopped a background compile."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

# the child: argv[0] is the console script's launcher; a signal arrives while the CLI imports
_DURING_IMPORT = textwrap.dedent("""
    import importlib.abc, os, signal, sys
    sys.argv[0] = os.path.join(os.path.dirname(sys.executable), "lumc")
    SIG = getattr(signal, sys.argv[1])
    class Hit(importlib.abc.MetaPathFinder):
        fired = False
        def find_spec(self, name, path=None, target=None):
            if name in ("click", "numpy") and not Hit.fired:
                Hit.fired = True
                os.kill(os.getpid(), SIG)
            return None
    sys.meta_path.insert(0, Hit())
    from lumc.compiler.tools.cli import main
    print("imported")
    main(["cache", "info"])
""")


def _child(code: str, *args: str, ignore_sigint: bool = False) -> subprocess.CompletedProcess:
    def pre():
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, preexec_fn=pre, env=os.environ.copy())


@pytest.mark.parametrize("sig,what", [("SIGINT", "interrupted (Ctrl-C)"),
                                      ("SIGTERM", "terminated (SIGTERM)")])
def test_a_signal_while_the_cli_imports_is_one_line(sig, what, cache_dir):
    res = _child(_DURING_IMPORT, sig)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.strip().splitlines() == [f"lumc: error: {what} while starting; nothing was "
                                               "done"], res.stderr[-2000:]
    assert "imported" not in res.stdout and not cache_dir.exists()


def test_an_ignored_sigint_stays_ignored(cache_dir):
    code = textwrap.dedent("""
        import os, signal, sys, time
        sys.argv[0] = os.path.join(os.path.dirname(sys.executable), "lumc")
        import lumc.compiler.tools.cli as c
        def fake_main(*a, **k):
            os.kill(os.getpid(), signal.SIGINT)      # a Ctrl-C at the terminal, for another job
            time.sleep(0.2)
            print("survived", signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                  signal.getsignal(signal.SIGTERM) is c._first_interrupt)
        c.cli.main = fake_main
        c.main([])
    """)
    res = _child(code, ignore_sigint=True)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert res.stdout.split() == ["survived", "True", "True"], res.stdout


def test_a_program_importing_the_cli_keeps_its_handlers():
    code = textwrap.dedent("""
        import signal
        import lumc.compiler.tools.cli
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,
              signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """)
    res = _child(code)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["True", "True"]
