"""E-graph candidates carried to a machine without egglog (the GPU image of ``make gpu-check``).

egglog is not installed where the GPU is (its wheel alone is 48.6 MB, beyond what a device session
carries), and without it a compile searches only the greedy program. So the e-graph runs on a CPU
machine, and what it decided travels as data: for each candidate program, the decoded graph the
e-graph chose (its rewritten expressions: attention, layer norm and horizontal forms), the form
records, and the fusion flags (``+norm-prologue``, ``+norm-on-load``, ``+kv-prologue``,
``+attention``, ``+mlp``, ``+rows``). The machine with the GPU rebuilds each program with the same
greedy fusion (:func:`lumc.compiler.core.fusion.greedy_program`, pure Python) and searches them as
if its own e-graph had produced them.

The file holds no weights. Leaves are bound on the receiving machine:

* inputs by name (shape and dtype checked);
* constants by content (:func:`const_digest`: dtype, shape and bytes), among the model graph's own
  constants and those :func:`~lumc.compiler.core.constfold.fold_constants` derives from them (the
  e-graph reads the folded graph: transposed weights, folded scales);
* a horizontally concatenated weight (``rewrites.horizontal.decode_hcat``) by its recipe: the two
  nodes it concatenates, rebuilt and concatenated again;
* small constants (scalars, short tables, up to :data:`INLINE_BYTES`) by value.

A candidate with a leaf that cannot be bound (another model, other weights) is dropped, and a file
whose inputs, outputs and weights do not match the graph is not used: the compile falls back to
the greedy program and its report says why. Nothing carried is trusted beyond that: every kernel of
a carried program is checked against the receiving machine's reference run like any other.

Writing: a compile with ``LUMC_CARRY_CANDIDATES_TO=DIR`` (``make gpu-candidates``) writes
``DIR/<model>-<signature>.json`` (+ ``.npz`` of the inline constants) after its e-graph stage.
Reading: a compile with ``LUMC_CARRIED_CANDIDATES=DIR`` where egglog is missing uses the matching
file, if any.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path

import numpy as np

from lumc.ir.graph import Graph, Node, input_node
from lumc.ir.serialize import graph_from_bytes, graph_to_bytes

from lumc.compiler.core.constfold import fold_constants
from lumc.compiler.core.extract import FormRecord
from lumc.compiler.core.fusion import greedy_program
from lumc.compiler.runtime.artifact import write_atomic
from lumc.compiler.runtime.program import Program
from lumc.ir.provenance import rebuilt

FORMAT = "lumc-carried-candidates/1"
WRITE_ENV = "LUMC_CARRY_CANDIDATES_TO"
READ_ENV = "LUMC_CARRIED_CANDIDATES"
INLINE_BYTES = 1 << 16      # constants up to this size travel by value
WEIGHT_BYTES = 1 << 10      # constants from this size on are the model's weights (the signature)

_DIGESTS: "weakref.WeakKeyDictionary[Node, str]" = weakref.WeakKeyDictionary()


def const_digest(n: Node) -> str:
    """Content hash of a constant node: dtype, shape and bytes (cached per node)."""
    d = _DIGESTS.get(n)
    if d is None:
        v = np.ascontiguousarray(n.arg.value)
        h = hashlib.sha256(f"{n.dtype.name}{tuple(n.shape)}".encode())
        h.update(v.tobytes())
        d = _DIGESTS[n] = h.hexdigest()[:32]
    return d


def graph_signature(graph: Graph) -> dict:
    """What a carried file must match: inputs and outputs (names, shapes, dtypes) and a digest of
    the model's weights (its constants of :data:`WEIGHT_BYTES` or more, in any order)."""
    weights = sorted(const_digest(n) for n in graph.nodes()
                     if n.op == "Constant" and n.nbytes >= WEIGHT_BYTES)
    return {"inputs": {k: [list(n.shape), n.dtype.name] for k, n in graph.inputs.items()},
            "outputs": {k: [list(n.shape), n.dtype.name] for k, n in graph.outputs.items()},
            "weights": hashlib.sha256("".join(weights).encode()).hexdigest()[:32]}


def _local_constants(graph: Graph) -> dict[str, Node]:
    """``{digest: node}`` of the graph's constants and of its folded graph's."""
    out = {}
    for g in (graph, fold_constants(graph, {})):
        for n in g.nodes():
            if n.op == "Constant" and n.nbytes > INLINE_BYTES:
                out.setdefault(const_digest(n), n)
    return out


