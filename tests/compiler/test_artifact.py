"""Artifact files: round trip, atomic writes, and one clear error for every kind of damage."""
import os
import zipfile

import pytest

from lumc.compiler.artifact import load_artifact, save_artifact, write_atomic
from lumc.ir.errors import ArtifactError


PLAN = b'{"device": "sim:h200", "simulated": true, "calls": [], "outputs": {}}'


def test_roundtrip(tmp_path):
    p = tmp_path / "m.lumc"
    given = {"plan.json": PLAN, "notes.bin": b"\x00\x01"}
    h = save_artifact(p, given, "0.1.0")
    manifest, parts = load_artifact(p, "0.1.0")
    assert parts == given and len(h) == 64


@pytest.mark.parametrize("damage", ["truncate", "garbage", "foreign_zip", "flip_part", "version", "missing"])
def test_damaged_artifacts(tmp_path, damage):
    p = tmp_path / "m.lumc"
    save_artifact(p, {"plan.json": b'{"kernels": []}' * 50}, "0.1.0")
    version = "0.1.0"
    if damage == "truncate":
        p.write_bytes(p.read_bytes()[:40])
    elif damage == "garbage":
        p.write_bytes(os.urandom(500))
    elif damage == "foreign_zip":
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("hello.txt", "hi")
    elif damage == "flip_part":
        with zipfile.ZipFile(p) as z:
            members = {n: z.read(n) for n in z.namelist()}
        members["plan.json"] = members["plan.json"].replace(b"kernels", b"kernelz")
        with zipfile.ZipFile(p, "w") as z:
            for n, d in members.items():
                z.writestr(n, d)
    elif damage == "version":
        version = "9.9.9"
    elif damage == "missing":
        p = tmp_path / "nope.lumc"
    with pytest.raises(ArtifactError) as e:
        load_artifact(p, version)
    assert "\n" not in str(e.value)


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "out.bin"
    write_atomic(p, b"old")


    with pytest.raises(TypeError):
        write_atomic(p, None)        # fails while writing
    assert p.read_bytes() == b"old"
    assert [f.name for f in tmp_path.iterdir()] == ["out.bin"]   # no temp file left behind
