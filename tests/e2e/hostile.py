"""Hostile inputs built from scratch: artifacts, ONNX models and tuning databases that a careless or
hostile user could hand to lumc. Shared by the robustness tests and the fuzz test."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile


def artifact_parts(path) -> tuple[dict, dict[str, bytes]]:
    """``(manifest, parts)`` of a real artifact, read without lumc's checks."""
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    return json.loads(parts.pop("manifest.json")), parts


def write_artifact(path, manifest: dict, parts: dict[str, bytes], *, rehash: bool = True,
                   deflate: tuple[str, ...] = ()) -> None:
    """Write ``parts`` as an artifact with a manifest whose hashes match (``rehash``): what a
    hostile author can always do, since the hashes are not signed."""
    m = json.loads(json.dumps(manifest))
    if rehash:
        m["parts"] = {k: hashlib.sha256(v).hexdigest() for k, v in parts.items()}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("manifest.json", json.dumps(m))
        for k, v in parts.items():
            kind = zipfile.ZIP_DEFLATED if (k.endswith(".json") or k in deflate) else zipfile.ZIP_STORED
            z.writestr(k, v, compress_type=kind)


def zip_bomb_member(path, name: str, size: int, *, manifest: dict | None = None,
                    parts: dict[str, bytes] | None = None, level: int = 9) -> None:
    """An artifact whose member ``name`` inflates to ``size`` zero bytes (written in 1 MiB chunks;
    the file itself is about ``size / 1000`` bytes). Its manifest hash is right."""
    parts = dict(parts or {})
    h = hashlib.sha256()
    chunk = bytes(1 << 20)
    for _ in range(size // len(chunk)):
        h.update(chunk)
    m = json.loads(json.dumps(manifest or {"format": "lumc-artifact/1", "lumc_version": "0"}))
    m["parts"] = {k: hashlib.sha256(v).hexdigest() for k, v in parts.items()}
    m["parts"][name] = h.hexdigest()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level) as z:
        z.writestr("manifest.json", json.dumps(m))
        for k, v in parts.items():
            if k != name:
                z.writestr(k, v)
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as f:
            for _ in range(size // len(chunk)):
                f.write(chunk)


def nested_json(depth: int) -> bytes:
    """``{"a": [[[...]]]}`` nested ``depth`` lists deep."""
    return b'{"a": ' + b"[" * depth + b"]" * depth + b"}"


def npz_bytes(arrays: dict) -> bytes:
    import numpy as np
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def one_line_error(res, *words):
    """A click result that is exit 2 with exactly one stderr line ``lumc: error: ...`` naming each
    of ``words``, no traceback and no exception other than SystemExit; returns the line."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("lumc: error: "), lines[0]
    assert "Traceback" not in res.output and "allow_pickle" not in lines[0]
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit)
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def lumc_cli(*args):
    """``lumc ARGS`` in-process (click's runner); arguments may be paths or numbers."""
    from click.testing import CliRunner
    from lumc.compiler.tools.cli import cli
    return CliRunner().invoke(cli, [str(a) for a in args])
