"""Readers of a contraction's tile through a view (a slice, a permutation, a split of heads) are
stored by the contraction's kernel (``compiler/core/fusion_stored.py``): one kernel instead of a
matmul and a copy kernel, with the same values as the reference, in the Triton interpreter too."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.codegen import SourceWriter
from lumc.backends.triton.indexing import store_order, store_through
from lumc.backends.triton.runner import run_program
from lumc.compiler.core.fusion import greedy_program
from lumc.ir import dtypes as dt
from lumc.ir.tensor import Tensor, split
from lumc.ir.views import View

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fusion import graph, inp, run_both  # noqa: E402

RNG = np.random.default_rng(7)


def _w(shape, d=dt.f32):
    return Tensor.const(RNG.standard_normal(shape).astype(d.np))


def _heads(t: Tensor, b: int, s: int, h: int) -> Tensor:
    """``[B, S, H*D]`` as ``[B, H, S, D]`` (a key cache's layout)."""
    return t.reshape((b, s, h, t.shape[-1] // h)).permute((0, 2, 1, 3))


def _projections(m: int, k: int, n: int, d=dt.f32, product_read: bool = False):
    """Merged Q/K/V projections returned as outputs: ``q + bq`` (a column slice), ``k + bk`` as
    heads (a permutation of a slice) and ``relu(v + bv)``; with ``product_read`` the product is
    also read by a row sum of it scaled by 2 (another kernel: a reduction)."""
    x = inp("x", (m, k), d)
    p = x @ _w((k, 3 * n), d)
    q, kk, v = split(p, [n, n, n], 1)
    outs = {"q": q + _w((n,), d), "k": _heads(kk + _w((n,), d), 1, m, 2),
            "v": (v + _w((n,), d)).maximum(0.0)}
    if product_read:
        outs["p2"] = (p * 2.0).sum(1)
    return graph(outs, {"x": x})


def _interpreted(g, p, d=dt.f32, tol=None):
    feed = {k: RNG.standard_normal(n.shape).astype(n.dtype.np) for k, n in g.inputs.items()}
    want = ReferenceExecutor(g, "float64")(feed)
    got = run_program(p, feed)
    for k in want:
        assert got[k].shape == want[k].shape
        np.testing.assert_allclose(got[k].astype(np.float64), want[k],
                                   rtol=tol or 1e-4, atol=tol or 1e-4, err_msg=k)


@pytest.mark.parametrize("m,k,n", [(64, 48, 32), (37, 20, 22), (5, 130, 6)])
def test_readers_through_views_are_stored_by_the_contraction(m, k, n):
    g = _projections(m, k, n)
    p = run_both(g)
    assert p.form_counts() == {"matmul": 1}
    assert not any("is a copy" in line or "read through a view" in line for line in p.notes)
    # the product itself is not written: nothing but the stored readers reads it
    assert [o.shape for o in p.calls[0].kernel.meaning.outputs.values()] == [
        (m, n), (1, 2, m, n // 2), (m, n)]
    _interpreted(g, p)


def test_a_product_read_elsewhere_is_written_too():
    g = _projections(40, 24, 16, product_read=True)
    p = run_both(g)
    assert p.form_counts() == {"matmul": 1, "reduction": 1}
    assert (40, 1, 48) in [o.shape for o in p.calls[0].kernel.meaning.outputs.values()]
    _interpreted(g, p)


def test_half_precision_and_split_k_configs_store_the_same_values():
    from lumc.backends.triton import configs
    from lumc.backends.triton.launch import TritonKernel
    g = _projections(24, 1024, 16, dt.f16)
    p = run_both(g)
    assert p.form_counts() == {"matmul": 1}
    kern = p.calls[0].kernel
    feed = [RNG.standard_normal(n.shape).astype(n.dtype.np) for n in p.calls[0].inputs]
    want = ReferenceExecutor(kern.meaning, "float64")(
        {f"in{i}": a for i, a in enumerate(feed)})
    tk = TritonKernel(kern)
    assert tk.rendered.config_space == "matmul_splitk"     # the finish kernel stores them too
    for split_k in (1, 4):
        cfg = configs.make(4, 2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=8,
                           SPLIT_K=split_k)
        got = tk(*feed, config=cfg)
        for name, t in zip(kern.meaning.outputs, got):
            np.testing.assert_allclose(np.asarray(t, np.float64), want[name], rtol=2e-2,
                                       atol=2e-2, err_msg=f"{name} SPLIT_K={split_k}")


def test_views_that_cannot_be_inverted_stay_copies():
    """A broadcast (one product position read at several indices) and a sliding window
    (overlapping reads) are not stored through: the copy kernel stays, and the values hold."""
    x = inp("x", (16, 8))
    p = x @ _w((8, 12))
    outs = {"b": p.reshape((16, 1, 12)).expand((16, 3, 12)),
            "w": p.window(1, 4, 2)}
    g = graph(outs, {"x": x})
    prog = run_both(g)
    assert "pointwise" in prog.form_counts()
    assert store_order(View.contiguous((16, 1, 12)).expand((16, 3, 12))) is None


def test_a_float64_contraction_keeps_its_copy_kernel():
    """The row engine (no ``tl.dot`` for float64) does not store through views: the kernel with
    the readers does not render, so they stay apart, and the values hold."""
    g = _projections(9, 7, 6, dt.f64)
    p = run_both(g)
    assert p.form_counts() == {"matmul": 1, "pointwise": 1}
    _interpreted(g, p, tol=1e-12)


@st.composite
def _views(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    v = View.contiguous(shape)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["permute", "slice", "reshape", "expand"]))
        if op == "permute":
            v = v.permute(tuple(draw(st.permutations(range(v.ndim)))))
        elif op == "slice":
            starts, steps, counts = [], [], []
            for d in v.shape:
                a = draw(st.integers(0, d - 1))
                s = draw(st.integers(1, 2))
                starts.append(a)
                steps.append(s)
                counts.append(draw(st.integers(1, (d - 1 - a) // s + 1)))
            v = v.slice(starts, steps, counts)
        elif op == "reshape":
            r = v.reshape((v.numel,))
            v = r if r is not None else v
        else:
            k = draw(st.integers(0, v.ndim - 1))
            if v.shape[k] == 1:
                v = v.expand(tuple(3 if i == k else d for i, d in enumerate(v.shape)))
    return shape, v


@settings(max_examples=300, deadline=None)
@given(_views())
@example(((1, 2, 1, 3), View((1, 2, 1, 2), (0, 3, 0, 2), 0, None)))    # injective, not nested
def test_store_through_inverts_every_invertible_view(case):
    """For each source position, the emitted digits name the one output index that reads it, and
    the mask is true exactly at the positions the view reads; a view refused by ``store_order``
    reads some position twice, is masked, or its strides do not nest (a step-2 slice of 2 of 3
    columns of 2 rows reads 0, 2, 3, 5, each once: refused, conservatively)."""
    shape, v = case
    n = int(np.prod(shape))
    idx = np.indices(v.shape).reshape(v.ndim, -1)
    reads = v.offset + np.tensordot(np.array(v.strides), idx, 1) if v.ndim else np.array([0])
    order = store_order(v)
    if order is None:
        dims = sorted(((s, d) for d, s in zip(v.shape, v.strides) if d > 1), reverse=True)
        nested = all(s1 >= s2 * d2 for (s1, _), (s2, d2) in zip(dims, dims[1:]))
        assert v.mask is not None or len(set(reads.tolist())) < reads.size or not nested
        return
    w = SourceWriter()
    out, valid = store_through(w, v, "addr", 0)
    env = {"addr": np.arange(n)}
    exec(w.body().replace("    ", ""), {}, env)    # the emitted lines are plain arithmetic
    digits = [np.broadcast_to(eval(e, {}, env), (n,)) for e in out]
    ok = np.ones(n, bool) if valid is None else np.broadcast_to(eval(valid, {}, env), (n,))
    assert sorted(np.flatnonzero(ok).tolist()) == sorted(reads.tolist())
    for pos in np.flatnonzero(ok):
        i = tuple(int(d[pos]) for d in digits)
        assert v.offset + sum(a * s for a, s in zip(i, v.strides)) == pos


def test_an_injective_view_whose_strides_do_not_nest_is_refused():
    """Strides that do not nest are refused even where the view reads each position once: a
    dilated window (``i * 3 + j * 2``, ``j < 3``) reads 0, 2, 4, 3, 5, 7, and greedy digits find
    nothing at 4 (``4 // 3`` is 1, leaving 1, which no column reads), though ``(0, 2)`` reads it;
    a step-2 slice of 2 of 3 columns (0, 2, 3, 5) is refused by the same rule, conservatively."""
    window = View((2, 3), (3, 2), 0, None)
    assert store_order(window) is None
    v = View.contiguous((2, 3)).slice([0, 0], [1, 2], [2, 2])
    assert v.strides == (3, 2)
    assert store_order(v) is None


def test_one_sized_module_serves_every_sequence_length():
    """A key cache's heads of a ranged sequence length: the stored kernel's strides and bounds
    are sizes, re-sized per call by the size-generic module."""
    from lumc.backends.triton.size_generic import SizedKernel
    from lumc.ir.symbolic import Resizer, probing
    P = 61
    with probing([P]):
        x = inp("x", (2, P, 16))
        p = x @ _w((16, 24)) + _w((24,))
        q, k, v = split(p, [8, 8, 8], 2)
        g = graph({"q": q, "k": _heads(k, 2, P, 2), "v": _heads(v, 2, P, 2)}, {"x": x})
        prog = greedy_program(g)
    assert prog.form_counts() == {"matmul": 1}
    kern = prog.calls[0].kernel
    sk = SizedKernel(kern, {P: "L0"})
    for n in (1, 6, 33):
        m = Resizer({P: n}).graph(kern.meaning)
        feed = {name: RNG.standard_normal(ph.shape).astype(np.float32)
                for name, ph in m.inputs.items()}
        ref = ReferenceExecutor(m, "float64")(feed)
        got = sk(*[feed[name] for name in m.inputs], sizes={"L0": n})
        for o, t in zip(m.outputs, got):
            np.testing.assert_allclose(t.numpy(), ref[o], rtol=1e-4, atol=1e-4, err_msg=f"{o} {n}")


def test_torch_projections_returned_as_outputs_compile_to_one_kernel(tmp_path, monkeypatch):
    import torch
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)

    class Cache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split(32, dim=-1)
            return torch.relu(q), k.view(b, s, 4, 8).transpose(1, 2), v.view(b, s, 4, 8)

    m = Cache().eval()
    x = torch.randn(2, 12, 32)
    f = lumc.compile(m, budget="60s", device="sim:h200", example_inputs=(x,))
    with torch.no_grad():
        want = m(x)
    got = f(x)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    (spec,) = [s for s in f._cache.values() if s.compiled is not None]
    assert spec.compiled.report_dict()["kernels"] == 1


def test_a_reader_of_the_product_in_two_orders_is_not_stored():
    """``p.T + p`` reads the product through a transpose and in its own order: no tile position
    holds both, so the matmul renderer refuses such an output and fusion keeps it apart."""
    from lumc.backends.triton.codegen import RenderError
    from lumc.backends.triton.render_matmul import render_matmul
    from lumc.ir.graph import Graph
    from lumc.ir.kernels import Kernel
    x = inp("x", (12, 8))
    p = x @ _w((8, 12))
    g = graph({"y": p.transpose(0, 1) + p}, {"x": x})
    prog = run_both(g)
    assert prog.form_counts() == {"matmul": 1, "pointwise": 1}
    a, b = inp("in0", (12, 8)), inp("in1", (8, 12))
    q = a @ b
    k = Kernel("matmul", Graph({"in0": a.node, "in1": b.node},
                               {"out0": (q.transpose(0, 1) + q).node}))
    with pytest.raises(RenderError, match="cannot be stored"):
        render_matmul(k)


def test_the_vendor_path_writes_the_same_stored_outputs():
    """The kernel's cuBLAS config (the torch replay of its meaning) gives the readers' values at
    their own shapes, as the Triton kernel does."""
    import torch
    from lumc.compiler.runtime.extern import ExternKernel
    g = _projections(24, 40, 16)
    p = run_both(g)
    call = p.calls[0]
    ins = [RNG.standard_normal(n.shape).astype(np.float32) for n in call.inputs]
    want = ReferenceExecutor(call.kernel.meaning, "float64")(
        {f"in{i}": a for i, a in enumerate(ins)})
    outs = [torch.full(o.shape, float("nan")) for o in call.kernel.meaning.outputs.values()]
    ExternKernel(call.kernel)(*[torch.from_numpy(a) for a in ins], outputs=outs)
    for name, t in zip(call.kernel.meaning.outputs, outs):
        np.testing.assert_allclose(t.numpy(), want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_the_unfused_program_keeps_one_kernel_per_op():
    from lumc.compiler.core.pipeline import unfused_program
    g = _projections(16, 8, 6)
    prog = unfused_program(g)
    (mm,) = [c for c in prog.calls if c.kernel.form == "matmul"]
    assert [o.op for o in mm.kernel.meaning.outputs.values()] == ["SumReduce"]
    assert prog.form_counts()["pointwise"] >= 4


def test_an_empty_reader_is_not_stored_through_its_view():
    """A zero-width slice of the product (a split with an empty part) reads nothing: its size-0
    dim would drop out of the digits with the unit dims, and the kernel would store the other
    dims' digits into the empty buffer (in the interpreter, over a neighbouring output). It stays
    a copy kernel of nothing; the other reader is still stored."""
    assert store_order(View.contiguous((4, 12)).slice([0, 5], [1, 1], [4, 0])) is None
    x = inp("x", (4, 8))
    p = x @ _w((8, 12))
    empty, _ = split(p, [0, 12], 1)
    first, _ = split(p, [4, 8], 1)
    g = graph({"a": empty + 1.0, "b": first.transpose(0, 1) * 2.0}, {"x": x})
    prog = run_both(g)
    (mm,) = [c for c in prog.calls if c.kernel.form == "matmul"]
    assert all(0 not in o.shape for o in mm.kernel.meaning.outputs.values())
    _interpreted(g, prog)


def test_a_view_under_the_stored_view_is_refused_even_when_it_is_the_same_view():
    """``T(2 * T(p))`` whose two ``View`` nodes hold one ``View`` object (value-equal views
    share no object in the tensor API, but nothing forbids it): the inner transpose reads the
    product at the tile's transposed position, which the kernel does not hold. It was skipped as
    the stored view (by its object's id), and the kernel stored ``2 * p.T + 1`` where the meaning
    is ``2 * p + 1`` (off by 20 in the interpreter). The renderer refuses it now."""
    from lumc.backends.triton.codegen import RenderError
    from lumc.backends.triton.render_matmul import render_matmul
    from lumc.ir.graph import Graph, node
    from lumc.ir.kernels import Kernel
    a, b = inp("in0", (8, 6)), inp("in1", (6, 8))
    t = View.contiguous((8, 8)).permute((1, 0))
    inner = Tensor(node("View", ((a @ b).node,), t)) * 2.0
    o = Tensor(node("View", (inner.node,), t)) + 1.0
    k = Kernel("matmul", Graph({"in0": a.node, "in1": b.node}, {"out0": o.node}))
    with pytest.raises(RenderError, match="moves elements"):
        render_matmul(k)


def test_the_simulator_prices_the_digits_under_a_normalization_formed_on_load():
    """Pre-LN QKV returning its key and value as heads: the matmul kernel forms the norm on load
    (its sum of squares is one more contraction in the meaning) and stores the readers through
    their views; the digits were priced at 0 there (``stored_view_ops`` took only a meaning of
    one contraction), as in the same kernel without the norm they are not."""
    from lumc.backends.triton.render_matmul import stored_view_ops
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    from lumc.ir.library.norm import rms_norm
    x = inp("x", (2, 10, 16))
    p = rms_norm(x, _w((16,))) @ _w((16, 48)) + _w((48,))
    q, k, v = split(p, [16, 16, 16], 2)
    g = graph({"q": q * 0.5, "k": _heads(k, 2, 10, 4), "v": _heads(v, 2, 10, 4)}, {"x": x})
    new, forms, _ = egraph_candidates(g, "h200", k=1).best.decoded
    prog = greedy_program(new, forms=forms, norm_prologue=True)
    (mm,) = [c.kernel for c in prog.calls if c.kernel.form == "matmul"]
    assert [o.shape for o in mm.meaning.outputs.values()] == [(2, 10, 16), (2, 4, 10, 4),
                                                               (2, 4, 10, 4)]
    # q's view has 3 non-unit dims, k's and v's 4 each: 7 ops a dim, 3 for the offset and store
    assert stored_view_ops(mm) == (7 * 3 + 3) + 2 * (7 * 4 + 3)


def test_why_not_still_says_why_a_stored_reader_and_a_kept_product_are_written():
    """``--why-not`` reads the refusal lines per written value. A stored reader that is a model
    output read by another contraction is still written because it is a model output (the line
    was dropped with the ones that kept it apart, and the entry said the producer was a form
    whose output is its root); a product written for a reader in its own order says so."""
    from lumc.compiler.core.fusion_stored import STORED_KEPT
    from lumc.compiler.core.why_not import why_not
    x = inp("x", (20, 16))
    p = x @ _w((16, 48))
    q, k, _ = split(p, [16, 16, 16], 1)
    q = q + 1.0
    prog = run_both(graph({"q": q, "o": q @ _w((16, 8)), "k": k.transpose(0, 1) * 2.0},
                          {"x": x}))
    assert prog.form_counts() == {"matmul": 2}
    (entry,) = why_not(prog)["pairs"]
    assert entry["fusion"] == "model output", entry
    prog = run_both(_projections(40, 24, 16, product_read=True))
    (entry,) = why_not(prog)["pairs"]
    assert entry["fusion"] == STORED_KEPT, entry
    assert not any("is a copy" in line or "read through a view" in line for line in prog.notes)


def test_a_product_read_back_only_through_a_stored_output_is_not_written():
    """An output view (``t = p.T``, stored by the matmul) also read by another kernel
    (``t + 1``): that kernel reads ``t``, not the product, so the product is not written (it was:
    the reader counted as one of the product's, through the view); ``--why-not`` says ``t`` is
    written as a model output (its 'is a copy' line went, and no line said why)."""
    from lumc.compiler.core.why_not import why_not
    x = inp("x", (12, 8))
    t = (x @ _w((8, 10))).transpose(0, 1)
    g = graph({"t": t, "u": t + 1.0}, {"x": x})
    prog = run_both(g)
    mm, pw = prog.calls
    assert [o.shape for o in mm.outputs] == [(10, 12)] and list(pw.inputs) == mm.outputs
    (entry,) = why_not(prog)["pairs"]
    assert entry["fusion"] == "model output", entry
    _interpreted(g, prog)


@pytest.mark.parametrize("shape", [(1, 1), ()])
def test_one_element_read_off_the_product_is_stored_at_one_lane(shape):
    """``p[2:3, 3:4]`` (or ``p[2, 3]``): a view with no dim above 1 has no digit, so the store's
    offset was the constant 0, a scalar pointer for the tile's value (Triton: 'Value argument
    cannot be block type if pointer argument is not a block'); the pointer spans the tile, and
    the one lane the view reads stores."""
    x = inp("x", (6, 8))
    p = x @ _w((8, 10))
    y = inp("y", (1, 1))
    one = p.slice([2, 3], [3, 4]).reshape(shape)
    g = graph({"a": one + y.reshape(shape), "b": p.transpose(0, 1) * 2.0}, {"x": x, "y": y})
    prog = run_both(g)
    assert prog.form_counts() == {"matmul": 1}
    _interpreted(g, prog)


def test_a_prefix_returned_off_the_product_is_stored_and_served_from_its_own_buffer():
    """A contiguous output view (the first batch ``p[0:1]``) stored by the matmul, with the
    product not written: the program serves it from the buffer the kernel writes
    (``program.output_source``); served from the product's, the program was refused ('output ...
    is not written by any call') and the compile failed."""
    x = inp("x", (2, 1, 16))
    p = x @ _w((16, 19))
    g = graph({"o1": p.slice([0], [1]), "t": p.transpose(0, 2) * 2.0}, {"x": x})
    prog = run_both(g)
    assert prog.form_counts() == {"matmul": 1}
    assert sorted(o.shape for o in prog.calls[0].outputs) == [(1, 1, 19), (19, 1, 2)]
    _interpreted(g, prog)


def test_a_reader_in_the_products_order_joins_the_stored_ones():
    """``relu(p)`` returned beside ``p.T * 2``: the product is read through a transpose, so it
    was written and ``relu(p)`` was a pointwise kernel of its own; it is an epilogue output of
    the matmul now, and the product is not written."""
    x = inp("x", (12, 8))
    p = x @ _w((8, 20))
    g = graph({"t": p.transpose(0, 1) * 2.0, "r": p.maximum(0.0)}, {"x": x})
    prog = run_both(g)
    assert prog.form_counts() == {"matmul": 1}
    assert sorted(o.shape for o in prog.calls[0].outputs) == [(12, 20), (20, 12)]
    _interpreted(g, prog)
