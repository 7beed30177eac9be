"""The search loop: roofline-pruned timing of candidate programs within a budget.

A candidate program is a list of kernels (by key). Every kernel has a roofline bound (seconds,
launch overhead included) and a config space. The loop:

1. **Breadth.** Candidates in order of their bound (the sum of their kernels' bounds). A candidate
   whose bound is not below the best measured program time is pruned without compiling anything.
   Otherwise each of its kernels not yet measured is compiled, checked against the reference
   (``measure`` reports numerics failures; a wrong kernel config is discarded, never chosen) and
   timed at its first legal config. A program's time is the sum of its kernels' best times.
2. **Depth**, after each candidate measured. Time goes first to the kernels of the best programs
   whose best measured time is furthest above their bound, in seconds, times the number of times
   one of those programs runs them (a repeated layer's kernel once per layer: what tuning it could
   save the program), divided by one plus the kernel's tries in a row that found nothing better;
   their other configs are tried in order (best predicted first, ``config_order.ordered_configs``).
   A kernel whose best time is within ``slack`` of its bound is done: no config can beat it by more
   than that (counted as pruned), and a config whose own bound (``config_bounds``) is not below the
   kernel's best time is pruned (but for a config of more precise arithmetic than the one kept,
   which a tie within ``precision_gain`` would keep: it is pruned only by its own bound over the
   fastest time plus that). Tuning stops when the best time has not improved by ``min_gain``
   over ``window`` measurements and every open kernel of the best programs has had ``PATIENCE``
   tries in a row that found nothing better (once the first holds, only kernels short of that are
   tried: a kernel run once in a 60-kernel program, under ``min_gain`` of its time, is not left at
   its first config). Then, rather than stop, the next measured program whose bound is still below
   the best time joins the pool (*widening*): its own kernels, at their first configs, may hide a
   faster plan than the best ones' tuned kernels (GPT-2's up- and down-projection beside the mlp
   twins, simulated: 886 us untuned, 4th, against 834; tuned, 776). Then breadth goes on against
   the tuned best.
   A kernel keeps its fastest config, except that a config of less precise arithmetic (fp8 beside
   bf16, bf16 beside tf32x3) must be faster than the most precise one by ``precision_gain`` (1%)
   of the time: on a launch-bound kernel the precisions tie, and the tie goes to the precise one.
3. **Re-time.** The top 3 programs are re-measured with their chosen configs (``remeasure``: timed
   again on a GPU, not read from the tuning database; each shared kernel once) and the fastest is
   chosen, ties broken by candidate order, so the same inputs give the same choice.

The deadline is checked before every measurement; a tiny budget still returns the best-bound
candidate (untimed if nothing could be measured).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from lumc.compiler.core.budget import Deadline

LOOKAHEAD_KERNELS = 4    # the depth phase's lookahead: the kernels of largest gap...
LOOKAHEAD_CONFIGS = 3    # ... their next untried configs each...
LOOKAHEAD_UNITS = 8      # ... at most this many pairs per call
PRECISION_GAIN = 0.01    # the share of a kernel's time a less precise config must save
PATIENCE = 3             # tries in a row without a better time before a kernel counts as tuned


@dataclass(frozen=True)
class Measurement:
    """One kernel config measured: ``seconds`` (None when it failed), ``status`` one of ``ok``,
    ``rejected`` (numerics differ from the reference), ``error`` (did not compile or run),
    ``budget`` (not measured: no time left for it; the search stops)."""
    seconds: float | None
    status: str = "ok"
    note: str = ""
    from_db: bool = False      # read from the tuning database: nothing compiled or run for it


@dataclass
class SearchStats:
    """What the search counted. A *program* is one candidate (a list of kernels); a *pair* is one
    (kernel, config) of the distinct kernels of all programs.

    ``programs`` and ``programs_pruned`` (never measured: their bound was not below the best
    time); ``kernels`` (distinct) and ``kernel_configs`` (their pairs); ``configs_pruned`` (pairs
    never tried: a kernel within ``slack`` of its bound, or the config's own bound not below the
    kernel's best time); ``candidates_compiled``: pairs tried, each once (compiled and checked, or
    read from the tuning database: ``from_db`` of them), of which ``candidates_rejected`` failed
    and ``candidates_timed`` have a time. ``candidates_total`` (the programs plus each kernel's
    configs beyond its first) and ``candidates_pruned`` (programs and pairs pruned) are the older
    mixed counts, kept in reports.
    """
    candidates_total: int = 0
    candidates_pruned: int = 0
    candidates_compiled: int = 0
    candidates_rejected: int = 0
    candidates_timed: int = 0
    programs: int = 0
    programs_pruned: int = 0
    kernels: int = 0
    kernel_configs: int = 0
    configs_pruned: int = 0
    from_db: int = 0
    measurements: int = 0
    stopped_because: str = "exhausted"
    log: list[str] = field(default_factory=list)


@dataclass
class SearchResult:
    """The choice: ``candidate`` index, ``configs`` per kernel key, ``time_s`` (None if untimed),
    ``bound_s`` of the chosen candidate, and the statistics."""
    candidate: int
    configs: dict
    time_s: float | None
    bound_s: float
    kernel_times: dict
    stats: SearchStats
    program_times: dict


def run_search(candidates: Sequence[Sequence[Hashable]], bounds: dict, configs: dict,
               measure: Callable[[Hashable, int], Measurement], deadline: Deadline, *,
               slack: float = 0.01, min_gain: float = 0.01, window: int = 24,
               retime_top: int = 3, on_progress: Callable[[SearchStats, float, float], None] | None = None,
               config_bounds: Callable[[Hashable, int], float] | None = None,
               before_candidate: Callable[[int], None] | None = None,
               remeasure: Callable[[Hashable, int], Measurement] | None = None,
               runnable: Callable[[Hashable], bool] | None = None,
               lookahead: Callable[[list], None] | None = None,
               precision_rank: Callable[[Hashable, int], int] | None = None,
               precision_gain: float = PRECISION_GAIN) -> SearchResult:
    """Choose the fastest candidate within the deadline (see module docstring).

    Args:
        candidates: each candidate is the list of its kernel keys (kernels may be shared).
        bounds: ``{kernel key: roofline bound in seconds}``.
        configs: ``{kernel key: number of configs}`` (configs are indexed 0..n-1, 0 = default).
        measure: ``(kernel key, config index) -> Measurement``; it compiles, checks numerics and
            times, memoizing as it likes (the tuning database).
        deadline: the budget being spent.
        slack: a kernel within this fraction of its bound is not tuned further.
        min_gain, window: early stop when the best time improved by less than ``min_gain``
            (relative) over the last ``window`` measurements; the window grows to twice the number
            of distinct kernels being tuned, since one config try improves one kernel only.
        on_progress: called after each measurement with ``(stats, best_time, best_bound)``.
        config_bounds: ``(kernel key, config index) -> seconds``, a lower bound for that config
            (e.g. the roofline of its padded tiles); a config whose bound is not below the kernel's
            best measured time is pruned without compiling.
        before_candidate: called with a candidate's index before it is measured (the pipeline
            starts that candidate's numerics checks in a process pool).
        remeasure: like ``measure`` but timing again rather than reading a memoized time, for the
            final re-time of the top programs (default: ``measure``).
        runnable: ``kernel key -> bool``, False for a kernel with no config that can run (Triton
            cannot render it and no extern applies); the untimed fallback skips candidates holding one.
        lookahead: called in the depth phase before each measurement with the ``(kernel key,
            config index)`` pairs likely measured next (the next configs of the kernels furthest
            from their bound, largest gap first, less those their bound prunes), so that workers
            can start them ahead of need;
            it must not change what ``measure`` returns.
        precision_rank: ``(kernel key, config index) -> int``, 0 for the most precise arithmetic
            and larger for less (``precision_gate.PRECISION_ORDER``). A kernel then keeps the most
            precise of its configs timed within ``precision_gain`` (relative) of its fastest one:
            a reduced precision must buy at least that share of the kernel's time (an fp8 config
            tied with bf16 on a launch-bound kernel is not taken). None: the fastest config.
    """
    stats = SearchStats()
    n = len(candidates)
    cand_bound = [sum(bounds[k] for k in c) for c in candidates]
    order = sorted(range(n), key=lambda i: (cand_bound[i], i))
    rank = {i: r for r, i in enumerate(order)}    # a candidate's place in ``order``
    kernels = {k for c in candidates for k in c}
    stats.candidates_total = n + sum(max(configs[k] - 1, 0) for k in kernels)
    stats.programs, stats.kernels = n, len(kernels)
    stats.kernel_configs = sum(configs[k] for k in kernels)
    best_t: dict = {}        # kernel -> best seconds
    best_cfg: dict = {}      # kernel -> config index
    tried: dict = {k: set() for k in kernels}
    dead: set = set()        # kernels with no working config
    prog_time: dict[int, float] = {}
    best = [math.inf, order[0] if order else 0]
    history: list[float] = []
    fruitless: dict = {}     # kernel -> tries in a row that did not improve its best time
    timed: dict = {k: {} for k in kernels}   # kernel -> {config index: seconds}, the ok ones

    def choose(k) -> None:
        """best_t/best_cfg of ``k``: its fastest config or, given ``precision_rank``, the most
        precise one timed within ``precision_gain`` of the fastest (ties: the faster, then the
        first tried). Order-free: a faster config found later can unseat a precise one."""
        ts = timed[k]
        fastest = min(ts.values())
        if precision_rank is None:
            ci = next(c for c, t in ts.items() if t == fastest)
        else:
            ci = min((c for c, t in ts.items() if t <= fastest * (1 + precision_gain)),
                     key=lambda c: (precision_rank(k, c), ts[c]))
        best_t[k], best_cfg[k] = ts[ci], ci

    def more_precise(k, ci) -> bool:
        """Config ``ci`` of ``k`` is of more precise arithmetic than the config ``k`` keeps."""
        return precision_rank is not None and precision_rank(k, ci) < precision_rank(k, best_cfg[k])

    def hopeless(k, ci) -> bool:
        """Config ``ci``'s own bound proves ``k`` cannot keep it: not below ``k``'s time or, for
        a more precise config (kept within ``precision_gain`` of the fastest), above that."""
        if config_bounds is None:
            return False
        if more_precise(k, ci):
            return config_bounds(k, ci) > min(timed[k].values()) * (1 + precision_gain)
        return config_bounds(k, ci) >= best_t[k]

    def progress():
        if on_progress is not None:
            on_progress(stats, best[0], cand_bound[best[1]])

    def try_config(k, ci) -> bool:
        if deadline.expired():
            return False
        tried[k].add(ci)
        m = measure(k, ci)
        if m.status == "budget":         # the measurer has no time left for this config
            tried[k].discard(ci)
            return False
        stats.measurements += 1
        stats.candidates_compiled += 1
        stats.from_db += bool(m.from_db)
        if m.status != "ok" or m.seconds is None:
            stats.candidates_rejected += 1
            stats.log.append(f"kernel {k} config {ci}: {m.status} {m.note}".rstrip())
        else:
            stats.candidates_timed += 1
            timed[k][ci] = m.seconds
            choose(k)
        return True

    def first_working(k) -> bool:
        while k not in best_t:
            nxt = next((ci for ci in range(configs[k]) if ci not in tried[k]), None)
            if nxt is None:
                dead.add(k)
                return True
            if not try_config(k, nxt):
                return False
        return True

    def refresh() -> None:
        for i in range(n):
            if all(k in best_t for k in candidates[i]):
                prog_time[i] = sum(best_t[k] for k in candidates[i])
        if prog_time:      # a precise config kept over a faster one can raise a program's time
            best[1] = min(prog_time, key=lambda i: (prog_time[i], rank[i]))
            best[0] = prog_time[best[1]]
        history.append(best[0])
        progress()

    def measure_candidate(i) -> bool:
        """Default configs for the kernels of candidate ``i`` not measured yet; False if out of time."""
        for k in candidates[i]:
            if k in dead:
                break
            if not first_working(k):
                return False
        if any(k in dead for k in candidates[i]):
            stats.log.append(f"candidate {i} has a kernel with no working config")
        refresh()
        return True

    def upcoming(by_gap) -> list:
        """The configs the depth phase likely tries next: per kernel in gap order, its next
        untried configs that its best time does not prune."""
        def nxt(k):
            ok = (c for c in range(configs[k]) if c not in tried[k] and not hopeless(k, c))
            return ((k, c) for c in itertools.islice(ok, LOOKAHEAD_CONFIGS))
        return list(itertools.islice(itertools.chain.from_iterable(
            nxt(k) for k in by_gap[:LOOKAHEAD_KERNELS]), LOOKAHEAD_UNITS))

    def tune() -> str | None:
        """Depth: tune the kernels of the best programs, largest gap to bound first, until the best
        time stops improving. Returns "budget" when the deadline passed, else None."""
        start = len(history)
        closing, converged = False, ""
        width = retime_top       # the kernels of this many best programs are tuned (widening: more)
        while True:
            if deadline.expired():
                return "budget"
            ranked = sorted(prog_time, key=lambda i: (prog_time[i], rank[i]))
            top = ranked[:width]
            pool = {k for i in top for k in candidates[i]}
            for k in list(pool):
                if k in best_t and best_t[k] <= bounds[k] * (1 + slack) and len(tried[k]) < configs[k]:
                    # but a more precise config, which a tie would keep, is still tried
                    rest = [c for c in range(configs[k]) if c not in tried[k]
                            and not more_precise(k, c)]
                    if not rest:
                        continue
                    stats.candidates_pruned += len(rest)
                    stats.configs_pruned += len(rest)
                    stats.log.append(f"kernel {k}: within {slack:.0%} of its bound, "
                                     f"{len(rest)} configs pruned")
                    tried[k].update(rest)
            open_k = [k for k in pool if k in best_t and len(tried[k]) < configs[k]]
            if closing:
                # the program-wide test said converged: only kernels without PATIENCE tries in a
                # row that found nothing better are tried, then the search stops
                open_k = [k for k in open_k if fruitless.get(k, 0) < PATIENCE]
            if not open_k:
                # widen: the next measured program whose bound is still below the best time has
                # kernels no one tuned (its own up- and down-projection beside a twin's fused
                # kernel): it joins the pool, rather than losing at its first configs
                nxt = next((j for j in ranked[width:] if cand_bound[j] < best[0]), None)
                if nxt is not None:
                    width = ranked.index(nxt) + 1
                    stats.log.append(f"candidate {nxt} joins the tuning: bound "
                                     f"{cand_bound[nxt]:.3e}s < best {best[0]:.3e}s")
                    continue
                stats.stopped_because = converged if closing else "exhausted"
                return None
            # the time a kernel could still save the best programs: its gap to its bound times
            # the times one of them runs it (a repeated layer's kernel counts once per layer),
            # discounted by its tries in a row that found nothing better (its configs come best
            # predicted first: a kernel whose next ones keep losing yields to the others)
            uses = {k: max(candidates[i].count(k) for i in top) for k in open_k}
            by_gap = sorted(open_k, key=lambda k: ((best_t[k] - bounds[k]) * uses[k]
                                                   / (1 + fruitless.get(k, 0)),
                                                   best_t[k] / max(bounds[k], 1e-12), str(k)),
                            reverse=True)
            k = by_gap[0]
            ci = next(ci for ci in range(configs[k]) if ci not in tried[k])
            if lookahead is not None:
                lookahead(upcoming(by_gap))
            if hopeless(k, ci):
                tried[k].add(ci)
                stats.candidates_pruned += 1
                stats.configs_pruned += 1
                continue
            before = best_t[k]
            if not try_config(k, ci):
                return "budget"
            fruitless[k] = 0 if best_t[k] < before else fruitless.get(k, 0) + 1
            refresh()
            win = max(window, 2 * len(pool))
            if not closing and len(history) - start > win and history[-win - 1] < math.inf and \
                    history[-1] > history[-win - 1] * (1 - min_gain):
                converged = (f"converged (best improved < {min_gain:.0%} over {win} "
                             "measurements)")
                closing = True

    # Candidates in bound order. Each is measured at default configs unless its bound already
    # proves it cannot beat the best time; after each new best the best programs are tuned, so the
    # bar the next candidates must pass is a tuned time, and more of them are pruned.
    out_of_time = False
    pruned: set[int] = set()

    def prune_hopeless() -> None:
        # free: a bound not below the best time can only stay so as the best time falls
        for j in order:
            if j not in pruned and j not in prog_time and cand_bound[j] >= best[0]:
                pruned.add(j)
                stats.candidates_pruned += 1
                stats.programs_pruned += 1
                stats.log.append(f"candidate {j} pruned: bound {cand_bound[j]:.3e}s >= best "
                                 f"{best[0]:.3e}s")

    for i in order:
        if i in pruned or i in prog_time:
            continue
        prune_hopeless()
        if i in pruned:
            continue
        if before_candidate is not None:
            before_candidate(i)
        if not measure_candidate(i):
            out_of_time = True
            break
        prune_hopeless()
        if prog_time and tune() == "budget":
            out_of_time = True
            break
    if out_of_time:
        stats.stopped_because = "budget"

    # 3. re-time the top programs with their chosen configs
    if prog_time:
        top = sorted(prog_time, key=lambda i: (prog_time[i], rank[i]))[:retime_top]
        if len(top) > 1 and not deadline.expired():
            retimed = {}
            again = remeasure or measure
            fresh: dict = {}         # a kernel shared by several top programs is re-timed once
            for i in top:
                total = 0.0
                for k in candidates[i]:
                    m = fresh.get(k) or fresh.setdefault(k, again(k, best_cfg[k]))
                    total += m.seconds if m.seconds is not None else math.inf
                retimed[i] = total
            best[1] = min(top, key=lambda i: (retimed[i], rank[i]))
            best[0] = retimed[best[1]]
            prog_time.update(retimed)
        chosen = best[1]
        return SearchResult(chosen, {k: best_cfg[k] for k in candidates[chosen]}, best[0],
                            cand_bound[chosen], {k: best_t[k] for k in candidates[chosen]}, stats,
                            dict(prog_time))
    # nothing measured: the best-bound candidate that can run, untimed, default configs
    chosen = order[0] if order else 0
    if runnable is not None:
        chosen = next((i for i in order if all(runnable(k) for k in candidates[i])), chosen)
    if out_of_time:
        stats.stopped_because = ("budget (no program timed whole: the best-bound candidate "
                                 "returned untimed)")
    else:
        stats.stopped_because = ("no candidate has a working config for every kernel "
                                 "(best-bound candidate returned untimed)")
    return SearchResult(chosen, {k: 0 for k in (candidates[chosen] if candidates else [])}, None,
                        cand_bound[chosen] if candidates else 0.0, {}, stats, {})
