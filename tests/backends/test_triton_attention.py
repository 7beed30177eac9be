"""Flash-attention kernels through the interpreter: online softmax over key blocks, scale, masks.

The meaning is written the way a model writes attention (matmul, scale, mask, softmax, matmul);
the renderer finds the two products and the softmax in it and never materializes the scores.
"""
from __future__ import annotations

import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.backends.triton import configs, render
from lumc.backends.triton.codegen import RenderError
from lumc.ir.library.norm import softmax
from lumc.ir.tensor import Tensor
from triton_cases import attention, check, make_kernel

SMALL_BLOCKS = configs.make(4, 1, BLOCK_M=16, BLOCK_N=16)


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("lq,lk", [(1, 7), (7, 127), (127, 33), (33, 1023)])
def test_flash_ragged_lengths(lq, lk, d):
    k = make_kernel("attention", attention(0.125),
                    [((2, lq, 16), d), ((2, lk, 16), d), ((2, lk, 16), d)])
    tk = check(k, config=SMALL_BLOCKS)
    src = tk.source
    assert tk.rendered.variant == "flash"
    # scores live in registers: one dot for q k^T and one for p v per key block, no score store
    # (fp32 operands: each dot is a constexpr choice among bf16, fp16 and tl.dot's own precisions)
    assert src.count("tl.dot(") == (6 if d == dt.f32 else 2) and src.count("tl.store(") == 1


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
def test_causal_mask_from_iota(d):
    k = make_kernel("attention", attention(0.2, causal=True),
                    [((2, 3, 37, 8), d), ((2, 3, 37, 8), d), ((2, 3, 37, 24), d)])
    check(k, config=SMALL_BLOCKS)


def test_additive_bias_and_4097_keys():
    k = make_kernel("attention", attention(0.3, bias=True),
                    [((1, 7, 8), dt.f32), ((1, 4097, 8), dt.f32), ((1, 4097, 8), dt.f32),
                     ((7, 4097), dt.f32)])
    check(k, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=256))


def test_boolean_mask_with_fully_masked_row():
    """A query row with every key masked gives NaN, as the reference's softmax of all -inf."""
    k = make_kernel("attention", attention(0.5, bool_mask=True),
                    [((1, 5, 16), dt.f32), ((1, 40, 16), dt.f32), ((1, 40, 16), dt.f32),
                     ((5, 40), dt.bool_)])
    rng = np.random.default_rng(0)
    mask = rng.random((5, 40)) < 0.6
    mask[2, :] = False
    feed = {"in0": rng.standard_normal((1, 5, 16)).astype(np.float32),
            "in1": rng.standard_normal((1, 40, 16)).astype(np.float32),
            "in2": rng.standard_normal((1, 40, 16)).astype(np.float32), "in3": mask}
    tk = check(k, feed, config=SMALL_BLOCKS)
    (out,) = tk(*feed.values(), config=SMALL_BLOCKS)
    assert np.isnan(out.numpy()[0, 2]).all() and not np.isnan(out.numpy()[0, 1]).any()


def _select(scale: float, fill: float, keep_of):
    """``softmax(where(keep, q k^T * scale, fill)) v`` as torch.export lowers SDPA with a boolean
    mask (fill -inf) or HF's eager path writes it (fill = the dtype's lowest finite value)."""
    def f(q, k, v, *masks):
        s = (q @ k.transpose(-1, -2)) * scale
        keep = keep_of(*masks)
        return softmax(keep.where(s, fill), -1).cast(q.dtype) @ v
    return f


def _bert_keep(qm, km):
    # BERT: query mask [1, 1, L, 1] and key padding [B, 1, 1, S], combined in the kernel
    return qm.logical_and(km)


