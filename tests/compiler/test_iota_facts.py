"""Index arithmetic proved at every size of a probed dim (``lumc.compiler.core.iota_facts``): a
graph built at a probe prime, folded, re-sized to sizes of a range and run, against numpy."""
import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.constfold import fold_constants
from lumc.compiler.core.iota_facts import Lin, lin_of
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node, node
from lumc.ir.library.reduce import cumsum
from lumc.ir.symbolic import Substitution, probing, resize
from lumc.ir.tensor import Tensor, concat

P = 1009                      # the probe, as a range's import uses one above a small range
SIZES = (1, 2, 3, 17, 64, 127, 128)


def _at(g: Graph, n: int) -> Graph:
    """``g`` re-sized to ``L = n``; the prepend's padded extent ``L + 1`` is the table entry a
    range's import learns (``lumc.ir.symbolic.learn_table``)."""
    return resize(g, Substitution({P: n}, {P + 1: (1, ((P, 1, 1),))}))


def _packed_graph(L: int, step: int = 1, threshold: int | None = None) -> Graph:
    """transformers' packed-sequence check on ``position_ids = step * arange(L)``:
    ``cumsum(diff(pos, prepend=pos[:, :1] - 1) != 1)``, the gathers of ``arange`` by its wrapped
    index (``where(i < 0, i + L, i)``), the mask ``packed[q] == packed[k] & k <= q`` applied to
    an input ``x [1, L]``; with ``threshold``, also ``& k < threshold``."""
    x = input_node("x", (1, L), dt.f32)
    i = Tensor.iota((L,), 0)
    pos = i.mul(Tensor.full((L,), step, dt.i64)).reshape((1, L))
    first = pos.slice([0], [1], [1]).add(Tensor.full((1, 1), -1, dt.i64))
    cat = concat([first, pos], 1)
    diff = cat.slice([1], [L + 1], [1]).add(cat.slice([0], [L], [1]).mul(Tensor.full((1, L), -1, dt.i64)))
    packed = cumsum(diff.ne(Tensor.full((1, L), 1, dt.i64)).cast(dt.i64), 1).reshape((L,))
    wrapped = i.lt(Tensor.full((L,), 0, dt.i64)).where(i.add(Tensor.full((L,), L, dt.i64)), i)
    idx = Tensor(node("Gather", (i.node, wrapped.node), 0))
    pk = Tensor(node("Gather", (packed.node, idx.node), 0))
    q, k = pk.reshape((L, 1)).expand((L, L)), pk.reshape((1, L)).expand((L, L))
    qi, ki = idx.reshape((L, 1)).expand((L, L)), idx.reshape((1, L)).expand((L, L))
    mask = q.eq(k).logical_and(ki.le(qi))
    if threshold is not None:
        mask = mask.logical_and(ki.lt(Tensor.full((L, L), threshold, dt.i64)))
    xs = Tensor(x).reshape((1, L)).expand((L, L))
    y = mask.where(xs, Tensor.full((L, L), 0.0, dt.f32)).add(pk.cast(dt.f32).reshape((1, L)).expand((L, L)))
    return Graph({"x": x}, {"y": y.node})


def _expected(x: np.ndarray, step: int, threshold: int | None) -> np.ndarray:
    L = x.shape[1]
    pos = step * np.arange(L)[None]
    packed = np.cumsum(np.diff(pos, prepend=pos[:, :1] - 1, axis=-1) != 1, axis=-1)[0]
    q, k = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    mask = (packed[q] == packed[k]) & (k <= q)
    if threshold is not None:
        mask &= k < threshold
    return np.where(mask, np.broadcast_to(x, (L, L)), 0.0).astype(np.float32) + packed[None].astype(np.float32)


def _folded_at_probe(step=1, threshold=None):
    with probing((P,)):
        g = _packed_graph(P, step, threshold)
        return g, fold_constants(g)


