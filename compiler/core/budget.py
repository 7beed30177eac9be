"""The compile budget: a hard wall-clock deadline for the whole compile.

``parse_duration("30m")`` turns the user's DURATION into seconds; :class:`Deadline` tracks what is
left against an injectable clock, so tests drive it with a fake timer; :func:`hard_deadline` makes
it hold for any graph, whatever stage is running when it passes.
"""
from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from lumc.ir.errors import BudgetError

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}

# the longest budget: a year. Past about 300 years the deadline's timer (setitimer) and thread
# waits overflow the platform's time_t; a year is already no deadline at all
MAX_BUDGET_S = 8760 * 3600.0

# where a user gives the budget, named in every "too small a budget" error (a torch.compile user has
# no --budget)
BUDGET_KNOBS = "lumc compile --budget, lumc.compile(budget=...), torch.compile options={'budget': ...}"


def parse_duration(text: str | float | int) -> float:
    """Seconds in a DURATION such as ``30m``, ``90s``, ``1h``, ``1.5m`` or a bare number of seconds.

    Compound forms (``1h30m``, ``2m30s``) are accepted too, each unit once, largest first.

    Raises:
        BudgetError: for an unparseable, zero or negative budget (``banana``, ``0``, ``-5s``,
            ``10s10s``),
            or one over a year (:data:`MAX_BUDGET_S`).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        s = str(text).strip().lower()
        if s.startswith("-"):
            raise BudgetError(f"budget {text!r} must be positive")
        # ASCII digits only: float() would read '١٠' as 10, but a budget is written in 0-9
        parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|min|m|h)?", s, flags=re.ASCII)
        rebuilt = "".join(a + (u or "") for a, u in parts)
        if not parts or rebuilt != s.replace(" ", "") or (len(parts) > 1 and not all(u for _, u in parts)):
            raise BudgetError(f"budget {text!r} is not a duration; write e.g. 90s, 30m or 1h")
        rank = [{"h": 0, "min": 1, "m": 1, "s": 2, "ms": 3}[u or "s"] for _, u in parts]
        if any(b <= a for a, b in zip(rank, rank[1:])):     # 1h30m, not 10s10s or 30m1h
            raise BudgetError(f"budget {text!r} repeats or reorders a unit; write e.g. 1h30m")
        seconds = sum(float(a) * _UNITS[u or "s"] for a, u in parts)
    if not seconds > 0:
        raise BudgetError(f"budget {text!r} must be positive")
    if seconds != seconds or seconds == float("inf"):
        raise BudgetError(f"budget {text!r} must be finite")
    if seconds > MAX_BUDGET_S:
        raise BudgetError(f"budget {text!r} is over a year; give at most {MAX_BUDGET_S / 3600:g}h")
    return seconds


def grace_seconds(budget_s: float) -> float:
    """How far past the budget a compile may return: 5%, or 10 s for budgets under 3 minutes."""
    return 10.0 if budget_s < 180.0 else 0.05 * budget_s


@dataclass
class Deadline:
    """A budget being spent.

    Attributes:
        budget_s: the whole budget in seconds.
        clock: a monotonic clock in seconds (``time.monotonic``; tests pass a fake).
        doing: what the compile is doing now (``"the search"``), named when the budget runs
            out (:func:`hard_deadline`); set by the stages.
    """
    budget_s: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(default=-1.0)
    doing: str = field(default="", compare=False, repr=False)

    def __post_init__(self):
        if self.start < 0:
            self.start = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        return max(0.0, self.budget_s - self.elapsed())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def fraction_used(self) -> float:
        return min(1.0, self.elapsed() / self.budget_s)

    def sub(self, fraction: float) -> "Deadline":
        """A deadline for one stage: ``fraction`` of what remains now, on the same clock."""
        return Deadline(self.remaining() * fraction, self.clock)


class _DeadlinePassed(BaseException):
    """Raised by the SIGALRM handler of :func:`hard_deadline`; a BaseException, so that no
    ``except Exception`` on the way swallows it (it re-fires every 2 s regardless)."""


@contextlib.contextmanager
def hard_deadline(deadline: Deadline, what: str = "the compile") -> Iterator[None]:
    """End the block with :class:`BudgetError` once ``deadline``'s budget plus its grace
    (:func:`grace_seconds`) has passed, whatever it is doing (a SIGALRM timer).

    Stages check the deadline themselves and degrade (no e-graph, the best-bound candidate
    untimed); this is the guarantee behind them, for graphs so large that even the cheapest path
    cannot finish in time. Active only on the main thread with a real clock (``time.monotonic``);
    elsewhere the block runs unguarded.

    Raises:
        BudgetError: the budget and grace ran out inside the block (one line).
    """
    if (deadline.clock is not time.monotonic or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    limit = max(0.01, deadline.remaining() + grace_seconds(deadline.budget_s))

    def on_alarm(signum, frame):
        raise _DeadlinePassed()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit, 2.0)
    try:
        yield
    except _DeadlinePassed:
        doing = f", in {deadline.doing}," if deadline.doing else ""
        raise BudgetError(f"the budget of {deadline.budget_s:g} s (+{grace_seconds(deadline.budget_s):g}"
                          f" s grace) ran out after {deadline.elapsed():.1f} s{doing} before {what} "
                          f"could return a program; this graph needs a larger budget "
                          f"({BUDGET_KNOBS})") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
