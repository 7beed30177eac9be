"""A decoding step's normalization formed on load in its GEMVs (``rowplan.RowPlan.prologue``).

With one row per sequence the projections after an RMSNorm or LayerNorm are GEMVs, rendered as row
kernels (one program per ``BLOCK_M`` output columns, each summing over the hidden dim). The norm's
row statistics are taken again in each program over the main tile, through the view that reads
the normalized input, so the normalization is never written: rendered and run in the Triton
interpreter for batches whose rows map to different statistics, both row-kernel variants, a paired
gate/up, and the refusal of a view that reads the statistic's rows across the reduced axis. The
simulator prices the statistics per main tile element."""
from __future__ import annotations

import pytest
import torch

from lumc.backends.devices import get_device
from lumc.backends.simulator import row_dims, row_passes, row_prologue_ops, simulate_kernel_time
from lumc.backends.triton import configs
from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.render import render_parts
from lumc.backends.triton.rowplan import plan_rows
from lumc.ir import dtypes as dt
from lumc.ir.library.norm import layer_norm, rms_norm
from test_triton_paired_matmul import LlamaMLP
from triton_cases import check, egraph_candidates_checked, make_kernel


def _normed(kind, x, s, b):
    return rms_norm(x, s) if kind == "rms" else layer_norm(x, s, b)[0]


def _gemv(kind: str, batch: int, c: int, n: int):
    """``norm(x) @ w`` for ``x [batch, 1, c]`` (a decoding step's hidden state)."""
    return make_kernel("reduction", lambda x, s, b, w: _normed(kind, x, s, b) @ w,
                       [((batch, 1, c), dt.f32), ((c,), dt.f32), ((c,), dt.f32), ((c, n), dt.f32)])


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("batch,c,n", [(1, 48, 40), (3, 100, 24), (2, 64, 1)])   # n=1: a value head
@pytest.mark.parametrize("variant", ["one-pass", "looped"])
def test_gemv_forms_its_input_normalized_on_load(kind, batch, c, n, variant):
    k = _gemv(kind, batch, c, n)
    plan = plan_rows(k)
    assert (plan.M, plan.K) == (batch * n, c)
    assert len(plan.prologue) == (1 if kind == "rms" else 2)     # LayerNorm: mean and variance
    assert not any(o.shape == (batch, 1, c) for o in k.meaning.outputs.values())
    # ragged: BLOCK_M does not divide the rows, BLOCK_K not the hidden dim when looped
    for cfg in ({"BLOCK_M": 4, "BLOCK_K": 32 if variant == "looped" else 128, "num_warps": 4},
                {"BLOCK_M": 16, "BLOCK_K": 64 if variant == "looped" else 128, "num_warps": 4}):
        check(k, variant=variant, config=configs.make(cfg.pop("num_warps"), 1, **cfg), seed=batch)


def test_paired_gate_and_up_share_the_statistic():
    """The gated MLP's gate and up GEMVs of one RMSNorm: one row kernel, two sums, one statistic."""
    def build(x, s, wg, wu):
        h = rms_norm(x, s)
        g, u = h @ wg, h @ wu
        return g / ((-g).exp() + 1.0) * u
    c, f = 64, 72
    k = make_kernel("reduction", build, [((2, 1, c), dt.f32), ((c,), dt.f32),
                                         ((c, f), dt.f32), ((c, f), dt.f32)])
    plan = plan_rows(k)
    assert len(plan.reduces) == 2 and len(plan.prologue) == 1
    check(k)
    check(k, variant="looped", config=configs.make(4, 1, BLOCK_M=8, BLOCK_K=16))


def test_statistic_read_across_its_rows_is_refused():
    """``norm(x).T @ w`` sums the normalized value down a column: each term has another row's
    statistic, which one value per main row cannot hold. The renderer refuses it (the fusion keeps
    such a norm a kernel of its own) instead of computing a wrong sum."""
    k = make_kernel("reduction", lambda x, s, w: rms_norm(x, s).permute((1, 0)) @ w,
                    [((24, 24), dt.f32), ((24,), dt.f32), ((24, 16), dt.f32)])
    with pytest.raises(RenderError, match="row statistic"):
        render_parts(k, None)


def test_simulator_prices_the_statistics_per_tile_element():
    """Row dims come from the GEMV, not from the statistic listed first, and the statistics' ops
    are what the simulator issues for every element of the main tile (its per-kernel record)."""
    from lumc.backends.simulator import _static
    k = _gemv("rms", 1, 512, 1024)
    plain = make_kernel("reduction", lambda x, w: x @ w, [((1, 1, 512), dt.f32),
                                                          ((512, 1024), dt.f32)])
    assert row_dims(k) == (1024, 512)
    assert row_prologue_ops(k) >= 4 and row_prologue_ops(plain) == 0
    assert _static(k)[6] == (1024, 512, row_prologue_ops(k), row_passes(k))


