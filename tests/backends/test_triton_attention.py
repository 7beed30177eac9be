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
    assert src.count("tl.dot(") == 2 and src.count("tl.store(") == 1


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
