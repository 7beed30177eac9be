"""Size-range benchmark: one compile for a range of sequence lengths against single-shape compiles at
each bucket's representative size. Not a test; prints figures (times are SIMULATED on sim:h200).

    python tests/bench/bench_ranges.py                       # MiniLM-L3, sequence_length=1..256
    python tests/bench/bench_ranges.py --range 1..128 --budget 120

Every compile uses its own empty tuning database, so no compile reuses another's timings, and
plan reuse is off. Printed: the range compile's wall time and each single-shape compile's, their
ratio, and per bucket the simulated time of the range's plan at its representative size next to
the single-shape plan's at that size.
"""
from __future__ import annotations

import argparse
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm-l3")
    ap.add_argument("--dim", default="sequence_length")
    ap.add_argument("--range", default="1..256")
    ap.add_argument("--fixed", default="batch_size=1")
    ap.add_argument("--budget", type=float, default=120.0)
    a = ap.parse_args()
    from lumc.compiler.core.buckets import parse_range
    from lumc.compiler.core.pipeline import compile_model
    from lumc.compiler.frontends.models import fetch_model
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    path = str(fetch_model(a.model))
    fixed = {k: int(v) for k, v in (kv.split("=") for kv in a.fixed.split(",") if kv)}

    def fresh_db():
        return TuningDatabase(tempfile.mkdtemp(prefix="lumc-bench-") + "/t.sqlite")

    t0 = time.perf_counter()
    rng = compile_model(path, budget=a.budget, device="sim:h200", db=fresh_db(), reuse_plan=False,
                        shapes={**fixed, a.dim: parse_range(a.range)})
    t_range = time.perf_counter() - t0
    rows = []
    for v in rng.report_dict()["variants"]:
        rep = v["representative"][a.dim]
        t0 = time.perf_counter()
        one = compile_model(path, budget=a.budget, device="sim:h200", db=fresh_db(),
                            reuse_plan=False, shapes={**fixed, a.dim: rep})
        t_one = time.perf_counter() - t0
        rows.append((v["describe"], rep, v["best_time_s"], one.report_dict()["best_time_s"], t_one,
                     v["kernels"], one.report_dict()["kernels"]))
    print(f"{a.model} {a.dim}={a.range}: one range compile {t_range:.1f} s wall "
          f"({len(rows)} buckets, budget {a.budget:g} s)")
    print(f"{'bucket':<22} {'rep':>5} {'range us':>9} {'single us':>10} {'ratio':>6} "
          f"{'kernels':>8} {'single compile s':>17}")
    for desc, rep, tr, ts, t_one, kr, ks in rows:
        print(f"{desc:<22} {rep:>5} {tr * 1e6:9.1f} {ts * 1e6:10.1f} {tr / ts:6.3f} "
              f"{kr:>3}/{ks:<4} {t_one:17.1f}")
    worst = max(abs(tr / ts - 1) for _, _, tr, ts, *_ in rows)
    biggest = rows[-1][4]
    mean = sum(r[4] for r in rows) / len(rows)
    print(f"simulated time, range plan vs single-shape plan: worst {100 * worst:.1f}% apart")
    print(f"compile time: range {t_range:.1f} s = {t_range / biggest:.2f}x the single-shape "
          f"compile at the largest size ({biggest:.1f} s), {t_range / mean:.2f}x the mean single "
          f"compile ({mean:.1f} s)")


if __name__ == "__main__":
    main()
