"""Plan reuse: a repeated compile of the same model, shapes, device, versions and options returns
the stored result of the earlier one (``compile_model(reuse_plan=True)``), without re-timing.

Plans live in the tuning database's ``plans_dir`` as ordinary ``.lumc`` artifacts, keyed by a hash
of the model's bytes and everything that changes the result (:func:`_plan_cache_key`).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from lumc.compiler.core.budget import Deadline
from lumc.compiler.runtime.compiled import CompiledModel
from lumc.compiler.runtime.targets import Target


def _plan_cache_key(model, shapes, example_inputs, target: Target, ver: dict, use_egraph: bool,
                    values: bool = False) -> str | None:
    """A key for the compile's result, or None when the model is not given as a file or bytes.
    ``values``: the example inputs' values are part of it too (a reduced precision: its quality
    gate, which decides the plan's precision, runs on them)."""
    extra = b""
    if isinstance(model, (str, os.PathLike)):
        try:
            with open(model, "rb") as f:
                src = f.read()
        except OSError:
            return None
        extra = _external_data_digest(src, os.path.dirname(os.path.abspath(model)))
        if extra is None:
            return None
    elif isinstance(model, (bytes, bytearray)):
        src = bytes(model)
    else:
        try:
            src = model.SerializeToString()
        except AttributeError:
            return None
    h = hashlib.sha256(src)
    h.update(extra)
    shp = {k: list(np.atleast_1d(v).tolist()) for k, v in sorted((shapes or {}).items())}
    ex = {k: [list(np.shape(v))] + ([value_digest(v)] if values else [])
          for k, v in sorted((example_inputs or {}).items())}
    h.update(repr((shp, ex, target.name, sorted(ver.items()), use_egraph)).encode())
    return h.hexdigest()[:32]


def value_digest(v) -> str:
    """An example input's dtype, shape and the sha256 of its bytes."""
    if hasattr(v, "detach"):      # a torch tensor (bf16 has no numpy dtype)
        from lumc.compiler.core.torch_plan_cache import tensor_digest
        return tensor_digest(v)
    a = np.ascontiguousarray(v)
    return f"{a.dtype}{list(a.shape)}:{hashlib.sha256(a.reshape(-1).view(np.uint8)).hexdigest()}"


def _external_data_digest(src: bytes, base: str) -> bytes | None:
    """A hash of the external data files a model file names (its weights, when it was saved with
    ``save_as_external_data``), in name order: they are part of the model as much as the file is
    (new weights in ``model.bin`` beside an unchanged ``model.onnx`` reused the stored plan, with
    the old weights). ``b""`` for a model with none; None when one cannot be read (no reuse)."""
    import onnx
    from lumc.compiler.runtime.onnx_files import external_data_locations
    if b"location" not in src:          # no external data entry can be in the file
        return b""
    try:
        names = external_data_locations(onnx.load_from_string(src))
    except Exception:   # a malformed model: the frontend says what is wrong with it
        return None
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0")
        try:
            with open(os.path.join(base, name), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 24), b""):
                    h.update(chunk)
        except OSError:
            return None
    return h.digest()


def _key_of(path) -> str:
    return path.name.split(".", 1)[0]


def stamp_plan_key(cm: CompiledModel, path) -> None:
    """Record in ``cm``'s report the key of the plan file ``path`` it is about to be stored as:
    :func:`_reuse_plan` uses a stored plan only under its own key."""
    cm._report["plan_key"] = _key_of(path)


def _reuse_plan(path, budget_s: float, deadline: Deadline) -> CompiledModel | None:
    """The stored result of an identical earlier compile, if its search finished (converged or
    exhausted) or had at least this budget; None otherwise (the search then runs, and the tuning
    database still makes every timing it measured free). A plan whose report names another key
    (a file renamed or copied in the cache: another model's plan, returned as this model's) or
    none is not used either."""
    from lumc.compiler.runtime.compiled import load
    from lumc.ir.errors import ArtifactError
    if not path.exists():
        return None
    try:
        cm = load(path)
    except ArtifactError:
        return None                       # unreadable: recompile (and overwrite it)
    if cm._report.get("plan_key") != _key_of(path):
        return None                       # not this key's plan: recompile (and overwrite it)
    try:
        os.utime(path)                    # recently used: the last the plan cache evicts
    except OSError:
        pass
    r = cm._report
    # precision auto: its fp32 plan's search too (a reduced plan kept over an fp32 plan its share
    # of a small budget left untimed is compared again at a larger budget)
    # and a size range's: each bucket's search
    finished = not any(str(why or "").startswith("budget") for why in (
        r.get("stopped_because"), (r.get("auto") or {}).get("fp32_stopped_because"),
        *(v.get("stopped_because") for v in r.get("variants") or ())))
    if not finished and r.get("budget_s", 0) < budget_s:
        return None
    # what the earlier compile did (its workers, its e-graph) stays with it: this one ran neither
    r["reused_plan"] = {"compile_s": r.get("compile_s"), "budget_s": r.get("budget_s"),
                        "stopped_because": r.get("stopped_because"),
                        "workers": r.pop("workers", None), "egraph": r.get("egraph")}
    r["egraph"] = {"used": False, "reused_plan": True}
    r["stopped_because"] = "reused the plan of an identical earlier compile (nothing re-timed)"
    r["budget_s"] = budget_s
    r["compile_s"] = deadline.elapsed()
    r["measured"] = 0
    return cm


def _store_plan(path, cm: CompiledModel) -> None:
    """Store ``cm`` at ``path``; the plan cache then sheds its least recently used plans past
    its size limit (``tuning_db.evict_plans``: ``LUMC_PLAN_CACHE_MB``). A plan that cannot be
    stored (a read-only cache, a file where the plans folder should be) never fails the compile,
    but the compile's notes say so: a recompile would not find it."""
    from lumc.compiler.runtime.tuning_db import evict_plans
    from lumc.ir.errors import ArtifactError
    try:
        stamp_plan_key(cm, path)
        cm.save(path)
        evict_plans(path.parent, path)
    except (OSError, ArtifactError) as e:
        cm._report.setdefault("warnings", []).append(
            f"plan cache: the plan was not stored for reuse in {path.parent} ({type(e).__name__}: "
            f"{' '.join(str(e).split())}); a recompile searches again")
