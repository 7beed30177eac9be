"""The search's final re-time measures again (not the memoized time), and the untimed fallback
skips candidates holding a kernel that cannot run."""
import pytest

from lumc.compiler.core.budget import Deadline
from lumc.compiler.core.search import Measurement, run_search
from tests.compiler.test_search import FakeClock, make_measure


def test_retime_measures_again_and_choice_follows_fresh_times():
    clock = FakeClock()
    measure, _ = make_measure({"p": [1.0], "q": [1.1]}, clock)
    fresh = []

    def remeasure(k, ci):                 # the GPU now says q is faster
        fresh.append(k)
        return Measurement({"p": 1.3, "q": 1.05}[k])
    r = run_search([["p"], ["q"]], {"p": 0.5, "q": 0.5}, {"p": 1, "q": 1}, measure,
                   Deadline(100, clock), remeasure=remeasure)
    assert sorted(fresh) == ["p", "q"]
    assert r.candidate == 1 and r.time_s == pytest.approx(1.05)


def test_shared_kernel_is_retimed_once():
    clock = FakeClock()
    measure, _ = make_measure({"s": [1.0], "a": [1.0], "b": [1.0]}, clock)
    fresh = []

    def remeasure(k, ci):
        fresh.append(k)
        return Measurement(1.0)
    run_search([["s", "a"], ["s", "b"]], {"s": 0.1, "a": 0.1, "b": 0.1}, {"s": 1, "a": 1, "b": 1},
               measure, Deadline(100, clock), remeasure=remeasure)
    assert fresh.count("s") == 1


def test_untimed_fallback_skips_kernels_that_cannot_run():
    clock = FakeClock()
    measure, calls = make_measure({"x": [1.0], "y": [1.0]}, clock)
    d = Deadline(1e-9, clock)
    clock.t = 1.0
    # candidate 0 has the better bound but its kernel "x" has no runnable config
    r = run_search([["x"], ["y"]], {"x": 1.0, "y": 3.0}, {"x": 1, "y": 1}, measure, d,
                   runnable=lambda k: k != "x")
    assert r.candidate == 1 and r.time_s is None and not calls
