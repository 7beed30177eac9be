"""The tuning database: measured kernel times in SQLite under the user cache dir.

A row is keyed by the kernel's content hash, its config, the device name, and the lumc, Triton and
driver versions: a timing from another version or device is never trusted, only ignored. A database
that cannot be read is set aside (renamed ``*.corrupt-<time>``) with a warning and rebuilt; it never
crashes a compile. One a newer lumc wrote (a higher schema) is another version's, and is left as it
is: the compile warns and keeps its timings in memory. Writes commit immediately, so a compile
interrupted with Ctrl-C keeps every timing measured so far.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from lumc.compiler.runtime.temp_files import STALE_TEMP_S, sweep_stale_temps
from lumc.ir.errors import ArtifactError

SCHEMA_VERSION = 1


def default_db_path() -> Path:
    """``$LUMC_CACHE_DIR/tuning.sqlite``, else the user cache dir of ``lumc``."""
    root = os.environ.get("LUMC_CACHE_DIR") or platformdirs.user_cache_dir("lumc")
    return Path(root) / "tuning.sqlite"


@dataclass(frozen=True)
class TimingKey:
    """What a timing depends on. ``config`` is a canonical JSON string of the kernel config."""
    kernel_hash: str
    config: str
    device: str
    lumc_version: str
    triton_version: str
    driver_version: str


@dataclass(frozen=True)
class Timing:
    """A stored measurement: ``seconds`` (median), ``ok`` False when the kernel failed numerics
    or compilation (then ``note`` says why), ``simulated`` True for analytical times."""
    seconds: float
    ok: bool
    simulated: bool
    note: str = ""


_COLUMNS = ("kernel_hash TEXT, config TEXT, device TEXT, lumc_version TEXT, triton_version TEXT, "
            "driver_version TEXT, seconds REAL, ok INTEGER, simulated INTEGER, note TEXT, "
            "created REAL")
# SQLite's primary result codes for a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB): only these set
# the file aside; a full disk (SQLITE_FULL), an I/O error, a read-only folder or a lock are the
# environment's, and the file is left alone (https://www.sqlite.org/rescode.html)
_CORRUPT_CODES = (11, 26)


class _NewerSchema(sqlite3.DatabaseError):
    """A readable database another (newer) lumc wrote: its timings are that version's, kept."""


def _corrupt(err: Exception) -> bool:
    """``err`` says the database file itself is damaged (or has another schema: lumc's own
    DatabaseError, which has no SQLite code)."""
    code = getattr(err, "sqlite_errorcode", None)
    return code is None or (code & 0xFF) in _CORRUPT_CODES