def _feed(specs, seed, masks):
    rng = np.random.default_rng(seed)
    out = {f"in{i}": rng.standard_normal(sh).astype(d.np) for i, (sh, d) in enumerate(specs[:3])}
    for j, m in enumerate(masks):
        out[f"in{3 + j}"] = m
    return out


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("L", [7, 127])
@pytest.mark.parametrize("fill", ["-inf", "lowest"])
def test_select_mask_bert_padding_with_a_fully_masked_sequence(fill, L, d):
    """Batch 1 has every key masked: its rows are NaN with fill -inf (softmax of all -inf, as the
    reference) and the plain mean of v with a finite fill (every score equal)."""
    f = float("-inf") if fill == "-inf" else float(np.finfo(d.np).min)
    B, H, D = 3, 2, 16
    specs = [((B, H, L, D), d)] * 3 + [((1, 1, L, 1), dt.bool_), ((B, 1, 1, L), dt.bool_)]
    k = make_kernel("attention", _select(0.25, f, _bert_keep), specs)
    km = np.ones((B, 1, 1, L), bool)
    km[1] = False                       # a sequence of padding only
    km[2, ..., L // 2:] = False         # half padding: whole key blocks masked for every row
    feed = _feed(specs, 0, [np.ones((1, 1, L, 1), bool), km])
    cfg = configs.make(4, 1, BLOCK_M=128, BLOCK_N=32)     # 4 key blocks, the last 2 all padding
    tk = check(k, feed, config=cfg)
    assert tk.rendered.variant == "flash" and tk.source.count("tl.store(") == 1
    out = tk(*feed.values(), config=cfg)[0].numpy().astype(np.float64)
    if fill == "-inf":
        assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2]]).any()
    else:
        want = feed["in2"][1].astype(np.float64).mean(axis=-2, keepdims=True)
        np.testing.assert_allclose(out[1], np.broadcast_to(want, out[1].shape),
                                   rtol=2e-2 if d == dt.f16 else 1e-5, atol=2e-2 if d == dt.f16 else 1e-5)


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
def test_select_mask_gpt2_causal_and_padding_materialized(d):
    """GPT-2: one bool [B, 1, L, S] tensor (causal and padding) read per head, fill -inf."""
    B, H, L, D = 2, 3, 45, 8
    specs = [((B, H, L, D), d)] * 3 + [((B, 1, L, L), dt.bool_)]
    k = make_kernel("attention", _select(0.3, float("-inf"), lambda m: m), specs)
    keep = np.broadcast_to(np.tril(np.ones((L, L), bool)), (B, 1, L, L)).copy()
    keep[1, ..., :5] = False            # left padding: the first 5 queries of batch 1 see nothing
    check(k, _feed(specs, 1, [keep]), config=SMALL_BLOCKS)


def test_scores_read_transposed_are_refused():
    """softmax over the *query* axis (scores transposed before the softmax) is not attention's
    online softmax over keys: refused instead of silently computing the wrong axis."""
    k = make_kernel("attention",
                    lambda q, kk, v: softmax((q @ kk.transpose(-1, -2)).transpose(-1, -2) * 0.5,
                                             -1) @ v,
                    [((2, 9, 8), dt.f32), ((2, 9, 8), dt.f32), ((2, 9, 8), dt.f32)])
    with pytest.raises(RenderError, match="keep each query"):
        render(k)


def test_head_dims_differ_and_default_config():
    k = make_kernel("attention", attention(0.125),
                    [((3, 65, 40), dt.f16), ((3, 70, 40), dt.f16), ((3, 70, 20), dt.f16)])
    check(k)


def test_attention_config_space_fits_shared_memory():
    k = make_kernel("attention", attention(0.125), [((4, 16, 1024, 128), dt.bf16)] * 3)
    rk = render(k)
    space = configs.config_space(rk.config_space, rk.problem)
    assert space and all(configs.shared_memory_estimate("attention", rk.problem, c.kwargs())
                         <= configs.SMEM_LIMIT for c in space)


def test_not_attention_is_refused():
    k = make_kernel("attention", lambda a, b: a @ b, [((7, 8), dt.f32), ((8, 9), dt.f32)])
    with pytest.raises(RenderError, match="two contractions"):
        render(k)


@pytest.mark.parametrize("where", ["q", "k", "v", "q-inf"])
def test_nan_and_inf_poison_rows_as_the_reference_without_a_nan_reduction(where):
    """The row max reaches the output only through the exponent, so the kernel drops its
    per-block NaN reduction; a NaN (or an inf that makes ``inf - inf``) in q, k or v still gives
    exactly the reference's NaN rows and columns, in any key block."""
    k = make_kernel("attention", attention(0.25),
                    [((2, 19, 16), dt.f32), ((2, 70, 16), dt.f32), ((2, 70, 16), dt.f32)])
    assert "nan_blk" not in render(k).source
    rng = np.random.default_rng(1)
    feed = {f"in{i}": rng.standard_normal(s).astype(np.float32)
            for i, s in enumerate([(2, 19, 16), (2, 70, 16), (2, 70, 16)])}
    if where == "q":
        feed["in0"][0, 5, 3] = np.nan
    elif where == "k":
        feed["in1"][1, 45, 0] = np.nan        # a key in the third block of 16
    elif where == "v":
        feed["in2"][0, 33, 7] = np.nan
    else:
        feed["in0"][1, 2, :] = np.inf
    tk = check(k, feed, config=SMALL_BLOCKS)
    out = tk(*feed.values(), config=SMALL_BLOCKS)[0].numpy()
    assert np.isnan(out).any() and not np.isnan(out).all()


