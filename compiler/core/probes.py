"""Which primes probe a size range (``lumc.compiler.core.buckets``, ``lumc.ir.symbolic``): per
ranged dim, a probe, a check and a third prime, inside the range where it holds two odd primes,
else (and for learning affine values) above it and above :data:`ABOVE_UNITS` units."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lumc.ir.errors import InputError
from lumc.compiler.core.options import option

if TYPE_CHECKING:
    from lumc.compiler.core.buckets import DimRange


def _primes_in(lo: int, hi: int) -> list[int]:
    """Primes in ``[lo, hi]``, largest first."""
    out = []
    for v in range(hi, max(lo, 2) - 1, -1):
        if v >= 2 and all(v % d for d in range(2, int(math.isqrt(v)) + 1)):
            out.append(v)
    return out


PROBE_TRIES = 4    # probe assignments tried when a range's sizes need affine values
ABOVE_UNITS = 1000  # affine values are learned at probes above this many units (see probe_assignments)


def probe_assignments(ranges: dict[str, DimRange], tries: int = PROBE_TRIES,
                      above: bool | str = False):
    """Up to ``tries`` assignments ``(probe, check, third)`` of primes per ranged dim (in units of
    its step, all distinct). Inside the range, the probes largest first (``above=False``: sizes
    that are products of the dims need nothing else); else the primes above the range and above
    :data:`ABOVE_UNITS` units, smallest first (``above=True``: a table of affine values needs
    probe sizes larger than every small size the model holds, else a padded size at the probe, ``W / 16 + 1 = 27``,
    can equal a static one, a 3 x 3 x 3 kernel's stride 27, and a context-free re-size cannot
    tell them apart; and factors ``m p + a`` distinct for distinct ``(m, a)``, ``p > 2 |a|``).
    The third prime verifies such a table (:func:`_affine_table`); it is None where there are
    too few. A later assignment moves the probes. ``above="narrow"``: only the dims with fewer
    than two odd primes inside are probed above (a batch of 1..4 beside a sequence of 1..64: a
    model with a 512-row position table imports at no sequence above the range, but at a batch
    of 1009); it raises InputError where no dim is narrow, or every one is.

    Raises:
        InputError: a range with fewer than two odd primes to probe it.
    """
    cands = {}
    narrow = {k for k, r in ranges.items()
              if len([p for p in _primes_in(r.lo // r.step, r.hi // r.step) if p > 2]) < 2}
    if above == "narrow" and not 0 < len(narrow) < len(ranges):
        raise InputError("no mixed probes: " + ("every" if narrow else "no") + " dim is narrow")
    for i, (k, r) in enumerate(ranges.items()):
        if above is True or (above == "narrow" and k in narrow):
            # each dim its own band, 1.5x apart: two dims' probes never within a pad of each
            # other (H' + 6 = W' would make a padded H and W one value) nor of twice it
            base = int(max(r.hi // r.step, ABOVE_UNITS) * 1.5 ** i)
            cands[k] = _primes_in(base + 1, base + 400)[::-1]
        else:
            cands[k] = [p for p in _primes_in(r.lo // r.step, r.hi // r.step) if p > 2]
    out = []
    for shift in range(tries):
        used: set[int] = set()
        probe, check, third = {}, {}, {}
        ok = True
        for k in ranges:
            free = [p for p in cands[k] if p not in used]
            if len(free) < 2:
                ok = False
                break
            probe[k] = free[min(shift, len(free) - 2)]
            used.add(probe[k])
        for k in ranges if ok else ():
            free = [p for p in cands[k] if p not in used]
            if not free:
                ok = False
                break
            check[k] = free[0]
            used.add(check[k])
        if not ok:
            if shift == 0:
                k = next(k for k in ranges if len(cands[k]) < 2) if any(
                    len(c) < 2 for c in cands.values()) else next(iter(ranges))
                r = ranges[k]
                raise InputError(f"{option('shape')} {k}={r.describe()}: too narrow to probe (it needs two "
                                 f"odd primes in {r.lo // r.step}..{r.hi // r.step}); give its "
                                 "sizes as a list")
            break
        for k in ranges:
            free = [p for p in cands[k] if p not in used]
            third[k] = free[0] if free else None
            used |= set(free[:1])
        if len(ranges) == 2 and None not in third.values():
            # the three points not on one line in (dim 1, dim 2): no affine relation between the
            # dims holds at all three (twin primes 19/17, 13/11, 7/5 would keep H - W constant)
            k1, k2 = ranges

            def off_line(t2):
                return (check[k1] - probe[k1]) * (t2 - probe[k2]) != \
                    (check[k2] - probe[k2]) * (third[k1] - probe[k1])
            if not off_line(third[k2]):
                alt = [p for p in cands[k2] if p not in used and off_line(p)]
                if alt:
                    third[k2] = alt[0]
        if (probe, check, third) not in out:
            out.append((probe, check, third))
    return out


def choose_probes(ranges: dict[str, DimRange]) -> tuple[dict[str, int], dict[str, int],
                                                        dict[str, int]]:
    """The first of :func:`probe_assignments`."""
    return probe_assignments(ranges, 1)[0]
