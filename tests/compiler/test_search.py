"""The search loop with a fake timer and fake measurements."""
import math

import pytest

from lumc.compiler.core.budget import Deadline, grace_seconds, parse_duration
from lumc.compiler.core.search import Measurement, run_search
from lumc.ir.errors import BudgetError


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make_measure(times, clock, cost=1.0, wrong=()):
    calls = []

    def measure(k, ci):
        calls.append((k, ci))
        clock.t += cost
        if (k, ci) in wrong:
            return Measurement(None, "rejected", "max rel error 0.5")
        return Measurement(times[k][ci])
    return measure, calls


def test_bound_pruning_and_choice():
    clock = FakeClock()
    # candidate 0: one fused kernel; candidate 1: two unfused kernels whose bound exceeds 0's time
    cands = [["fused"], ["a", "b"]]
    bounds = {"fused": 1.0, "a": 1.5, "b": 1.5}
    times = {"fused": [2.0, 1.2, 1.9], "a": [1.6], "b": [1.6]}
    measure, calls = make_measure(times, clock)
    r = run_search(cands, bounds, {"fused": 3, "a": 1, "b": 1}, measure, Deadline(100, clock))
    assert r.candidate == 0
    assert r.configs == {"fused": 1}
    assert r.time_s == pytest.approx(1.2)
    assert r.stats.candidates_pruned >= 1          # candidate 1 never compiled
    assert not any(k in ("a", "b") for k, _ in calls)


def test_wrong_kernel_is_never_chosen():
    clock = FakeClock()
    times = {"k": [0.5, 2.0]}
    measure, _ = make_measure(times, clock, wrong={("k", 0)})
    r = run_search([["k"]], {"k": 0.1}, {"k": 2}, measure, Deadline(100, clock))
    assert r.configs == {"k": 1} and r.time_s == pytest.approx(2.0)
    assert r.stats.candidates_rejected == 1


def test_tiny_budget_returns_best_bound_candidate_untimed():
    clock = FakeClock()
    measure, calls = make_measure({"x": [1.0], "y": [1.0]}, clock)
    d = Deadline(1e-9, clock)
    clock.t = 1.0
    r = run_search([["x", "y"], ["x"]], {"x": 1.0, "y": 3.0}, {"x": 1, "y": 1}, measure, d)
    assert r.candidate == 1 and r.time_s is None and not calls
    assert "untimed" in r.stats.stopped_because


def test_an_untimed_result_with_timed_kernels_does_not_say_nothing_was_timed():
    """The search line counts (kernel, config) pairs, the stop reason programs: a budget that ran
    out after one kernel of a two-kernel program read '1 timed' beside 'nothing timed'."""
    clock = FakeClock()
    measure, calls = make_measure({"x": [1.0], "y": [1.0]}, clock, cost=1.0)
    r = run_search([["x", "y"]], {"x": 1.0, "y": 1.0}, {"x": 1, "y": 1}, measure,
                   Deadline(0.5, clock))
    assert r.time_s is None and r.stats.candidates_timed == 1 and calls == [("x", 0)]
    assert r.stats.stopped_because.startswith("budget (no program timed whole")
    assert "nothing timed" not in r.stats.stopped_because


def test_deadline_stops_measuring():
    clock = FakeClock()
    times = {"k": [float(10 - i) for i in range(10)]}
    measure, calls = make_measure(times, clock, cost=1.0)
    r = run_search([["k"]], {"k": 0.1}, {"k": 10}, measure, Deadline(4.5, clock))
    assert len(calls) <= 5 and r.stats.stopped_because == "budget"
    assert r.time_s == min(times["k"][:len(calls)])


def test_gap_to_bound_goes_first_and_converges():
    clock = FakeClock()
    # kernel "near" is already close to its bound, "far" is 10x above: "far" gets tuned first
    times = {"near": [1.005] + [1.0] * 40, "far": [10.0] + [9.99] * 40}
    measure, calls = make_measure(times, clock, cost=0.01)
    r = run_search([["near", "far"]], {"near": 1.0, "far": 1.0}, {"near": 41, "far": 41}, measure,
                   Deadline(1000, clock), window=5)
    tuned = [k for k, ci in calls[2:]]
    assert tuned and all(k == "far" for k in tuned[:5])
    assert r.stats.stopped_because.startswith("converged")
    assert r.stats.candidates_pruned > 0          # "near" within 1% of its bound: configs pruned