def test_packed_sequence_check_folds_to_nothing_at_every_size():
    g, f = _folded_at_probe()
    ops = f.op_counts()
    # the cumsum's contraction, both gathers and the diff's comparisons are proved away: what is
    # left is the causal comparison of two iotas and the select of x
    assert "Gather" not in ops and "SumReduce" not in ops, ops
    assert ops.get("LessThan", 0) == 1, ops
    rng = np.random.default_rng(0)
    for n in SIZES:
        x = rng.standard_normal((1, n)).astype(np.float32)
        got = ReferenceExecutor(_at(f, n))({"x": x})["y"]
        np.testing.assert_array_equal(got, _expected(x, 1, None))
        np.testing.assert_array_equal(got, ReferenceExecutor(_at(g, n))({"x": x})["y"])


@pytest.mark.parametrize("step, threshold", [(2, None), (1, 100)])
def test_values_that_depend_on_the_size_stay_computed(step, threshold):
    # step 2: every position starts a new sequence, packed = arange (a cumsum of ones, not
    # proved); k < 100: true below 100, false above, not one form at every size
    g, f = _folded_at_probe(step, threshold)
    assert "SumReduce" in f.op_counts() if step == 2 else f.op_counts().get("LessThan", 0) >= 2
    rng = np.random.default_rng(1)
    for n in SIZES + (150,):
        x = rng.standard_normal((1, n)).astype(np.float32)
        got = ReferenceExecutor(_at(f, n))({"x": x})["y"]
        np.testing.assert_array_equal(got, _expected(x, step, threshold))


def test_lin_reads_probe_multiples_padded_extents_and_literals():
    assert lin_of(3 * P, (P,)) == Lin(0, ((P, 3),))
    assert lin_of(P + 1, (P,)) == Lin(1, ((P, 1),))
    assert lin_of(-P, (P,)) == Lin(0, ((P, -1),))
    assert lin_of(256, (P,)) == Lin(256) and lin_of(P * P, (P,)) is None
    assert lin_of(P + 1, (P,), near=False) == Lin(P + 1)      # a literal is never read as padded
    # decided for every size >= 1: L >= 1 is, L >= 2 is not (false at L = 1)
    assert (Lin(0, ((P, 1),)) - Lin(1)).nonneg() and not (Lin(0, ((P, 1),)) - Lin(2)).nonneg()


def test_a_padded_extent_is_read_against_the_nearest_probe():
    """At a check import the probe and check primes are both active: 502 is the check prime 503
    less one (not the probe 509 less 7, which made the probe and check imports fold differently
    and a range whose top primes are close, seq 2..512, unprobeable); a tie is not read."""
    assert lin_of(502, (509, 503)) == Lin(-1, ((503, 1),))
    assert lin_of(504, (509, 503)) == Lin(1, ((503, 1),))
    assert lin_of(508, (509, 503)) == Lin(-1, ((509, 1),))
    assert lin_of(506, (509, 503)) is None


def test_unsigned_integers_are_not_analysed():
    """A cast to uint64 wraps a negative value: ``(arange - 1).cast(u64) < ... + 1`` is False at
    element 0; the analysis takes signed int64 and bool alone, so nothing folds (and nothing
    crashes on a negative value it cannot hold)."""
    from lumc.compiler.core.iota_facts import index_value
    L = P
    i = Tensor.iota((L,), 0).add(Tensor.full((L,), -1, dt.i64))
    u = i.cast(dt.u64)
    assert index_value(u.node, [None], (P,)) is None
    x = input_node("x", (L,), dt.f32)
    keep = u.lt(u.add(Tensor.full((L,), 1, dt.u64)))
    y = keep.where(Tensor(x), Tensor(x).scalar_like(0.0))
    g = Graph({"x": x}, {"y": y.node})
    with probing((P,)):
        folded = fold_constants(g)
    for n in (1, 2, 3):
        a = np.arange(n, dtype=np.float32) + 1
        got = ReferenceExecutor(_at(folded, n))({"x": a})["y"]
        want = np.where((np.arange(n) - 1).astype(np.uint64) < (np.arange(n) - 1).astype(np.uint64) + np.uint64(1), a, 0)
        np.testing.assert_array_equal(got, want)
