"""Triton kernels for ``test_sampled_check.py`` (a ``@triton.jit`` function must live in a file)."""
import triton
import triton.language as tl


@triton.jit
def double_short(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """``out = 2 * x``, except that its mask is one element too tight: the last is never written."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n - 1)
