"""The reference executor: a numpy interpreter of primitive graphs, the numerics oracle of lumc.

Each node is evaluated by its row's numpy reference (``lumc.ir.ops``), with two exceptions that keep
real models fast without changing results beyond reassociation:

* ``SumReduce(Mul(a, b))`` is evaluated with ``numpy.einsum`` over the operands' views, so a matmul or
  convolution written as a broadcast product plus a sum never materializes the product. Broadcast
  (stride-0) dims of each operand are dropped before the contraction.
* A ``SumReduce(Mul(mask, v))`` that is a prefix sum (a cumsum's triangular 0/1 mask times a
  finite ``v``, :func:`lumc.backends.scan_structure.scan_of`) is evaluated as ``numpy.cumsum``:
  ``O(L)`` per row, not the contraction's ``O(L^2)`` (a CumSum over 4096 x 4096 took minutes,
  past any compile budget); a zero sum is +0.0, as the contraction's. Its ``[L, L]`` mask is
  never evaluated (36 GiB of int64 iota at L = 70000).
* Views are numpy views (``as_strided``), copying only where masked (padding).
* An elementwise op, or a reduction over other dims, whose operands all broadcast along a dim
  (stride 0) is computed once along it and returned as a broadcast view: the same bits, without
  the work (a BatchNorm + ReLU written over a convolution's product space, recomputed per output
  channel, took 4 s per kernel of densenet121).
* A row mean ``SumReduce(x) * (1/L)`` (``lumc.backends.row_moments.find_means``: a LayerNorm's,
  ``ReduceMean``'s; not a mean of squares) is the mean on shifted data, as the kernels compute it:
  exact on a constant row (not with ``precision="terms"``, which sums magnitudes; nor a mean only
  sums read, which their einsum evaluates from the sum itself).

With ``precision="float64"`` every floating tensor is carried in float64 and rounded to its declared
dtype only at the outputs; use it to measure the rounding error of the native run. With
``precision="terms"``, the same, with every floating ``SumReduce`` summing its terms' absolute
values (prefix sums and contractions too, as cheaply): an output's value is the scale of the
rounding error of its sums, element by element (as :func:`summand_magnitudes`' graph).
"""
from __future__ import annotations

import string

import numpy as np

from lumc.backends.row_moments import find_means, shifted_mean
from lumc.backends.scan_structure import ScanSpec, scan_of
from lumc.ir import dtypes as dt
from lumc.ir.errors import DivisionByZeroError, IndexRangeError, InputError
from lumc.ir.provenance import rebuilt, where
from lumc.ir.graph import Graph, Node
from lumc.ir.ops import OPS, cast_array