def test_attention_configs_fit_the_shared_memory_of_a_block():
    """BERT-base's masked fp32 attention (D = 64, an int64 padding mask): the tutorial default
    (128x64 tiles, 2 stages) takes 232 KiB on sm_90, over the 227 KiB a block may use, so it is
    not legal; the default falls back to the same tiles with one stage, and every legal config's
    estimate is within the limit and above what the 2-stage tile compiles to."""
    from lumc.backends.triton import configs
    p = {"M": 128, "N": 128, "D": 64, "DV": 64, "batch": 12, "BLOCK_D": 64, "BLOCK_DV": 64,
         "itemsize": 4, "dot_dtype": "f32", "SCORE_BYTES": 9}
    big = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}
    assert configs.attention_shared_memory(p, big) >= 237568     # metadata.shared of that compile
    assert not configs._legal("attention", p, big)
    d = configs.default_config("attention", p)
    assert (d["BLOCK_M"], d["BLOCK_N"], d.num_stages) == (128, 64, 1)
    space = configs.config_space("attention", p)
    assert space and all(configs.shared_memory_estimate("attention", p, c.kwargs())
                         <= configs.SMEM_LIMIT for c in space)


@pytest.mark.parametrize("case", ["plain-f16", "bias-f32", "bool-mask", "causal-f32", "dv-differs"])
def test_simulator_prices_attention_at_the_shared_memory_it_takes(case):
    """The simulator's occupancy reads attention's shared memory from the same fitted bound as
    the config space (``configs.attention_shared_memory``), from the same problem the renderer
    reports; it used to count a matmul's two operand tiles (2-3x less) and so ran more programs
    per SM than fit."""
    from lumc.backends import simulator
    from lumc.backends.devices import get_device
    specs = {"plain-f16": (attention(0.125), [((3, 65, 40), dt.f16), ((3, 70, 40), dt.f16),
                                              ((3, 70, 40), dt.f16)]),
             "bias-f32": (attention(0.3, bias=True), [((1, 7, 8), dt.f32), ((1, 300, 8), dt.f32),
                                                      ((1, 300, 8), dt.f32), ((7, 300), dt.f32)]),
             "bool-mask": (attention(0.5, bool_mask=True),
                           [((1, 5, 16), dt.f32), ((1, 40, 16), dt.f32), ((1, 40, 16), dt.f32),
                            ((5, 40), dt.bool_)]),
             "causal-f32": (attention(0.2, causal=True), [((2, 3, 128, 64), dt.f32)] * 3),
             "dv-differs": (attention(0.2), [((2, 3, 37, 8), dt.f32), ((2, 3, 37, 8), dt.f32),
                                             ((2, 3, 37, 24), dt.f32)])}
    fn, ins = specs[case]
    k = make_kernel("attention", fn, ins)
    rk = render(k)
    sim = simulator.attention_problem(k)
    assert {key: rk.problem[key] for key in sim} == sim
    for c in configs.config_space("attention", rk.problem):
        kw = c.kwargs()
        want = configs.attention_shared_memory(rk.problem, kw)
        assert simulator._smem_bytes(k, kw, ins[0][1].itemsize) == want
        simulator.simulate_kernel_time(k, kw, get_device("h200"))   # legal configs price


