"""int64 indexing only where an address can pass 2**31 (not for a big virtual M*N*K product)."""
import pytest

from lumc.backends.triton.benchcases import _attention, _kernel
from lumc.backends.triton.render import render
from lumc.ir import dtypes as dt


@pytest.mark.parametrize("m,n,k,wide", [
    (2048, 2048, 2048, False),           # M*N*K = 2**33, every address < 2**23: int32
    (8192, 8192, 8192, False),           # M*N*K = 2**39, operands 2**26 elements: int32
    (1 << 16, 64, 1 << 15, True),        # A has 2**31 elements: int64
])
def test_matmul_index_width_follows_addresses(m, n, k, wide):
    kern = _kernel("matmul", lambda a, b: a @ b, [((m, k), dt.bf16), ((k, n), dt.bf16)])
    src = render(kern).source
    assert ("tl.int64" in src) == wide
    assert ("int64 indexing" in src) == wide


def test_attention_product_space_does_not_force_int64():
    # B*Lq*Lk*D = 8*1024*1024*128 = 2**33, every tensor 2**23 elements
    kern = _kernel("attention", _attention(0.125), [((2, 4, 1024, 128), dt.bf16)] * 3)
    assert "tl.int64" not in render(kern).source
