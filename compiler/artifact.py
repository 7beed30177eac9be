"""Artifacts: a compiled model saved as one self-contained ``.lumc`` file.

A ``.lumc`` file is a zip archive:

* ``manifest.json`` — ``{"format": "lumc-artifact/1", "lumc_version", "created", "parts":
  {name: sha256}}``; every other member is listed with its hash and checked on load;
* ``graph.json`` + ``consts.npz`` — the primitive graph with its weights (``lumc.ir.serialize``);
* ``plan.json`` — the chosen program: kernels (form, covered nodes by position, config), the device
  and whether its times were simulated;
* ``report.json`` — the compile report;
* ``source.onnx`` — the source model, so ``lumc run ART --check`` runs onnxruntime without the
  original file.

Writes are atomic (a temporary file in the same folder, then ``os.replace``): an interrupted save
leaves the previous file untouched and no partial file behind.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import stat
import time
import zipfile
import zlib
from pathlib import Path

from lumc.ir.errors import ArtifactError, LumcError
from lumc.ir.serialize import FORMAT as GRAPH_FORMAT

FORMAT = "lumc-artifact/1"
MANIFEST = "manifest.json"


class OutputError(LumcError, OSError):
    """An output file cannot be written: its folder cannot be created or written, the path is a
    device, FIFO or directory, or it is one of the command's own input files.

    Also an ``OSError``, so code that tolerates a failed write (a read-only cache) keeps doing so.
    """


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def output_target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` replaces: ``path`` with symlinks resolved (a dangling link
    names the file to create).

    Raises:
        OutputError: the target exists and is not a regular file (a device, FIFO, directory).
    """
    target = Path(os.path.realpath(os.fspath(path)))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as e:
        raise OutputError(f"cannot write {os.fspath(path)}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"cannot write {os.fspath(path)}: it is {_kind(st.st_mode)}, not a regular "
                          "file; lumc only replaces regular files")
    return target


def refuse_same_file(out: str | os.PathLike, src: str | os.PathLike, what: str = "the input") -> None:
    """Refuse to write ``out`` when it is the file ``src`` (same inode, or the same real path).

    Raises:
        OutputError: naming both paths.
    """
    same = os.path.realpath(out) == os.path.realpath(src)
    if not same:
        try:
            same = os.path.samefile(out, src)
        except OSError:
            same = False
    if same:
        raise OutputError(f"output {os.fspath(out)} is {what} {os.fspath(src)}: writing it would "
                          "destroy it; choose another output path")


def check_writable(path: str | os.PathLike) -> None:
    """Fail early, before long work, when ``path`` cannot be written.

    Checks what :func:`write_atomic` would meet: a non-regular target, an ancestor that is not a
    folder, and (when the folder exists) that a file can be created in it. Missing folders are
    fine: :func:`write_atomic` creates them.

    Raises:
        OutputError: one line naming the path and the reason.
    """
    target = output_target(path)
    parent = target.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"cannot write {os.fspath(path)}: {parent} is not a folder")
    if parent != target.parent:
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"cannot write {os.fspath(path)}: cannot create folders in {parent}")
        return
    try:
        fd, tmp = _create_temp(target)
    except OSError as e:
        raise OutputError(f"cannot write {os.fspath(path)}: cannot create a file in "
                          f"{target.parent} ({e.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


def _create_temp(target: Path) -> tuple[int, str]:
    # O_EXCL with mode 0666: the umask applies, as for any file a shell creates (mkstemp gives 0600)
    for _ in range(100):
        tmp = os.path.join(target.parent, f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                           0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {target}")


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + ``os.replace``).

    A symlink is followed and the file it points to replaced; missing folders are created; a new
    file gets mode ``0666 & ~umask``, a replaced one keeps its mode. On any failure (or Ctrl-C) the
    previous file is untouched and no temporary file is left.

    Raises:
        OutputError: the target is a device, FIFO or directory, or the folder or file cannot be
            created or written (one line; also an ``OSError``).
    """
    target = output_target(path)
    shown = os.fspath(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {shown}: cannot create folder {target.parent} "
                          f"({e.strerror or e})") from None
    try:
        fd, tmp = _create_temp(target)
    except OSError as e:
        raise OutputError(f"cannot write {shown}: cannot create a file in {target.parent} "
                          f"({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if target.exists():
                os.fchmod(f.fileno(), stat.S_IMODE(os.stat(target).st_mode))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise OutputError(f"cannot write {shown}: {e.strerror or e}") from None
        raise


def save_artifact(path: str | os.PathLike, parts: dict[str, bytes], lumc_version: str) -> str:
    """Save ``parts`` (member name -> bytes) as an artifact; returns the artifact hash (sha256 of
    the manifest)."""
    manifest = {"format": FORMAT, "lumc_version": lumc_version, "created": time.time(),
                "parts": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(parts.items())}}
    mbytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(MANIFEST, mbytes, compress_type=zipfile.ZIP_DEFLATED)
        for k, v in sorted(parts.items()):
            # weights (npz, onnx) are incompressible floats: store them; deflate only the JSON
            kind = zipfile.ZIP_DEFLATED if k.endswith(".json") else zipfile.ZIP_STORED
            z.writestr(k, v, compress_type=kind)
    write_atomic(path, buf.getvalue())
    return artifact_hash(manifest)


def artifact_hash(manifest: dict) -> str:
    """A stable hash of an artifact's content (its parts' hashes; not its creation time)."""
    return hashlib.sha256(json.dumps(manifest["parts"], sort_keys=True).encode()).hexdigest()


def looks_like_artifact(path: str | os.PathLike) -> bool:
    """A ``.lumc`` artifact, whole or damaged, rather than an ONNX model: a zip archive by its magic
    bytes, or a file named ``*.lumc`` that does not start like an ONNX protobuf (whose first field,
    ``ir_version``, is the byte 0x08)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return str(path).endswith(".lumc")
    if head.startswith(b"PK"):
        return True
    return str(path).endswith(".lumc") and not head.startswith(b"\x08")


