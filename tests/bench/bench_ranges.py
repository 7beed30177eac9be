"""Size-range benchmark: one compile for a range of sequence lengths against single-shape compiles at
each bucket's representative size. Not a test; prints figures (times are SIMULATED on sim:h200).

    python tests/bench/bench_ranges.py                       # MiniLM-L3, sequence_length=1..256
    python tests/bench/bench_ranges.py --range 1..128 --budget 120

Every compile runs in its own process with its own empty cache directory (``LUMC_CACHE_DIR``: the
tuning database and the rendered-kernel cache) and plan reuse off, so none reuses another's
timings, kernels or warm imports: each pays the same cold start. Printed: the range compile's wall
time and each single-shape compile's, their ratio, and per bucket the simulated time of the
range's plan at its representative size next to the single-shape plan's at that size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _child(spec: dict) -> None:
    """One compile (in this fresh process); prints its figures as JSON on the last line."""
    from lumc.compiler.core.buckets import parse_range
    from lumc.compiler.core.pipeline import compile_model
    shapes = {k: (parse_range(v) if isinstance(v, str) else v) for k, v in spec["shapes"].items()}
    t0 = time.perf_counter()
    m = compile_model(spec["path"], budget=spec["budget"], device="sim:h200", reuse_plan=False,
                      shapes=shapes)
    wall = time.perf_counter() - t0
    print(json.dumps({"wall": wall, "report": m.report_dict()}))


def _run(path: str, shapes: dict, budget: float) -> dict:
    env = dict(os.environ, LUMC_CACHE_DIR=tempfile.mkdtemp(prefix="lumc-bench-"))
    spec = json.dumps({"path": path, "shapes": shapes, "budget": budget})
    out = subprocess.run([sys.executable, __file__, "--child", spec], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm-l3")
    ap.add_argument("--dim", default="sequence_length")
    ap.add_argument("--range", default="1..256")
    ap.add_argument("--fixed", default="batch_size=1")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return _child(json.loads(a.child))
    from lumc.compiler.frontends.models import fetch_model
    path = str(fetch_model(a.model))
    fixed = {k: int(v) for k, v in (kv.split("=") for kv in a.fixed.split(",") if kv)}
    rng = _run(path, {**fixed, a.dim: a.range}, a.budget)
    t_range = rng["wall"]
    rows = []
    for v in rng["report"]["variants"]:
        rep = v["representative"][a.dim]
        one = _run(path, {**fixed, a.dim: rep}, a.budget)
        rows.append((v["describe"], rep, v["best_time_s"], one["report"]["best_time_s"],
                     one["wall"], v["kernels"], one["report"]["kernels"]))
    print(f"{a.model} {a.dim}={a.range}: one range compile {t_range:.1f} s wall "
          f"({len(rows)} buckets, budget {a.budget:g} s; each compile a fresh process and cache)")
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
