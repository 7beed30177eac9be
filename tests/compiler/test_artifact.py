"""Artifact files: round trip, atomic writes, and one clear error for every kind of damage."""
import hashlib
import json
import os
import stat
import zipfile

import pytest

from lumc.compiler.runtime.artifact import (OutputError, check_writable, load_artifact, looks_like_artifact,
                                    refuse_same_file, save_artifact, write_atomic)
from lumc.ir.errors import ArtifactError, LumcError


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


# ---- where and how outputs are written --------------------------------------------------------

@pytest.mark.parametrize("name", ["b" * 245 + ".lumc", "\u00fc" * 120 + ".npz", "c" * 255])
def test_a_long_name_the_folder_takes_is_written(tmp_path, name):
    """The temporary file's name is the target's plus 15 bytes: a name of 241 to 255 bytes, which
    the folder takes, was refused ('cannot create a file in ... (File name too long)')."""
    p = tmp_path / name
    check_writable(p)
    write_atomic(p, b"one")
    write_atomic(p, b"two")
    assert p.read_bytes() == b"two"
    assert [f.name for f in tmp_path.iterdir()] == [name]       # no temp file left behind


def test_write_follows_a_symlink_and_keeps_it(tmp_path):
    real, link = tmp_path / "real.bin", tmp_path / "link.bin"
    link.symlink_to(real)
    write_atomic(link, b"one")
    write_atomic(link, b"two")
    assert link.is_symlink() and real.read_bytes() == b"two"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["link.bin", "real.bin"]


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_write_refuses_special_files(tmp_path, kind):
    p = tmp_path / "special"
    os.mkfifo(p) if kind == "fifo" else p.mkdir()
    for target in (p, tmp_path / "link"):
        if target != p:
            target.symlink_to(p)
        with pytest.raises(OutputError) as e:
            write_atomic(target, b"data")
        assert "not a regular file" in str(e.value) and "\n" not in str(e.value)
    assert stat.S_ISFIFO(p.stat().st_mode) if kind == "fifo" else p.is_dir()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["link", "special"]


def test_new_files_follow_the_umask_and_replaced_ones_keep_their_mode(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "new.bin", b"x")
        assert stat.S_IMODE((tmp_path / "new.bin").stat().st_mode) == 0o640
        kept = tmp_path / "kept.bin"
        kept.write_bytes(b"old")
        kept.chmod(0o604)
        write_atomic(kept, b"new")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o604 and kept.read_bytes() == b"new"
    finally:
        os.umask(old)


def test_missing_folders_are_created_and_unwritable_ones_are_output_errors(tmp_path):
    write_atomic(tmp_path / "a" / "b" / "c.bin", b"x")
    assert (tmp_path / "a" / "b" / "c.bin").read_bytes() == b"x"
    (tmp_path / "file").write_bytes(b"not a folder")
    bad = [tmp_path / "file" / "x.bin"] + (["/proc/x.lumc"] if os.path.isdir("/proc/self") else [])
    for p in bad:
        with pytest.raises(OutputError) as e:
            write_atomic(p, b"x")
        assert isinstance(e.value, OSError) and isinstance(e.value, LumcError)   # both, on purpose
        assert str(p) in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(OutputError):
            check_writable(p)
        with pytest.raises(OutputError):
            save_artifact(p, {"plan.json": PLAN}, "0.1.0")


def test_check_writable_has_no_side_effects(tmp_path):
    check_writable(tmp_path / "new" / "deeper" / "x.bin")    # missing folders are fine...
    check_writable(tmp_path / "x.bin")
    assert list(tmp_path.iterdir()) == []                       # ...and nothing is left behind


def test_refuse_same_file(tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(b"model")
    (tmp_path / "alias.onnx").symlink_to(src)
    os.link(src, tmp_path / "hard.onnx")
    for same in (src, tmp_path / "alias.onnx", tmp_path / "hard.onnx", tmp_path / "." / "m.onnx"):
        with pytest.raises(OutputError, match="is the model"):
            refuse_same_file(same, src, "the model")
    refuse_same_file(tmp_path / "m.lumc", src, "the model")     # another file: fine


# ---- damaged parts are named -----------------------------------------------------------------

def _doctor(src, dst, part, data):
    """Copy an artifact replacing ``part`` by ``data`` with a matching hash in the manifest (so only
    the part's content is wrong), or replacing the manifest itself."""
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[part] = data
    if part != "manifest.json":
        man = json.loads(members["manifest.json"])
        man["parts"][part] = hashlib.sha256(data).hexdigest()
        members["manifest.json"] = json.dumps(man).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)


