"""``lumc cache``: where the tuning database, the stored plans and the generated kernels live, and
how much they hold.

    lumc cache info
    lumc cache clear
"""
from __future__ import annotations

import pathlib
import shutil

import click

from lumc.compiler.tools.cli import _fmt_bytes, cli


@cli.group("cache")
def cache_grp():
    """The tuning database and the generated-kernel cache (under the user cache dir)."""


def _kernel_cache_dir() -> pathlib.Path | None:
    try:
        from lumc.backends.triton.cache import cache_dir
        return pathlib.Path(cache_dir())
    except Exception:
        return None


def _size(files) -> str:
    return _fmt_bytes(sum(p.stat().st_size for p in files if p.exists()))


def _could_make(folder: pathlib.Path) -> bool:
    """Whether ``folder`` (absent) can be created: it is, with its missing parents, and removed
    again, so the check leaves nothing behind."""
    made = [a for a in (folder, *folder.parents) if not a.exists()]
    try:
        folder.mkdir(parents=True)
    except OSError:
        return False
    for a in made:              # innermost first
        a.rmdir()
    return True


@cache_grp.command("info")
def cache_info():
    """Where the caches are, and how much they hold."""
    from lumc.compiler.runtime.temp_files import sweep_stale_temps
    from lumc.compiler.runtime.tuning_db import TuningDatabase, default_db_path, plan_cache_limit
    root = default_db_path().parent
    if not root.exists() and _could_make(root):
        # a report leaves nothing behind: the first compile makes the cache (one that cannot be
        # made is the database's one-line error below)
        plan_cache_limit()      # a bad LUMC_PLAN_CACHE_MB is still one line
        click.echo(f"no cache yet at {root} (the first compile creates it)")
        return
    db = TuningDatabase()
    kdir = _kernel_cache_dir()
    swept = [p for d in (db.plans_dir, kdir) if d is not None for p in sweep_stale_temps(d)]
    if swept:
        click.echo(f"removed {len(swept)} temporary file{'s' * (len(swept) != 1)} that killed "
                   "writes left")
    info = db.info()
    click.echo(f"tuning database: {info['path']} ({info['entries']} timings, {_fmt_bytes(info['bytes'])})")
    for dev, n in sorted(info["by_device"].items()):
        click.echo(f"  {dev}: {n}")
    plans = db.stored_plans()
    n = sum(p.suffix == ".lumc" for p in plans)
    if db.plans_dir.exists() and not db.plans_dir.is_dir():
        click.echo(f"stored plans: {db.plans_dir} is not a folder: no plan can be stored or "
                   "reused (remove it)")
    else:
        click.echo(f"stored plans: {db.plans_dir} ({n} plan{'s' * (n != 1)}, "
                   f"{_size(plans)}; least recently used evicted past "
                   f"{_fmt_bytes(plan_cache_limit())}, LUMC_PLAN_CACHE_MB)")
    aside = db.set_aside_files()
    if aside:
        click.echo(f"set-aside corrupt databases: {len(aside)} file{'s' * (len(aside) != 1)} "
                   f"({_size(aside)}): "
                   + ", ".join(p.name for p in aside))
    if kdir is not None and kdir.exists():
        files = [p for p in kdir.rglob("*") if p.is_file()]
        click.echo(f"kernel sources: {kdir} ({len(files)} file{'s' * (len(files) != 1)}, "
                   f"{_size(files)})")


@cache_grp.command("clear")
def cache_clear():
    """Delete every stored timing, stored plan, set-aside corrupt database and generated kernel
    source."""
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    db = TuningDatabase()
    n = db.clear()
    plans, aside = db.clear_plans_and_set_aside()
    kdir = _kernel_cache_dir()
    removed = 0
    if kdir is not None and kdir.exists():
        removed = sum(1 for p in kdir.rglob("*") if p.is_file())
        shutil.rmtree(kdir, ignore_errors=True)
    def count(k: int, noun: str) -> str:
        return f"{k} {noun}{'s' * (k != 1)}"
    click.echo(f"cleared {count(n, 'timing')}, {count(plans, 'stored plan')}, "
               f"{count(aside, 'set-aside database file')} and "
               f"{count(removed, 'kernel source file')}")
