"""The schema of an artifact's JSON parts, checked on load before any reader touches them.

A ``.lumc`` manifest's hashes are not signed, so a hostile artifact may carry any JSON with
matching hashes. :func:`check_json_part` parses a part with a bounded nesting depth and checks
every key a reader of lumc uses (``lumc.compiler.runtime.compiled.load``, ``CompiledModel.report``,
``lumc inspect``, ``lumc run``) against the type that reader expects, so a wrong type is one
:class:`~lumc.ir.errors.ArtifactError` naming the part and the key, never a ``TypeError`` later.
Nothing here recurses on the document: the depth check and the walk are iterative.
"""
from __future__ import annotations

import json

from lumc.ir.errors import ArtifactError

MAX_JSON_DEPTH = 64   # lumc writes at most ~6 levels (report -> per_kernel -> [i] -> config -> ...)

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))

# part -> {key: (accepted types, required)}; nested tables for list items / dict values below
_TOP: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "manifest.json": {"format": ((str,), True), "lumc_version": ((str,), True),
                      "created": (NUM, False), "parts": ((dict,), True)},
    "graph.json": {"format": ((str,), True), "nodes": ((list,), True), "inputs": ((dict,), True),
                   "outputs": ((dict,), True), "origins": ((dict,), False)},
    "plan.json": {"device": ((str,), True), "simulated": ((bool,), True), "calls": ((list,), True),
                  "outputs": ((dict,), True), "label": ((str,), False)},
    "report.json": {
        "model": ((str,), False), "device": ((str,), False), "simulated": ((bool,), False),
        "budget_s": (OPT_NUM, False), "compile_s": (OPT_NUM, False),
        "stopped_because": (OPT_STR, False), "kernels": (OPT_INT, False),
        "best_time_s": (OPT_NUM, False), "bound_time_s": (OPT_NUM, False),
        "bytes_moved": (OPT_NUM, False), "ideal_bytes": (OPT_NUM, False),
        "workspace_bytes": (OPT_NUM, False),
        "candidates_total": (OPT_INT, False), "candidates_pruned": (OPT_INT, False),
        "candidates_compiled": (OPT_INT, False), "candidates_timed": (OPT_INT, False),
        "candidates_rejected": (OPT_INT, False), "programs": (OPT_INT, False),
        "programs_pruned": (OPT_INT, False), "distinct_kernels": (OPT_INT, False),
        "kernel_configs": (OPT_INT, False), "configs_pruned": (OPT_INT, False),
        "configs_from_db": (OPT_INT, False), "max_rel_error": (OPT_NUM, False),
        "checked_after_budget": (OPT_INT, False),
        "egraph": ((dict,), False), "warnings": ((list,), False), "log": ((list,), False),
        "per_kernel": ((list,), False), "inputs": ((dict,), False), "outputs": ((dict,), False),
        "stage_seconds": ((dict,), False), "form_counts": ((dict,), False),
        "eager_check": ((dict,), False)},
}
_PLAN_CALL = {"form": ((str,), True), "attrs": ((list,), True), "covers": ((list,), True),
              "meaning": ((str,), True), "meaning_consts": ((str,), True),
              "inputs": ((list,), True), "outputs": ((list,), True),
              "config": ((dict, type(None)), True)}    # None: no config applies (CPU-run kernel)
_GRAPH_NODE = {"op": ((str,), True), "srcs": ((list,), True), "arg": ((dict, type(None)), True)}
_PER_KERNEL = {"form": ((str,), True), "impl": ((str,), False), "time_s": (OPT_NUM, False), "bound_s": (NUM, True),
               "flops": (NUM, True), "bytes": (NUM, True), "pct_of_bound": (OPT_NUM, False),
               "config": ((dict, type(None)), False), "kernel": ((str,), False),
               "covers": ((list,), False), "arithmetic_intensity": (OPT_NUM, False),
               "workspace_bytes": (OPT_NUM, False)}


def _type_names(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false",
             list: "a list", dict: "an object", type(None): "null"}
    if float in types:
        types = tuple(t for t in types if t is not int)
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _is(value, types: tuple[type, ...]) -> bool:
    # JSON true/false are Python bools, which are ints: a bool is a number only where bool is asked
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _check_table(where: str, doc, table: dict) -> None:
    if not isinstance(doc, dict):
        raise ArtifactError(f"{where} is a JSON {_json_kind(doc)}, expected an object")
    for key, (types, required) in table.items():
        if key not in doc:
            if required:
                raise ArtifactError(f"{where} lacks {key!r}")
            continue
        if not _is(doc[key], types):
            raise ArtifactError(f"{where}: {key!r} is a JSON {_json_kind(doc[key])}, expected "
                                f"{_type_names(types)}")