GOOD_PARTS = {"plan.json": PLAN, "report.json": b"{}",
              "graph.json": b'{"format": "lumc-graph/1", "nodes": [], "inputs": {}, "outputs": {}}'}


@pytest.mark.parametrize("part,data,words", [
    ("manifest.json", b"[1]", ["'manifest.json'", "list"]),
    ("manifest.json", b'{"format": "lumc-artifact/1", "parts": [1]}', ["'manifest.json'", "parts"]),
    ("manifest.json", b"\xff\xfe", ["'manifest.json'", "not valid JSON"]),
    ("report.json", b"[1]", ["'report.json'", "list"]),
    ("plan.json", b"[1]", ["'plan.json'", "list"]),
    ("plan.json", b'{"device": "sim:h200", "calls": [], "outputs": {}}', ["'plan.json'", "simulated"]),
    ("graph.json", b"{garbage", ["'graph.json'", "not valid JSON"]),
    ("graph.json", b'{"format": "x", "nodes": [], "inputs": {}, "outputs": {}}', ["'graph.json'", "format"]),
    ("consts.npz", b"garbage", ["'consts.npz'", "npz"]),
])
def test_malformed_parts_are_named(tmp_path, part, data, words):
    import io

    import numpy as np
    buf = io.BytesIO()
    np.savez(buf, c0=np.zeros(2, np.float32))
    good = tmp_path / "good.lumc"
    save_artifact(good, {**GOOD_PARTS, "consts.npz": buf.getvalue()}, "0.1.0")
    load_artifact(good, "0.1.0")
    bad = tmp_path / "bad.lumc"
    _doctor(good, bad, part, data)
    with pytest.raises(ArtifactError) as e:
        load_artifact(bad, "0.1.0")
    assert "\n" not in str(e.value) and "bad.lumc" in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_looks_like_artifact(tmp_path):
    art = tmp_path / "a.lumc"
    save_artifact(art, {"plan.json": PLAN}, "0.1.0")
    trunc = tmp_path / "t.bin"
    trunc.write_bytes(art.read_bytes()[:50])
    onnx_named_lumc = tmp_path / "m.lumc"
    onnx_named_lumc.write_bytes(b"\x08\x08\x12\x04test")    # ir_version first, as ONNX writes it
    garbage_lumc = tmp_path / "g.lumc"
    garbage_lumc.write_bytes(b"\x00garbage")
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"\x08\x08\x12\x04test")
    assert looks_like_artifact(art) and looks_like_artifact(trunc) and looks_like_artifact(garbage_lumc)
    assert not looks_like_artifact(onnx_named_lumc) and not looks_like_artifact(onnx_file)
    with pytest.raises(ArtifactError, match="damaged .lumc artifact"):
        load_artifact(trunc, "0.1.0")


