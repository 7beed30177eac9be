"""Seeded mutations for the fuzz test: real models, small graphs, artifacts and tuning databases.

Each case is ``(kind, source, seed)``; :func:`run_case` builds its hostile input from the seed in
a scratch folder and runs one lumc command on it in-process (click's runner), returning
``(exit_code, stderr, exception_name)``. Everything is deterministic in the seed.
"""
from __future__ import annotations

import json
import os
import random
import sqlite3
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hostile import artifact_parts, nested_json, npz_bytes, write_artifact, zip_bomb_member

# ---- ONNX models ---------------------------------------------------------------------------------


def _attr_drop(m, rng):
    nodes = [n for n in m.graph.node if n.attribute]
    if nodes:
        n = rng.choice(nodes)
        del n.attribute[rng.randrange(len(n.attribute))]


def _attr_garble(m, rng):
    nodes = [n for n in m.graph.node if n.attribute]
    if nodes:
        a = rng.choice(rng.choice(nodes).attribute)
        if a.type == onnx.AttributeProto.INT:
            a.i = rng.choice([-(2 ** 40), -1, 0, 2 ** 31, 10 ** 12])
        elif a.type == onnx.AttributeProto.INTS:
            a.ints[:] = [rng.choice([-7, 0, 99, 2 ** 33]) for _ in range(rng.randint(0, 6))]
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = rng.choice([float("nan"), float("inf"), -1e30, 0.0])
        else:
            a.type = onnx.AttributeProto.STRING
            a.s = b"\xff" * rng.randint(0, 8)


def _extra_input(m, rng):
    n = rng.choice(m.graph.node)
    n.input.append(rng.choice([i for nn in m.graph.node for i in nn.input] or ["x"]))


def _drop_input(m, rng):
    nodes = [n for n in m.graph.node if n.input]
    if nodes:
        n = rng.choice(nodes)
        del n.input[rng.randrange(len(n.input))]


def _dangling_input(m, rng):
    n = rng.choice(m.graph.node)
    if n.input:
        n.input[rng.randrange(len(n.input))] = "no_such_value"


def _op_swap(m, rng):
    rng.choice(m.graph.node).op_type = rng.choice(["Relu", "MatMul", "Gather", "Reshape", "Conv",
                                                   "LSTM", "Frobnicate", "Softmax", "Concat", ""])


def _dim_bad(m, rng):
    vis = [vi for vi in m.graph.input if vi.type.tensor_type.shape.dim]
    if vis:
        d = rng.choice(rng.choice(vis).type.tensor_type.shape.dim)
        d.dim_value = rng.choice([-3, 0, 2 ** 40, 1])


def _versions(m, rng):
    if rng.random() < 0.5:
        m.ir_version = rng.choice([0, -1, 999, 2])
    else:
        m.opset_import[0].version = rng.choice([0, -1, 1, 6, 99])


def _init_damage(m, rng):
    inits = list(m.graph.initializer)
    if not inits:
        return
    t = rng.choice(inits)
    c = rng.random()
    if c < 0.3 and t.raw_data:
        t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data))]
    elif c < 0.55:
        t.data_type = rng.choice([TensorProto.STRING, TensorProto.INT16, TensorProto.COMPLEX64, 99])
    elif c < 0.8:
        t.dims[:] = [rng.choice([-1, 0, 3, 2 ** 31]) for _ in range(rng.randint(0, 4))]
    else:
        m.graph.initializer.remove(t)


def _index_oob(m, rng):
    ints = [t for t in m.graph.initializer if t.data_type == TensorProto.INT64 and t.raw_data]
    if ints:
        t = rng.choice(ints)
        a = numpy_helper.to_array(t).copy()
        if a.size:
            a.flat[rng.randrange(a.size)] = rng.choice([-(2 ** 40), 2 ** 40, 10 ** 6, -10 ** 6])
            t.CopyFrom(numpy_helper.from_array(a, t.name))


