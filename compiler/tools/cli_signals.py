"""SIGINT and SIGTERM in the ``lumc`` console script, before and while :func:`cli.main
<lumc.compiler.tools.cli.main>` runs (its handler, ``_first_interrupt``, turns them into one error
line after cleanup). Light on purpose: imported before everything else the CLI imports."""
from __future__ import annotations

import os
import signal
import sys
import threading


def stop_while_starting(signum, frame):
    """SIGINT or SIGTERM while the console script imports lumc (two seconds, more on a loaded
    machine), before ``main`` installs its handler: nothing is open or written yet, so one line
    and status 2 at once. (A Ctrl-C there printed the KeyboardInterrupt traceback of whatever
    import it hit; a SIGTERM killed the process, status -15, no line.)"""
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted (Ctrl-C)"
    os.write(2, f"lumc: error: {what} while starting; nothing was done\n".encode())
    os._exit(2)


def handle_signals(handler) -> None:
    """``handler`` for SIGINT and SIGTERM on the main thread, but for a signal the parent set to be
    ignored (a shell's background job ignores Ctrl-C at the terminal; nohup): that one stays
    ignored, as Python leaves it."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, handler)


def launched_as_lumc() -> bool:
    """Whether this process is the ``lumc`` console script (its ``argv[0]`` is the launcher), not
    a program or test that imports the CLI and keeps its own handlers."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return os.path.splitext(name)[0] in ("lumc", "lumc-script")


def handle_signals_while_starting(run_as_main: bool = False) -> None:
    """In the console script (or the CLI module run as ``__main__``), :func:`stop_while_starting`
    until ``main`` takes over."""
    if run_as_main or launched_as_lumc():
        handle_signals(stop_while_starting)
