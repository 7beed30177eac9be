"""Loading the rules into egglog costs what the rules cost, not what one long program costs to
parse: egglog 13.2's parser is about quadratic in a program's length (EGGLOG-NOTES.md), and the
whole rule set sent as one program took 1.4 GB of memory in every compile process."""
from __future__ import annotations

import subprocess
import sys

# the peak of this process's own memory (VmHWM): ru_maxrss survives exec on Linux, so a child of
# a large test process would report its parent's peak
SCRIPT = """
from lumc.rewrites.schedule import Saturator, all_rules
s = Saturator()
hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM"))
print(len(all_rules()), hwm // 1024)
"""


def test_loading_every_rule_stays_small():
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rules, peak_mb = (int(x) for x in p.stdout.split())
    assert rules > 100 and peak_mb < 400, (rules, peak_mb)
