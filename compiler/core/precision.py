"""The precision policy of a compile: what each contraction may run at, how weights are stored, and
the quality gate that measures what reduced precision cost.

``--precision`` (``precision=``) names the policy:

=========  ===========================================================================================
``fp32``   fp32-class results (default): contractions on tensor cores in split TF32 (``tf32x3``), or
           IEEE FFMA (``ieee``) where the search finds it faster (tiny K); default tolerance 1e-4
``tf32``   one TF32 MMA per product (10 mantissa bits): tolerance 5e-3
``bf16``   weights stored in bf16 (half the bytes; vectors such as biases and norm parameters stay
           fp32), contractions on bf16 tensor cores with fp32 accumulation; everything else
           computes in fp32: tolerance 1e-1
``fp16``   the same with fp16 weights and fp16 tensor cores: tolerance 2e-2
``fp8``    bf16 weights, contractions at e4m3 with per-1xBLOCK_K scales (``dot_precision.py``) or bf16
           where that is faster: tolerance 2e-1
``auto``   per kernel, fp8, bf16 or tf32x3, the fastest that keeps the quality gate, chosen from
           each contraction's measured sensitivity (:mod:`lumc.compiler.core.precision_gate`); a
           less precise config must be 1% faster than a more precise one, and the whole reduced
           plan 1% faster than the model's fp32 plan, which auto compiles too (40% of the budget)
=========  ===========================================================================================

The tolerances are relative to the largest reference magnitude of each output (``max_rel_error``).
They are defaults a user tightens with ``--tolerance`` (and ``--max-kl`` for distributions), set
so that the README's models pass at each precision on sim:h200 with random inputs: measured bf16
max rel errors were MiniLM 1.4e-2, Silero 7.0e-3, PP-OCR 6.5e-2 (its sigmoid map, where a 5e-2
gate failed), Magika's class probabilities KL 8e-7 with top-1 100%; fp8 up to 6.5e-2 (PP-OCR);
int8 weights up to 7.2e-2 (Silero). They are not a promise for other models: the compile measures
each one and reports it.

``--weights`` stores contraction weights quantized (weight-only; activations keep the policy), each
dequantized in its contraction's prologue as a primitive expression over what is stored
(:mod:`lumc.compiler.core.weight_quant`), so only the stored bytes cross HBM:

=========  ===========================================================================================
``int8``   symmetric per-output-channel int8, ``scale = amax / 127`` over each channel's reduced
           axes (TensorRT/torchao's weight-only int8): ``Cast(Q, f32) * scale``, 1 byte per weight;
           tolerance 1e-1
``fp8``    float8 e4m3 (OCP 8-bit floating point spec v1.0, largest finite 448) per output channel,
           ``scale = amax / 448``: ``Cast(Q, f32) * scale``, 1 byte per weight; tolerance 1.5e-1
``nvfp4``  NVIDIA's NVFP4 (Blackwell / TensorRT Model Optimizer docs): e2m1 values, an e4m3 scale
           per 16 consecutive weights along K, an fp32 per-tensor scale ``amax / (6 * 448)``;
           0.5625 bytes per weight. A weight whose K is not a multiple of 16 (or whose reduced axes
           are not one run in memory) is skipped and stays as the precision stores it; tolerance
           4e-1
=========  ===========================================================================================

The weights tolerances come from the same models with every op exact (weights alone; the largest
max rel error over the outputs, random inputs): int8 up to 7.6e-2 (Silero); fp8 MiniLM 7.8e-2,
Silero 1.3e-1, Magika 3.0e-3, PP-OCR 2.7e-1 (over the gate: it falls back to the model's weights);
nvfp4 MiniLM 3.3e-1 (its pooled output, cosine 0.963; the hidden states 1.1e-1), Magika 2.8e-3
(KL 4e-4), Silero 7.4e-1 (its LSTM state) and PP-OCR 6.5e-1 (both fall back). Weight-only fp8
loses more than int8 here (3 mantissa bits against 127 uniform levels per channel: 2.6% against
0.8% relative rms per weight; NVFP4 9.5%).

Quality (:func:`measure_quality`) compares the compiled program, run by the CPU executor with every
reduced-precision contraction emulated (``lumc.backends.precision``), with the fp32 reference of the
original model on sample inputs: max abs and rel error and cosine similarity per output, and for
outputs that are probabilities (rows along the last axis non-negative and summing to 1) or named
logits, the mean and max KL divergence per row against the reference distribution and top-1
agreement. KL and cosine are computed in float64. Integer and bool outputs (an ``ArgMax``, a
comparison) must equal the reference exactly; the report counts the values that differ. One
exception: an ArgMax/ArgMin index of float scores may pick a near-tie (:func:`near_ties`: a class
whose fp32 score is within the tolerance of the best one's, relative to the row's largest score),
as top-1 of a logits output may already; the report counts those apart (``near_ties``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import InputError
from lumc.ir.graph import Graph, Node, const_node, node
from lumc.compiler.core import weight_quant
from lumc.ir.provenance import rebuilt
from lumc.compiler.core.options import option

POLICIES = ("fp32", "tf32", "bf16", "fp16", "fp8", "auto")
WEIGHTS = ("same", "int8", "fp8", "nvfp4")

# the tl.dot operand precisions each policy allows, per operand dtype (first = preferred default)
DOT_PRECISIONS = {
    "fp32": {"f32": ("tf32x3", "ieee"), "bf16": ("bf16",), "f16": ("fp16",)},
    "tf32": {"f32": ("tf32", "ieee"), "bf16": ("bf16",), "f16": ("fp16",)},
    "bf16": {"f32": ("bf16",), "bf16": ("bf16",), "f16": ("fp16",)},
    "fp16": {"f32": ("fp16",), "bf16": ("bf16",), "f16": ("fp16",)},
    "fp8": {"f32": ("fp8", "bf16"), "bf16": ("fp8", "bf16"), "f16": ("fp8", "fp16")},
    "auto": {"f32": ("fp8", "bf16", "tf32x3"), "bf16": ("fp8", "bf16"), "f16": ("fp8", "fp16")},
}
WEIGHT_DTYPE = {"fp32": None, "tf32": None, "bf16": dt.bf16, "fp16": dt.f16, "fp8": dt.bf16,
                "auto": dt.bf16}
DEFAULT_TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 1e-1, "fp16": 2e-2, "fp8": 2e-1,
                     "auto": 1e-1}
WEIGHTS_TOLERANCE = {"same": 0.0, "int8": 1e-1, "fp8": 1.5e-1, "nvfp4": 4e-1}
# a weight is a Constant with at least this many elements (scalars and tiny vectors stay exact)
MIN_WEIGHT_ELEMENTS = 64
# the order in which the gate raises a failing compile's policy
FALLBACK = {"fp8": "bf16", "auto": "bf16", "fp16": "fp32", "bf16": "fp32", "tf32": "fp32"}


@dataclass(frozen=True)
class PrecisionPolicy:
    """A compile's precision settings.

    Attributes:
        precision: one of :data:`POLICIES`.
        weights: one of :data:`WEIGHTS`.
        tolerance: the largest max rel error (``max|got - ref| / max|ref|`` per output) allowed.
        max_kl: the largest mean KL divergence per row allowed on probability or logit outputs
            (None: no KL gate).
        logits: output names to treat as logits (softmax applied before KL and top-1).
    """
    precision: str = "fp32"
    weights: str = "same"
    tolerance: float | None = None
    max_kl: float | None = None
    logits: tuple[str, ...] = ()

    def __post_init__(self):
        if self.precision not in POLICIES:
            raise InputError(f"unknown {option('precision', self.precision)}; choose one of "
                             f"{', '.join(POLICIES)}")
        if self.weights not in WEIGHTS:
            raise InputError(f"unknown {option('weights', self.weights)}; choose one of "
                             f"{', '.join(WEIGHTS)}")
        for name, v in ((option("tolerance"), self.tolerance), (option("max-kl"), self.max_kl)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float,
                                                                             np.number))):
                raise InputError(f"{name} must be a number, got {v!r}")
            if v is not None and not (np.isfinite(v) and v >= 0):
                raise InputError(f"{name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def from_user(cls, precision: str = "fp32", weights: str = "same", tolerance=None,
                  max_kl=None, logits=()) -> "PrecisionPolicy":
        """The policy a user asked for, refusing options that would do nothing: ``tolerance``,
        ``max_kl`` and ``logits`` gate a reduced precision (the quality gate never runs at fp32
        with the model's weights, where every kernel is checked at the dtype's own tolerance).
        ``logits`` is output names, or one name as a string.

        Raises:
            InputError: as the constructor, or such an option at fp32.
        """
        names = (logits,) if isinstance(logits, str) else logits
        try:
            names = tuple(names if names is not None else ())
        except TypeError:
            names = None
        if names is None or not all(isinstance(n, str) for n in names):
            raise InputError(f"logits must be output names (strings), got {logits!r}")
        p = cls(precision, weights, tolerance, max_kl, names)
        given = [option(name) for name, v in (("max-kl", p.max_kl is not None),
                                              ("logits", p.logits),
                                              ("tolerance", p.tolerance is not None)) if v]
        if not p.reduced and given:
            raise InputError(f"{given[0]} gates a reduced precision ({option('precision')} "
                             f"other than fp32, or {option('weights')}); at fp32 with the model's "
                             "weights there is nothing to judge")
        return p

    def check_search(self, search: bool, where: str = "search=False") -> None:
        """Raises InputError for a reduced policy without the kernel search (``search=False``):
        the reference executor runs the lowered graph at fp32 and no gate runs, so the option
        would silently do nothing."""
        if not search and self.reduced:
            asked = self.precision if self.precision != "fp32" else f"weights {self.weights}"
            raise InputError(f"{where} runs the reference executor at fp32, with the model's "
                             f"weights: {option('precision')}/{option('weights')} ({asked}) "
                             "would do nothing; leave them out, or keep the search")

    @property
    def reduced(self) -> bool:
        """True when results may differ from fp32 beyond its tolerance (the gate then runs)."""
        return self.precision != "fp32" or self.weights != "same"

    @property
    def rtol(self) -> float:
        if self.tolerance is not None:
            return self.tolerance
        return max(DEFAULT_TOLERANCE[self.precision], WEIGHTS_TOLERANCE[self.weights])

    def check_logits(self, outputs: dict) -> None:
        """Raises InputError when ``logits`` names no output of the model (``outputs``: ``{name:
        node}``), or one that holds no row of scores: an integer or bool output, a scalar, a last
        axis of one element (the KL and top-1 gate would silently measure nothing)."""
        for name in self.logits:
            n = outputs.get(name)
            if n is None:
                raise InputError(f"{option('logits', name)}: the model has no output of that name; "
                                 f"outputs: {', '.join(outputs)}")
            if not n.dtype.is_float or not n.shape or n.shape[-1] < 2:
                what = (f"is {n.dtype.name}" if not n.dtype.is_float else
                        "is a scalar" if not n.shape else f"has shape {list(n.shape)}")
                raise InputError(f"{option('logits', name)}: that output {what}; logits are rows of at "
                                 "least two float scores along the last axis (KL and top-1 "
                                 "would measure nothing)")

    def check_max_kl(self, reference: dict, float_names: list[str]) -> None:
        """Raises InputError when ``max_kl`` is set, ``logits`` names no output, and no output in
        ``float_names`` of ``reference`` (the fp32 model's outputs on the sample inputs, ``{name:
        array}``) is a probability distribution (:func:`is_probability`): the KL gate would judge
        nothing and the option would be silently ignored."""
        if self.max_kl is None or self.logits:
            return
        if not any(is_probability(reference[k]) for k in float_names):
            raise InputError(f"{option('max-kl')} gates the KL divergence of a probability output, "
                             "but no output of the model is a distribution (rows >= 0 summing to 1 "
                             "on the sample inputs); name the outputs that are logits with "
                             f"{option('logits', 'NAME')}")

    def dot_precisions(self) -> dict:
        return dict(DOT_PRECISIONS[self.precision])

    def as_dict(self) -> dict:
        return {"precision": self.precision, "weights": self.weights, "tolerance": self.rtol,
                "max_kl": self.max_kl, "logits": list(self.logits)}


# ---- weights -------------------------------------------------------------------------------------
def store_weights(graph: Graph, policy: PrecisionPolicy) -> tuple[Graph, dict]:
    """The graph with its weights stored as the policy says; compute stays in the graph's dtypes.

    Every fp32 ``Constant`` of at least :data:`MIN_WEIGHT_ELEMENTS` elements and two dims over 1
    (not a vector: biases and norm parameters stay fp32, as under autocast) that is not a gather
    table becomes ``Cast(W', f32)`` of its bf16/fp16 rounding (round to nearest even) under
    ``bf16``/``fp16``/``fp8``/``auto``; with ``weights`` ``int8``/``fp8``/``nvfp4``, a weight read
    only by contractions becomes the dequantization of its quantized storage instead
    (:mod:`lumc.compiler.core.weight_quant`; see the module docstring). A weight the format cannot
    store (NVFP4 with a K not a multiple of 16; a weight holding inf or NaN) is ``skipped``: it
    stays as the precision stores it.

    Returns:
        ``(graph, stats)``; stats count the weights ``converted`` (any narrower storage), per
        format (``int8``, ``fp8``, ``nvfp4``) and ``skipped``, and their bytes before and after
        (``bytes_after`` includes NVFP4's 2 KiB decode table once).
    """
    to = WEIGHT_DTYPE[policy.precision]
    if to is None and policy.weights == "same":
        return graph, {"converted": 0}
    users = graph.users()
    memo: dict[int, Node] = {}
    stats = {"converted": 0, "int8": 0, "fp8": 0, "nvfp4": 0, "skipped": 0, "bytes_before": 0,
             "bytes_after": 0}
    for n in graph.nodes():
        if n.op == "Constant":
            memo[id(n)] = _store_constant(n, users, to, policy.weights, stats)
        elif n.srcs:
            srcs = tuple(memo[id(s)] for s in n.srcs)
            memo[id(n)] = rebuilt(n, srcs)
        else:
            memo[id(n)] = n
    if stats["nvfp4"]:
        stats["bytes_after"] += weight_quant.NVFP4_PAIRS.nbytes
    out = Graph({k: memo[id(v)] for k, v in graph.inputs.items()},
                {k: memo[id(v)] for k, v in graph.outputs.items()})
    return out, stats


def _gathered(n: Node, users: dict) -> bool:
    """True when ``n`` is (through views) the table of a ``Gather``: an embedding reads only the
    rows it gathers, so storing it narrower saves little, and a cast of the whole table would be a
    kernel of its own (the gather form reads its table directly)."""
    todo, seen = [n], set()
    while todo:
        x = todo.pop()
        for u in users.get(id(x), []):
            if u.op == "Gather" and u.srcs[0] is x:
                return True
            if u.op == "View" and id(u) not in seen:
                seen.add(id(u))
                todo.append(u)
    return False


def _store_constant(n: Node, users: dict, to, weights: str, stats: dict) -> Node:
    if n.dtype != dt.f32 or n.numel < MIN_WEIGHT_ELEMENTS or _gathered(n, users):
        return n
    if weights != "same":
        reduced = contraction_reduced_axes(n, users)
        if reduced is not None:
            got = weight_quant.store_quantized(n, reduced, weights)
            if got is not None:
                stats[weights] += 1
                stats["converted"] += 1
                stats["bytes_before"] += n.nbytes
                stats["bytes_after"] += got[1]
                return got[0]
            stats["skipped"] += 1
    if to is None or sum(d > 1 for d in n.shape) < 2:
        # a vector (a bias, a norm's scale and shift) stays fp32: it saves no bytes worth having,
        # and its cast would keep it out of the prologue a contraction forms the norm in
        return n
    # beyond fp16's range a weight rounds to ±inf (IEEE-754): expected, and the quality gate then
    # refuses the plan and the compile falls back, saying so; numpy's overflow warning adds nothing
    with np.errstate(over="ignore"):
        low = np.asarray(n.arg.value, dtype=np.float32).astype(to.np)
    stats["converted"] += 1
    stats["bytes_before"] += n.nbytes
    stats["bytes_after"] += low.nbytes
    return node("Cast", (const_node(low),), dt.f32)


def contraction_reduced_axes(w: Node, users: dict) -> tuple[int, ...] | None:
    """The axes of weight ``w`` that its contractions sum over, when every use of ``w`` is an operand
    of ``SumReduce(Mul(...))`` read through one permuting/broadcasting view; None otherwise (the
    weight is then not quantized per channel). ``users`` is ``Graph.users()``."""
    from lumc.ir.views import contiguous_strides
    strides = contiguous_strides(w.shape)
    found: set[int] | None = None

    def _users_of(x: Node) -> list[Node]:
        return users.get(id(x), [])
    if not _users_of(w):
        return None
    for u in _users_of(w):
        if u.op != "View" or u.arg.mask is not None or u.arg.offset != 0:
            return None
        muls = [m for m in _users_of(u) if m.op == "Mul"]
        if not muls or len(muls) != len(_users_of(u)):
            return None
        axes = set()
        for m in muls:
            sums = _users_of(m)
            if not sums or any(s.op != "SumReduce" for s in sums):
                return None
            for s in sums:
                for d in s.arg:
                    st = u.arg.strides[d]
                    if st == 0:
                        continue
                    hits = [j for j, x in enumerate(strides) if x == st and w.shape[j] > 1]
                    if len(hits) != 1:
                        return None
                    axes.add(hits[0])
        if found is not None and axes != found:
            return None
        found = axes
    return tuple(sorted(found)) if found else None


# ---- quality -------------------------------------------------------------------------------------
def is_probability(x: np.ndarray) -> bool:
    """True for an output whose rows along the last axis are distributions (>= 0, sum 1 +- 1e-3),
    judged on its finite rows, of which there must be one: a softmax with a NaN row (a NaN input
    row) was no distribution at all, so its KL and top-1 were silently left out of the gate and
    --max-kl was refused as having nothing to judge."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0 or a.shape[-1] < 2 or a.size == 0:
        return False
    rows = a.reshape(-1, a.shape[-1])
    rows = rows[np.all(np.isfinite(rows), axis=-1)]
    return bool(rows.size and np.all(rows >= 0) and np.allclose(rows.sum(axis=-1), 1.0,
                                                                  atol=1e-3))


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def output_quality(got: np.ndarray, ref: np.ndarray, logits: bool = False) -> dict:
    """Quality figures of one output against its fp32 reference (float64 arithmetic).

    Returns ``{max_abs, max_rel, cosine}`` plus ``{kl_mean, kl_max, top1}`` when the reference is a
    probability output or ``logits`` is set (KL(ref || got) per row over the last axis, natural log).
    """
    from lumc.compiler.core.errors import max_abs_error, max_rel_error
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    out = {"max_abs": max_abs_error(g, r), "max_rel": max_rel_error(g, r)}
    gf, rf = g.ravel(), r.ravel()
    # over the elements finite in both (max_rel judges NaN and inf: they must match); a NaN made
    # the cosine of matching outputs 0
    fin = np.isfinite(gf) & np.isfinite(rf)
    gf, rf = gf[fin], rf[fin]
    den = float(np.linalg.norm(gf) * np.linalg.norm(rf))
    if np.array_equal(gf, rf):      # exactly 1: the dot and the norms sum in other orders, and
        out["cosine"] = 1.0         # a 1 - 1 ulp read 'cosine >= 0.999999' for an exact plan
    else:                           # (on AVX2 numpy); never above 1 either
        out["cosine"] = max(-1.0, min(1.0, float(np.dot(gf, rf) / den))) if den > 0 else 0.0
    prob = is_probability(r)
    if (prob or logits) and r.ndim >= 1 and r.shape[-1] >= 2:
        with np.errstate(invalid="ignore"):
            p = r if prob else _softmax(r)
            q = g if prob else _softmax(g)
        # rows of a distribution the fp32 model defines (a logit row holding +inf, or all -inf, has
        # none: max_rel judges whether the plan's NaN matches); none at all (a zero-size output):
        # no KL, which as the mean of no rows was NaN and failed --max-kl
        rows = np.all(np.isfinite(p), axis=-1)
        if rows.any():
            p, q = p[rows], q[rows]
            bad = ~np.all(np.isfinite(q), axis=-1)
            q = np.clip(np.where(np.isfinite(q), q, 1.0), 1e-30, None)
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(p > 0, p * (np.log(np.clip(p, 1e-300, None)) - np.log(q)), 0.0)
            # a KL is never below 0; a row of q summing to a hair over 1 (a rounded softmax) gave
            # 'mean KL -3.92e-08' in the report; a row the plan made non-finite is infinitely off
            kl = np.where(bad, np.inf, np.maximum(terms.sum(axis=-1), 0.0))
            out["kl_mean"] = float(np.mean(kl))
            out["kl_max"] = float(np.max(kl))
            out["top1"] = float(np.mean(np.argmax(p, axis=-1) == np.argmax(q, axis=-1)) if not
                                bad.all() else 0.0)
    return out


def near_ties(got: np.ndarray, ref: np.ndarray, scores: np.ndarray, axis: int, keepdims: bool,
              rtol: float) -> int:
    """How many of the indices where ``got`` differs from the fp32 model's ``ref`` (both an
    ArgMax/ArgMin over ``axis`` of ``scores``, the fp32 model's values) pick a near-tie: an index
    whose fp32 score is within ``rtol`` of the one the fp32 model picked, relative to the largest
    finite ``|score|`` of that slice, ``|s[got] - s[ref]| <= rtol * max |s|``. That is the float
    gate's own measure (max abs error over the largest reference magnitude) applied to the scores
    the index reads: a reduced-precision program whose scores are within the tolerance may order
    two such scores either way. NaN scores and indices outside the axis are never ties; an index
    with another shape has none."""
    g, r = np.asarray(got, np.int64), np.asarray(ref, np.int64)
    s = np.asarray(scores, np.float64)
    if not keepdims:
        g, r = np.expand_dims(g, axis), np.expand_dims(r, axis)
    if g.shape != r.shape or s.ndim != g.ndim or s.shape[axis] == 0:
        return 0
    n = s.shape[axis]
    inside = (g >= 0) & (g < n) & (r >= 0) & (r < n)
    sg = np.take_along_axis(s, np.clip(g, 0, n - 1), axis)
    sr = np.take_along_axis(s, np.clip(r, 0, n - 1), axis)
    scale = np.max(np.where(np.isfinite(s), np.abs(s), 0.0), axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        tie = (g != r) & inside & np.isfinite(sg) & np.isfinite(sr) & \
            (np.abs(sg - sr) <= rtol * scale)
    return int(np.count_nonzero(tie))


def integer_error(got, ref, tie: tuple | None, rtol: float) -> float:
    """An integer or bool output's share of a report's max rel error: 0 where it equals ``ref`` or
    differs only at near-ties (``tie``: ``(fp32 scores, axis, largest, keepdims)`` of an ArgMax/
    ArgMin, :func:`near_ties` within ``rtol``), else inf."""
    g, r = np.asarray(got), np.asarray(ref)
    if g.shape == r.shape and np.array_equal(g, r):
        return 0.0
    if tie is not None and g.shape == r.shape and \
            near_ties(g, r, tie[0], tie[1], tie[3], rtol) == np.count_nonzero(g != r):
        return 0.0
    return float("inf")


def measure_quality(outputs: dict, reference: dict, policy: PrecisionPolicy,
                    float_names: list[str], exact_names: list[str] = (),
                    ties: dict | None = None) -> dict:
    """The ``quality`` report of a compile: per output figures, the worst of each, and the gate's
    verdict (``passed``, with ``reason`` when it failed).

    Outputs in ``exact_names`` (integer and bool: an ``ArgMax`` of logits, a comparison) have no
    relative error: each must equal the fp32 model's, and ``exact_outputs`` gives ``{name:
    {differ, count}}``, the elements that differ. An index output in ``ties`` (``{name: (fp32
    scores, axis, largest, keepdims)}``, an ArgMax/ArgMin of float scores) may differ where the
    index is a near-tie within the tolerance (:func:`near_ties`; counted in ``near_ties``): only
    the other differences fail the gate."""
    per = {k: output_quality(outputs[k], reference[k], k in policy.logits) for k in float_names}
    exact = {}
    for k in exact_names:
        g, r = np.asarray(outputs[k]), np.asarray(reference[k])
        differ = int(r.size) if g.shape != r.shape else int(np.count_nonzero(g != r))
        exact[k] = {"differ": differ, "count": int(r.size)}
        if differ and k in (ties or {}):
            s, axis, _, keepdims = ties[k]
            exact[k]["near_ties"] = near_ties(g, r, s, axis, keepdims, policy.rtol)
    worst_rel = max((q["max_rel"] for q in per.values()), default=0.0)
    kls = [q["kl_mean"] for q in per.values() if "kl_mean" in q]
    q = {"outputs": per, "max_rel": worst_rel, "tolerance": policy.rtol,
         "min_cosine": min((v["cosine"] for v in per.values()), default=1.0),
         "kl_mean": max(kls) if kls else None, "max_kl": policy.max_kl}
    if exact:
        q["exact_outputs"] = exact
    reason = None
    wrong = [k for k, v in exact.items() if v["differ"] > v.get("near_ties", 0)]
    if wrong:
        v = exact[wrong[0]]
        ties_n = v.get("near_ties", 0)
        reason = (f"output {wrong[0]}: {v['differ'] - ties_n} of {v['count']} integer values "
                  f"differ from the fp32 model's" + (f" (and {ties_n} more at near-ties)"
                                                      if ties_n else ""))
    elif not worst_rel <= policy.rtol:
        reason = f"max rel error {worst_rel:.3g} > tolerance {policy.rtol:g}"
    elif policy.max_kl is not None and kls and not max(kls) <= policy.max_kl:
        reason = f"mean KL {max(kls):.3g} > {option('max-kl')} {policy.max_kl:g}"
    q["passed"] = reason is None
    if reason:
        q["reason"] = reason
    return q


def precision_report(policy: PrecisionPolicy, quality: dict | None, weight_stats: dict,
                     per_kernel: list[dict]) -> dict:
    """The report fields of precision: ``precision``, ``weights``, ``tolerance``, ``quality`` (None
    for fp32, else :func:`measure_quality`'s figures), ``weight_storage``; each ``per_kernel`` entry
    gains ``precision`` (its tl.dot operand precision, None for kernels without one)."""
    for row in per_kernel:
        row["precision"] = (row.get("config") or {}).get("PRECISION")
    return {"precision": policy.precision, "weights": policy.weights, "tolerance": policy.rtol,
            "quality": quality, "weight_storage": weight_stats}
