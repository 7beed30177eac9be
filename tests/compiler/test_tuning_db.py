"""The tuning database: keyed lookups, version isolation, corrupt files set aside and rebuilt."""
import warnings

import pytest

from lumc.compiler.runtime.tuning_db import Timing, TimingKey, TuningDatabase, config_key


def key(**kw):
    base = dict(kernel_hash="abc", config=config_key({"BLOCK": 128, "num_warps": 4}), device="sim:h200",
                lumc_version="0.1.0", triton_version="3.9.0", driver_version="none")
    base.update(kw)
    return TimingKey(**base)


def test_roundtrip_and_isolation(tmp_path):
    db = TuningDatabase(tmp_path / "t.sqlite")
    db.put(key(), Timing(1.5e-5, True, True))
    assert db.get(key()) == Timing(1.5e-5, True, True, "")
    # any other device or version is a miss, never a wrong hit
    for other in (key(device="cuda:NVIDIA H200"), key(triton_version="3.8.0"), key(lumc_version="0.2"),
                  key(driver_version="570"), key(config=config_key({"BLOCK": 256, "num_warps": 4}))):
        assert db.get(other) is None
    db.put(key(), Timing(1.0e-5, False, True, "rejected: max rel error 0.3"))
    assert db.get(key()).ok is False
    assert db.info()["entries"] == 1
    db.close()
    # persisted across connections
    assert TuningDatabase(tmp_path / "t.sqlite").get(key()).note.startswith("rejected")


def test_corrupt_database_is_set_aside_and_rebuilt(tmp_path):
    p = tmp_path / "t.sqlite"
    p.write_bytes(b"this is not sqlite at all" * 100)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        db = TuningDatabase(p)
    assert any("unreadable" in str(x.message) for x in w)
    assert db.recovered_from is not None and db.recovered_from.exists()
    assert db.recovered_from.read_bytes().startswith(b"this is not sqlite")
    db.put(key(), Timing(2e-6, True, True))
    assert db.get(key()).seconds == pytest.approx(2e-6)


def test_clear(tmp_path):
    db = TuningDatabase(tmp_path / "t.sqlite")
    db.put(key(), Timing(1.0, True, True))
    db.put(key(kernel_hash="def"), Timing(1.0, True, True))
    assert db.clear() == 2 and db.info()["entries"] == 0


def test_config_key_is_canonical():
    assert config_key({"b": 1, "a": 2}) == config_key({"a": 2, "b": 1})


def test_stored_plans_and_set_aside_files_are_listed_and_cleared(tmp_path):
    p = tmp_path / "tuning.sqlite"
    p.write_bytes(b"garbage" * 200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = TuningDatabase(p)                      # sets the garbage aside
    (tmp_path / "other.sqlite.corrupt-1").write_bytes(b"x")    # another database's: not ours
    assert db.plans_dir == tmp_path / "plans" and db.stored_plans() == []
    db.plans_dir.mkdir()
    (db.plans_dir / "k1.lumc").write_bytes(b"plan")
    (db.plans_dir / ".k2.lumc.1234.tmp").write_bytes(b"half")  # a killed write's leftover
    aside = db.set_aside_files()
    assert [f.name for f in aside] == [db.recovered_from.name]
    assert len(db.stored_plans()) == 2
    (db.plans_dir / "k3.torch").write_bytes(b"{}")            # a torch plan's interface file
    (db.plans_dir / "k4.lumc").mkdir()                        # a folder where a plan would go
    # plans as `cache info` counts them (*.lumc files); everything in the folder goes
    assert db.clear_plans_and_set_aside() == (1, 1)
    assert db.stored_plans() == [] and db.set_aside_files() == []
    assert list(db.plans_dir.iterdir()) == []
    assert (tmp_path / "other.sqlite.corrupt-1").exists() and p.exists()
    db.put(key(), Timing(1e-6, True, True))           # the live database still works
    assert db.get(key()).seconds == pytest.approx(1e-6)


def _sqlite_error(cls, message: str, code: int):
    import sqlite3
    e = getattr(sqlite3, cls)(message)
    e.sqlite_errorcode = code
    return e


@pytest.mark.parametrize("message,code", [("database or disk is full", 13),
                                          ("disk I/O error", 10),
                                          ("attempt to write a readonly database", 8)])
def test_a_full_or_read_only_disk_leaves_a_healthy_database_alone(tmp_path, monkeypatch, message,
                                                                   code):
    """Only a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB) is set aside: a full disk, an I/O
    error or a read-only folder is the environment's, and the user's timings stay where they are
    while this compile keeps its own in memory."""
    p = tmp_path / "t.sqlite"
    db = TuningDatabase(p)
    db.put(key(), Timing(2e-5, True, True))
    db.close()
    before = p.read_bytes()

    def refuse(self):
        raise _sqlite_error("OperationalError", message, code)
    monkeypatch.setattr(TuningDatabase, "_open", refuse)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        db2 = TuningDatabase(p)
    assert any("cannot be written" in str(x.message) for x in w), [str(x.message) for x in w]
    assert not any("unreadable" in str(x.message) for x in w)
    assert db2.recovered_from is None and db2.set_aside_files() == []
    assert p.read_bytes() == before
    db2.put(key(), Timing(3e-5, True, True))            # this compile's timings, in memory
    assert db2.get(key()).seconds == 3e-5
    monkeypatch.undo()
    assert TuningDatabase(p).get(key()).seconds == 2e-5  # the file's own, untouched


def test_an_io_error_on_write_does_not_set_the_database_aside(tmp_path):
    p = tmp_path / "t.sqlite"
    db = TuningDatabase(p)
    db.put(key(), Timing(2e-5, True, True))

    class Failing:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, sql, *a):
            if sql.startswith("INSERT"):
                raise _sqlite_error("OperationalError", "disk I/O error", 10)
            return self.conn.execute(sql, *a)
    db._conn = Failing(db._conn)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        db.put(key(kernel_hash="def"), Timing(1e-5, True, True))
    assert any("cannot be written" in str(x.message) for x in w)
    assert db.set_aside_files() == [] and db.get(key()).seconds == 2e-5