def test_retime_makes_choice_deterministic():
    clock = FakeClock()
    times = {"p": [1.0], "q": [1.0]}
    measure, _ = make_measure(times, clock)
    r1 = run_search([["p"], ["q"]], {"p": 0.5, "q": 0.5}, {"p": 1, "q": 1}, measure, Deadline(100, clock))
    r2 = run_search([["p"], ["q"]], {"p": 0.5, "q": 0.5}, {"p": 1, "q": 1}, measure, Deadline(100, clock))
    assert r1.candidate == r2.candidate == 0


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("90s", 90), ("1h", 3600), ("1h30m", 5400),
                                          ("2", 2), ("1.5m", 90), ("2m30s", 150),
                                          ("1h 2min 3s", 3723)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["banana", "0", "-5s", "", "10x", "0s", "nan", "10s10s", "30m1h",
                                  "1m2min"])
def test_bad_budgets(text):
    """A compound budget takes each unit once, largest first: '10s10s' read as 20 s."""
    with pytest.raises(BudgetError):
        parse_duration(text)


@pytest.mark.parametrize("budget", ["9999999999s", "99999999h", 1e300, 1e10])
def test_a_budget_over_a_year_is_refused(budget):
    """A budget past ~300 years (a user's 'no limit') overflowed the deadline's timer: the compile
    ended in 'OverflowError: timestamp out of range for platform time_t' from setitimer."""
    with pytest.raises(BudgetError, match="over a year"):
        parse_duration(budget)
    assert parse_duration("8760h") == 8760 * 3600.0      # a year is still a budget


def test_grace():
    assert grace_seconds(60) == 10 and grace_seconds(1800) == pytest.approx(90)
    assert not math.isinf(grace_seconds(1))


def test_config_bounds_prune_without_measuring():
    clock = FakeClock()
    times = {"k": [1.0, 3.0, 0.9, 5.0]}
    measure, calls = make_measure(times, clock)
    cb = {0: 0.5, 1: 2.0, 2: 0.5, 3: 4.0}   # configs 1 and 3 cannot beat the measured 1.0
    r = run_search([["k"]], {"k": 0.5}, {"k": 4}, measure, Deadline(100, clock),
                   config_bounds=lambda k, ci: cb[ci])
    assert ("k", 1) not in calls and ("k", 3) not in calls
    assert r.configs == {"k": 2} and r.stats.candidates_pruned == 2


def test_a_kernel_repeated_per_layer_goes_first():
    """Tuning order is what a kernel could save the best program: its gap to its bound times how
    often the program runs it. A layer's kernel (12 runs, 1 s above its bound) goes before a
    one-off kernel 5 s above its bound, though the one-off is further above in ratio."""
    clock = FakeClock()
    times = {"layer": [3.0] + [2.0] * 5, "once": [6.0] + [5.9] * 5}
    measure, calls = make_measure(times, clock, cost=0.01)
    run_search([["layer"] * 12 + ["once"]], {"layer": 2.0, "once": 1.0},
               {"layer": 6, "once": 6}, measure, Deadline(1000, clock), window=5)
    tuned = [k for k, _ in calls[2:]]
    assert tuned[0] == "layer", calls


def test_fruitless_tries_yield_to_another_kernel():
    """A kernel whose next configs keep losing yields to the next kernel by potential: the one
    with the smaller gap but a much better config is reached before the search converges (it was
    never tried when the order was by gap alone: every try went to the first kernel)."""
    clock = FakeClock()
    times = {"mm": [8.0] * 51, "att": [5.0, 5.0, 1.5] + [5.0] * 48}
    measure, calls = make_measure(times, clock, cost=0.01)
    r = run_search([["mm", "att", "mm", "att"]], {"mm": 1.0, "att": 1.0},
                   {"mm": 51, "att": 51}, measure, Deadline(1000, clock), window=5)
    assert ("att", 2) in calls, calls
    assert r.configs["att"] == 2 and r.time_s == pytest.approx(2 * 8.0 + 2 * 1.5)
    assert r.stats.stopped_because.startswith("converged")


