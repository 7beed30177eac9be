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
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

from lumc.ir.errors import ArtifactError

FORMAT = "lumc-artifact/1"
MANIFEST = "manifest.json"


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
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


def load_artifact(path: str | os.PathLike, lumc_version: str) -> tuple[dict, dict[str, bytes]]:
    """Read and verify an artifact.

    Returns:
        ``(manifest, parts)``.
    Raises:
        ArtifactError: a missing, truncated, corrupt or foreign file, a part whose hash does not
            match, or an artifact from another lumc version.
    """
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such artifact")
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if MANIFEST not in names:
                raise ArtifactError(f"{path}: not a lumc artifact (no {MANIFEST})")
            manifest = json.loads(z.read(MANIFEST))
            if manifest.get("format") != FORMAT:
                raise ArtifactError(f"{path}: artifact format {manifest.get('format')!r}, "
                                    f"this lumc reads {FORMAT!r}")
            parts = {}
            for k, h in manifest["parts"].items():
                if k not in names:
                    raise ArtifactError(f"{path}: artifact is missing its part {k!r}")
                data = z.read(k)
                if hashlib.sha256(data).hexdigest() != h:
                    raise ArtifactError(f"{path}: part {k!r} is corrupt (hash mismatch)")
                parts[k] = data
    except ArtifactError:
        raise
    except (zipfile.BadZipFile, zlib.error, json.JSONDecodeError, KeyError, OSError, EOFError,
            ValueError, TypeError) as e:
        raise ArtifactError(f"{path}: not a readable lumc artifact ({type(e).__name__}: {e})") from None
    if manifest.get("lumc_version") != lumc_version:
        raise ArtifactError(f"{path}: compiled by lumc {manifest.get('lumc_version')}, this is lumc "
                            f"{lumc_version}; recompile the model")
    return manifest, parts