def _json_kind(v) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _items(where: str, seq: list, table: dict) -> None:
    for i, item in enumerate(seq):
        _check_table(f"{where}[{i}]", item, table)


def _int_list(where: str, seq) -> None:
    if not isinstance(seq, list) or not all(_is(x, (int,)) and x >= 0 for x in seq):
        raise ArtifactError(f"{where} is not a list of non-negative integers")


def json_depth(doc) -> int:
    """How deep ``doc`` (parsed JSON) nests lists and objects; iterative, so any depth is safe."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            d += 1
            deepest = max(deepest, d)
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_json_part(artifact: str, name: str, data: bytes) -> dict:
    """Parse and check one JSON part of an artifact.

    Args:
        artifact: the artifact path (for messages).
        name: the member name (``manifest.json``, ``graph.json``, ``plan.json``, ``report.json``).
        data: the member's bytes (already size-capped by the reader).
    Returns:
        the parsed document (a dict whose keys have the types their readers expect).
    Raises:
        ArtifactError: not UTF-8 JSON, nested deeper than :data:`MAX_JSON_DEPTH`, not an object,
            or a key missing or of the wrong type (naming the part and the key).
    """
    where = f"{artifact}: part {name!r}"
    too_deep = f"{where} nests JSON deeper than {MAX_JSON_DEPTH} levels"
    try:
        doc = json.loads(data)
    except RecursionError:     # the C scanner recurses once per level and stops at the limit
        raise ArtifactError(too_deep) from None
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ArtifactError(f"{where} is not valid JSON ({first})") from None
    if json_depth(doc) > MAX_JSON_DEPTH:
        raise ArtifactError(too_deep)
    _check_table(where, doc, _TOP.get(name, {}))
    if name == "manifest.json":
        if not all(isinstance(k, str) and isinstance(h, str) for k, h in doc["parts"].items()):
            raise ArtifactError(f"{where} has no valid 'parts' table (name -> sha256)")
    elif name == "graph.json":
        _items(f"{where}: nodes", doc["nodes"], _GRAPH_NODE)
        for i, n in enumerate(doc["nodes"]):
            _int_list(f"{where}: nodes[{i}].srcs", n["srcs"])
            if any(s >= i for s in n["srcs"]):
                raise ArtifactError(f"{where}: nodes[{i}].srcs names a later node (a graph is "
                                    "stored sources first)")
        for key in ("inputs", "outputs"):
            if not all(_is(v, (int,)) and 0 <= v < len(doc["nodes"]) for v in doc[key].values()):
                raise ArtifactError(f"{where}: {key!r} must map names to node positions")
    elif name == "plan.json":
        _items(f"{where}: calls", doc["calls"], _PLAN_CALL)
        for i, c in enumerate(doc["calls"]):
            _int_list(f"{where}: calls[{i}].inputs", c["inputs"])
            _int_list(f"{where}: calls[{i}].outputs", c["outputs"])
            if not all(isinstance(a, list) and len(a) == 2 and isinstance(a[0], str)
                       for a in c["attrs"]):
                raise ArtifactError(f"{where}: calls[{i}].attrs is not a list of [name, value]")
            if c["config"] is not None and not all(isinstance(k, str) for k in c["config"]):
                raise ArtifactError(f"{where}: calls[{i}].config has a non-string key")
        if not all(_is(v, (int,)) and v >= 0 for v in doc["outputs"].values()):
            raise ArtifactError(f"{where}: 'outputs' must map names to node positions")
    elif name == "report.json":
        _items(f"{where}: per_kernel", doc.get("per_kernel", []), _PER_KERNEL)
        for key in ("inputs", "outputs"):
            for k, v in doc.get(key, {}).items():
                if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], list)
                        and isinstance(v[1], str)):
                    raise ArtifactError(f"{where}: {key}[{k!r}] is not [shape, dtype]")
        if not all(_is(v, OPT_NUM) for v in doc.get("stage_seconds", {}).values()):
            raise ArtifactError(f"{where}: 'stage_seconds' must map stages to seconds")
    return doc