# what lumc.compiler.compiled.load reads from each JSON part (key -> accepted types)
_JSON_PARTS = {
    "plan.json": {"device": (str,), "simulated": (bool,), "calls": (list,), "outputs": (dict,)},
    "report.json": {},
    "graph.json": {"nodes": (list,), "inputs": (dict,), "outputs": (dict,)},
}


def _check_parts(path: Path, parts: dict[str, bytes]) -> None:
    """Each known part is readable and has the shape its reader expects (names the part)."""
    for name, keys in _JSON_PARTS.items():
        if name not in parts:
            continue
        try:
            doc = json.loads(parts[name])
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ArtifactError(f"{path}: part {name!r} is not valid JSON ({e})") from None
        if not isinstance(doc, dict):
            raise ArtifactError(f"{path}: part {name!r} is a JSON {type(doc).__name__}, expected an "
                                "object")
        for k, types in keys.items():
            if not isinstance(doc.get(k), types):
                raise ArtifactError(f"{path}: part {name!r} lacks {k!r} or it is not a "
                                    f"{types[0].__name__}")
        if name == "graph.json" and doc.get("format") != GRAPH_FORMAT:
            raise ArtifactError(f"{path}: part 'graph.json' has graph format "
                                f"{doc.get('format')!r}, this lumc reads {GRAPH_FORMAT!r}")
    if "consts.npz" in parts:
        import numpy as np
        try:
            with np.load(io.BytesIO(parts["consts.npz"]), allow_pickle=False) as z:
                z.files  # noqa: B018  (np.load of a non-npz returns an array: no .files)
        except (AttributeError, OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise ArtifactError(f"{path}: part 'consts.npz' is not a readable .npz archive "
                                f"({type(e).__name__})") from None


def load_artifact(path: str | os.PathLike, lumc_version: str) -> tuple[dict, dict[str, bytes]]:
    """Read and verify an artifact.

    Returns:
        ``(manifest, parts)``.
    Raises:
        ArtifactError: a missing, truncated, corrupt or foreign file, a malformed manifest, a part
            whose hash does not match or that its reader could not parse (naming the part), or an
            artifact from another lumc version.
    """
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such artifact")
    if path.is_dir():
        raise ArtifactError(f"{path}: is a directory, not a .lumc artifact")
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if MANIFEST not in names:
                raise ArtifactError(f"{path}: damaged .lumc artifact or another zip archive (no "
                                    f"{MANIFEST}; truncated?)")
            try:
                manifest = json.loads(z.read(MANIFEST))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ArtifactError(f"{path}: part {MANIFEST!r} is not valid JSON ({e})") from None
            if not isinstance(manifest, dict):
                raise ArtifactError(f"{path}: part {MANIFEST!r} is a JSON {type(manifest).__name__}, "
                                    "expected an object")
            if manifest.get("format") != FORMAT:
                raise ArtifactError(f"{path}: artifact format {manifest.get('format')!r}, "
                                    f"this lumc reads {FORMAT!r}")
            listed = manifest.get("parts")
            if not isinstance(listed, dict) or not all(
                    isinstance(k, str) and isinstance(h, str) for k, h in listed.items()):
                raise ArtifactError(f"{path}: part {MANIFEST!r} has no valid 'parts' table "
                                    "(name -> sha256)")
            parts = {}
            for k, h in listed.items():
                if k not in names:
                    raise ArtifactError(f"{path}: artifact is missing its part {k!r}")
                data = z.read(k)
                if hashlib.sha256(data).hexdigest() != h:
                    raise ArtifactError(f"{path}: part {k!r} is corrupt (hash mismatch)")
                parts[k] = data
    except ArtifactError:
        raise
    except zipfile.BadZipFile as e:
        raise ArtifactError(f"{path}: damaged .lumc artifact (truncated or not a zip archive: "
                            f"{e})") from None
    except (zlib.error, KeyError, OSError, EOFError, ValueError, TypeError, RuntimeError,
            NotImplementedError) as e:
        raise ArtifactError(f"{path}: damaged .lumc artifact ({type(e).__name__}: {e})") from None
    if manifest.get("lumc_version") != lumc_version:
        raise ArtifactError(f"{path}: compiled by lumc {manifest.get('lumc_version')}, this is lumc "
                            f"{lumc_version}; recompile the model")
    _check_parts(path, parts)
    return manifest, parts