class TuningDatabase:
    """SQLite store of kernel timings (see module docstring).

    Args:
        path: database file; created with its folder if missing.
    Raises:
        ArtifactError: the cache folder cannot be created or written, or the path is a folder
            (one line naming it; an unreadable database file is set aside instead).
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_db_path()
        plan_cache_limit()                # a bad LUMC_PLAN_CACHE_MB: one line, before any work
        self.recovered_from: Path | None = None
        self.hits = 0
        self.misses = 0
        self.bad_rows = 0
        self.write_failed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and not self.path.is_file():
                raise ArtifactError(f"tuning database {self.path} is not a regular file; remove it "
                                    "or set LUMC_CACHE_DIR to another folder")
            try:
                self._conn = self._open()
            except _NewerSchema as e:   # another version's timings: left as they are
                self._conn = self._in_memory(e)
            except sqlite3.DatabaseError as e:
                self._conn = self._set_aside_and_rebuild(e) if _corrupt(e) else \
                    self._in_memory(e)
        except sqlite3.Error as e:   # still failing on a fresh file: the folder is the problem
            raise ArtifactError(f"tuning database {self.path} cannot be opened ({e}); set "
                                "LUMC_CACHE_DIR to a writable folder") from None
        except OSError as e:
            raise ArtifactError(f"cache dir {self.path.parent} cannot be used: "
                                f"{e.strerror or e}; set LUMC_CACHE_DIR to a writable folder"
                                ) from None

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        row = conn.execute("SELECT v FROM meta WHERE k='schema'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            if str(row[0]).isdigit() and int(row[0]) > SCHEMA_VERSION:
                conn.close()
                raise _NewerSchema(f"schema {row[0]}, written by a newer lumc; this one reads "
                                   f"schema {SCHEMA_VERSION}")
            raise sqlite3.DatabaseError(f"schema {row[0]}, expected {SCHEMA_VERSION}")
        conn.execute(f"""CREATE TABLE IF NOT EXISTS timings ({_COLUMNS},
            PRIMARY KEY (kernel_hash, config, device, lumc_version, triton_version, driver_version))""")
        conn.execute("PRAGMA quick_check").fetchone()
        return conn

    def _in_memory(self, err: Exception) -> sqlite3.Connection:
        """The database file cannot be used for a reason outside it (a full disk, a read-only
        folder, an I/O error, a newer lumc's schema): it is left as it is, and this compile keeps
        its timings in memory."""
        if isinstance(err, _NewerSchema):
            warnings.warn(f"lumc: tuning database {self.path} has {err}: it is left as it is and "
                          "this compile's timings are not kept (give each lumc version its own "
                          "LUMC_CACHE_DIR)", RuntimeWarning, stacklevel=4)
            self.write_failed = True
        else:
            self._warn_unwritable(err)
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.execute(f"""CREATE TABLE timings ({_COLUMNS},
            PRIMARY KEY (kernel_hash, config, device, lumc_version, triton_version, driver_version))""")
        return conn

    def _set_aside_and_rebuild(self, err: Exception) -> sqlite3.Connection:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                os.replace(p, Path(str(aside) + suffix))
        self.recovered_from = aside
        warnings.warn(f"lumc: tuning database {self.path} was unreadable ({err}); moved it to "
                      f"{aside} and started a new one", RuntimeWarning, stacklevel=3)
        return self._open()

    def get(self, key: TimingKey) -> Timing | None:
        """The stored timing for exactly this key, or None."""
        try:
            row = self._conn.execute(
                "SELECT seconds, ok, simulated, note FROM timings WHERE kernel_hash=? AND config=? "
                "AND device=? AND lumc_version=? AND triton_version=? AND driver_version=?",
                (key.kernel_hash, key.config, key.device, key.lumc_version, key.triton_version,
                 key.driver_version)).fetchone()
        except sqlite3.DatabaseError as e:
            try:
                if not _corrupt(e):
                    raise e
                self._conn = self._set_aside_and_rebuild(e)
            except (sqlite3.Error, OSError) as e2:
                self._warn_unwritable(e2)
            row = None
        timing = None if row is None else self._valid_timing(key, row)
        if timing is None:
            self.misses += 1
            return None
        self.hits += 1
        return timing

    def _valid_timing(self, key: TimingKey, row: tuple) -> Timing | None:
        """The row as a Timing, or None (with one warning per database) when another program or a
        damaged file left values no measurement gives: ``seconds`` not a number, NULL, negative or
        NaN (or infinite for a passing kernel), flags other than 0/1, a note that is not text."""
        seconds, ok, simulated, note = row
        bad = None
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            bad = f"seconds is {'NULL' if seconds is None else type(seconds).__name__}"
        elif not seconds >= 0 or (ok == 1 and not math.isfinite(seconds)):
            bad = f"seconds is {seconds!r}"
        elif ok not in (0, 1) or simulated not in (0, 1) or isinstance(ok, float) \
                or isinstance(simulated, float):
            bad = f"ok/simulated are {ok!r}/{simulated!r}, not 0 or 1"
        elif note is not None and not isinstance(note, str):
            bad = f"note is {type(note).__name__}"
        if bad is None:
            return Timing(float(seconds), bool(ok), bool(simulated), note or "")
        self.bad_rows += 1
        if self.bad_rows == 1:
            warnings.warn(f"lumc: tuning database {self.path} has invalid rows (kernel "
                          f"{key.kernel_hash[:12]}: {bad}); ignoring them, they will be re-measured",
                          RuntimeWarning, stacklevel=3)
        return None

    def put(self, key: TimingKey, timing: Timing) -> None:
        """Store (or replace) a timing; committed at once."""
        args = (key.kernel_hash, key.config, key.device, key.lumc_version, key.triton_version,
                key.driver_version, float(timing.seconds), int(timing.ok), int(timing.simulated),
                timing.note, time.time())
        sql = "INSERT OR REPLACE INTO timings VALUES (?,?,?,?,?,?,?,?,?,?,?)"
        try:
            self._conn.execute(sql, args)
        except sqlite3.OperationalError as e:   # read-only or locked: keep compiling without it
            self._warn_unwritable(e)
        except sqlite3.DatabaseError as e:
            try:
                if not _corrupt(e):
                    raise e
                self._conn = self._set_aside_and_rebuild(e)
                self._conn.execute(sql, args)
            except (sqlite3.Error, OSError) as e2:
                self._warn_unwritable(e2)

    def _warn_unwritable(self, err: Exception) -> None:
        if not self.write_failed:
            warnings.warn(f"lumc: tuning database {self.path} cannot be written ({err}); timings of "
                          "this compile are not kept", RuntimeWarning, stacklevel=4)
        self.write_failed = True

    def info(self) -> dict:
        """Path, size in bytes, row count, and rows per device."""
        rows = self._conn.execute("SELECT device, COUNT(*) FROM timings GROUP BY device").fetchall()
        size = self.path.stat().st_size if self.path.exists() else 0
        return {"path": str(self.path), "bytes": size, "entries": sum(c for _, c in rows),
                "by_device": {d: c for d, c in rows}}

    def clear(self) -> int:
        """Delete every timing; returns how many were deleted.

        Raises:
            ArtifactError: the database cannot be written (a read-only or full disk)."""
        n = self._conn.execute("SELECT COUNT(*) FROM timings").fetchone()[0]
        try:
            self._conn.execute("DELETE FROM timings")
        except sqlite3.OperationalError as e:
            raise ArtifactError(f"tuning database {self.path} cannot be cleared ({e})") from None
        try:
            self._conn.execute("VACUUM")      # give the space back: `cache info` shows the size
        except sqlite3.OperationalError:      # another process holds the database: keep its pages
            pass
        return int(n)

    @property
    def plans_dir(self) -> Path:
        """Where stored plans of earlier compiles live (``<cache dir>/plans/*.lumc``, written by the
        pipeline's plan reuse)."""
        return self.path.parent / "plans"

    def stored_plans(self) -> list[Path]:
        """The stored plan files (``*.lumc`` and any temporary file a killed write left)."""
        d = self.plans_dir
        return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []

    def set_aside_files(self) -> list[Path]:
        """Unreadable databases set aside by earlier runs (``<name>.corrupt-<time>`` and their
        ``-wal``/``-shm`` companions)."""
        return sorted(p for p in self.path.parent.glob(f"{self.path.name}.corrupt-*") if p.is_file())

    def clear_plans_and_set_aside(self) -> tuple[int, int]:
        """Delete everything in the plans folder (plans, a torch plan's interface file, temporary
        files, a folder someone put there) and every set-aside database; returns ``(plans,
        files)`` deleted: ``*.lumc`` plans, as ``lumc cache info`` counts them, and set-aside
        files (one another process removed first is not counted)."""
        import shutil
        d = self.plans_dir
        plans = 0
        for p in (sorted(d.iterdir()) if d.is_dir() else []):
            try:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
                    plans += p.suffix == ".lumc"
            except FileNotFoundError:
                pass
        aside = 0
        for p in self.set_aside_files():
            try:
                p.unlink()
                aside += 1
            except FileNotFoundError:
                pass
        return plans, aside

    def close(self) -> None:
        self._conn.close()


PLAN_CACHE_MB = 4096   # default size of the stored-plan cache (LUMC_PLAN_CACHE_MB overrides)


def plan_cache_limit() -> int:
    """The stored-plan cache's size limit in bytes: ``LUMC_PLAN_CACHE_MB`` (MB, 0 keeps only the
    latest plan), else :data:`PLAN_CACHE_MB`.

    Raises:
        InputError: a value that is not a finite number >= 0 (it was ignored: ``abc`` or ``-5``
            kept the 4 GB default without a word); checked when the cache is opened, before a
            compile's work.
    """
    raw = os.environ.get("LUMC_PLAN_CACHE_MB")
    if raw is None:
        return int(PLAN_CACHE_MB * 1e6)
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not (math.isfinite(mb) and mb >= 0):
        from lumc.ir.errors import InputError
        raise InputError(f"LUMC_PLAN_CACHE_MB={raw!r}: the stored-plan cache's size is a number of "
                         f"MB >= 0 (unset: {PLAN_CACHE_MB})")
    return int(mb * 1e6)


def evict_plans(plans_dir: Path, keep: Path, limit_bytes: int | None = None) -> list[Path]:
    """Keep the stored plans within ``limit_bytes`` (default :func:`plan_cache_limit`),
    deleting the least recently used first (by modification time: a reuse touches its plan),
    never ``keep`` (the plan just written). A plan's companion files (a torch module's
    ``<key>.torch`` interface) go with it. Returns the plans deleted; a file another process
    removed first is skipped."""
    limit = plan_cache_limit() if limit_bytes is None else limit_bytes
    sweep_stale_temps(plans_dir)        # what killed writes left, whatever the limit
    groups: dict[str, list[Path]] = {}
    now = time.time()
    for p in (sorted(q for q in plans_dir.iterdir() if q.is_file()) if plans_dir.is_dir() else []):
        if p.name.startswith("."):
            # a temporary file (``.KEY.lumc.XXXX.tmp``): another compile may be writing it right
            # now (deleting it failed that compile's store); one a killed write left goes once
            # it is stale
            try:
                if now - p.stat().st_mtime < STALE_TEMP_S:
                    continue
            except FileNotFoundError:
                continue
        groups.setdefault(p.name.lstrip(".").split(".", 1)[0], []).append(p)

    def stat(paths):
        try:
            return (max(p.stat().st_mtime for p in paths), sum(p.stat().st_size for p in paths))
        except FileNotFoundError:
            return (0.0, 0)
    sized = {k: stat(v) for k, v in groups.items()}
    total = sum(b for _, b in sized.values())
    gone = []
    for stem in sorted(sized, key=lambda k: sized[k][0]):
        if total <= limit:
            break
        if stem == keep.name.split(".", 1)[0]:
            continue
        for p in groups[stem]:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        total -= sized[stem][1]
        gone.append(groups[stem][0])
    return gone


def config_key(config: dict) -> str:
    """Canonical JSON of a kernel config (sorted keys), the ``config`` column."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))
