"""The untimed fallback program's checks: a compile whose search timed no whole program within its
budget returns the best-bound candidate at default configs (``search.run_search``), and its
kernels are checked here, past the deadline, before it is returned."""
from __future__ import annotations

from lumc.compiler.core.budget import Deadline
from lumc.compiler.core.precision_gate import config_rank
from lumc.compiler.core.search import SearchResult
from lumc.ir.errors import LumcError

MAX_OTHER_CONFIGS = 4   # configs tried, in the grace, for a fallback kernel whose default failed


def check_untimed(result: SearchResult, keys: list, measurer, model: str,
                  warnings: list, deadline: Deadline | None = None) -> int:
    """The untimed fallback (nothing was measured within the budget: the best-bound candidate at
    default configs) has its kernels' generated code checked now, past the deadline, within the
    hard deadline's grace (a budget too small for that is a ``BudgetError``): no program is
    returned with kernels nothing ran. A kernel whose default config fails its check gets the
    first of up to :data:`MAX_OTHER_CONFIGS` others that passes, more precise arithmetic first
    (an fp8 fused MLP 0.046 off its emulation at a 2 s budget failed the compile, with bf16
    configs that pass): ``result.configs`` names it, and ``warnings`` says so. A kernel whose code
    cannot run here (a dtype the Triton interpreter lacks: uint2, the fnuz float8s) is named in
    ``warnings`` as unchecked. Returns how many kernels were checked here (0 when the search
    measured the program). ``deadline`` (the compile's) names the checks done and the time they
    still need, for the budget error.

    Raises:
        LumcError: a kernel of the fallback gave wrong values at every config tried (the search
            had no time to choose another program).
    """
    if result.time_s is not None:
        return 0
    measurer.deadline = None          # the hard deadline bounds it
    checked = 0
    todo = list(dict.fromkeys(keys))
    ran, ran_s = 0, 0.0          # checks that ran here (not verdicts the tuning database held)
    for i, k in enumerate(todo):
        if deadline is not None and i:   # named if the budget's grace runs out here
            more = (f", up to about {ran_s / ran * (len(todo) - i):.0f} s more needed on this "
                    "machine" if ran else "")
            deadline.doing = (f"the checks of the untimed fallback program's kernels ({i} of "
                              f"{len(todo)} done{more})")
        t0 = deadline.elapsed() if deadline is not None else 0.0
        ci = result.configs.get(k, 0)
        m = measurer(k, ci)
        if deadline is not None and not m.from_db:
            ran, ran_s = ran + 1, ran_s + deadline.elapsed() - t0
        form = measurer.entries[k].kernel.form
        if m.status == "rejected":
            j = _other_passing(measurer, k, ci)
            if j is None:
                raise LumcError(f"{model}: nothing was measured within the budget, and the "
                                f"fallback program's {form} kernel failed its check past the "
                                f"deadline ({m.note}), at its other configs too; give a larger "
                                "budget")
            result.configs[k] = j
            warnings.append(f"the untimed fallback program's {form} kernel failed its check at "
                            f"its default config ({m.note}); it runs config "
                            f"{_describe(measurer.config_of(k, j))}, which passed")
            checked += 1
        elif m.status == "ok":
            checked += 1
        else:
            warnings.append(f"the fallback program's {form} kernel {k[:12]} could not be checked "
                            f"({m.note})")
    return checked


def _other_passing(measurer, k, failed: int) -> int | None:
    """The first config of kernel ``k`` other than ``failed`` whose check passes, of up to
    :data:`MAX_OTHER_CONFIGS` tried: more precise arithmetic than ``failed``'s first, then in
    the kernel's order (best predicted first); None when none does."""
    bad = config_rank(measurer.config_of(k, failed))
    others = sorted((j for j in range(measurer.n_configs(k)) if j != failed),
                    key=lambda j: (config_rank(measurer.config_of(k, j)) >= bad, j))
    for j in others[:MAX_OTHER_CONFIGS]:
        if measurer(k, j).status == "ok":
            return j
    return None


def _describe(cfg: dict | None) -> str:
    return " ".join(f"{a}={v}" for a, v in sorted((cfg or {}).items())) or "default"
