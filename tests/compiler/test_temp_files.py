"""Temporary files a killed write left beside its target or in the cache are removed by the next
write of that target and by ``lumc cache info``, never one a live write may still own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

from lumc.compiler.runtime.artifact import write_atomic
from lumc.compiler.runtime.temp_files import DEAD_OWNER_S, STALE_TEMP_S, sweep_stale_temps


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


def _killed_write(target) -> list:
    """Run ``write_atomic(target)`` in a child, ``kill -9`` it mid-write (in its fsync), and
    return the temporary files it left beside ``target``."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from lumc.compiler.runtime.artifact import write_atomic
        def hang(fd):
            print("writing", flush=True)
            time.sleep(600)
        os.fsync = hang
        write_atomic({str(target)!r}, b"x" * 4096)
        """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    return sorted(p for p in target.parent.iterdir() if p.name.endswith(".tmp"))


def test_a_killed_write_is_swept_by_the_next_write_of_its_target(tmp_path):
    target = tmp_path / "m.lumc"
    left = _killed_write(target)
    assert len(left) == 1 and f".{os.getpid()}-" not in left[0].name
    write_atomic(target, b"first")          # right after the kill: the temp may be a live one's
    assert left[0].exists()
    _age(left[0], DEAD_OWNER_S + 5)
    other = tmp_path / f".other.lumc.{_dead_pid()}-0a1b2c3d.tmp"     # another target's
    other.write_bytes(b"o")
    _age(other, STALE_TEMP_S + 5)
    write_atomic(target, b"second")
    assert target.read_bytes() == b"second"
    assert not left[0].exists() and other.exists()


def test_sweep_keeps_what_a_live_write_may_own(tmp_path):
    dead, me = _dead_pid(), os.getpid()
    files = {
        f".a.lumc.{dead}-1a2b3c4d.tmp": (DEAD_OWNER_S + 5, False),   # dead owner, untouched
        f".b.lumc.{dead}-1a2b3c4d.tmp": (10, True),                  # dead owner, just written
        f".c.lumc.{me}-1a2b3c4d.tmp": (DEAD_OWNER_S + 5, True),      # a live owner
        f".d.lumc.{me}-1a2b3c4d.tmp": (STALE_TEMP_S + 5, False),     # untouched an hour
        ".e.lumc.1a2b3c4d.tmp": (DEAD_OWNER_S + 5, True),            # no PID: by age only
        ".f.lumc.1a2b3c4d.tmp": (STALE_TEMP_S + 5, False),
        "g.lumc": (STALE_TEMP_S + 5, True),                          # not a temporary file
        ".h.tmp": (STALE_TEMP_S + 5, True),                          # not one of lumc's
    }
    for name, (age, _) in files.items():
        (tmp_path / name).write_bytes(b"x")
        _age(tmp_path / name, age)
    gone = sweep_stale_temps(tmp_path)
    assert sorted(p.name for p in gone) == sorted(n for n, (_, keep) in files.items() if not keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, (_, keep)
                                                                 in files.items() if keep)


def test_cache_info_removes_temporary_files_of_killed_writes(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from lumc.compiler.tools.cli import cli
    cache = tmp_path / "cache"
    monkeypatch.setenv("LUMC_CACHE_DIR", str(cache))
    TuningDatabase().info()
    dead = _dead_pid()
    left = []
    for folder, name in (("plans", "0123abcd.lumc"), ("kernels", "lumc_matmul_0123.py")):
        (cache / folder).mkdir(parents=True, exist_ok=True)
        p = cache / folder / f".{name}.{dead}-a1b2c3d4.tmp"
        np.save(str(p) + ".npy", np.zeros(3))       # some bytes
        os.replace(str(p) + ".npy", p)
        _age(p, DEAD_OWNER_S + 5)
        left.append(p)
    res = CliRunner().invoke(cli, ["cache", "info"])
    assert res.exit_code == 0, res.output
    assert "removed 2 temporary files that killed writes left" in res.output
    assert not any(p.exists() for p in left)
