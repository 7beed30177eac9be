"""SIGINT and SIGTERM in the ``lumc`` console script, before and while :func:`cli.main
<lumc.compiler.tools.cli.main>` runs (its handler, ``_first_interrupt``, turns them into one error
line after cleanup; one Python swallowed in a garbage-collection callback is sent again), and once
the command is over, while the process exits (ignored). Light on purpose: imported before
everything else the CLI imports."""
from __future__ import annotations

import os
import signal
import sys
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``, a job scheduler, ``timeout``): handled as Ctrl-C is, so the same
    cleanup runs (temporary files removed, workers stopped) and the command ends with one line and
    exit status 2."""


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


_as_program = False     # whether this process is the lumc program (its handlers are lumc's)


def ignore_signals_from_now() -> None:
    """The command is over (its outputs written, its line printed, its status set): in the
    ``lumc`` program, SIGINT and SIGTERM are ignored while the process exits (0.3 s or more: the
    garbage collection of the compile's arrays, the pools' exit hooks). There a Ctrl-C turned a
    finished compile into 'interrupted', status 2; a SIGTERM printed the traceback of the
    ``Terminated`` raised in a garbage-collection callback; and either killed the process after it
    printed 'wrote X' (status -15 or -2, no line), Python restoring the default handlers as it
    finalizes, which it does not do for an ignored signal. A program that calls ``main`` keeps
    its own handlers."""
    global command_over
    if _as_program:
        command_over = True
        handle_signals(signal.SIG_IGN)


command_over = False    # set by ignore_signals_from_now
_REDELIVER_S = 0.02     # how long after a swallowed interrupt it is sent again


def redeliver_swallowed_interrupts(handler) -> None:
    """In the ``lumc`` program: an interrupt that ``handler`` raised where Python cannot propagate
    an exception (a garbage-collection callback, a ``__del__``: Python prints it as 'Exception
    ignored in ...' with its traceback and goes on, so the Ctrl-C or SIGTERM was lost) is sent
    again, to be raised at the next instruction, unless the command is over by then."""
    if not _as_program:
        return
    previous = sys.unraisablehook

    def hook(unraisable):
        err = unraisable.exc_value
        signum = (None if not isinstance(err, KeyboardInterrupt) else
                  signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT)
        if signum is None:
            previous(unraisable)
        elif not command_over:
            signal.signal(signum, handler)    # it ignores both signals once it has raised
            # from a thread, a moment later: sent from here, the handler would raise in this hook
            # (swallowed too); one swallowed again comes back here
            timer = threading.Timer(_REDELIVER_S, os.kill, (os.getpid(), signum))
            timer.daemon = True
            timer.start()
    sys.unraisablehook = hook


def launched_as_lumc() -> bool:
    """Whether this process is the ``lumc`` console script (its ``argv[0]`` is the launcher), not
    a program or test that imports the CLI and keeps its own handlers."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return os.path.splitext(name)[0] in ("lumc", "lumc-script")


def handle_signals_while_starting(run_as_main: bool = False) -> None:
    """In the console script (or the CLI module run as ``__main__``), :func:`stop_while_starting`
    until ``main`` takes over."""
    global _as_program
    if run_as_main or launched_as_lumc():
        _as_program = True
        handle_signals(stop_while_starting)
