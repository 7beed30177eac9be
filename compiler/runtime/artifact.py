"""Artifacts: a compiled model saved as one self-contained ``.lumc`` file.

A ``.lumc`` file is a zip archive:

* ``manifest.json`` — ``{"format": "lumc-artifact/1", "lumc_version", "created", "parts":
  {name: sha256}}``; every other member is listed with its hash and checked on load;
* ``graph.json`` + ``consts.npz`` — the primitive graph with its weights (``lumc.ir.serialize``);
  a weight that is one of ``source.onnx``'s initializers byte for byte is stored there only, by
  name (``lumc.compiler.runtime.source_refs``);
* ``plan.json`` — the chosen program: kernels (form, covered nodes by position, config), the device
  and whether its times were simulated;
* ``report.json`` — the compile report;
* ``source.onnx`` — the source model, so ``lumc run ART --check`` runs onnxruntime without the
  original file;
* ``structure.json`` — a torch module's output structure (``lumc.compiler.runtime.out_structure``),
  so ``lumc.load`` returns what the module returns.

Writes are atomic (a temporary file in the same folder, then ``os.replace``): an interrupted save
leaves the previous file untouched and no partial file behind.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import secrets
import stat
import time
import zipfile
import zlib
from pathlib import Path

from lumc.compiler.runtime.temp_files import sweep_stale_temps, temp_prefix
from lumc.ir.errors import ArtifactError, InputError, LumcError
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


def refuse_unregular_input(path: str, what: str, kind: str) -> None:
    """Refuse an input path that is not a regular file before opening it: a FIFO nobody writes
    blocked ``np.load`` forever, a device (``/dev/zero``) was read without end.

    Raises:
        InputError: naming the option, the path and what it is.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{what}: {path}: no such file") from None
    except OSError as err:
        raise InputError(f"{what}: cannot read {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what}: {path} is {_kind(st.st_mode)}, not {kind} (a regular file)")


def names_a_folder(path: str | os.PathLike) -> bool:
    """Whether the text of ``path`` ends in a path separator (``out/``): a folder, never a file
    to write (``pathlib.Path`` and ``realpath`` drop the separator)."""
    text = os.fspath(path)
    return isinstance(text, str) and text.endswith((os.sep, os.altsep or os.sep))


