"""Comparing a bench against a baseline: the kernel-speed regression check of ``lumc bench --compare``.

Rules:

* A baseline is refused (:class:`BaselineMismatchError`, one line) when it is not a bench document,
  when it is malformed (a missing or mistyped field, a time or size that is not a finite number
  >= 0, a kernel row given twice), when it was measured on another device (GPU index aside), or
  when it belongs to another model (another source sha256) or to other input shapes.
* Kernels are matched by kernel hash (the k-th launch of a hash in the baseline with the k-th in this
  run); those left over are matched by position and form (the same kernel slot whose code changed);
  the rest are reported as ``missing`` (baseline only) or ``new`` (this run only), never an error.
* A figure regresses when ``now / baseline > 1 + threshold``. Compared: each kernel's time, the
  end-to-end time, the bytes moved and the kernel count (on a simulated device all deterministic).
  A measured time must also be slower by more than :data:`NOISE_FLOOR_S`.
* Precision: a baseline whose ``precision`` or ``weights`` differ from this run's (or that predates
  those fields: ``unknown``) times other arithmetic, so the run fails as a regression does (the
  summary says so) unless the caller accepts it (``lumc bench --allow-precision-change``).
* Noise: a suspected time regression is re-measured (the ``remeasure`` callback, with more repeats)
  before it fails the run; the lower of the two medians counts. On a simulated device re-measuring
  gives the same figure, so a suspected regression there is a real one.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lumc.compiler.tools.bench import BENCH_FORMAT, BenchError, device_key
from lumc.ir.errors import LumcError

NOISE_FLOOR_S = 0.5e-6   # a measured kernel must be this much slower too: CUDA-event jitter on Hopper


class BaselineMismatchError(LumcError):
    """The baseline is from another device, model or input shapes, or is not a bench document."""


def parse_threshold(text: str) -> float:
    """``"5%"`` -> 0.05; a bare fraction below 1 (``"0.05"``) is taken as is.

    Raises:
        LumcError: anything else (negative, ``banana``, ``5`` without ``%``).
    """
    s = str(text).strip()
    try:
        v = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
    except ValueError:
        v = -1.0
    if not (0.0 <= v < 1.0 or s.endswith("%") and v >= 0.0):
        raise LumcError(f"--max-regression {text!r}: expected a percentage like 5% (or a fraction "
                        "like 0.05)")
    return v


def load_baseline(path) -> dict:
    """Read a bench JSON document.

    Raises:
        BaselineMismatchError: missing file, not JSON, or not a ``lumc bench`` document.
    """
    p = Path(path)
    if not p.is_file():
        raise BaselineMismatchError(f"baseline {path}: no such file" if not os.path.exists(p) else
                                    f"baseline {path}: not a regular file (a FIFO, device or "
                                    "folder is never read)")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        from lumc.compiler.runtime.artifact import looks_like_artifact
        if looks_like_artifact(p):      # the artifact itself, not its bench document
            raise BaselineMismatchError(
                f"baseline {path} is a compiled .lumc artifact, not a bench document; write "
                f"one with lumc bench {path} --json BASELINE.json and compare with that") from None
        raise BaselineMismatchError(f"baseline {path}: not a JSON file ({type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != BENCH_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise BaselineMismatchError(f"baseline {path}: not a lumc bench document (format {got!r}, "
                                    f"expected {BENCH_FORMAT!r}); write one with lumc bench --json")
    for key in ("device", "model", "kernels", "end_to_end"):
        if key not in doc:
            raise BaselineMismatchError(f"baseline {path}: bench document lacks {key!r}")
    problem = bench_doc_problem(doc)
    if problem:
        raise BaselineMismatchError(f"baseline {path} is malformed: {problem}")
    return doc


def _amount(v) -> bool:
    """A finite number >= 0 (not a bool, not NaN)."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0)


