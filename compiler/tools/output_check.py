"""``lumc run --check``: judging an output against onnxruntime, and against float64 when they differ.

An element passes when ``|got - ref| <= atol + rtol * |ref|`` (``numpy.isclose``'s and
``torch.testing.assert_close``'s rule), with ``rtol`` and ``atol`` by dtype unless given: a pure
relative tolerance fails correct runs whose outputs sit near 0 (a sigmoid map, a softmax tail),
where both runtimes round to different tiny values. Integers and bools must be equal; NaN must be
at the same positions; equal infinities are exact.

When lumc and onnxruntime disagree beyond that, both are judged against a float64 evaluation of
the same graph (the reference executor in float64): the check says which is closer, and passes
when lumc is within the tolerance of float64 (onnxruntime was the one off), or when neither is
(the output cancels near 0 where its terms do not: a running sum of 40000 floats crossing 0) and
lumc is the closer, within ``rtol`` of float64 relative to the output's largest magnitude, and
each element within ``atol`` plus ``rtol`` times the magnitude of its own sums' terms (float64,
each sum over absolute values, :func:`float64_terms`): an output mixing scales (a long running
sum beside rows of small values) does not lend its largest magnitude to its small elements.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sys

import click
import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import LumcError

# atol by dtype: about 100 ulp of 1.0 for f32, a few ulp for f16/bf16, as torch.testing's defaults
# are in spirit (torch: f32 1e-5, f16 1e-5, bf16 1e-5; ours are looser for the half types, whose
# kernels accumulate in f32 and round once, while onnxruntime rounds every op)
ATOL: dict[str, float] = {"f64": 1e-12, "f32": 1e-5, "f16": 1e-3, "bf16": 1e-2}

_TINY = float(np.finfo(np.float32).tiny)   # floor of the rel-error denominator


@dataclass(frozen=True)
class OutputCheck:
    """One output compared with a reference.

    Attributes:
        max_abs: max |got - ref| over elements (0 for empty outputs).
        max_rel: ``max_abs / max(max |ref|, tiny)``; inf where shapes, dtypes or NaN positions
            differ.
        ok: floats: every element within ``atol + rtol * |ref|``; integers and bools: equal.
        note: why the output failed beyond its numbers, or what the float64 judge said, else "".
        rtol, atol: the tolerances applied (0 for integers and bools).
        excess: max over elements of ``|got - ref| / (atol + rtol * |ref|)`` (<= 1 passes).
    """
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""
    rtol: float = 0.0
    atol: float = 0.0
    excess: float = 0.0


def _dtype_of(dtype: np.dtype) -> dt.DType:
    try:
        return dt.from_numpy(dtype)
    except Exception:   # a dtype lumc does not hold: judge it as f32
        return dt.f32


def output_rtol(dtype: np.dtype, rtol: float | None) -> float:
    """The relative tolerance of an output: ``rtol`` for floats when given, else the project's
    table by dtype (``lumc.ir.dtypes.RTOL``: f32 1e-4, f16 1e-2, bf16 4e-2, f64 1e-10); 0 (exact)
    for integers and bools."""
    d = _dtype_of(dtype)
    if not d.is_float:
        return 0.0
    return float(rtol) if rtol is not None else dt.rtol_for(d)


def output_atol(dtype: np.dtype, atol: float | None) -> float:
    """The absolute tolerance of an output: ``atol`` for floats when given, else :data:`ATOL` by
    dtype; 0 for integers and bools."""
    d = _dtype_of(dtype)
    if not d.is_float:
        return 0.0
    return float(atol) if atol is not None else ATOL.get(d.name, 1e-5)


def compare_output(got: np.ndarray, ref: np.ndarray, rtol: float | None = None,
                   atol: float | None = None, magnitude: np.ndarray | None = None) -> OutputCheck:
    """Compare one output with a reference (see the module docstring); None tolerances take the
    output dtype's defaults (:func:`output_rtol`, :func:`output_atol`). ``magnitude``: what
    ``rtol`` scales per element instead of ``|ref|`` (the terms of its sums, :func:`float64_terms`;
    the shape of ``ref``)."""
    if got.shape != ref.shape:
        return OutputCheck(np.inf, np.inf, False, f"shape {got.shape} != onnxruntime {ref.shape}")
    if got.dtype != ref.dtype:
        return OutputCheck(np.inf, np.inf, False, f"dtype {got.dtype} != onnxruntime {ref.dtype}")
    rtol, atol = output_rtol(ref.dtype, rtol), output_atol(ref.dtype, atol)
    if got.size == 0:
        return OutputCheck(0.0, 0.0, True, rtol=rtol, atol=atol)
    a, b = got.astype(np.float64), ref.astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return OutputCheck(np.inf, np.inf, False, "NaN at different positions", rtol, atol, np.inf)
    same = (a == b) | nan_a  # equal infinities count as exact
    with np.errstate(invalid="ignore"):  # inf - inf where `same` already says equal
        diff = np.where(same, 0.0, np.abs(a - b))
    max_abs = float(diff.max())
    finite_b = np.abs(b[np.isfinite(b)])
    scale = max(float(finite_b.max()) if finite_b.size else 0.0, _TINY)
    if got.dtype.kind in "biu":
        return OutputCheck(max_abs, max_abs / scale, max_abs == 0, rtol=0.0, atol=0.0,
                           excess=np.inf if max_abs else 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.abs(b) if magnitude is None else np.abs(np.asarray(magnitude, np.float64))
        allowed = atol + rtol * np.where(np.isfinite(m), m, 0.0)
        ratio = np.where(same, 0.0, diff / np.maximum(allowed, 1e-300))
    excess = float(ratio.max())
    return OutputCheck(max_abs, max_abs / scale, excess <= 1.0, rtol=rtol, atol=atol, excess=excess)


def judge_by_float64(got: np.ndarray, ort: np.ndarray, f64: np.ndarray, rtol: float | None,
                     atol: float | None, terms: np.ndarray | None = None) -> OutputCheck:
    """The verdict where lumc (``got``) and onnxruntime (``ort``) disagree: both against the
    float64 evaluation ``f64`` (cast to the output dtype's values in float64). Passes when lumc
    is within tolerance of float64, or (``terms``: the magnitudes of each element's sums' terms,
    :func:`float64_terms`) where neither runtime is, as the module docstring says; the note
    says which side is closer and by how much."""
    base = compare_output(got, ort, rtol, atol)
    if got.shape != f64.shape:
        return base
    f64 = np.asarray(f64, np.float64)
    ours = compare_output(got.astype(np.float64), f64, output_rtol(got.dtype, rtol),
                          output_atol(got.dtype, atol))
    theirs = compare_output(ort.astype(np.float64), f64, output_rtol(got.dtype, rtol),
                            output_atol(got.dtype, atol))
    closer = "lumc" if ours.max_abs <= theirs.max_abs else "onnxruntime"
    note = (f"vs float64: lumc max_abs {ours.max_abs:.3g}, onnxruntime {theirs.max_abs:.3g}; "
            f"{closer} is closer")
    ok = ours.ok
    if not ok and not theirs.ok and ours.max_abs <= theirs.max_abs and \
            ours.max_rel <= output_rtol(got.dtype, rtol) and \
            terms is not None and np.shape(terms) == got.shape and \
            compare_output(got.astype(np.float64), f64, output_rtol(got.dtype, rtol),
                           output_atol(got.dtype, atol), magnitude=terms).ok:
        # neither meets the per-element rule against float64: the output cancels to near 0 where
        # its terms do not (a long running sum crossing 0), below what the dtype's arithmetic
        # resolves; lumc, within rtol of the output's largest magnitude and the closer, passes
        ok = True
        note += (f"; neither runtime is within the per-element tolerance of float64 (values "
                 f"cancelling near 0); lumc's max_rel {ours.max_rel:.3g} vs float64, and each "
                 f"element within rtol of its terms' magnitude, passes")
    return OutputCheck(base.max_abs, base.max_rel, ok, note, base.rtol, base.atol, base.excess)


def tolerance_note(checks: dict[str, OutputCheck], rtol: float | None, atol: float | None) -> str:
    """``atol 1e-05 + rtol 0.0001 by dtype; ints exact`` (what the verdict line says)."""
    def part(name, given, vals):
        if given is not None:
            return f"{name} {given:g}"
        used = sorted({v for v in vals if v > 0})
        return f"{name} {'/'.join(f'{v:g}' for v in used)}" if used else name
    a = part("atol", atol, [c.atol for c in checks.values()])
    r = part("rtol", rtol, [c.rtol for c in checks.values()])
    if rtol is None and atol is None:
        return f"{a} + {r} by dtype; ints exact"
    if rtol is None or atol is None:     # say which one is the dtype's (the other was given)
        a, r = (f"{a} (by dtype)", r) if atol is None else (a, f"{r} (by dtype)")
    return f"{a} + {r}; ints exact"


# ---- the --check report (lumc run): one line per output, then the verdict
def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def float64_outputs(graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph evaluated in float64 by the reference executor (rounded once at the outputs):
    the judge where lumc and onnxruntime disagree."""
    from lumc.backends.reference import ReferenceExecutor
    return ReferenceExecutor(graph, "float64")({k: inputs[k] for k in graph.inputs})


def float64_terms(graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph in float64 with every sum over its terms' absolute values (the reference
    executor's ``"terms"`` precision): per element, the scale of its sums' rounding error, which
    :func:`judge_by_float64` allows where the output cancels near 0. ``{}`` where that run fails
    (an index computed from a float sum, out of its table with the sums' terms made positive):
    no output is judged by its terms then."""
    from lumc.backends.reference import ReferenceExecutor
    try:
        return ReferenceExecutor(graph, "terms")({k: inputs[k] for k in graph.inputs})
    except LumcError:
        return {}


UNOPTIMIZED_NOTE = "onnxruntime without graph optimizations"


def judge_by_unoptimized(got: np.ndarray, c: OutputCheck, plain: np.ndarray, rtol: float | None,
                         atol: float | None) -> OutputCheck:
    """The last word where lumc is outside tolerance of both onnxruntime and float64: onnxruntime
    run with its graph optimizations off (``plain``), which executes each node as the model writes
    it. Its fusions (a QDQ pair into an integer kernel, a 16-bit QDQ MatMul) change values; lumc
    within tolerance of the unfused run computes what the model says, and passes, noted."""
    u = compare_output(got, plain, rtol, atol)
    if not u.ok:
        return c
    note = (f"{c.note}; {UNOPTIMIZED_NOTE}: max_abs {u.max_abs:.3g}, within tolerance "
            "(its optimized graph changes the values)")
    return OutputCheck(c.max_abs, c.max_rel, True, note, c.rtol, c.atol, c.excess)


def computed_through(graph) -> dict[str, np.dtype]:
    """``{output: numpy dtype}`` for the float outputs wider than a half type whose computation
    passes through one (an op of the output's cone that yields f16 or bf16: an fp16 model whose
    inputs and outputs stay f32, as onnxruntime's ``convert_float_to_float16(keep_io_types=True)``
    writes it): such an output carries that type's rounding, so ``--check`` judges it at that
    type's tolerance, not its own. bf16 before f16 where both occur (the coarser)."""
    from lumc.ir.graph import toposort
    out = {}
    for name, n in graph.outputs.items():
        if not n.dtype.is_float or n.dtype.name not in ("f32", "f64"):
            continue
        halves = {m.dtype.name for m in toposort([n]) if m.srcs and m.dtype.name in ("f16", "bf16")}
        if halves:
            out[name] = (dt.bf16 if "bf16" in halves else dt.f16).np
    return out


def _near_tie_check(got: np.ndarray, ref: np.ndarray, c: OutputCheck, tie: tuple | None,
                    rtol: float) -> OutputCheck:
    """An index output that differs from the reference only at near-ties of its fp32 scores
    passes, noted (see :func:`print_outputs`)."""
    from lumc.compiler.core.precision import integer_error, near_ties
    if tie is None or integer_error(got, ref, tie, rtol):
        return c
    n = near_ties(got, ref, tie[0], tie[1], tie[3], rtol)
    return dataclasses.replace(c, ok=True, note=f"{n} index{'es' * (n != 1)} at near-ties (fp32 "
                                                f"scores within the tolerance {rtol:g})")


def print_outputs(outputs: dict, ref: dict | None, rtol: float | None, atol: float | None = None,
                  float64=None, unoptimized=None, through: dict | None = None, ties=None,
                  terms=None) -> dict[str, OutputCheck]:
    """Print one line per output (name, shape, dtype, and with ``ref`` its errors against
    onnxruntime, judged by :func:`compare_output`); where one disagrees, ``float64()`` (the graph
    in float64) judges both (:func:`judge_by_float64`), and where lumc is outside tolerance of
    that too, ``unoptimized()`` (onnxruntime with its graph optimizations off) has the last word
    (:func:`judge_by_unoptimized`). ``through``: :func:`computed_through`, whose outputs take
    their half type's default tolerances where none is given. ``ties()`` (a reduced-precision
    artifact's, at its tolerance ``rtol``): ``{output: (fp32 scores, axis, largest, keepdims)}`` of
    its ArgMax/ArgMin outputs, which pass where they differ only at near-ties, as the compile's
    quality gate judged them (``lumc.compiler.core.precision.near_ties``). ``terms()``: the
    graph's :func:`float64_terms`, for the float64 judge where neither runtime is within tolerance
    of float64. Returns the checks."""
    checks: dict[str, OutputCheck] = {}
    judge = plain = tie_of = scales = None
    if ref is not None:
        for name, y in outputs.items():
            if name not in ref:
                checks[name] = OutputCheck(np.inf, np.inf, False, "not an onnxruntime output")
                continue
            got = np.asarray(y)
            a = atol.get(name) if isinstance(atol, dict) else atol   # per output (precision)
            r = rtol
            half = (through or {}).get(name)
            if half is not None:       # computed through f16/bf16: that type's defaults
                r = output_rtol(half, r)
                a = output_atol(half, a)
            c = compare_output(got, ref[name], r, a)
            if not c.ok and float64 is not None and not c.note and got.dtype.kind in "fiub":
                judge = judge if judge is not None else float64()
                if name in judge:
                    c = judge_by_float64(got, ref[name], judge[name], r, a)
                    if not c.ok and terms is not None and "lumc is closer" in c.note:
                        scales = scales if scales is not None else terms()
                        c = judge_by_float64(got, ref[name], judge[name], r, a, scales.get(name))
                if not c.ok and unoptimized is not None:
                    plain = plain if plain is not None else unoptimized()
                    if name in plain:
                        c = judge_by_unoptimized(got, c, plain[name], r, a)
            if not c.ok and ties is not None and rtol and got.dtype.kind in "biu" and \
                    got.shape == np.shape(ref[name]):
                tie_of = tie_of if tie_of is not None else ties()
                c = _near_tie_check(got, ref[name], c, tie_of.get(name), rtol)
            if half is not None and not c.note:
                c = dataclasses.replace(c, note=f"(computed through {np.dtype(half).name}: "
                                                "judged at its tolerance)")
            checks[name] = c
    width = max([len(n) for n in outputs] + [6])
    for name, y in outputs.items():
        y = np.asarray(y)
        line = f"  {name:<{width}}  {_fmt_shape(y.shape):<16} {str(y.dtype):<8}"
        if name in checks:
            c = checks[name]
            line += (f"  max_abs {c.max_abs:.3g}  max_rel {c.max_rel:.3g}  "
                     f"{'ok' if c.ok else 'FAIL'}{'  ' + c.note if c.note else ''}")
        click.echo(line)
    return checks


def finish_check(checks: dict[str, OutputCheck], rtol: float | None, atol: float | None = None,
                 how: str | None = None, against: str = "onnxruntime") -> None:
    """The ``--check`` verdict: exit 1 when any output failed; ``how`` names the tolerance when it
    is not the dtype table's or the flags' (a reduced-precision artifact's own); ``against``
    names the reference (a torch module's artifact: its graph in float64)."""
    bad = [n for n, c in checks.items() if not c.ok]
    note = how or tolerance_note(checks, rtol, atol)
    if bad:
        click.echo(f"check: FAILED for {', '.join(bad)} ({note})", err=True)
        sys.exit(1)
    judged = [n for n, c in checks.items()
              if c.note.startswith("vs float64") and UNOPTIMIZED_NOTE not in c.note]
    plain = [n for n, c in checks.items() if UNOPTIMIZED_NOTE in c.note]
    tail = (f"; {', '.join(judged)} differ from onnxruntime, and lumc is within tolerance of "
            "float64" if judged else "")
    if plain:
        tail += (f"; {', '.join(plain)} differ from onnxruntime, and lumc is within tolerance of "
                 f"{UNOPTIMIZED_NOTE}")
    what = "the output matches" if len(checks) == 1 else f"all {len(checks)} outputs match"
    click.echo(f"check: {what} {against} ({note}{tail})")


# ---------------------------------------------------------------------------------------------
# lumc models


def run_onnxruntime(path: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs for ``--check`` (its default, optimized session)."""
    return onnxruntime_outputs(path, inputs, optimized=True)


def run_onnxruntime_unoptimized(path: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime with its graph optimizations off: each node run as the model writes it (the
    --check's last judge, lumc.compiler.tools.output_check.judge_by_unoptimized)."""
    return onnxruntime_outputs(path, inputs, optimized=False)


def onnxruntime_outputs(path: str, inputs: dict[str, np.ndarray], *,
                         optimized: bool) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        feeds = {i.name: inputs[i.name] for i in sess.get_inputs() if i.name in inputs}
        return dict(zip(names, sess.run(names, feeds)))
    except Exception as err:  # onnxruntime raises its own untyped errors
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise LumcError(f"onnxruntime could not run the model for --check: {first}") from None