def _rebuild(n: Node, memo: dict[int, Node], leaf) -> Node:
    """``n`` with every leaf replaced by ``leaf(n)`` (or kept when it returns None), iteratively."""
    stack = [n]
    while stack:
        x = stack[-1]
        if id(x) in memo:
            stack.pop()
            continue
        if not x.srcs:
            got = leaf(x)
            memo[id(x)] = x if got is None else got
            stack.pop()
            continue
        todo = [s for s in x.srcs if id(s) not in memo]
        if todo:
            stack.extend(todo)
            continue
        srcs = tuple(memo[id(s)] for s in x.srcs)
        memo[id(x)] = rebuilt(x, srcs)
        stack.pop()
    return memo[id(n)]


def _json_attrs(v):
    if isinstance(v, tuple):
        return {"t": [_json_attrs(x) for x in v]}
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def _from_json_attrs(v):
    if isinstance(v, dict) and "t" in v:
        return tuple(_from_json_attrs(x) for x in v["t"])
    if isinstance(v, list):
        return [_from_json_attrs(x) for x in v]
    return v


def dump(graph: Graph, programs: list[Program], directory: str | Path, name: str,
         stats: dict | None = None) -> Path | None:
    """Write the decoded candidates of ``programs`` (those the e-graph built: their ``decoded``
    attribute) for ``graph`` (the graph the e-graph stage was given); returns the JSON path, or
    None when no candidate is portable. Raises OSError when the directory is not writable."""
    from lumc.rewrites.horizontal import HCAT_SOURCES
    specs = [p for p in programs if getattr(p, "decoded", None) is not None]
    local = _local_constants(graph)
    leaves: dict[str, list] = {}
    placeholders: dict[int, Node] = {}
    roots: list[Node] = []
    extra: list[Node] = []                    # hcat sources, serialized beside the candidates

    def leaf(x: Node):
        if x.op != "Constant" or x.nbytes <= INLINE_BYTES:
            return None
        if id(x) in placeholders:
            return placeholders[id(x)]
        d = const_digest(x)
        if d in local:
            key, how = f"__carry_c_{d}", ["c", d]
        elif x in HCAT_SOURCES:
            a, b = HCAT_SOURCES[x]
            key, how = f"__carry_h_{len(leaves)}", ["h", a, b]
            extra.extend((a, b))
        else:
            raise _Unportable(f"constant {x!r} is neither a model weight nor a concatenation of them")
        leaves[key] = how
        ph = placeholders[id(x)] = input_node(key, x.shape, x.dtype)
        return ph

    memo: dict[int, Node] = {}
    out = []
    for p in specs:
        new, forms, flags = p.decoded
        byid = {id(n): n for n in new.nodes()}
        try:
            outs = {k: _rebuild(v, memo, leaf) for k, v in new.outputs.items()}
            fr = [(_rebuild(byid[rid], memo, leaf), rec, [_rebuild(i, memo, leaf)
                                                          for i in rec.inputs])
                  for rid, rec in forms.items() if rid in byid]
        except _Unportable:
            continue
        out.append((p.label, outs, fr, flags))
    # hcat sources (and theirs) become nodes of the document too
    done = set()
    while extra:
        x = extra.pop()
        if id(x) in done:
            continue
        done.add(id(x))
        try:
            roots.append(_rebuild(x, memo, leaf))
        except _Unportable:
            return None
    for key, how in leaves.items():
        if how[0] == "h":
            how[1], how[2] = memo[id(how[1])], memo[id(how[2])]
    if not out:
        return None
    all_roots: dict[str, Node] = {}
    for i, (_, outs, fr, _) in enumerate(out):
        for k, v in outs.items():
            all_roots[f"o{i}:{k}"] = v
        for j, (r, _, ins) in enumerate(fr):
            all_roots[f"f{i}:{j}"] = r
            for m, x in enumerate(ins):
                all_roots[f"f{i}:{j}:{m}"] = x
    for k, x in enumerate(roots):
        all_roots[f"x{k}"] = x
    for key, how in leaves.items():
        if how[0] == "h":
            all_roots[f"{key}:a"], all_roots[f"{key}:b"] = how[1], how[2]
    phs = {k: v for k, v in ((n.arg.name, n) for n in placeholders.values())}
    doc, npz, index = graph_to_bytes(Graph({**dict(graph.inputs), **phs}, all_roots))
    body = {
        "format": FORMAT, "signature": graph_signature(graph), "name": name,
        "stats": {k: v for k, v in (stats or {}).items() if isinstance(v, (int, float, str))},
        "leaves": {k: (how if how[0] == "c" else ["h", index[id(how[1])], index[id(how[2])]])
                   for k, how in leaves.items()},
        "candidates": [{"label": lab, "flags": list(flags),
                        "outputs": {k: index[id(v)] for k, v in outs.items()},
                        "forms": [[index[id(r)], rec.form, _json_attrs(rec.attrs),
                                   [index[id(x)] for x in ins]] for r, rec, ins in fr]}
                       for lab, outs, fr, flags in out],
        "graph": json.loads(doc)}
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{body['signature']['weights'][:12]}"
    # each file whole or not at all (a temp name of its own, renamed): the weights first, so a
    # .json that names them never meets a half-written .npz
    write_atomic(d / f"{stem}.npz", npz)
    path = d / f"{stem}.json"
    write_atomic(path, json.dumps(body).encode())
    return path