def _show(v) -> str:
    """A value as it reads in the JSON file (null, NaN, "fast"), cut to 40 characters."""
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def bench_doc_problem(doc: dict) -> str | None:
    """What is wrong with a bench document's fields a comparison reads, or None.

    Checked: ``device`` a string; ``precision`` and ``weights`` strings or absent; ``model`` an
    object with string ``sha256`` and ``inputs`` ``{name: [shape, dtype]}``; ``kernels`` a list of objects, each with a unique integer
    ``index``, string ``kernel`` and ``form``, a finite ``time_s`` >= 0 and a ``config`` object or
    null; ``end_to_end`` an object whose ``time_s``, ``bytes_moved`` and ``kernel_count`` are finite
    numbers >= 0.
    """
    if not isinstance(doc.get("device"), str) or not doc["device"]:
        return f"'device' is {_show(doc.get('device'))}, expected a device name"
    for f in ("precision", "weights"):
        if doc.get(f) is not None and not isinstance(doc[f], str):
            return f"'{f}' is {_show(doc[f])}, expected a name such as fp32 or same (or null)"
    m = doc.get("model")
    if not isinstance(m, dict):
        return f"'model' is {_show(m)}, expected an object with name, sha256 and inputs"
    if not isinstance(m.get("sha256"), str):
        return f"'model' has no sha256 string (got {_show(m.get('sha256'))})"
    inputs = m.get("inputs")
    if not isinstance(inputs, dict) or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], list)
            and all(isinstance(d, int) and not isinstance(d, bool) for d in v[0])
            and isinstance(v[1], str) for v in inputs.values()):
        return "'model.inputs' is not {name: [shape, dtype]}"
    ks = doc.get("kernels")
    if not isinstance(ks, list):
        return f"'kernels' is a {type(ks).__name__}, expected a list of kernel rows"
    seen: set[int] = set()
    for pos, k in enumerate(ks):
        if not isinstance(k, dict):
            return f"kernel row {pos} is {_show(k)}, expected an object"
        idx = k.get("index")
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            return f"kernel row {pos} has index {_show(idx)}, expected an integer >= 0"
        if idx in seen:
            return f"kernel row #{idx} appears twice"
        seen.add(idx)
        for f in ("kernel", "form"):
            if not isinstance(k.get(f), str):
                return f"kernel row #{idx} lacks {f!r} (or it is not a string)"
        if "time_s" not in k:
            return f"kernel row #{idx} lacks 'time_s'"
        if not _amount(k["time_s"]):
            return f"kernel row #{idx} has time_s {_show(k['time_s'])}, expected a finite number of " \
                   "seconds >= 0"
        if k.get("config") is not None and not isinstance(k["config"], dict):
            return f"kernel row #{idx} has config {_show(k['config'])}, expected an object or null"
    e = doc.get("end_to_end")
    if not isinstance(e, dict):
        return f"'end_to_end' is {_show(e)}, expected an object"
    for f in ("time_s", "bytes_moved", "kernel_count"):
        if f not in e:
            return f"'end_to_end' lacks {f!r}"
        if not _amount(e[f]):
            return f"end_to_end {f} is {_show(e[f])}, expected a finite number >= 0"
    return None


def check_comparable(base: dict, now: dict, name: str = "baseline") -> None:
    """Refuse a baseline from another device, model or input shapes.

    Raises:
        BaselineMismatchError: one line naming both sides.
    """
    if device_key(base["device"]) != device_key(now["device"]):
        raise BaselineMismatchError(
            f"{name} was measured on {base['device']}, this run is on {now['device']}: a baseline "
            "only compares on the same device; refresh it there (lumc bench --json)")
    bm, nm = base["model"], now["model"]
    if bm.get("sha256") != nm.get("sha256"):
        raise BaselineMismatchError(
            f"{name} is for another model ({bm.get('name')}, sha256 {str(bm.get('sha256'))[:12]}), "
            f"this is {nm.get('name')} (sha256 {str(nm.get('sha256'))[:12]})")
    if bm.get("inputs") != nm.get("inputs"):
        def fmt(m):
            return ", ".join(f"{k}={'x'.join(map(str, v[0]))}" for k, v in (m.get("inputs") or {}).items())
        raise BaselineMismatchError(f"{name} is for inputs {fmt(bm)}, this run has {fmt(nm)}")


@dataclass
class Row:
    """One compared figure."""
    label: str
    metric: str                    # "time", "bytes" or "count"
    baseline: float | None
    now: float | None
    status: str = "ok"             # ok, improved, REGRESSION, noise, missing, new
    note: str = ""
    index: int | None = None       # kernel index in this run (for re-measuring)
    first: float | None = None     # the first measurement, when re-measured

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.now is None:
            return None
        if self.baseline == 0:
            return 1.0 if self.now == 0 else float("inf")
        return self.now / self.baseline