def output_target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` replaces: ``path`` with symlinks resolved (a dangling link
    names the file to create).

    Raises:
        OutputError: the target exists and is not a regular file (a device, FIFO, directory), or
            ``path`` ends in a separator (it names a folder).
    """
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise OutputError(f"cannot write {path!r}: expected a file path (a str or pathlib.Path), "
                          f"got a {type(path).__name__}")
    if not os.fspath(path):
        raise OutputError("cannot write to an empty path: name the output file")
    if names_a_folder(path):    # realpath drops the slash: 'out/' wrote a file named 'out'
        raise OutputError(f"cannot write {os.fspath(path)}: it ends in '/', which names a folder; "
                          "give a file name in it")
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


def model_files(model, what: str = "the model") -> list[tuple[str, str]]:
    """``(path, what)`` for each file a model given by path is made of, for
    :func:`refuse_same_file`: the file itself and, for an ONNX model saved with external data,
    every data file it names (its weights, beside it: ``-o model.data`` replaced them with the
    artifact). A model that is not a path, or a file that is no readable ONNX model (an artifact,
    a damaged file), is just itself."""
    if not isinstance(model, (str, os.PathLike)):
        return []
    files = [(os.fspath(model), what)]
    try:
        if looks_like_artifact(model):
            return files
        with open(model, "rb") as f:
            src = f.read()
    except OSError:
        return files
    if b"location" not in src:          # no external data entry can be in the file
        return files
    try:
        import onnx
        from lumc.compiler.runtime.onnx_files import external_data_locations
        names = external_data_locations(onnx.load_from_string(src))
    except Exception:                   # not an ONNX model: the frontend says what is wrong
        return files
    base = os.path.dirname(os.fspath(model))
    return files + [(os.path.join(base, n), f"{os.fspath(model)}'s external data file")
                    for n in names]


def refuse_source_files(out: str | os.PathLike, sources) -> None:
    """:func:`refuse_same_file` for each ``(path, what)`` of ``sources`` (:func:`model_files`)."""
    for src, what in sources:
        refuse_same_file(out, src, what)


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
    sweep_stale_temps(parent, _temp_stem(target))    # a compile killed writing it left them
    try:
        fd, tmp = _create_temp(target)
    except OSError as e:
        raise OutputError(f"cannot write {os.fspath(path)}: cannot create a file in "
                          f"{target.parent} ({e.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


_TEMP_NAME_BYTES = 200    # of the target's name in its temporary file's (NAME_MAX is 255)


def _temp_stem(target: Path) -> str:
    # the temporary name takes at most 26 bytes more than the target's (``.NAME.PID-XXXXXXXX.tmp``):
    # a long name (a file name may have 255 bytes) is cut, or a name the folder takes was refused
    # as 'File name too long'
    return target.name.encode()[:_TEMP_NAME_BYTES].decode(errors="ignore")


def _create_temp(target: Path) -> tuple[int, str]:
    # O_EXCL with mode 0666: the umask applies, as for any file a shell creates (mkstemp gives 0600)
    name = _temp_stem(target)
    for _ in range(100):
        tmp = os.path.join(target.parent, f"{temp_prefix(name)}{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                           0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {target}")


def strict_json(doc) -> bytes:
    """``doc`` as strict JSON (RFC 8259), indented, newline-terminated: a non-finite float (an
    infinite error or ratio, a NaN) is written as ``null``, never as ``Infinity`` or ``NaN``, which
    ``JSON.parse``, ``jq`` and CI tools refuse; other non-JSON values by ``str``."""
    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return v
    return (json.dumps(finite(doc), indent=1, default=str, allow_nan=False) + "\n").encode()


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + ``os.replace``).

    A symlink is followed and the file it points to replaced; missing folders are created; a new
    file gets mode ``0666 & ~umask``, a replaced one keeps its mode. On any failure (or Ctrl-C) the
    previous file is untouched and no temporary file is left; one a killed write of the same
    target left is removed (``temp_files.sweep_stale_temps``).

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
    sweep_stale_temps(target.parent, _temp_stem(target))    # what a killed write left
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
    data, digest = artifact_bytes(parts, lumc_version)
    write_atomic(path, data)
    return digest


def artifact_bytes(parts: dict[str, bytes], lumc_version: str) -> tuple[bytes, str]:
    """The bytes of the artifact holding ``parts`` and its hash (what :func:`save_artifact`
    writes; a pickled compiled model is these bytes, read back by :func:`load_artifact`)."""
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
    return buf.getvalue(), artifact_hash(manifest)


def artifact_hash(manifest: dict) -> str:
    """A stable hash of an artifact's content (its parts' hashes; not its creation time)."""
    return hashlib.sha256(json.dumps(manifest["parts"], sort_keys=True).encode()).hexdigest()


PYTORCH_HINT = ("load the module in Python and compile it with lumc.compile(module, "
                "example_inputs=...), or export it to ONNX (torch.onnx.export)")


def pytorch_archive(src) -> str | None:
    """``"torch.save"``, ``"torch.export.save"`` or ``"torch.jit.save"`` where ``src`` (a path, the
    file's bytes or its member names) is a zip archive PyTorch wrote (told by its member names: the zip directory
    alone is read), else None. Such a file is neither an ONNX model nor a ``.lumc`` artifact,
    which are also zips, and was called one."""
    if isinstance(src, list):       # the member names, read already
        names = src
    else:
        try:
            with zipfile.ZipFile(io.BytesIO(src) if isinstance(src, (bytes, bytearray))
                                 else src) as z:
                names = z.namelist()
        except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, NotImplementedError,
                EOFError, OverflowError):
            return None
    if MANIFEST in names:
        return None
    base = {n.rsplit("/", 1)[-1] for n in names}
    if "archive_format" in base or any(n.endswith("/models/model.json") for n in names):
        return "torch.export.save"
    if "constants.pkl" in base:
        return "torch.jit.save"
    if "data.pkl" in base:
        return "torch.save"
    return None


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


# Member caps (bytes, uncompressed), checked against the zip directory before anything is inflated.
# lumc deflates only its JSON parts; graph and plan of a GPT-2-sized model are a few MB, so these
# caps leave two orders of magnitude of room and still bound a zip bomb's memory.
MAX_JSON_BYTES = {MANIFEST: 1 << 20, "report.json": 16 << 20, "graph.json": 128 << 20,
                  "plan.json": 128 << 20, "structure.json": 16 << 20}
MAX_INFLATION = 32   # a compressed non-JSON member may inflate at most 32x (floats barely compress)
_CHUNK = 1 << 20


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (``sysconf``), or None where it is not known."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _member_cap(info: zipfile.ZipInfo) -> int:
    """The most bytes member ``info`` may hold uncompressed (see :data:`MAX_JSON_BYTES`)."""
    base = part_basename(info.filename)
    if base in MAX_JSON_BYTES:
        return MAX_JSON_BYTES[base]
    if info.compress_type == zipfile.ZIP_STORED:
        return info.compress_size
    return max(_CHUNK, MAX_INFLATION * info.compress_size)


def _check_sizes(path: Path, infos: list[zipfile.ZipInfo], file_size: int) -> None:
    """Refuse, from the zip directory alone, members larger than their cap or than memory."""
    total = 0
    for info in infos:
        cap = _member_cap(info)
        if info.file_size > cap:
            raise ArtifactError(f"{path}: part {info.filename!r} claims {info.file_size} bytes "
                                f"uncompressed, more than the {cap} a lumc artifact allows "
                                "(a zip bomb?)")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size > file_size:
            raise ArtifactError(f"{path}: part {info.filename!r} is larger than the file "
                                "(truncated?)")
        total += info.file_size
    mem = memory_bytes()
    if mem is not None and total > mem // 2:
        raise ArtifactError(f"{path}: its parts need {total} bytes, more than half of this "
                            f"machine's {mem} bytes of memory")


def _open_regular(path: Path):
    """Open ``path`` for reading only if it is a regular file (never blocks on a FIFO, never
    reads a device: a link to /dev/zero is refused, not read)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such artifact") from None
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"{path}: is {_kind(st.st_mode)}, not a .lumc artifact (a regular "
                            "file)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read it ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):    # replaced between stat and open
        os.close(fd)
        raise ArtifactError(f"{path}: is {_kind(st.st_mode)}, not a .lumc artifact")
    return os.fdopen(fd, "rb"), st.st_size


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, want: str) -> bytes | None:
    """The member's bytes if their sha256 is ``want``, else None. A compressed member is hashed
    in a first streaming pass and kept only when it matches; zipfile never reads past the
    declared size."""
    h = hashlib.sha256()
    keep = info.compress_type == zipfile.ZIP_STORED
    chunks = []
    with z.open(info) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if keep:
                chunks.append(chunk)
    if h.hexdigest() != want:
        return None
    if keep:
        return b"".join(chunks)
    return z.read(info)


def check_npz(path: Path, data: bytes, part: str = "consts.npz") -> None:
    """``consts.npz`` is itself a zip of ``.npy`` members: cap each as above and check that every
    array header's shape fits the bytes its member holds, before numpy allocates it.

    Raises:
        ArtifactError: naming ``part``.
    """
    import numpy as np
    bad = f"{path}: part {part!r} is not a readable .npz archive"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
            _check_sizes(path, infos, len(data))
            for info in infos:
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                    if dtype.hasobject:
                        raise ArtifactError(f"{bad} (member {info.filename!r} holds Python "
                                            "objects; lumc never unpickles)")
                    need = dtype.itemsize
                    for d in shape:
                        need *= int(d)
                    if need > info.file_size:
                        raise ArtifactError(f"{bad} (member {info.filename!r} declares shape "
                                            f"{tuple(shape)} but holds {info.file_size} bytes)")
    except ArtifactError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, zlib.error, TypeError,
            NotImplementedError, RuntimeError, OverflowError) as e:
        raise ArtifactError(f"{bad} ({type(e).__name__})") from None


def part_basename(name: str) -> str:
    """The part kind of member ``name``: a variant's parts live under ``v0/``, ``v1/``... (see
    ``lumc.compiler.runtime.variants``) and are capped and checked like the top-level ones."""
    return name.rsplit("/", 1)[-1]


def _check_parts(path: Path, parts: dict[str, bytes]) -> dict[str, dict]:
    """Each known part (at the top level or under a variant's prefix) is readable and has the
    shape its reader expects (names the part); returns the parsed JSON parts by member name."""
    from lumc.compiler.runtime.artifact_schema import check_json_part
    docs = {}
    for name, data in parts.items():
        base = part_basename(name)
        if base in ("graph.json", "plan.json", "report.json"):
            docs[name] = check_json_part(str(path), name if base == name else base, data)
            if base == "graph.json" and docs[name].get("format") != GRAPH_FORMAT:
                raise ArtifactError(f"{path}: part {name!r} has graph format "
                                    f"{docs[name].get('format')!r}, this lumc reads "
                                    f"{GRAPH_FORMAT!r}")
        elif base == "consts.npz":
            check_npz(path, data, name)
    return docs


def load_artifact(path: str | os.PathLike, lumc_version: str,
                  data: bytes | None = None) -> tuple[dict, dict[str, bytes]]:
    """Read and verify an artifact (the file ``path``, or ``data``: its bytes, ``path`` then only
    naming it in errors).

    Only a regular file is read (a FIFO, device or directory is refused without reading); every
    member's uncompressed size is capped from the zip directory before it is inflated
    (:data:`MAX_JSON_BYTES`, :data:`MAX_INFLATION`, half the machine's memory in all); hashes are
    computed while streaming; every JSON part is schema-checked
    (:func:`lumc.compiler.runtime.artifact_schema.check_json_part`).

    Returns:
        ``(manifest, parts)``.
    Raises:
        ArtifactError: a missing, truncated, corrupt or foreign file, a malformed manifest, an
            oversized member, a part whose hash does not match or that its reader could not parse
            (naming the part), or an artifact from another lumc version.
    """
    from lumc.compiler.runtime.artifact_schema import check_json_part
    path = Path(path)
    f, file_size = _open_regular(path) if data is None else (io.BytesIO(data), len(data))
    try:
        with f, zipfile.ZipFile(f) as z:
            infos = {i.filename: i for i in z.infolist()}
            if MANIFEST not in infos:
                kind = pytorch_archive(list(infos))
                if kind:
                    raise ArtifactError(f"{path}: a PyTorch file ({kind}), not a .lumc artifact "
                                        f"or an ONNX model; {PYTORCH_HINT}")
                raise ArtifactError(f"{path}: damaged .lumc artifact or another zip archive (no "
                                    f"{MANIFEST}; truncated?)")
            _check_sizes(path, list(infos.values()), file_size)
            manifest = check_json_part(str(path), MANIFEST, z.read(MANIFEST))
            if manifest.get("format") != FORMAT:
                raise ArtifactError(f"{path}: artifact format {manifest.get('format')!r}, "
                                    f"this lumc reads {FORMAT!r}")
            parts = {}
            for k, h in manifest["parts"].items():
                if k not in infos:
                    raise ArtifactError(f"{path}: artifact is missing its part {k!r}")
                data = _read_member(z, infos[k], h)
                if data is None:
                    raise ArtifactError(f"{path}: part {k!r} is corrupt (hash mismatch)")
                parts[k] = data
    except ArtifactError:
        raise
    except zipfile.BadZipFile as e:
        if data is None and not looks_like_artifact(path):   # an ONNX model, another file
            raise ArtifactError(f"{path}: not a .lumc artifact; compile the model first "
                                "(lumc.compile(MODEL, budget=...), or lumc compile MODEL -o "
                                "OUT.lumc)") from None
        raise ArtifactError(f"{path}: damaged .lumc artifact (truncated or not a zip archive: "
                            f"{e})") from None
    except (zlib.error, KeyError, OSError, EOFError, ValueError, TypeError, RuntimeError,
            NotImplementedError, OverflowError) as e:
        raise ArtifactError(f"{path}: damaged .lumc artifact ({type(e).__name__}: {e})") from None
    if manifest.get("lumc_version") != lumc_version:
        raise ArtifactError(f"{path}: compiled by lumc {manifest.get('lumc_version')}, this is lumc "
                            f"{lumc_version}; recompile the model")
    _check_parts(path, parts)
    return manifest, parts