def test_decoding_mlp_is_two_kernels():
    """LlamaMLP with one row: RMSNorm + gate + up + SiLU product in one row kernel, then the
    down-projection with the residual. Every candidate matches eager."""
    torch.manual_seed(3)
    mod, x = LlamaMLP(width=64, inner=96).eval(), torch.randn(1, 1, 64)
    res = egraph_candidates_checked(mod, x, k=32)
    two = [p for p in res.candidates if len(p.calls) == 2]
    assert two, {p.label: p.form_counts() for p in res.candidates}
    first = two[0].calls[0].kernel
    assert plan_rows(first).prologue and len(plan_rows(first).reduces) == 2
    check(first)


def _paired_norm(c, f):
    def build(x, s, wg, wu):
        h = rms_norm(x, s)
        g, u = h @ wg, h @ wu
        return g / ((-g).exp() + 1.0) * u
    return make_kernel("reduction", build, [((1, 1, c), dt.f32), ((c,), dt.f32),
                                            ((c, f), dt.f32), ((c, f), dt.f32)])


def test_config_space_leaves_registers_for_every_live_tile():
    """A paired GEMV with its input normalized on load keeps three tiles live: its config space
    offers no tile that fills the per-thread register budget once (one warp, one row of 4096
    spilled 172 bytes on sm_90), while a plain reduction keeps its full budget."""
    k = _paired_norm(4096, 512)
    parts = render_parts(k, None)
    assert parts.problem["LIVE_TILES"] == 3
    space = configs.config_space(parts.config_space, parts.problem)
    assert space
    for cfg in space:
        assert cfg["BLOCK_M"] * cfg["BLOCK_K"] * 3 <= configs.REG_TILE * cfg.num_warps
    plain = make_kernel("reduction", lambda x: x.sum(-1), [((8, 4096), dt.f32)])
    assert render_parts(plain, None).problem["LIVE_TILES"] == 1


@pytest.mark.slow
def test_best_simulated_config_compiles_for_hopper_without_spills():
    """Llama-8B's decoding gate/up (hidden 4096, 14336 columns) with the RMSNorm on load: the
    config the simulator ranks first compiles for sm_90 ahead of time without spilling."""
    from lumc.backends.triton.aot import compile_aot
    from lumc.backends.triton.render import render
    k = _paired_norm(4096, 14336)
    parts = render_parts(k, None)
    dev = get_device("h200")
    space = configs.config_space(parts.config_space, parts.problem)
    best = min(space, key=lambda c: simulate_kernel_time(k, c.kwargs(), dev))
    r = compile_aot(render(k), best)
    assert r.error is None, r.error
    assert not r.spills, (str(best), r.registers, r.spill_stores)


def test_normalized_input_permuted_after_its_view_is_refused():
    """The normalized input read into the main shape, then permuted across rows before the sum:
    main row ``(i, j)`` needs the statistic of row ``j``, the view alone says ``i``. Refused (a
    statistic computed per main row through that view would be another row's)."""
    def build(x, s, w):
        v = rms_norm(x, s).reshape((4, 16, 1)).expand((4, 16, 4))
        return (v * 2.0).permute((2, 1, 0)).mul(w).sum(1)
    k = make_kernel("reduction", build, [((4, 1, 16), dt.f32), ((16,), dt.f32),
                                         ((4, 16, 4), dt.f32)])
    with pytest.raises(RenderError, match="row statistic|normalized input"):
        render_parts(k, None)


@pytest.mark.parametrize("variant,block_k", [("one-pass", 128), ("looped", 32)])
def test_gemv_of_a_constant_rows_layer_norm_is_zero(variant, block_k):
    """A decoding step whose hidden state is one value ``c`` per sequence: its LayerNorm is 0, so
    ``LN(x) @ w`` is 0 with no affine. The statistics over the main tile take the mean on shifted
    data (``row_moments``); ``sum * fl(1/c)`` was an ulp off, ``(x - mean) / sqrt(eps)`` not 0."""
    import numpy as np
    from lumc.backends.triton import TritonKernel
    from lumc.backends.triton.launch import to_numpy
    batch, c, n = 4, 100, 24
    k = _gemv("layer", batch, c, n)
    rng = np.random.default_rng(0)
    x = np.repeat(np.array([-3712.3, 0.1, 12345.6, 7.77], np.float32)[:, None, None], c, axis=2)
    feed = [x, np.ones(c, np.float32), np.zeros(c, np.float32),
            rng.standard_normal((c, n)).astype(np.float32)]
    cfg = configs.make(4, 1, BLOCK_M=16, BLOCK_K=block_k)
    got = to_numpy(TritonKernel(k, variant)(*feed, config=cfg)[0])
    np.testing.assert_array_equal(got, 0.0)