@dataclass
class Comparison:
    """The outcome: every row, and whether any figure regressed beyond the threshold."""
    rows: list[Row]
    threshold: float
    simulated: bool
    notes: list[str] = field(default_factory=list)
    precision_change: str | None = None    # :func:`precision_change`'s line, when they differ
    precision_allowed: bool = False        # ... and the caller accepted it

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.status == "REGRESSION"]

    @property
    def ok(self) -> bool:
        return not self.regressions and (self.precision_change is None or self.precision_allowed)

    def table(self) -> str:
        """kernel | baseline | now | ratio | status, then one summary line."""
        def fmt(v, metric):
            if v is None:
                return "-"
            if metric == "time":
                return f"{v * 1e6:.2f} us"
            if metric == "bytes":
                return f"{v / 1e6:.3f} MB"
            return f"{int(v)}"
        w = max([len(r.label) for r in self.rows] + [6])
        lines = [f"{'kernel':<{w}}  {'baseline':>12}  {'now':>12}  {'ratio':>7}  status"]
        for r in self.rows:
            ratio = f"{r.ratio:6.2f}x" if r.ratio is not None and r.ratio != float("inf") else (
                "    inf" if r.ratio == float("inf") else "      -")
            extra = f"  ({r.note})" if r.note else ""
            lines.append(f"{r.label:<{w}}  {fmt(r.baseline, r.metric):>12}  {fmt(r.now, r.metric):>12}"
                         f"  {ratio}  {r.status}{extra}")
        pct = f"{100 * self.threshold:g}%"
        if self.regressions:
            names = ", ".join(r.label for r in self.regressions[:6])
            more = f" and {len(self.regressions) - 6} more" if len(self.regressions) > 6 else ""
            lines.append(f"compare: {len(self.regressions)} regression(s) over {pct}: {names}{more}")
        elif self.ok:
            lines.append(f"compare: ok, nothing slower than the baseline by more than {pct}")
        if self.precision_change is not None:
            lines.append(self.precision_change + (
                " (accepted: --allow-precision-change)" if self.precision_allowed else
                "\ncompare: FAILED: not like for like; refresh the baseline (lumc bench --json) "
                "or pass --allow-precision-change to compare anyway"))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def match_kernels(base: list[dict], now: list[dict]) -> list[tuple[dict | None, dict | None, str]]:
    """Pair kernel rows: by kernel hash (k-th launch with k-th launch), then by position and form.

    Returns ``(baseline row or None, this run's row or None, how)`` with ``how`` one of ``hash``,
    ``position``, ``missing``, ``new``; in this run's launch order, missing ones last.
    """
    by_hash: dict[str, list[dict]] = {}
    for b in base:
        by_hash.setdefault(b["kernel"], []).append(b)
    pairs: dict[int, tuple[dict, str]] = {}
    used: set[int] = set()
    for n in now:
        lst = by_hash.get(n["kernel"])
        if lst:
            b = lst.pop(0)
            pairs[n["index"]] = (b, "hash")
            used.add(b["index"])
    base_at = {b["index"]: b for b in base}
    for n in now:
        if n["index"] in pairs:
            continue
        b = base_at.get(n["index"])
        if b is not None and b["index"] not in used and b["form"] == n["form"]:
            pairs[n["index"]] = (b, "position")
            used.add(b["index"])
    out: list[tuple[dict | None, dict | None, str]] = []
    for n in now:
        if n["index"] in pairs:
            b, how = pairs[n["index"]]
            out.append((b, n, how))
        else:
            out.append((None, n, "new"))
    out += [(b, None, "missing") for b in base if b["index"] not in used]
    return out


def precision_change(base: dict, now: dict) -> str | None:
    """``precision differs: baseline fp32 (weights same), this bf16 (weights same): times are not
    like for like`` when the two bench documents' ``precision`` or ``weights`` differ, or ``...
    unknown`` when a document lacks them (written by a lumc that did not record them), else None."""
    def side(d):
        return (d.get("precision") or "unknown", d.get("weights") or "unknown")
    b, n = side(base), side(now)
    if b == n and "unknown" not in b:
        return None
    if "unknown" in b + n:
        what, tail = "precision unknown", "times may not be like for like"
    else:
        what = {(True, False): "precision differs", (False, True): "weights differ"}.get(
            (b[0] != n[0], b[1] != n[1]), "precision and weights differ")
        tail = "times are not like for like"
    return f"{what}: baseline {b[0]} (weights {b[1]}), this {n[0]} (weights {n[1]}): {tail}"


def _judge(row: Row, threshold: float, floor: float) -> None:
    r = row.ratio
    if r is None:
        return
    if r > 1.0 + threshold and (row.metric != "time" or row.now - row.baseline > floor):
        row.status = "REGRESSION"
    elif r < 1.0 - threshold:
        row.status = "improved"
    else:
        row.status = "ok"


