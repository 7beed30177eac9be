"""Generated sources on disk: written once per content hash, imported from there.

Triton compiles only functions defined in files (``@triton.jit`` reads the function's source), so each
rendered kernel is written to ``<cache>/kernels/<name>.py`` where ``<cache>`` is
``platformdirs.user_cache_dir("lumc")`` (``LUMC_CACHE_DIR`` overrides it), and imported by path. The
name carries the hash of the code (the ``# covers model nodes`` comment aside: kernels of repeated
layers share one file, which keeps the first one's comment), so a file is never rewritten with
different code; writes go through
a temporary file and an atomic rename, so a crash never leaves half a kernel behind.

Interpreted or compiled is a property of the process: ``@triton.jit`` (Triton's own library included)
reads ``TRITON_INTERPRET`` when a module is imported, so :mod:`lumc.backends.triton` sets it before
Triton is first imported when no GPU is present, and ahead-of-time compiles run in a child process.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

import platformdirs

from lumc.backends.triton.source import RenderedKernel
from lumc.ir.errors import KernelWriteError

_LOCK = threading.Lock()
_MODULES: dict[str, ModuleType] = {}


_FALLBACK: dict[Path, Path] = {}


def _configured_dir() -> Path:
    root = os.environ.get("LUMC_CACHE_DIR") or platformdirs.user_cache_dir("lumc")
    return Path(root) / "kernels"


def _private_dir() -> Path:
    """The fallback folder: private to this user, under the system temp dir."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    alt = Path(tempfile.gettempdir()) / f"lumc-kernels-{uid}"
    alt.mkdir(mode=0o700, parents=True, exist_ok=True)
    return alt


def cache_dir() -> Path:
    """The directory generated kernels live in (created on first use). Where the cache folder
    cannot be written (a read-only mount), a private folder under the system temp dir, with one
    warning: the kernels still compile, only not kept there (a kernel that cannot be written must
    not be mistaken for one that failed)."""
    d = _configured_dir()
    if d in _FALLBACK:
        return _FALLBACK[d]
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK | os.X_OK):
            return d
        why = "not writable"
    except OSError as e:
        why = e.strerror or str(e)
    alt = _private_dir()
    import warnings
    warnings.warn(f"lumc: kernel cache {d} cannot be used ({why}); generated kernels go to {alt}",
                  RuntimeWarning, stacklevel=2)
    _FALLBACK[d] = alt
    return alt


def write_source(rk: RenderedKernel) -> Path:
    """Write ``rk.source`` to ``<cache>/kernels/<rk.name>.py`` unless it is already there.

    A file there that is not this kernel's code (garbled, truncated, not UTF-8) is replaced; one
    that cannot be replaced or written (a directory in its place, a full disk, ``ulimit -f``)
    sends the kernels to the private fallback folder of :func:`cache_dir`, with one warning; no
    temporary file is left behind.

    Raises:
        KernelWriteError: neither folder can take the file (one line naming both reasons).
    """
    d = cache_dir()
    try:
        return _write(d / f"{rk.name}.py", rk.source)
    except OSError as e:
        why = e.strerror or str(e)
    try:
        alt = _private_dir()
        if alt == d:            # the cache is the fallback already
            raise OSError(0, "")
        path = _write(alt / f"{rk.name}.py", rk.source)
    except OSError as e:
        if e.strerror:
            why = f"{why}; the fallback folder: {e.strerror}"
        raise KernelWriteError(f"cannot write the generated kernel {rk.name}.py to {d} ({why}); "
                               "free disk space, raise the file size limit, or set "
                               "LUMC_CACHE_DIR to a writable folder") from None
    import warnings
    warnings.warn(f"lumc: kernel cache {d} cannot be written ({why}); generated kernels go to "
                  f"{alt}", RuntimeWarning, stacklevel=2)
    _FALLBACK[_configured_dir()] = alt
    return path


def _write(path: Path, source: str) -> Path:
    """``source`` at ``path`` (kept when the code is already there), through a temporary file and
    an atomic rename; the temporary file is removed on any failure."""
    try:
        if _code(path.read_text()) == _code(source):
            return path    # same code (the name hashes it); only the covered-nodes comment differs
    except FileNotFoundError:
        pass
    except UnicodeDecodeError:
        pass           # a garbled file: replaced below
    # ``.NAME.PID-XXXXXXXX.tmp``: ``lumc cache info`` removes one whose writer was killed
    # (``compiler/runtime/temp_files.py``)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp",
                               dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _code(src: str) -> list[str]:
    """The source without its ``# covers model nodes`` comment (which the name does not hash)."""
    lines = src.splitlines()
    out, skipping = [], False
    for ln in lines:
        if ln.startswith("# covers model nodes: "):
            skipping = True
            continue
        if skipping and ln.startswith("#   ") and not ln.startswith("# meaning"):
            continue
        skipping = False
        out.append(ln)
    return out


def load_module(rk: RenderedKernel) -> ModuleType:
    """Import the kernel's module from the cache, once per process."""
    with _LOCK:
        mod = _MODULES.get(rk.name)
        if mod is not None:
            return mod
        path = write_source(rk)
        modname = f"lumc_kernels.{rk.name}"
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        _MODULES[rk.name] = mod
        return mod
