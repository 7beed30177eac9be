"""The simulated device: never below the roofline bound, and configs really differ."""
import pytest

from lumc.backends.devices import get_device
from lumc.backends.simulator import contraction_dims, simulate_kernel_time
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.kernels import Kernel
from lumc.ir.tensor import Tensor


def roofline(k, dev):
    peak = (dev.tensor_flops if k.form == "matmul" else dev.vector_flops)[k.inputs[0].dtype.name]
    return max(k.flops() / peak, k.min_bytes() / dev.hbm_bandwidth) + dev.launch_overhead_s


def matmul_kernel(m, k, n, dtype=dt.f16):
    a = Tensor(input_node("in0", (m, k), dtype))
    b = Tensor(input_node("in1", (k, n), dtype))
    return Kernel("matmul", Graph({"in0": a.node, "in1": b.node}, {"out0": a.matmul(b).node}))


def softmax_kernel(rows, cols):
    x = Tensor(input_node("in0", (rows, cols), dt.f32))
    e = x.sub(x.max(-1, keepdims=True)).exp()
    return Kernel("softmax", Graph({"in0": x.node}, {"out0": e.div(e.sum(-1, keepdims=True)).node}))


def test_contraction_dims():
    c = contraction_dims(matmul_kernel(384, 1536, 384))
    assert (c.batch, c.m, c.n, c.k) == (1, 384, 384, 1536)


@pytest.mark.parametrize("dev_name", ["h100", "h200"])
def test_never_below_bound_and_configs_differ(dev_name):
    dev = get_device(dev_name)
    k = matmul_kernel(4096, 4096, 4096)
    times = {}
    for bm in (32, 64, 128):
        for bn in (32, 64, 128):
            for st in (1, 3):
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 4 if bm * bn < 8192 else 8,
                       "num_stages": st}
                times[(bm, bn, st)] = simulate_kernel_time(k, cfg, dev)
                assert times[(bm, bn, st)] >= roofline(k, dev)
    assert len(set(times.values())) > 10
    assert times[(128, 128, 3)] < times[(32, 32, 1)]
    # within a sane factor of the bound for a good config: a large fp16 GEMM is compute bound
    assert times[(128, 128, 3)] < 2.0 * roofline(k, dev)
    s = softmax_kernel(4096, 1000)
    t = [simulate_kernel_time(s, {"BLOCK": b, "num_warps": w}, dev) for b, w in ((1024, 4), (1024, 8), (4096, 16))]
    assert all(x >= roofline(s, dev) for x in t) and len(set(t)) == 3


def test_shared_memory_limit_raises():
    with pytest.raises(ValueError, match="shared memory"):
        simulate_kernel_time(matmul_kernel(1024, 1024, 1024), {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128,
                                                               "num_stages": 4}, get_device("h200"))


@pytest.mark.parametrize("cfg", [{"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 64, "BLOCK_N": 32},
                                 {"BLOCK_M": 128, "BLOCK_N": 64}])
def test_attention_time_grows_with_the_sequence(cfg):
    """The flash kernel's grid is one program per query block (each loops over the key blocks):
    priced as one program per (query, key) tile pair, a longer sequence filled more SMs and
    simulated faster (MiniLM's attention: 5.37 us at 16 tokens, 4.83 us at 64, one config)."""
    from lumc.backends.triton.benchcases import _kernel
    from lumc.ir.library.norm import softmax

    def plain(q, k, v):
        return softmax((q @ k.transpose(-1, -2)) * (32 ** -0.5), -1) @ v
    cfg = dict(cfg, num_warps=4, num_stages=2)
    times = [simulate_kernel_time(_kernel("attention", plain, [((1, 12, n, 32), dt.f32)] * 3),
                                  cfg, get_device("h200")) for n in (8, 16, 32, 64, 128, 256, 512)]
    assert all(a <= b for a, b in zip(times, times[1:])), [f"{t * 1e6:.2f}" for t in times]


@pytest.mark.parametrize("dtype", [dt.f32, dt.bf16])
@pytest.mark.parametrize("cfg", [{"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 64, "BLOCK_N": 32}])
def test_attention_time_across_block_boundaries(cfg, dtype):
    """One more query or key block (64 -> 65 tokens) doubled the grid and priced each program's
    loop over the key blocks as spread over twice the SMs: 11-15% faster for more work. Each
    program streams its tiles (L2 hits too) and the score function runs on padded tiles: the time
    no longer drops by more than rounding of the occupancy model (3%), queries or keys alike."""
    from lumc.backends.simulator import config_bound
    from lumc.backends.triton.benchcases import _kernel
    from lumc.ir.library.norm import softmax

    def plain(q, k, v):
        return softmax((q @ k.transpose(-1, -2)) * 0.125, -1) @ v
    cfg = dict(cfg, num_warps=4, num_stages=2)
    dev = get_device("h200")
    for shapes in ([lambda n: (1, 12, n, 64)] * 3,
                   [lambda n: (1, 12, n, 64), lambda n: (1, 12, 64, 64), lambda n: (1, 12, 64, 64)]):
        prev = 0.0
        for n in (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129):
            k = _kernel("attention", plain, [(f(n), dtype) for f in shapes])
            t = simulate_kernel_time(k, cfg, dev)
            assert t >= config_bound(k, cfg, dev)
            assert t >= 0.97 * prev, (n, prev, t)
            prev = t


@pytest.mark.parametrize("m,k,n", [(0, 27, 4), (16, 27, 0)])
def test_an_empty_product_costs_a_launch_not_a_zero_division(m, k, n):
    """A zero-size batch (Conv on [0, 3, 6, 6]) gives a contraction of no rows: the Triton
    estimate divided by a grid of no programs and the cuBLAS one by no vendor tiles
    (ZeroDivisionError), so every config of the kernel was an error and went unchecked."""
    from lumc.backends.extern import simulate_extern_time
    dev = get_device("h200")
    kern = matmul_kernel(m, k, n, dt.f32)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    for t in (simulate_kernel_time(kern, cfg, dev),
              simulate_extern_time(kern, {"IMPL": "cublas", "PRECISION": "ieee"}, dev)):
        assert dev.launch_overhead_s <= t < 1e-3


def test_a_split_row_kernel_counts_each_programs_share_of_the_row_once():
    """A sum over 4 rows of 2^24 at SPLIT 256: each of the 1024 programs steps over its
    ceil(K / SPLIT) share (``render_split``), so the kernel is memory-bound at about one read of its
    256 MiB. The work count took each program to read the whole row (SPLIT times the work) and
    priced it compute-bound at 4.7x that read, steering the search off large splits."""
    from lumc.compiler.core.fusion import greedy_program
    H200 = get_device("h200")
    x = Tensor(input_node("x", (4, 1 << 24), dt.f32))
    (call,) = greedy_program(Graph({"x": x.node}, {"y": x.sum(-1, keepdims=True).node})).calls
    read_s = 4 * (1 << 24) * 4 / H200.hbm_bandwidth
    times = {s: simulate_kernel_time(call.kernel, {"BLOCK_K": 4096, "BLOCK_M": 1, "SPLIT": s,
                                                   "num_warps": 8, "num_stages": 2}, H200)
             for s in (64, 256)}
    for s, t in times.items():
        assert read_s <= t <= 1.3 * read_s, (s, t, read_s)