def test_outputs_never_alias_the_callers_inputs_or_each_other(tmp_path):
    """Graph outputs that are an input, a view of one (Squeeze) or one value under two names came
    back as the caller's own array or views of it (and as one array twice): writing into an output
    changed the caller's input and the other output. onnxruntime returns fresh arrays; so does lumc."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    import lumc
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    f32 = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Squeeze", ["x"], ["sq"]),
                           helper.make_node("Relu", ["x"], ["y"]),
                           helper.make_node("Identity", ["y"], ["z"])], "g",
                          [vi("x", f32, [1, 2, 1, 3])],
                          [vi("x", f32, [1, 2, 1, 3]), vi("sq", f32, [2, 3]),
                           vi("y", f32, [1, 2, 1, 3]), vi("z", f32, [1, 2, 1, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    f = lumc.compile(m.SerializeToString(), budget="20s", device="sim:h200",
                     db=TuningDatabase(tmp_path / "t.sqlite"))
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 1, 3) - 2
    keep = x.copy()
    xo, sq, y, z = f(x)
    xo[...] = 100
    np.testing.assert_array_equal(x, keep)
    sq[...] = 200       # a view of the input came back read-only
    y[...] = 300
    np.testing.assert_array_equal(x, keep)
    np.testing.assert_array_equal(z, np.maximum(keep, 0))
    out = f.run({"x": x})
    out["x"][...] = 7
    np.testing.assert_array_equal(x, keep)


def test_outputs_viewing_a_value_are_writeable(tmp_path):
    """A Reshape of a value returned before the value, and a Slice of a row sum no kernel copies
    out, were served as read-only views of the value's buffer (``apply_view``): writing into the
    output raised 'assignment destination is read-only', and a torch caller got a tensor over a
    read-only array. onnxruntime returns writeable arrays; so does lumc."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import lumc
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    f32 = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    c = [numpy_helper.from_array(np.array(v, dtype=np.int64), n)
         for n, v in (("flat", [-1]), ("s", [0]), ("e", [1]), ("ax", [0]), ("last", [-1]))]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
                           helper.make_node("Reshape", ["y", "flat"], ["yf"]),
                           helper.make_node("ReduceSum", ["x", "last"], ["r"], keepdims=0),
                           helper.make_node("Slice", ["r", "s", "e", "ax"], ["r0"])], "g",
                          [vi("x", f32, [4, 8])],
                          [vi("yf", f32, [32]), vi("y", f32, [4, 8]), vi("r0", f32, [1])], c)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    f = lumc.compile(m.SerializeToString(), budget="20s", device="sim:h200",
                     db=TuningDatabase(tmp_path / "t.sqlite"))
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    for out in (f(x), tuple(f.run({"x": x}).values())):
        yf, y, r0 = out
        np.testing.assert_array_equal(yf, np.maximum(x, 0).reshape(-1))
        np.testing.assert_allclose(r0, x.sum(-1)[:1], rtol=1e-5)
        yf[...] = 7
        r0[...] = 7
        np.testing.assert_array_equal(y, np.maximum(x, 0))


@pytest.mark.parametrize("kind", ["meta", "sparse", "qint8"])
def test_a_torch_input_without_readable_data_is_an_input_error(tmp_path, monkeypatch, kind):
    """A meta, sparse or quantized tensor given to a compiled model (ONNX or torch module) raised
    torch's NotImplementedError/TypeError from deep in the conversion; it is one InputError naming
    the input."""
    import numpy as np
    import torch
    from onnx import TensorProto, helper
    import lumc
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    db = TuningDatabase(tmp_path / "t.sqlite")
    f = lumc.compile(m.SerializeToString(), budget="20s", device="sim:h200", db=db)
    x = torch.randn(2, 3)
    t = {"meta": lambda: x.to("meta"), "sparse": x.to_sparse,
         "qint8": lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)}[kind]()
    with pytest.raises(lumc.InputError, match="input 'x' is a .* tensor .* cannot be read"):
        f(t)
    mod = torch.nn.ReLU()
    h = lumc.compile(mod, budget="20s", device="sim:h200", example_inputs=(x,))
    with pytest.raises(lumc.InputError, match="tensor .* cannot be read"):
        h(t)
    np.testing.assert_array_equal(h(x).numpy(), mod(x).numpy())


def test_an_input_of_a_non_numeric_dtype_names_its_dtype(tmp_path):
    """A complex (or string) array was refused as 'input 'x' is a ndarray, not a numeric array',
    which says nothing of what is wrong with it; the message names its dtype and the compiled one."""
    import numpy as np
    from onnx import TensorProto, helper
    import lumc
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    f = lumc.compile(m.SerializeToString(), budget="20s", device="sim:h200",
                     db=TuningDatabase(tmp_path / "t.sqlite"))
    with pytest.raises(lumc.InputError) as e:
        f(np.zeros((2, 3), np.complex64))
    assert str(e.value).endswith("input 'x' has dtype complex64, not a number type lumc runs; "
                                 "compiled for float32")