def test_stats_count_programs_and_kernel_config_pairs_apart():
    """``candidates_total`` mixed programs with (kernel, config) pairs (1 + 2 + 3 - 1 - 1 here);
    the stats count each apart, and the pairs read from the tuning database."""
    clock = FakeClock()
    cands = [["fused"], ["a", "b"]]
    bounds = {"fused": 1.0, "a": 1.5, "b": 1.5}
    times = {"fused": [2.0, 1.2, 1.9], "a": [1.6], "b": [1.6]}
    measure, calls = make_measure(times, clock)

    def cached(k, ci):
        m = measure(k, ci)
        return Measurement(m.seconds, m.status, m.note, from_db=ci == 0)
    r = run_search(cands, bounds, {"fused": 3, "a": 1, "b": 1}, cached, Deadline(100, clock))
    st = r.stats
    assert (st.programs, st.kernels, st.kernel_configs) == (2, 3, 5)
    assert st.programs_pruned == 1 and st.candidates_total == 4     # the older mixed count
    assert st.candidates_compiled == len(set(calls)) == 3           # fused's 3 configs, each once
    assert st.configs_pruned + st.programs_pruned == st.candidates_pruned
    assert st.from_db == 1                                          # fused config 0


def test_a_kernel_run_once_is_tuned_before_the_search_converges():
    """Convergence was program-wide only (best improved < min_gain over the window): a kernel run
    once beside a layer kernel run 60 times saves under 1% of the program whatever its config,
    so the search stopped with it at its first config (BERT-12's layer-0 attention: 12.6 us where
    another config gives 6.6). Each open kernel now gets PATIENCE tries in a row that find
    nothing better before the search stops."""
    from lumc.compiler.core.search import PATIENCE
    clock = FakeClock()
    times = {"layer": [10.0, 9.0] + [9.0] * 50, "once": [6.0, 6.0, 3.0] + [6.0] * 10}
    measure, calls = make_measure(times, clock, cost=0.01)
    r = run_search([["layer"] * 60 + ["once"]], {"layer": 1.0, "once": 1.0},
                   {"layer": 52, "once": 13}, measure, Deadline(1000, clock), window=5)
    assert r.configs == {"layer": 1, "once": 2}
    assert r.time_s == pytest.approx(60 * 9.0 + 3.0)
    assert r.stats.stopped_because.startswith("converged")
    once = [ci for k, ci in calls if k == "once"]
    assert once == list(range(3 + PATIENCE))   # its default, 2 to its best, PATIENCE without gain
    assert len(calls) < 40                      # it stopped: "layer" was not tried to exhaustion


def test_a_budget_error_names_where_each_kind_of_user_gives_the_budget(monkeypatch):
    """It said "give a larger --budget", a flag a torch.compile user has no way to give."""
    import time
    from lumc.compiler.core import budget
    monkeypatch.setattr(budget, "grace_seconds", lambda b: 0.05)
    d = Deadline(0.01, time.monotonic)
    with pytest.raises(BudgetError) as e:
        with budget.hard_deadline(d, "the test"):
            time.sleep(5)
    msg = str(e.value)
    assert "--budget" in msg and "budget=" in msg and "options={'budget'" in msg, msg


def test_a_program_below_the_best_time_by_bound_is_tuned_though_not_among_the_top():
    """The depth phase tuned the kernels of the 3 best programs only. GPT-2's plan without the mlp
    kernel (up- and down-projection apart) was 4th at its first configs, 886 us against the mlp
    plans' tuned 834, with a bound of 385: its own two kernels were never tuned, and the tuned
    plan it stands for (758 us) was lost. A measured program whose bound is below the best time
    now joins the tuning once the pool has converged."""
    clock = FakeClock()
    cands = [["s", "f1"], ["s", "f2"], ["s", "f3"], ["s", "up", "down"]]
    bounds = {"s": 1.0, "f1": 2.0, "f2": 2.1, "f3": 2.2, "up": 1.5, "down": 1.5}   # B last by bound
    times = {f: [12.0, 10.0] + [10.0] * 20 for f in ("f1", "f2", "f3")}
    times.update(s=[1.0], up=[9.0, 8.0, 2.0] + [2.5] * 20, down=[9.0, 2.0] + [2.5] * 20)
    nconf = {k: len(v) for k, v in times.items()}
    measure, calls = make_measure(times, clock, cost=0.01)
    r = run_search(cands, bounds, nconf, measure, Deadline(1000, clock), window=5)
    assert r.candidate == 3 and r.configs == {"s": 0, "up": 2, "down": 1}
    assert r.time_s == pytest.approx(1.0 + 2.0 + 2.0)
    assert any("candidate 3 joins the tuning" in line for line in r.stats.log)
    # without room under the best time, a program does not join: its bound 1 + 12 > 11
    r = run_search(cands, {**bounds, "up": 6.0, "down": 6.0}, nconf, measure,
                   Deadline(1000, clock), window=5)
    assert r.candidate == 0 and not any("joins" in line for line in r.stats.log)