def test_score_function_view_that_moves_elements_is_refused():
    """``((k @ q^T) * c)^T``: the transpose comes after the scale, a view of a value computed
    from the scores; the flash loop evaluates the score function in the scores' own element
    order, so rendering it paired each query with the wrong keys (0.93 off; the search's check
    caught it). The plan refuses it; ``(q @ k^T) * c`` renders."""
    from lumc.backends.triton.benchcases import _kernel as _k
    from lumc.backends.triton.render_attention import AttentionPlan
    from lumc.ir.tensor import Tensor as _T
    tril = np.tril(np.ones((12, 12), bool))
    bad = _k("attention", lambda q, k, v: softmax(_T.const(tril).where(
        ((k @ q.transpose(-1, -2)) * 0.25).transpose(-1, -2), float("-inf")), -1) @ v,
        [((2, 3, 12, 16), dt.f32)] * 3)
    with pytest.raises(RenderError, match="moves elements"):
        AttentionPlan(bad)
    good = _k("attention", lambda q, k, v: softmax(_T.const(tril).where(
        (q @ k.transpose(-1, -2)) * 0.25, float("-inf")), -1) @ v, [((2, 3, 12, 16), dt.f32)] * 3)
    AttentionPlan(good)


def test_a_mask_that_depends_on_the_scores_skips_no_key_block():
    """where(S == 0 and j > i, -inf, S) masks the upper triangle only at S = 0: its key blocks
    must still be read (a causal skip from the S = 0 evaluation was 1.2 off), and SDPA's mask
    kind is not causal."""
    from lumc.backends.extern import sdpa_mask_kind

    def f(q, k, v):
        s = (q @ k.transpose(-1, -2)) * 0.25
        L, S = s.shape[-2], s.shape[-1]
        upper = Tensor.iota((L, S), 0).lt(Tensor.iota((L, S), 1))
        zero = s.eq(s.scalar_like(0.0)).logical_and(upper)
        return softmax(zero.where(s.scalar_like(float("-inf")), s), -1) @ v
    k = make_kernel("attention", f, [((2, 64, 16), dt.f32)] * 3)
    tk = check(k, config=SMALL_BLOCKS)
    assert "n_end" not in tk.source
    assert sdpa_mask_kind(k) == "dense"


def test_causal_mask_still_skips_key_blocks():
    k = make_kernel("attention", attention(0.25, causal=True), [((2, 64, 16), dt.f32)] * 3)
    assert "n_end" in check(k, config=SMALL_BLOCKS).source


@pytest.mark.parametrize("lk,block_n", [(40, 16), (7, 16), (33, 32)])
def test_a_row_value_of_the_max_is_a_second_output(lk, block_n):
    """PyTorch's ``_safe_softmax`` zeroing, as the SDPA lowering writes it: ``dead = max(scores)
    == -inf`` (every key masked, or every kept score -inf), ``where(dead, 0, attention)``. The
    kernel computes ``dead`` from its own running max and writes it as a second output of one
    value per query (the out-projection reads it); it was a reduction kernel over the mask."""
    def f(q, k, v, keep):
        s = keep.where((q @ k.transpose(-1, -2)) * 0.5, float("-inf"))
        dead = s.max(-1, keepdims=True).eq(float("-inf"))
        out = softmax(s, -1) @ v
        return dead.where(out.scalar_like(0.0), out), dead
    k = make_kernel("attention", f, [((2, 5, 16), dt.f32), ((2, lk, 16), dt.f32),
                                     ((2, lk, 16), dt.f32), ((2, 5, lk), dt.bool_)])
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 5, 16)).astype(np.float32)
    q[1, 3, 0] = -np.inf            # every kept key of this row scores -inf (k[..., 0] > 0)
    kk = rng.standard_normal((2, lk, 16)).astype(np.float32)
    kk[..., 0] = np.abs(kk[..., 0]) + 0.5
    q[0, 4, 1] = np.nan             # a NaN score is no mask: NaN stays, as in PyTorch
    mask = rng.random((2, 5, lk)) < 0.6
    mask[0, 2, :] = False           # every key masked
    mask[:, :, 0] = mask[:, :, 0] | (np.arange(5) != 2)[None, :]
    feed = {"in0": q, "in1": kk, "in2": rng.standard_normal((2, lk, 16)).astype(np.float32),
            "in3": mask}
    tk = check(k, feed, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=block_n))
    out, dead = (np.asarray(o) for o in tk(*feed.values(),
                                             config=configs.make(4, 1, BLOCK_M=16,
                                                                 BLOCK_N=block_n)))
    assert dead.shape == (2, 5, 1) and dead[0, 2, 0] and dead[1, 3, 0] and not dead[0, 4, 0]
    assert (out[0, 2] == 0).all() and (out[1, 3] == 0).all() and np.isnan(out[0, 4]).all()
    assert dead.sum() == 2 and np.isfinite(np.delete(out.reshape(10, 16), [2, 4, 8], 0)).all()
    assert tk.source.count("tl.store(") == 2