def compare_docs(base: dict, now: dict, threshold: float,
                 remeasure: Callable[[list[int], bool], dict] | None = None,
                 name: str = "baseline", allow_precision_change: bool = False) -> Comparison:
    """Compare two bench documents (see the module docstring).

    Args:
        base: the baseline document; now: this run's.
        threshold: the allowed slowdown as a fraction (0.05 for 5%).
        remeasure: ``(kernel indices, whole model?) -> {"kernels": {index: seconds}, "model":
            seconds or None}`` re-times suspected regressions; None judges on the first measurement.
        allow_precision_change: a baseline at another precision or weights (or an unknown one)
            is compared without failing (:func:`precision_change`; the line is printed either way).
    Raises:
        BaselineMismatchError: another device, model or input shapes.
    """
    check_comparable(base, now, name)
    simulated = bool(now.get("simulated"))
    floor = 0.0 if simulated else NOISE_FLOOR_S
    rows: list[Row] = []
    for b, n, how in match_kernels(base["kernels"], now["kernels"]):
        ref = n or b
        label = f"#{ref['index']} {ref['form']} {ref['kernel'][:8]}"
        if how == "missing":
            rows.append(Row(label, "time", b["time_s"], None, "missing", "in the baseline only"))
            continue
        if how == "new":
            rows.append(Row(label, "time", None, n["time_s"], "new", "not in the baseline",
                            index=n["index"]))
            continue
        note = "" if how == "hash" else f"matched by position; was {b['kernel'][:8]}"
        if how == "hash" and b["index"] != n["index"]:
            note = f"was #{b['index']}"
        if b.get("config") != n.get("config"):   # same code, another tile/warp choice
            changed = sorted(k for k in set(b.get("config") or {}) | set(n.get("config") or {})
                             if (b.get("config") or {}).get(k) != (n.get("config") or {}).get(k))
            note = (note + "; " if note else "") + "config changed: " + ", ".join(
                f"{k} {(b.get('config') or {}).get(k)}->{(n.get('config') or {}).get(k)}" for k in changed)
        row = Row(label, "time", b["time_s"], n["time_s"], note=note, index=n["index"])
        _judge(row, threshold, floor)
        rows.append(row)
    be, ne = base["end_to_end"], now["end_to_end"]
    model_rows = [Row("end to end", "time", be["time_s"], ne["time_s"]),
                  Row("bytes moved", "bytes", be["bytes_moved"], ne["bytes_moved"]),
                  Row("kernel count", "count", be["kernel_count"], ne["kernel_count"])]
    for r in model_rows:
        _judge(r, threshold, floor)
    rows += model_rows
    cmp = Comparison(rows, threshold, simulated, precision_change=precision_change(base, now),
                     precision_allowed=allow_precision_change)
    suspects = [r for r in rows if r.status == "REGRESSION" and r.metric == "time"]
    if suspects and remeasure is not None:
        idx = [r.index for r in suspects if r.index is not None]
        again = remeasure(idx, any(r.label == "end to end" for r in suspects))
        for r in suspects:
            t = again.get("model") if r.label == "end to end" else again.get("kernels", {}).get(r.index)
            if t is None:
                continue
            r.first = r.now
            r.now = min(r.now, t)
            _judge(r, threshold, floor)
            if r.status != "REGRESSION":
                r.status = "noise"
                r.note = (r.note + "; " if r.note else "") + \
                    f"first {r.first * 1e6:.2f} us, re-measured {t * 1e6:.2f} us"
        cmp.notes.append(f"re-measured {len(suspects)} suspected regression(s)"
                         + (" (simulated: deterministic, so the figures stand)" if simulated else ""))
    missing = sum(r.status == "missing" for r in rows)
    new = sum(r.status == "new" for r in rows)
    if missing or new:
        cmp.notes.append(f"{missing} kernel(s) only in the baseline, {new} only in this run "
                         "(reported, not failed: the end-to-end figures cover them)")
    if base.get("versions") != now.get("versions"):
        bv, nv = base.get("versions") or {}, now.get("versions") or {}
        diff = ", ".join(f"{k} {bv.get(k)} -> {nv.get(k)}" for k in sorted(set(bv) | set(nv))
                         if bv.get(k) != nv.get(k))
        cmp.notes.append(f"versions differ from the baseline: {diff}")
    return cmp


def scale_times(doc: dict, factor: float) -> dict:
    """A copy of a bench document with every time multiplied by ``factor`` (for tests and what-ifs)."""
    out = json.loads(json.dumps(doc))
    for k in out["kernels"]:
        for f in ("time_s", "min_s", "max_s"):
            if k.get(f) is not None:
                k[f] *= factor
    for f in ("time_s", "min_s", "max_s"):
        if out["end_to_end"].get(f) is not None:
            out["end_to_end"][f] *= factor
    return out


__all__ = ["BaselineMismatchError", "BenchError", "Comparison", "Row", "bench_doc_problem",
           "check_comparable", "compare_docs", "load_baseline", "match_kernels", "parse_threshold",
           "precision_change", "scale_times"]