def _outputs_bad(m, rng):
    if rng.random() < 0.5 and m.graph.output:
        m.graph.output[0].name = "not_produced"
    else:
        del m.graph.output[:]


def _cycle(m, rng):
    if len(m.graph.node) > 2 and m.graph.node[0].input and m.graph.node[-1].output:
        m.graph.node[0].input[0] = m.graph.node[-1].output[0]


MODEL_MUTATIONS = [_attr_drop, _attr_garble, _extra_input, _drop_input, _dangling_input, _op_swap,
                   _dim_bad, _versions, _init_damage, _index_oob, _outputs_bad, _cycle]


def mutate_model(data: bytes, rng: random.Random) -> bytes:
    """One to three structural mutations, or (one case in five) damaged bytes."""
    if rng.random() < 0.2:
        b = bytearray(data)
        if rng.random() < 0.5:
            return bytes(b[: rng.randrange(1, len(b))])
        for _ in range(rng.randint(1, 16)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    m = onnx.ModelProto()
    m.ParseFromString(data)
    for f in rng.sample(MODEL_MUTATIONS, rng.randint(1, 3)):
        f(m, rng)
    return m.SerializeToString()


def small_graph(rng: random.Random) -> onnx.ModelProto:
    """A random small graph: a chain of 1-40 unary/binary ops, a wide Sum, or a Gather."""
    kind = rng.choice(["chain", "sum", "gather"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rng.randint(1, 5), 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = []
    if kind == "chain":
        nodes, prev = [], "x"
        for i in range(rng.randint(1, 40)):
            op = rng.choice(["Relu", "Neg", "Abs", "Exp", "Tanh", "Add", "Mul"])
            ins = [prev, prev] if op in ("Add", "Mul") else [prev]
            nodes.append(helper.make_node(op, ins, [f"t{i}"]))
            prev = f"t{i}"
        nodes.append(helper.make_node("Identity", [prev], ["y"]))
    elif kind == "sum":
        nodes = [helper.make_node("Sum", ["x"] * rng.randint(1, 300), ["y"])]
    else:
        idx = np.array([rng.randint(-2, 6) for _ in range(3)], np.int64)
        inits = [numpy_helper.from_array(idx, "i")]
        nodes = [helper.make_node("Gather", ["x", "i"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "fuzz", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


# ---- artifacts and databases -----------------------------------------------------------------------


def mutate_artifact(src, out, rng: random.Random, version: str) -> None:
    """A hostile variant of the artifact ``src`` at ``out`` (hashes recomputed unless damaged)."""
    manifest, parts = artifact_parts(src)
    manifest["lumc_version"] = version
    c = rng.randrange(9)
    if c == 0:     # raw byte damage / truncation of the whole file
        b = bytearray(open(src, "rb").read())
        if rng.random() < 0.5:
            b = b[: rng.randrange(len(b))]
        else:
            for _ in range(rng.randint(1, 30)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        open(out, "wb").write(bytes(b))
        return
    if c == 1:     # zip bomb in some member (hash right)
        name = rng.choice(list(parts))
        zip_bomb_member(out, name, rng.choice([64, 300, 1100]) << 20, manifest=manifest, parts=parts)
        return
    name = rng.choice(["graph.json", "plan.json", "report.json", "manifest.json"])
    if c == 2:
        doc = nested_json(rng.choice([70, 5000, 200000]))
    elif c == 3:   # a key of a JSON part gets a value of another type
        d = json.loads(parts.get(name, b"{}")) if name != "manifest.json" else dict(manifest)
        _retype(d, rng)
        doc = json.dumps(d).encode()
    elif c == 4:
        doc = rng.choice([b"[]", b"null", b"\xff\xfe", b"{\"a\": 1", b"1e999999", b"\"x\"" * 3])
    elif c == 5:   # consts.npz with a lying or object header
        arrs = {"c0": np.zeros(rng.choice([0, 3, 10]), np.float32),
                "m0": np.array(["f32", str(rng.choice([3, 10 ** 9, -1]))])}
        if rng.random() < 0.5:
            arrs = {"c0": np.array([1, "a"], dtype=object)}
        parts["consts.npz"] = npz_bytes(arrs) if arrs["c0"].dtype != object else _object_npz()
        write_artifact(out, manifest, parts)
        return
    elif c == 6:   # indices in the plan / graph out of range
        d = json.loads(parts["plan.json"])
        for call in d["calls"]:
            call["inputs"] = [rng.choice([-1, 10 ** 9, 0]) for _ in call["inputs"]]
        parts["plan.json"] = json.dumps(d).encode()
        write_artifact(out, manifest, parts)
        return
    elif c == 7:   # a graph value declared enormous
        d = json.loads(parts["graph.json"])
        for n in d["nodes"]:
            if n["op"] == "Input":
                n["arg"]["shape"] = [2 ** 31, 2 ** 31]
        parts["graph.json"] = json.dumps(d).encode()
        write_artifact(out, manifest, parts)
        return
    else:          # members missing, extra, or the manifest listing something else
        if rng.random() < 0.5 and len(parts) > 1:
            parts.pop(rng.choice(list(parts)))
        manifest["parts"] = {"ghost": "0" * 64}
        write_artifact(out, manifest, parts, rehash=rng.random() < 0.5)
        return
    if name == "manifest.json":
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("manifest.json", doc)
            for k, v in parts.items():
                z.writestr(k, v)
    else:
        parts[name] = doc
        write_artifact(out, manifest, parts)


def _object_npz() -> bytes:
    import io
    buf = io.BytesIO()
    np.savez(buf, c0=np.array([1, "a"], dtype=object))  # pickled: lumc must refuse, not unpickle
    return buf.getvalue()


def _retype(d, rng: random.Random) -> None:
    """Give one key somewhere in ``d`` a value of the wrong JSON type."""
    target = d
    for _ in range(4):
        if isinstance(target, dict) and target:
            k = rng.choice(list(target))
            if isinstance(target[k], (dict, list)) and target[k] and rng.random() < 0.6:
                target = target[k]
                continue
            target[k] = rng.choice(["text", None, 12, [1, 2], {"a": 1}, True, -1e308])
            return
        if isinstance(target, list) and target:
            i = rng.randrange(len(target))
            if isinstance(target[i], (dict, list)) and rng.random() < 0.6:
                target = target[i]
                continue
            target[i] = rng.choice(["text", None, {"x": []}])
            return
        return


def poison_db(path, rng: random.Random) -> None:
    """Rows with text, NULL, negative or NaN-like seconds; or damaged bytes; or a folder."""
    c = rng.randrange(4)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if c == 3:
        os.makedirs(path, exist_ok=True)       # the database path is a folder
        return
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)",
                 (rng.choice(["1", "1", "7", "x"]),))
    conn.execute("""CREATE TABLE IF NOT EXISTS timings (kernel_hash TEXT, config TEXT, device TEXT,
        lumc_version TEXT, triton_version TEXT, driver_version TEXT, seconds REAL, ok INTEGER,
        simulated INTEGER, note TEXT, created REAL, PRIMARY KEY (kernel_hash, config, device,
        lumc_version, triton_version, driver_version))""")
    conn.commit()
    conn.close()
    if c == 2:
        b = bytearray(open(path, "rb").read())
        for _ in range(20):
            b[rng.randrange(100, len(b))] = rng.randrange(256)
        open(path, "wb").write(bytes(b))


def poison_matching_rows(path, rng: random.Random) -> None:
    """Set every stored timing to a value no measurement gives."""
    conn = sqlite3.connect(path)
    conn.execute("UPDATE timings SET seconds = ?", (rng.choice(["fast", None, -8e9, b"\x00"]),))
    conn.commit()
    conn.close()
