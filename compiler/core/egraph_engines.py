"""The e-graph engines of threads other than the main one.

An egglog ``EGraph`` is bound to the thread that made it: used from another it panics (``EGraph is
unsendable, but sent to another thread``: a compile in a second thread, or two at once, failed
with a pyo3 ``PanicException``), and dropped in another it prints ``... is being dropped on
another thread``. So each thread has its own engines (:func:`thread_engines`), dropped with the
thread, in it; a forked child, which clears the other threads' states, keeps theirs unused until
it exits, and a fork waits while an engine is being built (:func:`building`), so that none is
dropped half-made in the child.
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref

_THREAD = threading.local()


class _Engines(dict):
    """One thread's engines (a dict that a weak set can hold: hashed by identity)."""
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other


_LIVE: "weakref.WeakSet[_Engines]" = weakref.WeakSet()
_FORK_STASH: list[_Engines] = []
_BUILDING = threading.Lock()     # held while a thread builds an engine (not yet in its dict)


def thread_engines() -> dict:
    """This (non-main) thread's engines, ``{rule-set key: Saturator}``."""
    engines = getattr(_THREAD, "engines", None)
    if engines is None:
        engines = _THREAD.engines = _Engines()
        _LIVE.add(engines)
    return engines


@contextlib.contextmanager
def building():
    """Held while an engine is built and stored (a fork waits for it)."""
    with _BUILDING:
        yield


def _stash_before_fork() -> None:
    _BUILDING.acquire()
    _FORK_STASH[:] = list(_LIVE)


def _after_fork_in_parent() -> None:
    _FORK_STASH.clear()
    _BUILDING.release()


def _after_fork_in_child() -> None:
    global _BUILDING
    _BUILDING = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_stash_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