def test_a_budget_error_names_what_the_compile_was_doing(monkeypatch):
    """A budget that ran out said only that it ran out. It names the stage now, and in the checks
    of an untimed fallback program, how many were done and about how long the rest needs (the
    time per check so far): densenet121's 126 kernels took minutes past a 60 s budget."""
    import time
    from types import SimpleNamespace
    from lumc.compiler.core import budget
    from lumc.compiler.core.untimed import check_untimed
    from lumc.compiler.core.search import Measurement, SearchResult, SearchStats
    monkeypatch.setattr(budget, "grace_seconds", lambda b: 0.05)
    d = Deadline(0.01, time.monotonic)
    d.doing = "the search (12 kernel configs measured)"
    with pytest.raises(BudgetError, match=r"ran out after [0-9.]+ s, in the search \(12 kernel "
                                          r"configs measured\), before the test could return"):
        with budget.hard_deadline(d, "the test"):
            time.sleep(5)
    clock = FakeClock()
    d = Deadline(10.0, clock)
    seen = []

    def measure(k, ci):     # a verdict the tuning database holds, then checks of 2 s each
        seen.append(d.doing)
        if k == "a":
            return Measurement(1e-6, from_db=True)
        clock.t += 2.0
        return Measurement(1e-6)
    measure.entries = {k: SimpleNamespace(kernel=SimpleNamespace(form="matmul")) for k in "abcd"}
    measure.deadline = d
    result = SearchResult(0, {}, None, 1e-6, {}, SearchStats(), {})
    assert check_untimed(result, list("abcda"), measure, "m", [], d) == 4
    assert seen[:2] == ["", "the checks of the untimed fallback program's kernels (1 of 4 done)"]
    assert seen[2:] == [
        f"the checks of the untimed fallback program's kernels ({i} of 4 done, up to about "
        f"{2 * (4 - i)} s more needed on this machine)" for i in (2, 3)]


RANKS = {"ieee": 0, "tf32x3": 1, "bf16": 4, "fp8": 5}


def _ranked(precisions):
    return lambda k, ci: RANKS[precisions[k][ci]]


def test_a_less_precise_config_must_save_one_percent():
    """Launch-bound contractions time the same at fp8, bf16 and tf32x3: the tie goes to the most
    precise config timed within 1% of the fastest, whatever order the configs were tried in; an
    fp8 config faster by more than that is taken."""
    prec = {"mm": ["fp8", "bf16", "tf32x3", "ieee"]}
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        times = {"mm": [[1.0, 1.0, 1.008, 1.5][i] for i in order]}
        p = {"mm": [prec["mm"][i] for i in order]}
        clock = FakeClock()
        measure, _ = make_measure(times, clock)
        r = run_search([["mm"]], {"mm": 0.1}, {"mm": 4}, measure, Deadline(100, clock),
                       precision_rank=_ranked(p))
        assert p["mm"][r.configs["mm"]] == "tf32x3"
        assert r.time_s == pytest.approx(1.008)
        # without ranks, the fastest: one of the two tied at 1.0
        r = run_search([["mm"]], {"mm": 0.1}, {"mm": 4}, make_measure(times, FakeClock())[0],
                       Deadline(100, FakeClock()))
        assert r.time_s == pytest.approx(1.0) and p["mm"][r.configs["mm"]] in ("fp8", "bf16")
    clock = FakeClock()
    measure, _ = make_measure({"mm": [1.0, 0.9]}, clock)       # fp8 found last, 10% faster
    r = run_search([["mm"]], {"mm": 0.1}, {"mm": 2}, measure, Deadline(100, clock),
                   precision_rank=_ranked({"mm": ["bf16", "fp8"]}))
    assert r.configs == {"mm": 1} and r.time_s == pytest.approx(0.9)