class _Unportable(Exception):
    pass


def load(graph: Graph, directory: str | Path) -> tuple[list[Program], str]:
    """The carried candidates for ``graph`` from ``directory``, rebuilt (see the module
    docstring); ``([], why)`` when no file matches or no candidate binds."""
    sig = graph_signature(graph)
    d = Path(directory)
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    body = None
    for f in files:
        try:
            b = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if b.get("format") == FORMAT and b.get("signature") == sig:
            body, path = b, f
            break
    if body is None:
        return [], f"no carried candidates in {d} match this graph ({len(files)} files)"
    try:
        _, nodes = graph_from_bytes(json.dumps(body["graph"]).encode(),
                                    path.with_suffix(".npz").read_bytes())
    except Exception as e:  # noqa: BLE001 - a broken file is a reason, not a crash
        return [], f"carried candidates {path.name} unreadable: {e}"
    local = _local_constants(graph)
    bound: dict[str, Node] = {}

    def leaf(x: Node):
        if x.op != "Input":
            return None
        name = x.arg.name
        if name in graph.inputs:
            return graph.inputs[name]
        if name in bound:
            return bound[name]
        how = body["leaves"].get(name)
        if how is None:
            raise _Unportable(f"input {name!r} is not an input of this graph")
        if how[0] == "c":
            if how[1] not in local:
                raise _Unportable(f"weight {how[1]} is not in this graph")
            bound[name] = local[how[1]]
        else:
            from lumc.rewrites.horizontal import decode_hcat
            r = decode_hcat(_rebuild(nodes[how[1]], memo, leaf),
                            _rebuild(nodes[how[2]], memo, leaf))
            if r.op == "Cast":           # weights stored narrow: the leaf is the constant
                r = r.srcs[0]
            if r.op != "Constant":
                raise _Unportable(f"concatenation {name} did not fold to a constant here")
            bound[name] = r
        return bound[name]

    memo: dict[int, Node] = {}
    programs, dropped = [], 0
    for c in body["candidates"]:
        try:
            outs = {k: _rebuild(nodes[i], memo, leaf) for k, i in c["outputs"].items()}
            forms = {}
            for r, form, attrs, ins in c["forms"]:
                root = _rebuild(nodes[r], memo, leaf)
                forms[id(root)] = FormRecord(form, _from_json_attrs(attrs),
                                             [_rebuild(nodes[i], memo, leaf) for i in ins])
            # files before +kv-prologue hold 2 flags, before +attention 3, before +mlp 4,
            # before +rows 5
            pro, epi, kv, att, mlp, rows = (list(c["flags"]) + [False] * 4)[:6]
            p = greedy_program(Graph(dict(graph.inputs), outs), label=c["label"], forms=forms,
                               norm_prologue=pro, norm_epilogue=epi, kv_prologue=kv,
                               attention=att, mlp=mlp, rows=rows)
            p.validate()
        except Exception:  # noqa: BLE001 - a candidate that does not bind here is dropped
            dropped += 1
            continue
        programs.append(p)
    if programs and not _computes_the_graph(programs[0], graph):
        return [], (f"carried candidates {path.name} do not compute this graph on a random input "
                    "(the graphs match in inputs, outputs and weights only): not used")
    why = (f"{len(programs)} e-graph candidates carried from {path.name}"
           + (f" ({dropped} did not bind)" if dropped else ""))
    return programs, why


def _computes_the_graph(program: Program, graph: Graph, rtol: float = 1e-3) -> bool:
    """One carried program against the receiving graph on the reference executor, random inputs
    (the candidates come from one e-graph run over one graph: if one computes this graph, they
    all were derived from a graph that does)."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.frontends.models import generic_inputs
    from lumc.compiler.runtime.program import run_program_reference
    feed = generic_inputs({k: n.shape for k, n in graph.inputs.items()},
                          {k: n.dtype.np for k, n in graph.inputs.items()},
                          np.random.default_rng(0))
    want = ReferenceExecutor(graph)(feed)
    got = run_program_reference(program, graph, feed)
    for k, n in graph.outputs.items():
        a, b = np.asarray(got[k], np.float64), np.asarray(want[k], np.float64)
        if a.shape != b.shape:
            return False
        fin = np.isfinite(b)
        if not np.array_equal(fin, np.isfinite(a)):
            return False
        if fin.any() and np.abs(a[fin] - b[fin]).max() > rtol * max(np.abs(b[fin]).max(), 1e-30):
            return False
    return True
