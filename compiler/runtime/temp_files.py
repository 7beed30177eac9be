"""Temporary files of lumc's atomic writes, and sweeping the ones a killed process left.

Every write of an artifact, a report, a stored plan or a generated kernel goes through a temporary
file beside its target, ``.NAME.PID-RANDOM.tmp`` (``PID``: the writing process), renamed over the
target when complete and removed on any failure a process survives. A process killed mid-write
(``kill -9``, the OOM killer, a power cut) leaves it behind; :func:`sweep_stale_temps` removes
such files, never one a live write may still own:

* untouched for less than :data:`DEAD_OWNER_S`: kept (its writer may be on another host or in
  another PID namespace sharing the folder, where its PID means nothing here);
* its PID is not a live process on this host: removed;
* untouched for :data:`STALE_TEMP_S`: removed, whatever its PID (no write takes that long; a PID
  that is alive again may have been reused) or without one (earlier versions wrote
  ``.NAME.RANDOM.tmp``).

A write sweeps its own target's leftovers; ``lumc cache info`` and storing a plan sweep the cache
folders.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

DEAD_OWNER_S = 300.0     # a temporary file of a dead writer untouched this long is removed
STALE_TEMP_S = 3600.0    # any temporary file untouched this long was left by a killed write

_TEMP = re.compile(r"^\.(?P<name>.+)\.(?:(?P<pid>\d{1,10})-)?[0-9A-Za-z_]+\.tmp$")


def temp_prefix(name: str) -> str:
    """The start of a temporary file's name for target file ``name``: ``.NAME.PID-``."""
    return f".{name}.{os.getpid()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False                 # os.kill(0, 0) would signal our own process group
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True                  # it exists: another user's process
    except (OSError, OverflowError):
        return False                 # no such process (ProcessLookupError), or no valid PID
    return True


def is_stale(path: Path, *, now: float | None = None) -> bool:
    """Whether ``path`` is a temporary file of lumc's that no live write owns (rules above)."""
    m = _TEMP.match(path.name)
    if m is None:
        return False
    try:
        st = path.lstat()
    except OSError:
        return False
    age = (time.time() if now is None else now) - st.st_mtime
    if age < DEAD_OWNER_S:
        return False
    if age >= STALE_TEMP_S:
        return True
    return m["pid"] is not None and not _alive(int(m["pid"]))


def sweep_stale_temps(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove the stale temporary files in ``folder`` (only those of target file ``name``, when
    given); returns those removed. Never raises: a folder that cannot be listed, or a file another
    process removed first or that cannot be removed, is skipped."""
    gone = []
    prefix = "." if name is None else f".{name}."
    now = time.time()
    try:
        entries = [e for e in os.scandir(folder)
                   if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    except OSError:
        return gone
    for e in entries:
        p = Path(e.path)
        m = _TEMP.match(e.name)
        if m is None or (name is not None and m["name"] != name):
            continue
        try:
            if e.is_file(follow_symlinks=False) and is_stale(p, now=now):
                p.unlink()
                gone.append(p)
        except OSError:
            pass
    return gone