def test_a_precise_config_kept_can_lose_the_program():
    """The program time is the sum of the configs kept, not of the fastest ones: a program whose
    kernel kept tf32x3 at 1.008 loses to one at 1.005 (its fp8 twin at 1.0 would have won)."""
    clock = FakeClock()
    times = {"mm": [1.0, 1.008], "other": [1.005]}
    measure, _ = make_measure(times, clock)
    r = run_search([["mm"], ["other"]], {"mm": 0.1, "other": 0.1}, {"mm": 2, "other": 1},
                   measure, Deadline(100, clock), retime_top=1,
                   precision_rank=_ranked({"mm": ["fp8", "tf32x3"], "other": ["ieee"]}))
    assert r.candidate == 1 and r.time_s == pytest.approx(1.005)
    assert r.program_times[0] == pytest.approx(1.008)


def test_roofline_pruning_still_tries_a_more_precise_config_that_could_tie():
    """An fp8 config first within 1% of the kernel's bound pruned every other config ('within 1%
    of its bound'), and a config whose own bound was not below fp8's time was pruned too: the
    tf32x3 config timed within 1% of fp8, which the tie-break keeps, was never tried."""
    prec = ["fp8", "tf32x3"]
    clock = FakeClock()
    measure, _ = make_measure({"mm": [1.0, 1.005]}, clock)
    r = run_search([["mm"]], {"mm": 0.995}, {"mm": 2}, measure, Deadline(100, clock),
                   precision_rank=lambda k, ci: RANKS[prec[ci]])
    assert prec[r.configs["mm"]] == "tf32x3" and r.time_s == pytest.approx(1.005)
    clock = FakeClock()
    measure, _ = make_measure({"mm": [1.0, 1.004]}, clock)
    r = run_search([["mm"]], {"mm": 0.5}, {"mm": 2}, measure, Deadline(100, clock),
                   config_bounds=lambda k, ci: [0.5, 1.001][ci],
                   precision_rank=lambda k, ci: RANKS[prec[ci]])
    assert prec[r.configs["mm"]] == "tf32x3"
    # a precise config whose bound is over the 1% is still pruned, untried
    clock = FakeClock()
    measure, _ = make_measure({"mm": [1.0, 1.5]}, clock)
    r = run_search([["mm"]], {"mm": 0.5}, {"mm": 2}, measure, Deadline(100, clock),
                   config_bounds=lambda k, ci: [0.5, 1.02][ci],
                   precision_rank=lambda k, ci: RANKS[prec[ci]])
    assert prec[r.configs["mm"]] == "fp8" and r.stats.measurements == 1


def test_an_untimed_fallback_kernel_failing_its_default_config_takes_another():
    """At a 2 s budget the untimed fallback's fused MLP at its default fp8 config was 0.046 off
    its emulation (tolerance 0.04), and the compile failed ('give a larger budget') though its
    bf16 configs pass. The first other config that passes is taken, more precise ones first,
    and a note says so; a kernel failing at every config tried still fails the compile."""
    from types import SimpleNamespace
    from lumc.compiler.core.untimed import check_untimed
    from lumc.compiler.core.search import Measurement, SearchResult, SearchStats
    from lumc.ir.errors import LumcError
    precs = ["fp8", "fp8", "bf16", "bf16"]
    for passing, want in (({2, 3}, 2), ({1, 3}, 3), ({1}, 1), (set(), None)):
        tried = []

        def measure(k, ci):
            tried.append(ci)
            if k == "mlp" and ci not in passing:
                return Measurement(None, "rejected", f"max rel error 0.046 > 0.04 (config {ci})")
            return Measurement(1e-6)
        measure.entries = {k: SimpleNamespace(kernel=SimpleNamespace(form=k))
                           for k in ("mlp", "mm")}
        measure.n_configs = lambda k: 4
        measure.config_of = lambda k, j: {"PRECISION": precs[j], "BLOCK_M": 16 * (j + 1)}
        result = SearchResult(0, {}, None, 1e-6, {}, SearchStats(), {})
        notes: list = []
        if want is None:
            with pytest.raises(LumcError, match="mlp kernel failed its check .* at its other "
                                                "configs too; give a larger budget"):
                check_untimed(result, ["mlp", "mm"], measure, "m", notes)
            continue
        assert check_untimed(result, ["mlp", "mm"], measure, "m", notes) == 2
        assert result.configs == {"mlp": want}
        assert tried[:2] == [0, 2]          # the default, then the bf16 configs first
        assert len(notes) == 1 and "failed its check at its default config" in notes[0] and \
            f"BLOCK_M={16 * (want + 1)} PRECISION={precs[want]}, which passed" in notes[0]
