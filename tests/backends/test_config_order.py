"""The order the search tries a kernel's configs in (``config_order.ordered_configs``)."""
from lumc.backends.devices import H200
from lumc.backends.simulator import simulate_kernel_time
from lumc.backends.triton import configs
from lumc.backends.triton.launch import TritonKernel
from lumc.compiler.core.config_order import ordered_configs
from lumc.compiler.core.search import PATIENCE
from lumc.ir import dtypes as dt
from triton_cases import make_kernel


def test_the_models_best_and_the_known_good_tiles_alternate():
    """GPT-2's down-projection + residual (M 128, K 3072, N 768, fp32): its known-good tutorial
    tiles came all first, none split over K and all slow here (12 output tiles on 132 SMs), so
    the search's patience ran out before it tried one split-K config, and the kernel stayed at
    24.5 us simulated where a split-K config gives 15.3 us."""
    k = make_kernel("matmul", lambda a, b, c: (a @ b) + c,
                    [((128, 3072), dt.f32), ((3072, 768), dt.f32), ((128, 768), dt.f32)])
    tk = TritonKernel(k)
    order = ordered_configs(k, tk, H200)
    good = [c for c in configs.known_good(tk.rendered.config_space, tk.rendered.problem)
            if c in tk.config_space()]
    assert len(good) > PATIENCE and len(order) == len(set(order)) == len(tk.config_space())

    def sim(c):
        try:
            return simulate_kernel_time(k, c.kwargs(), H200)
        except ValueError:
            return float("inf")
    times = [sim(c) for c in order[1:]]
    # second: the model's fastest config; it splits K, and it is 40% under every known-good tile
    assert times[0] == min(times) and dict(order[1].kwargs()).get("SPLIT_K", 1) > 1
    assert times[0] < 0.6 * min(sim(c) for c in good)
    # the known-good tiles every other place, fastest first, all within the first 2 x their count
    placed = [i for i, c in enumerate(order) if c in good and c != order[0]]
    assert placed == list(range(2, 2 * len(placed) + 1, 2))[:len(placed)]
    assert [sim(order[i]) for i in placed] == sorted(sim(order[i]) for i in placed)
