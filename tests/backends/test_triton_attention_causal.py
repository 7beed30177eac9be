"""Attention with a static (causal) mask skips the key blocks no query of a program sees, and
still matches the reference; data-dependent masks keep the full key loop."""
import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton import configs
from lumc.backends.triton.benchcases import _kernel
from lumc.backends.triton.launch import TritonKernel, to_numpy
from lumc.compiler.core.measure import max_rel_error
from lumc.ir import dtypes as dt
from lumc.ir.library.norm import softmax
from lumc.ir.tensor import Tensor

L, D = 45, 16


def _causal(shift):
    def f(q, k, v):
        s = (q @ k.transpose(-1, -2)) * (D ** -0.5)
        i = Tensor.iota((L, L), 0, dt.i32)
        j = Tensor.iota((L, L), 1, dt.i32)
        return softmax(j.lt(i + shift).where(s, float("-inf")), -1) @ v
    return f


def _masked(q, k, v, m):
    s = (q @ k.transpose(-1, -2)) * (D ** -0.5)
    return softmax(m.where(s, float("-inf")), -1) @ v


@pytest.mark.parametrize("shift", [1, 9])
def test_causal_blocks_are_skipped_and_results_hold(shift):
    k = _kernel("attention", _causal(shift), [((2, 3, L, D), dt.f32)] * 3)
    tk = TritonKernel(k)
    assert f"(pid_m + 1) * BLOCK_M + {shift - 1})" in tk.source
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal((2, 3, L, D)).astype(np.float32) for _ in range(3)]
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    for bm, bn in ((16, 16), (32, 16)):
        cfg = configs.with_precision(configs.make(4, 1, BLOCK_M=bm, BLOCK_N=bn), tk.rendered.problem,
                                     "ieee")
        got = to_numpy(tk(*ins, config=cfg)[0])
        assert max_rel_error(got, ref) < 1e-5


def test_data_dependent_mask_keeps_every_key_block():
    k = _kernel("attention", _masked, [((2, 3, L, D), dt.f32)] * 3 + [((2, 1, 1, L), dt.bool_)])
    assert "n_end" not in TritonKernel(k).source
