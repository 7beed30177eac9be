"""The GPU benchmark of ``make gpu-check``: one row per kernel form against torch, as % of measured
ceilings, plus the JSON of everything measured.

Ceilings are measured, not quoted: the copy bandwidth of a 4 GiB device-to-device ``copy_`` (bytes
read + written per second) and the bf16 rate of ``torch.matmul`` at 8192^3. Each form's lumc kernel
is timed at a few configs from its space (the default first) and the best counts; torch eager and
``torch.compile(mode="max-autotune-no-cudagraphs")`` run the same computation. Times are medians of
``triton.testing.do_bench`` (CUDA events, L2 flushed between runs). Every lumc output is checked
against torch eager before its time counts.

Targets (issue 4): memory-bound forms reach 85% of the copy bandwidth; the bf16 matmul 90% of
``torch.matmul``; attention beats ``scaled_dot_product_attention``'s default. A miss is a row marked
``MISS``, never hidden.

Usage: ``python -m lumc.backends.triton.gpu_check [--json OUT] [--markdown OUT] [--budget S]``.
Without a CUDA device it renders every case (the CPU part), then stops with exit status 2.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from lumc.ir import dtypes as dt
from lumc.backends.triton import configs
from lumc.backends.triton.benchcases import BenchCase, bench_cases

MEM_TARGET = 0.85
MATMUL_TARGET = 0.90
NO_GPU_EXIT = 2
COMPILE_RESERVE_S = 60.0   # budget a torch.compile(max-autotune) must find left before it starts


def candidate_configs(tk, limit: int) -> list:
    """The default config, then up to ``limit - 1`` others from the space, spread over tile sizes."""
    space = tk.config_space()
    first = tk.default_config()
    rest = [c for c in space if c != first]
    if len(rest) > limit - 1 > 0:
        step = len(rest) / (limit - 1)
        rest = [rest[int(i * step)] for i in range(limit - 1)]
    if tk.rendered.config_space == "matmul":
        known = [configs.make(8, 3, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8),
                 configs.make(8, 4, BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, GROUP_M=8),
                 configs.make(4, 4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8)]
        rest = [c for c in known if c in space] + rest
    return [first] + rest[:max(0, limit - 1)]


def make_inputs(case: BenchCase, device: str = "cuda"):
    import torch
    args = []
    for i, n in enumerate(case.kernel.inputs):
        if n.dtype.is_int:
            args.append(torch.randint(0, case.index_ranges.get(i, 2), n.shape, device=device))
        else:
            from lumc.backends.triton.launch import torch_dtype
            args.append(torch.randn(n.shape, device=device, dtype=torch_dtype(n.dtype)))
    return args


def measure_ceilings(do_bench) -> dict:
    import torch
    n = 1 << 31                                       # 2 Gi bf16 elements = 4 GiB
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t_copy = do_bench(lambda: dst.copy_(src)) * 1e-3
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_mm = do_bench(lambda: a @ b) * 1e-3
    return {"copy_GBps": 2 * n * 2 / t_copy / 1e9, "bf16_matmul_TFLOPs": 2 * 8192 ** 3 / t_mm / 1e12,
            "copy_bytes": 2 * n * 2, "matmul_shape": [8192, 8192, 8192]}


def bench_case(case: BenchCase, ceil: dict, do_bench, deadline: float, n_configs: int,
               use_compile: bool) -> dict:
    import torch
    from lumc.backends.triton import TritonKernel
    row = {"case": case.name, "form": case.kernel.form, "bytes": case.bytes, "flops": case.flops,
           "bound": case.bound, "baseline": case.baseline}
    args = make_inputs(case)
    want = case.torch_fn(*args)
    tk = TritonKernel(case.kernel)
    row["variant"] = tk.rendered.variant
    best = None
    tried = []
    from lumc.backends.triton.launch import torch_dtype
    out = [torch.empty(p.shape, dtype=torch_dtype(p.dtype), device="cuda")
           for p in tk.rendered.outputs]
    for cfg in candidate_configs(tk, n_configs):
        if time.monotonic() > deadline and best is not None:
            break
        try:
            run = tk.bound_launch(args, out, cfg)
            torch.cuda.synchronize()
            scale = max(1.0, want.float().abs().max().item())
            ok = torch.allclose(out[0].float(), want.float().reshape(out[0].shape), rtol=5e-2,
                                atol=5e-2 * scale)
            if not ok:
                tried.append({"config": str(cfg), "error": "output differs from torch eager"})
                continue
            t = do_bench(run) * 1e-3
            tried.append({"config": str(cfg), "seconds": t})
            if best is None or t < best[1]:
                best = (cfg, t)
        except Exception as e:  # noqa: BLE001 - a failing config is reported, the others still run
            tried.append({"config": str(cfg), "error": f"{type(e).__name__}: {e}"[:300]})
    row["configs"] = tried
    row["torch_eager_s"] = do_bench(lambda: case.torch_fn(*args)) * 1e-3
    row["torch_compile_s"] = None
    # max-autotune compiles many templates (a minute or more for a GEMM): only with time left
    if use_compile and time.monotonic() < deadline - COMPILE_RESERVE_S:
        try:
            fn = torch.compile(case.torch_fn, mode="max-autotune-no-cudagraphs")
            fn(*args)
            row["torch_compile_s"] = do_bench(lambda: fn(*args)) * 1e-3
        except Exception as e:  # noqa: BLE001
            row["torch_compile_error"] = f"{type(e).__name__}: {e}"[:300]
    elif use_compile:
        row["torch_compile_error"] = "skipped: time budget spent"
    if best is None:
        row.update(lumc_s=None, config=None, achieved=None, pct_ceiling=None, target="MISS",
                   note="no config ran correctly")
        return row
    cfg, t = best
    row["lumc_s"] = t
    row["config"] = str(cfg)
    if case.bound == "memory":
        gbps = case.bytes / t / 1e9
        row["achieved"] = f"{gbps:.0f} GB/s"
        row["pct_ceiling"] = 100 * gbps / ceil["copy_GBps"]
        row["target"] = "ok" if gbps >= MEM_TARGET * ceil["copy_GBps"] else "MISS"
        row["target_rule"] = f">= {MEM_TARGET:.0%} of copy bandwidth"
    else:
        tf = case.flops / t / 1e12
        row["achieved"] = f"{tf:.0f} TFLOP/s"
        row["pct_ceiling"] = 100 * tf / ceil["bf16_matmul_TFLOPs"]
        if case.baseline == "sdpa":
            row["target"] = "ok" if t < row["torch_eager_s"] else "MISS"
            row["target_rule"] = "faster than scaled_dot_product_attention"
        elif case.name == "matmul":
            row["target"] = "ok" if row["torch_eager_s"] / t >= MATMUL_TARGET else "MISS"
            row["target_rule"] = f">= {MATMUL_TARGET:.0%} of torch.matmul"
        else:
            row["target"] = "report"
            row["target_rule"] = "no target (reported against the matmul ceiling)"
    return row


def format_table(rows: list[dict], ceil: dict, device: str) -> str:
    head = (f"device: {device}; copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul "
            f"{ceil['bf16_matmul_TFLOPs']:.0f} TFLOP/s (measured)\n")
    lines = ["| form | lumc | torch eager | torch.compile max-autotune | achieved | % of ceiling "
             "| target |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        def ms(x):
            return "-" if x is None else f"{x * 1e3:.3f} ms"
        pct = "-" if r.get("pct_ceiling") is None else f"{r['pct_ceiling']:.0f}%"
        lines.append(f"| {r['case']} ({r.get('variant', '')}) | {ms(r.get('lumc_s'))} | "
                     f"{ms(r.get('torch_eager_s'))} | {ms(r.get('torch_compile_s'))} | "
                     f"{r.get('achieved') or '-'} | {pct} | {r['target']}"
                     f" ({r.get('target_rule') or r.get('error') or r.get('note', '')}) |")
    return head + "\n".join(lines)


def dry_run() -> int:
    """The CPU part: render every case and list its config space size."""
    from lumc.backends.triton import render
    for case in bench_cases(dt.bf16):
        rk = render(case.kernel)
        n = len(configs.config_space(rk.config_space, rk.problem))
        print(f"  {case.name:10s} {rk.variant:9s} {rk.name}  {n} configs  "
              f"{case.bytes / 2**20:.0f} MiB  {case.flops / 1e12:.2f} TFLOP")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="gpu-check.json", help="where the full results go")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for the benchmark part")
    ap.add_argument("--configs", type=int, default=4, help="lumc configs tried per form")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    a = ap.parse_args(argv)
    print("gpu-check: rendering every benchmark case (CPU)")
    dry_run()
    import torch
    if not torch.cuda.is_available():
        print("gpu-check: STOP: no CUDA device here (torch.cuda.is_available() is False). Nothing "
              "was measured. Run `make gpu-check` on an H100/H200.", file=sys.stderr)
        return NO_GPU_EXIT
    from triton.testing import do_bench as _do_bench

    def do_bench(fn):
        return _do_bench(fn, warmup=25, rep=100, return_mode="median")

    from lumc.backends.triton.launch import interpreter_mode
    if interpreter_mode():
        print("gpu-check: STOP: TRITON_INTERPRET is set while a CUDA device is present; run with "
              "TRITON_INTERPRET=0 (gpu_check.sh exports it)", file=sys.stderr)
        return 3
    t0 = time.monotonic()
    deadline = t0 + a.budget
    device = torch.cuda.get_device_name(0)
    ceil = measure_ceilings(do_bench)
    import triton
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": device,
              "versions": {"torch": torch.__version__, "triton": triton.__version__,
                           "python": platform.python_version(), "cuda": torch.version.cuda},
              "ceilings": ceil, "rows": [], "seconds": 0.0, "complete": False}
    for case in bench_cases(dt.bf16):
        print(f"gpu-check: {case.name} ...", flush=True)
        try:
            result["rows"].append(bench_case(case, ceil, do_bench, deadline, a.configs,
                                             not a.no_compile))
        except Exception as e:  # noqa: BLE001 - one broken case (e.g. out of memory) is a row
            result["rows"].append({"case": case.name, "form": case.kernel.form, "target": "MISS",
                                   "torch_eager_s": None,
                                   "error": f"{type(e).__name__}: {e}"[:300]})
        torch.cuda.empty_cache()
        result["seconds"] = time.monotonic() - t0
        _write(a, result, ceil, device)      # after every case: a timeout keeps what was measured
    result["complete"] = True
    table = _write(a, result, ceil, device)
    print(table)
    print(f"gpu-check: wrote {a.json}" + (f" and {a.markdown}" if a.markdown else ""))
    return 0


def _write(a, result: dict, ceil: dict, device: str) -> str:
    """Write the JSON (and the markdown table) of what is measured so far; return the table."""
    table = format_table(result["rows"], ceil, device)
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1, default=str)
    if a.markdown:
        v = result["versions"]
        with open(a.markdown, "w") as f:
            f.write(f"# GPU results\n\n{result['date']}, {device}, torch {v['torch']}, "
                    f"triton {v['triton']}, python {v['python']}, CUDA {v['cuda']}"
                    f"{'' if result['complete'] else ' (incomplete: the run stopped early)'}"
                    f"\n\n{table}\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