class ReferenceExecutor:
    """Runs a :class:`~lumc.ir.graph.Graph` on numpy arrays.

    Args:
        graph: the primitive graph.
        precision: ``"native"`` (each node in its own dtype), ``"float64"`` or ``"terms"``
            (float64, sums over their terms' absolute values).
        dot_operands: optional ``f(operand, reduced_axes) -> operand`` applied to both operands of
            every tensor-core contraction (``SumReduce(Mul(a, b))`` over a product space with an
            ``M`` or ``N`` dim, :func:`lumc.backends.triton.contraction.tensor_core_contractions`)
            before the product: a reduced-precision ``tl.dot``
            (``lumc.backends.precision.round_operand``). A normalization's row statistics in
            the same kernel (``sum(d * d)``) are not rounded: the kernel sums them in fp32.
            Native precision only.
        factored: ``{id(operand): (numerator, factor, block)}`` for contraction operands that
            are (views or casts of) ``numerator * factor``, ``factor`` constant along the reduced
            axes, whose kernel rounds only the numerator and applies the factor after the product:
            a flash-attention loop rounds ``exp2(s - m_j)`` for ``P @ V``, with ``m_j`` the row's
            running max after key block ``j`` (``block`` keys each; None: one block), and divides
            by the row sum at the end (FlashAttention-2, Dao 2023, arXiv:2307.08691, Algorithm 1
            lines 8-12). With ``dot_operands`` set, such an operand is evaluated as
            ``round(E / R_j) * R_j * factor``, ``R_j`` the running max of the numerator ``E`` at
            the end of block ``j`` (``exp2(s - m_j) = E / R_j``), and not rounded again. The
            numerator's rounding must be elementwise (bf16, fp16, tf32).
        rounded: ids of nodes whose values the kernel stores at the reduced precision (with
            ``dot_operands`` set, rounded by it after evaluation): SDPA's half-precision output.
    """

    def __init__(self, graph: Graph, precision: str = "native", dot_operands=None,
                 factored: dict | None = None, rounded=()):
        if precision not in ("native", "float64", "terms"):
            raise ValueError(f"precision must be 'native', 'float64' or 'terms', got {precision!r}")
        self.graph = graph
        self.precision = precision
        self.dot_operands = dot_operands if precision == "native" else None
        self.order = graph.nodes()
        users: dict[int, int] = {}
        for n in self.order:
            for s in n.srcs:
                users[id(s)] = users.get(id(s), 0) + 1
        for n in graph.outputs.values():
            users[id(n)] = users.get(id(n), 0) + 1
        self.factored = dict(factored or {}) if self.dot_operands is not None else {}
        self.rounded = set(rounded) if self.dot_operands is not None else set()
        for num, fac, _ in self.factored.values():      # kept until the contraction reads them
            for x in (num, fac):
                users[id(x)] = users.get(id(x), 0) + 1
        self._users = users
        # a Mul whose every user is a SumReduce is never materialized (einsum evaluates the pair)
        self._fused_mul = set()
        sum_users: dict[int, int] = {}
        for n in self.order:
            if n.op == "SumReduce" and n.srcs[0].op == "Mul":
                sum_users[id(n.srcs[0])] = sum_users.get(id(n.srcs[0]), 0) + 1
        for k, c in sum_users.items():
            if c == users.get(k, 0):
                self._fused_mul.add(k)
        self._dots: set[int] = set()
        if self.dot_operands is not None:
            from lumc.backends.triton.contraction import tensor_core_contractions
            self._dots = {id(c.node) for c in tensor_core_contractions(self.order)}
        self._scan_products: set[int] = set()   # ids of the products whose mask is skipped
        self._scans: dict[int, ScanSpec] = {}    # id(SumReduce) -> its prefix sum (scan_of)
        self._mask_only = self._scan_masks(graph)
        # id(sum) -> its row mean ``SumReduce(x) * (1/L)`` (paired with a variance or not): the
        # mean's value is taken with the sum, from the sum's operand (which may be freed by the
        # time the mean is evaluated), and kept in the run's values under ("mean", id(mean)).
        # A mean read only by sums (a mean over size-1 dims of a kept-dims mean: ONNX ReduceMean
        # after GlobalAveragePool) is a fused Mul that the reading sum's einsum evaluates from the
        # sum's own value, never on its own: it is no such pair (the sum's value must be the sum)
        self._mean_of = {id(s1): m for s1, m, _ in
                         (find_means(self.order) if precision != "terms" else [])
                         if id(m) not in self._fused_mul}
        self._means = {id(m) for m in self._mean_of.values()}

    def _scan_masks(self, graph: Graph) -> set[int]:
        """Ids of the nodes that only a prefix sum's triangular mask reads (its ``Where``,
        ``LessThan`` and ``Iota`` nodes, ``[L, L]``): ``numpy.cumsum`` never reads them, and
        evaluating them would allocate ``L^2`` elements (36 GiB of int64 iota at L = 70000).
        Fills ``_scan_products`` with the fused products that read such a mask, and ``_scans``
        with the prefix sums (:func:`~lumc.backends.scan_structure.scan_of`, once per run's
        executor, not per evaluation)."""
        masks: dict[int, Node | None] = {}  # id(fused product) -> its mask, None: read whole
        for n in self.order:
            if n.op == "SumReduce" and id(n.srcs[0]) in self._fused_mul:
                spec = scan_of(n) if id(n) not in self._dots else None
                if spec is not None and spec.n > 0:
                    self._scans[id(n)] = spec
                mask = None if spec is None or spec.n == 0 else next(
                    s for s in n.srcs[0].srcs if s is not spec.operand)
                if masks.get(id(n.srcs[0]), mask) is not mask:
                    mask = None                # another reduction of the product reads it whole
                masks[id(n.srcs[0])] = mask
        mask_of: dict[int, int] = {}       # id(mask side) -> its reads by prefix sums' products
        for product, mask in masks.items():
            if mask is not None:
                mask_of[id(mask)] = mask_of.get(id(mask), 0) + 1
                self._scan_products.add(product)
        if not mask_of:
            return set()
        outputs = {id(n) for n in graph.outputs.values()}
        reads: dict[int, int] = {}         # per node, the reads from mask-only nodes
        only: set[int] = set()
        for n in reversed(self.order):
            k = id(n)
            if k not in outputs and n.op != "Input" and (
                    mask_of.get(k, 0) + reads.get(k, 0) == self._users.get(k, 0) > 0):
                only.add(k)
                for s in n.srcs:
                    reads[id(s)] = reads.get(id(s), 0) + 1
        return only

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate every output.

        Args:
            inputs: ``{input name: array}`` with exactly the graph's input shapes and dtypes.
        Returns:
            ``{output name: array}`` in the graph's output order and declared dtypes.
        Raises:
            InputError: on a missing input, or one of the wrong shape or dtype.
        """
        return self.run_keeping(inputs, set())[0]

    def run_keeping(self, inputs: dict[str, np.ndarray], keep: set[int]
                    ) -> tuple[dict[str, np.ndarray], dict[int, np.ndarray]]:
        """Evaluate every output and also return the values of the nodes whose ``id`` is in
        ``keep`` (``{id(node): array}``; a fused ``Mul`` in ``keep`` is materialized)."""
        vals: dict[int, np.ndarray] = {}
        remaining = dict(self._users)
        for k in keep:
            remaining[k] = remaining.get(k, 0) + 1   # never freed
        f64 = self.precision != "native"
        for name, n in self.graph.inputs.items():
            x = checked_input(n, inputs)
            vals[id(n)] = x.astype(np.float64) if (f64 and n.dtype.is_float) else x
        kept: dict[int, np.ndarray] = {}
        # a prefix sum's mask is not evaluated, unless a value asked for is it or reads it (the
        # product of a prefix sum, materialized when kept)
        skip = self._mask_only if not keep & (self._mask_only | self._scan_products) else set()
        for n in self.order:
            if id(n) in vals or (id(n) in self._fused_mul and id(n) not in keep) or id(n) in skip:
                continue
            try:
                vals[id(n)] = self._eval(n, vals, f64, force=id(n) in keep)
                if id(n) in self.rounded:
                    vals[id(n)] = self.dot_operands(vals[id(n)], ())
            except IndexError as e:   # a Gather index outside its axis (from an input or a constant)
                raise IndexRangeError(str(e), **where(n)) from None
            except ZeroDivisionError as e:   # an integer Mod by zero
                raise DivisionByZeroError(str(e), **where(n)) from None
            if id(n) in keep:
                kept[id(n)] = vals[id(n)]
            for s in n.srcs:
                k = id(s)
                remaining[k] -= 1
                if remaining[k] == 0 and s.op != "Input":
                    vals.pop(k, None)
                    if s.op == "Mul" and k in self._fused_mul:
                        for s2 in s.srcs:
                            remaining[id(s2)] -= 1
                            if remaining[id(s2)] == 0:
                                vals.pop(id(s2), None)
        out = {}
        for name, n in self.graph.outputs.items():
            v = vals[id(n)]
            if v.dtype != n.dtype.np:
                with np.errstate(over="ignore"):   # float64 rounded to the output's type: inf
                    v = v.astype(n.dtype.np)       # past its range is IEEE's result, no warning
            out[name] = np.asarray(v, order="C")
        for name, n in self.graph.inputs.items():
            if id(n) in keep:
                kept[id(n)] = vals[id(n)]
        return out, kept

    def _factored_operand(self, op: Node, vals, f64: bool, axes) -> np.ndarray:
        """``op`` (views or casts of ``numerator * factor``, read by a contraction over ``axes``)
        with the numerator rounded as the flash loop rounds it (see ``factored``)."""
        num, fac, block = self.factored[id(op)]
        chain, x = [], op
        while not (x.op == "Mul" and {id(s) for s in x.srcs} == {id(num), id(fac)}):
            chain.append(x)
            x = x.srcs[0]

        def through(v):                 # the chain's views and casts, applied to one factor
            for y in reversed(chain):
                v = self._eval(y, {id(y.srcs[0]): v}, f64, force=True)
            return v
        e, full = _compact_broadcast(through(vals[id(num)]))
        g = through(np.broadcast_to(vals[id(fac)], x.shape))
        keys = [d for d in axes if e.shape[d] > 1]
        rest = [d for d in range(e.ndim) if d not in keys]
        moved = np.transpose(e, rest + keys)
        flat = moved.reshape(moved.shape[:len(rest)] + (-1,)).astype(np.float32)
        k = flat.shape[-1]
        bn = k if block is None else max(1, min(int(block), k))
        with np.errstate(all="ignore"):
            run = np.maximum.accumulate(flat, axis=-1) if k else flat
            ends = np.minimum((np.arange(k) // bn + 1) * bn, k) - 1
            r = run[..., ends]
            rounded = np.where(r > 0, self.dot_operands(flat / r, ()) * r, flat)
        back = np.transpose(rounded.reshape(moved.shape), np.argsort(rest + keys))
        g, _ = _compact_broadcast(g)
        with np.errstate(all="ignore"):
            out = (back * g).astype(np.float32)   # in the numerator's compact shape: the einsum
        return out if full is None else np.broadcast_to(out, full)   # keeps it a broadcast

    def _eval(self, n: Node, vals, f64: bool, force: bool = False) -> np.ndarray:
        row = OPS[n.op]
        if id(n) in self._means and ("mean", id(n)) in vals:
            return vals.pop(("mean", id(n)))
        mean = self._mean_of.get(id(n))
        if mean is not None and id(n.srcs[0]) in vals:
            mv = shifted_mean(vals[id(n.srcs[0])], tuple(n.arg),
                              np.float64 if f64 else mean.dtype.np)
            vals[("mean", id(mean))] = mv
            if not force and self._users.get(id(n)) == 1:
                # only the mean reads this sum, and it takes the value above: the sum is not
                # computed a second time (its value stands in, never read)
                return mv
        if n.op == "SumReduce" and id(n.srcs[0]) in self._fused_mul and id(n.srcs[0]) not in vals:
            m = n.srcs[0]
            dots = self.dot_operands if id(n) in self._dots else None
            spec = self._scans.get(id(n))      # None where a tensor-core contraction (dots)
            terms = self.precision == "terms" and n.dtype.is_float
            if spec is not None:
                v = vals[id(spec.operand)]
                return _prefix_sum(spec, _abs(v) if terms else v, n.dtype, f64)
            a, b = (self._factored_operand(s, vals, f64, n.arg) if dots is not None and
                    id(s) in self.factored else
                    _abs(vals[id(s)]) if terms else vals[id(s)] for s in m.srcs)
            rounded = tuple(dots is not None and id(s) in self.factored for s in m.srcs)
            return _einsum_sum_of_product(a, b, n.arg, n.dtype, f64, dots, rounded)
        xs = [vals[id(s)] for s in n.srcs]
        if n.op == "SumReduce" and self.precision == "terms" and n.dtype.is_float:
            xs = [_abs(xs[0])]
        if n.op == "Cast":
            # a cast of a broadcast view (a weight expanded over a contraction's product space)
            # converts its distinct elements once and stays a broadcast view
            x, full = _compact_broadcast(xs[0])
            y = x.astype(np.float64) if (f64 and n.arg.is_float) else cast_array(x, n.arg)
            return y if full is None else np.broadcast_to(y, full)
        if n.op == "Constant" or n.op == "Iota":
            v = row.reference(xs, n.arg)
            return v.astype(np.float64) if (f64 and n.dtype.is_float) else v
        if n.op == "Mul" and id(n) in self._fused_mul and not force:
            raise AssertionError("fused Mul evaluated")
        if "elementwise" in row.props or "reduce" in row.props:
            # dims every operand broadcasts (stride 0), kept by the op: computed once, read back
            # as a broadcast view (BatchNorm + ReLU spelled over a convolution's product space)
            dims = _shared_broadcast(xs, set(n.arg) if "reduce" in row.props else set())
            if dims:
                idx = tuple(slice(0, 1) if d in dims else slice(None) for d in range(len(n.shape)))
                return np.broadcast_to(row.reference([x[idx] for x in xs], n.arg), n.shape)
        return row.reference(xs, n.arg)


def _shared_broadcast(xs: list, reduced: set) -> set[int]:
    """The dims of size > 1 outside ``reduced`` along which every array of ``xs`` (one shape) is a
    broadcast (stride 0): an elementwise op or a reduction over other dims gives one value along
    them, the same bits for every index."""
    if not xs or not all(isinstance(x, np.ndarray) and x.shape == xs[0].shape for x in xs):
        return set()
    return {d for d, size in enumerate(xs[0].shape)
            if size > 1 and d not in reduced and all(x.strides[d] == 0 for x in xs)}


def _abs(x: np.ndarray) -> np.ndarray:
    """``|x|``, a broadcast (stride-0) view kept one: its distinct elements only."""
    c, full = _compact_broadcast(x)
    r = np.abs(c)
    return r if full is None else np.broadcast_to(r, full)


def _compact_broadcast(x: np.ndarray) -> tuple[np.ndarray, tuple | None]:
    """``(x without its stride-0 dims (kept as size 1), x's shape)``, or ``(x, None)`` when ``x``
    has no broadcast dim."""
    if not isinstance(x, np.ndarray) or not any(st == 0 and d > 1 for st, d in zip(x.strides, x.shape)):
        return x, None
    idx = tuple(slice(0, 1) if (st == 0 and d > 1) else slice(None)
                for st, d in zip(x.strides, x.shape))
    return x[idx], x.shape


def checked_input(n: Node, inputs: dict) -> np.ndarray:
    """The array given for graph input ``n`` (an ``Input`` node), as numpy.

    Raises:
        InputError: when it is missing, or of another shape or dtype (one line naming the input).
    """
    name = n.arg.name
    if name not in inputs:
        raise InputError(f"missing input {name!r}", node=name)
    x = dt.native_order(np.asarray(inputs[name]))
    if tuple(x.shape) != n.shape:
        raise InputError(f"input {name!r} has shape {tuple(x.shape)}, expected {n.shape}", node=name)
    if x.dtype != n.dtype.np:
        raise InputError(f"input {name!r} has dtype {x.dtype}, expected {n.dtype.np}", node=name)
    return x


def _prefix_sum(spec: ScanSpec, v: np.ndarray, out_dtype: dt.DType, f64: bool) -> np.ndarray:
    """The value of scan ``spec`` (shape ``spec.red.shape``) from its operand's value ``v`` (shape
    ``[..., i, j, ...]``, constant along ``i``): a cumsum along ``j`` in the contraction's
    accumulator (integers wrap as its sum), shifted one when exclusive, flipped when reversed,
    moved to axis ``i``; a zero sum is +0.0 (the contraction's sum starts from +0.0)."""
    k = spec.k
    acc = (np.float64 if f64 else out_dtype.accumulator.np) if out_dtype.is_float else out_dtype.np
    row = v[(slice(None),) * (k - 1) + (slice(0, 1),)].astype(acc)   # a view: v is a broadcast
    if spec.reverse:
        row = np.flip(row, k)
    with np.errstate(all="ignore"):
        s = np.cumsum(row, axis=k, dtype=acc)
        if spec.exclusive:
            s = s - row if not out_dtype.is_float else np.concatenate(
                [np.zeros_like(np.take(s, [0], axis=k)), np.delete(s, -1, axis=k)], axis=k)
        if out_dtype.is_float:
            s = s + np.zeros((), acc)
    if spec.reverse:
        s = np.flip(s, k)
    target = np.float64 if (f64 and out_dtype.is_float) else out_dtype.np
    return np.ascontiguousarray(np.swapaxes(s, k - 1, k)).astype(target, copy=False)


def _einsum_sum_of_product(a: np.ndarray, b: np.ndarray, axes, out_dtype: dt.DType,
                           f64: bool, dot_operands=None, rounded=(False, False)) -> np.ndarray:
    """``sum(a * b, axes, keepdims=True)`` without materializing ``a * b``.

    ``a`` and ``b`` have the same shape (the ``Mul`` rule). Broadcast dims (numpy stride 0) of each
    operand are dropped from its einsum subscript, so a matmul's ``[M, K, N]`` broadcast product costs
    ``M*K*N`` FLOPs and ``M*K + K*N`` reads.
    """
    rank = a.ndim
    shape = a.shape
    letters = string.ascii_letters[:rank]
    if out_dtype.is_float:
        acc = np.float64 if f64 else out_dtype.accumulator.np
    else:
        acc = out_dtype.np

    def compact(x):
        idx, sub = [], []
        for k in range(rank):
            bcast = shape[k] > 1 and x.strides[k] == 0
            idx.append(0 if bcast else slice(None))
            sub.append("" if bcast else letters[k])
        return x[tuple(idx)].astype(acc, copy=False), "".join(sub)

    ca, sa = compact(a)
    cb, sb = compact(b)
    red = set(axes)
    if dot_operands is not None and out_dtype.is_float:
        if not rounded[0]:
            ca = dot_operands(ca, tuple(i for i, ch in enumerate(sa) if letters.index(ch) in red))
        if not rounded[1]:
            cb = dot_operands(cb, tuple(i for i, ch in enumerate(sb) if letters.index(ch) in red))
    present = set(sa) | set(sb)
    out_sub = "".join(letters[k] for k in range(rank) if k not in red and letters[k] in present)
    with np.errstate(all="ignore"):
        r = np.einsum(f"{sa},{sb}->{out_sub}", ca, cb, optimize=True)
        # dims broadcast in both operands: a reduced one scales the sum by its extent
        for k in range(rank):
            if letters[k] not in present and k in red and shape[k] != 1:
                r = r * np.asarray(shape[k], dtype=acc)
        keep_shape = [shape[k] if letters[k] in present else 1 for k in range(rank) if k not in red]
        r = np.reshape(r, keep_shape)
        full = [shape[k] for k in range(rank) if k not in red]
        r = np.broadcast_to(r, full)
        r = np.reshape(r, tuple(1 if k in red else shape[k] for k in range(rank)))
    target = np.float64 if (f64 and out_dtype.is_float) else out_dtype.np
    return np.asarray(r, order="C").astype(target, copy=False)


def largest_value(graph: Graph) -> Node | None:
    """The largest value a reference run of ``graph`` allocates whole, a lower bound of the run's
    peak memory: leaves, views (numpy views), casts (of a broadcast: compact), the products a
    ``SumReduce`` reads whole (one einsum) and a prefix sum's mask (never evaluated) are not
    counted. An elementwise value whose operands all broadcast along a dim is counted whole,
    though the run computes it once along that dim (``_shared_broadcast``): for such a graph the
    figure can exceed what the run allocates."""
    ex = ReferenceExecutor(graph)
    sized = [n for n in ex.order if n.op not in ("Input", "Constant", "Iota", "View", "Cast")
             and id(n) not in ex._fused_mul and id(n) not in ex._mask_only]
    return max(sized, key=lambda n: n.nbytes, default=None)


def unallocated(graph: Graph) -> set[int]:
    """Ids of the nodes of ``graph`` whose value a reference run never allocates whole: the
    products a ``SumReduce`` reads as one einsum, the triangular masks of its prefix sums (an
    artifact of a CumSum at L = 70000 declares a 36 GiB ``[L, L]`` mask no run evaluates), and
    unmasked views of a node that is not itself a view (numpy views of a value already counted;
    a view of a view may copy its source), except the graph's outputs: each is returned as an
    array of its own (a [4096, 8] Expand of 8 floats is 128 KiB at the output)."""
    ex = ReferenceExecutor(graph)
    outputs = {id(n) for k, n in graph.outputs.items() if not k.startswith("__n")}  # not the
    # plan boundaries an artifact stores as outputs (lumc.compiler.runtime.compiled.from_parts)
    return ex._fused_mul | ex._mask_only | {
        id(n) for n in ex.order
        if n.op == "View" and n.arg.mask is None and n.srcs[0].op != "View" and
        id(n) not in outputs}


def run_reference(graph: Graph, inputs: dict[str, np.ndarray], precision: str = "native"):
    """One-shot convenience: ``ReferenceExecutor(graph, precision)(inputs)``."""
    return ReferenceExecutor(graph, precision)(inputs)


def summand_magnitudes(graph: Graph) -> Graph:
    """``graph`` with every ``SumReduce`` summing the absolute values of its terms: evaluated in
    float64, an output's value is the scale of the rounding error any summation order leaves in
    it (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 4.4: the error of
    a recursive sum is bounded by ``(n - 1) u sum|x_i|``), where the output itself may cancel to
    about 0 (the sum of a normalized row). Elementwise ops and other reductions are kept."""
    from lumc.ir.graph import node, toposort
    from lumc.ir.tensor import Tensor
    new: dict[int, Node] = {}
    for n in toposort(list(graph.outputs.values())):
        srcs = [new[id(s)] for s in n.srcs]
        if n.op == "SumReduce" and srcs[0].dtype.is_float:
            srcs = [Tensor(srcs[0]).abs().node]
        new[id(n)] = n if not n.srcs else rebuilt(n, srcs)
    return Graph(dict(graph.inputs), {k: new[id(v)] for k, v in graph.outputs.items()})


class TooLargeError(InputError):
    """A size range whose reference runs would not fit this machine's memory
    (:func:`refuse_too_large`)."""


def refuse_too_large(graph, where: str) -> None:
    """Refused when one value of ``graph`` (``largest_value``) takes over half this machine's
    memory (a [B, H, S, S] score at B = S = 1023: 16 GiB; a MemoryError or the OOM killer)."""
    import os
    n = largest_value(graph)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if n is not None and 2 * n.nbytes > ram:
        raise TooLargeError(f"at {where} the reference run holds a {n.nbytes / 2**30:.3g} GiB "
                            f"value ({n.op} {list(n.shape)}), over half of this machine's "
                            f"{ram / 2**30:.3g} GiB memory; narrow the range (--shape, a Dim's "
                            "max, torch.compile options={'max_size': N})")
