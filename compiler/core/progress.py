"""The compile's progress: the rich display of the budget spent, the stage and the search's
counters (on a terminal only), and what the compile is doing now, which a budget error names
(``Deadline.doing``, :func:`lumc.compiler.core.budget.hard_deadline`)."""
from __future__ import annotations

from lumc.compiler.core.budget import Deadline
from lumc.compiler.runtime.targets import Target


# what each stage is doing, as a budget error names it ("ran out after 70.0 s, in the search, ...")
STAGE_TEXT = {"candidates": "the candidate stage (e-graph saturation and extraction)",
              "reference": "the reference run of the model", "search": "the search",
              "plan": "the checks of the chosen program"}


class Progress:
    """The rich progress display: budget used, candidate counters, best time against its bound."""

    def __init__(self, budget_s: float, target: Target, quiet: bool):
        self.quiet = quiet
        self.budget_s = budget_s
        self.target = target
        self._p = None
        self._task = None
        self.workers = None     # () -> {count, busy, idle, in_flight} of the search's workers
        from rich.console import Console
        if not quiet and Console(stderr=True).is_terminal:    # no display in logs and pipes
            from rich.progress import BarColumn, Progress as RP, TextColumn, TimeElapsedColumn
            self._p = RP(TextColumn("[bold]{task.fields[stage]:<11}"), BarColumn(bar_width=24),
                         TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                         console=Console(stderr=True), transient=True)
            self._p.start()
            self._task = self._p.add_task("compile", total=budget_s, stage="import", info="")

    def stage(self, name: str, deadline: Deadline, info: str = "") -> None:
        deadline.doing = STAGE_TEXT.get(name, name)     # named if the budget runs out in it
        if self._p is not None:
            self._p.update(self._task, completed=min(deadline.elapsed(), self.budget_s), stage=name,
                           info=info)

    def search(self, deadline: Deadline, stats, best: float, bound: float) -> None:
        if self._p is not None:
            self._show_search(deadline, stats, best, bound)
        deadline.doing = f"the search ({stats.measurements} kernel configs measured)"

    def _show_search(self, deadline: Deadline, stats, best: float, bound: float) -> None:
        unit = "sim" if self.target.simulated else "gpu"
        best_s = f"{best * 1e6:.1f}us" if best != float("inf") else "-"
        info = (f"programs {stats.programs} pruned {stats.programs_pruned} | (kernel, config) "
                f"pairs {stats.kernel_configs} pruned {stats.configs_pruned} tried "
                f"{stats.candidates_compiled} rejected {stats.candidates_rejected} timed "
                f"{stats.candidates_timed} | best {best_s} ({unit}) bound {bound * 1e6:.1f}us")
        w = self.workers() if self.workers is not None else None
        if w is not None:
            info += (f" | workers {w['busy']} busy {w['idle']} idle, {w['in_flight']} units "
                     "in flight")
        self.stage("search", deadline, info)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