def test_clearing_a_read_only_database_is_one_error(tmp_path):
    import sqlite3
    from lumc.ir.errors import ArtifactError
    p = tmp_path / "t.sqlite"
    db = TuningDatabase(p)
    db.put(key(), Timing(2e-5, True, True))
    db.close()
    db = TuningDatabase(p)
    db._conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, isolation_level=None)
    with pytest.raises(ArtifactError, match="cannot be cleared"):
        db.clear()


def test_an_unwritable_kernel_cache_falls_back_to_a_private_temp_dir(tmp_path, monkeypatch):
    """A read-only cache folder: kernels are written under the temp dir (one warning), so they
    compile and are timed instead of failing as if their code were wrong."""
    import os
    from lumc.backends.triton import cache
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "ro"))
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if str(p).startswith(str(tmp_path / "ro"))
                        else real(p, m))
    monkeypatch.setattr(cache, "_FALLBACK", {})
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        d = cache.cache_dir()
    assert not str(d).startswith(str(tmp_path)) and d.is_dir() and os.access(d, os.W_OK)
    assert cache.cache_dir() == d                      # decided once


def test_a_newer_lumcs_database_is_left_as_it_is(tmp_path):
    """A database with a higher schema (a newer lumc sharing the cache) was set aside as corrupt,
    so two versions discarded each other's timings on every compile. It is left untouched, with a
    warning, and this compile keeps its timings in memory; an older or unreadable schema is still
    set aside and rebuilt."""
    import sqlite3
    p = tmp_path / "tuning.sqlite"
    db = TuningDatabase(p)
    db.put(key(), Timing(2e-6, True, True))
    db.close()
    con = sqlite3.connect(p)
    con.execute("UPDATE meta SET v='2' WHERE k='schema'")
    con.commit()
    con.close()
    with pytest.warns(RuntimeWarning, match="schema 2, written by a newer lumc"):
        db = TuningDatabase(p)
    assert db.recovered_from is None and db.set_aside_files() == []
    assert db.get(key()) is None                      # not this version's timings
    db.put(key(kernel_hash="b"), Timing(1e-6, True, True))      # kept in memory
    assert db.get(key(kernel_hash="b")).seconds == pytest.approx(1e-6)
    db.close()
    con = sqlite3.connect(p)                          # the newer version's file is intact
    assert con.execute("SELECT v FROM meta WHERE k='schema'").fetchone() == ("2",)
    assert con.execute("SELECT COUNT(*) FROM timings").fetchone() == (1,)
    con.close()
    for old in ("0", "abc"):
        con = sqlite3.connect(p)
        con.execute("UPDATE meta SET v=? WHERE k='schema'", (old,))
        con.commit()
        con.close()
        with pytest.warns(RuntimeWarning, match="was unreadable"):
            db = TuningDatabase(p)
        assert db.recovered_from is not None
        db.put(key(), Timing(2e-6, True, True))
        db.close()
