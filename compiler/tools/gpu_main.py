"""The main job on a real GPU, for ``make gpu-check``: compile, run through CUDA graphs, check, race.

For each model (the four README models at their test shapes; GPT-2 small and BERT-base at
sequence 128 in fp32 and bf16, and, budget permitting, a 4-layer Llama at TinyLlama's sizes in bf16,
``lumc.compiler.tools.transformer_models``):

1. ``lumc.compile(..., device="cuda")``: the search times real kernels on the GPU (Triton configs and
   the vendor alternatives, ``IMPL``); the e-graph stage runs where egglog is installed; the GPU
   image has none, so ``make gpu-candidates`` runs it on a CPU machine first and the compile
   searches the candidates it carried (``lumc.compiler.core.carried``), else the greedy program
   (the report says which);
2. the chosen plan runs through its CUDA graph (``lumc.compiler.runtime.gpu_plan``) and its outputs are
   checked against the reference executor in float64 on the CPU, by the dtype tolerance table;
3. ``lumc bench``'s figures: the end-to-end CUDA-graph time, then torch eager and
   ``torch.compile(mode="max-autotune")`` of the same computation (``lumc.compiler.tools.rivals``), while
   the deadline leaves time for a max-autotune compile (:data:`INDUCTOR_RESERVE_S`);
4. one table row: lumc time, eager, max-autotune, % of the measured copy and matmul ceilings (the
   ideal bytes over the copy bandwidth, the FLOPs over the bf16 matmul rate), the implementations
   chosen (``triton``/``cublas``/...).

The table is printed and written to ``docs/gpu-results.md`` with the date, the device and the
versions; everything measured goes to a JSON file. Rows are written as they finish, so a timeout
keeps what was measured. Without a GPU it prints the plan (:data:`PLAN`) and exits 2.

Usage: ``python -m lumc.compiler.tools.gpu_main [--budget S] [--json OUT] [--markdown OUT]``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

NO_GPU_EXIT = 2
COMPILE_BUDGET_S = 25          # lumc's search budget per model on the GPU
# the e-graph run that writes a model's carried candidates, on the CPU machine before a GPU session
# (no device time spent): TinyLlama-4 bf16 needed 35 s of a 25 s budget on a busy 2-core machine,
# so it carried no candidates and its GPU compile would have searched the greedy program only
CANDIDATES_BUDGET_S = 60
INDUCTOR_RESERVE_S = 90        # a max-autotune compile starts only with this much time left
MODELS = ("minilm-l3", "magika", "silero-vad", "ppocr-det")
TRANSFORMERS = (("gpt2", "fp32"), ("bert", "fp32"), ("gpt2", "bf16"), ("bert", "bf16"),
                ("llama", "bf16"))   # last: RoPE in attention, paired gate/up (skipped if out of time)
ARCH_NAMES = {"gpt2": "GPT-2 small", "bert": "BERT-base",
              "llama": "Llama (TinyLlama sizes, 4 layers)"}

# (step, expected seconds on an H200 with a warm pip cache) — the closing note of gpu_check.sh
PLAN = (
    ("install carried wheels into build/gpu-site (pip --no-index)", 15),
    ("gpu tests (pytest -m gpu: bf16 kernels, split-K, cuDNN convolutions, a precompiled first "
     "launch, timing under 10 us, plans through CUDA graphs)", 110),
    ("measure ceilings: 1 GiB copy, 8192^3 bf16 matmul (cached in the tuning DB)", 5),
    ("the 4 models of README's Models table: compile --device cuda (25 s search each over the "
     "e-graph candidates carried in build/gpu-candidates, else the greedy program: the GPU "
     "image has no egglog), CUDA-graph run + float64 check, bench vs eager", 4 * 40),
    ("GPT-2 small and BERT-base, seq 128, fp32 and bf16: the same; then a 4-layer Llama at "
     "TinyLlama's sizes in bf16 (RoPE in attention, paired gate/up) only while the budget lasts",
     4 * 45),
    ("torch.compile max-autotune rivals, while the deadline leaves 90 s (skipped rows say so)", 120),
    ("write the table, docs/gpu-results.md and build/gpu-check/gpu-main.json", 1),
)


def plan_text() -> str:
    lines = [f"  {i + 1}. {what} (~{s} s)" for i, (what, s) in enumerate(PLAN)]
    return "\n".join(lines) + f"\n  total ~{sum(s for _, s in PLAN)} s (the script's limit: 600 s)"


def _model_path(name: str) -> str | None:
    """A README model from the carried ``build/gpu-models`` or the user cache (no download on
    the GPU machine)."""
    from lumc.compiler.frontends.models import model_info, cache_dir
    info = model_info(name)
    for d in ("build/gpu-models", str(cache_dir())):
        p = os.path.join(d, info.filename)
        if os.path.exists(p):
            return p
    return None


def _check(cm, inputs: dict) -> float:
    """Max relative error of the plan's GPU outputs against the float64 reference (CPU)."""
    import numpy as np
    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.core.errors import max_rel_error
    got = cm.run(inputs)                      # the GPU plan: buffers, CUDA graph replay
    ref = ReferenceExecutor(cm.graph, "float64")(inputs)
    worst = 0.0
    for k, n in cm.graph.outputs.items():
        if n.dtype.is_float:
            worst = max(worst, max_rel_error(got[k], ref[k]))
        elif not np.array_equal(got[k], ref[k].astype(got[k].dtype)):
            worst = float("inf")
    return worst


def _compile(job: dict, device: str, budget_s: float = COMPILE_BUDGET_S):
    import lumc
    if job["kind"] == "onnx":
        return lumc.compile(job["path"], budget=f"{budget_s}s", device=device,
                            shapes=job["shapes"])
    import torch
    from lumc.compiler.tools.transformer_models import transformer
    dtype = torch.bfloat16 if job["dtype"] == "bf16" else torch.float32
    mod, ex = transformer(job["arch"], dtype=dtype)
    f = lumc.compile(mod, budget=f"{budget_s}s", device=device, example_inputs=ex)
    with torch.no_grad():
        f(*ex)
    return f.specializations[0].compiled


def jobs() -> list[dict]:
    from lumc.compiler.frontends.models import model_info
    out = []
    for name in MODELS:
        out.append({"name": name, "kind": "onnx", "path": _model_path(name),
                    "shapes": dict(model_info(name).test_shapes[0])})
    for arch, d in TRANSFORMERS:
        out.append({"name": f"{ARCH_NAMES[arch]} seq128 {d}",
                    "kind": "torch", "arch": arch, "dtype": d})
    return out


def run_job(job: dict, device: str, ceil: dict, deadline: float) -> dict:
    from lumc.backends.extern import impl_of
    from lumc.compiler.tools.bench import bench_compiled, bench_inputs
    from lumc.compiler.tools.rivals import run_rivals
    from lumc.ir import dtypes as dt
    row = {"model": job["name"]}
    if job["kind"] == "onnx" and job["path"] is None:
        row["error"] = "model not carried (build/gpu-models) nor in the cache"
        return row
    t0 = time.monotonic()
    cm = _compile(job, device)
    row["compile_s"] = time.monotonic() - t0
    rep = cm.report_dict()
    row["egraph"] = bool(rep.get("egraph_used"))
    row["egraph_note"] = (rep.get("egraph") or {}).get("carried") or \
        (rep.get("egraph") or {}).get("error")
    impls: dict[str, int] = {}
    for c in cm.configs:
        impls[impl_of(c)] = impls.get(impl_of(c), 0) + 1
    row["impls"] = impls
    inputs = bench_inputs(cm)
    row["max_rel_error"] = _check(cm, inputs)
    tol = max(dt.rtol_for(n.dtype) for n in cm.graph.outputs.values() if n.dtype.is_float) \
        if any(n.dtype.is_float for n in cm.graph.outputs.values()) else 0.0
    row["check"] = "ok" if row["max_rel_error"] <= tol else f"FAIL (> {tol:g})"
    doc = bench_compiled(cm, repeats=20, inputs=inputs, wall=False)
    t = doc["end_to_end"]["time_s"]
    row["lumc_s"] = t
    row["pct_copy"] = 100 * (rep.get("ideal_bytes") or 0) / t / ceil["bandwidth"]
    row["pct_matmul"] = 100 * doc["end_to_end"]["flops"] / t / ceil["bf16"]
    names = ["eager"] + (["inductor"] if time.monotonic() < deadline - INDUCTOR_RESERVE_S else [])
    for name, r in zip(names, run_rivals(cm, names, inputs, t, device, device, repeats=20)[1:]):
        row[f"{name}_s"] = r.time_s            # rows come back in ``names`` order, after lumc's
        row[f"{name}_note"] = r.note
    if "inductor" not in names:
        row["inductor_note"] = "skipped: the deadline left no time for a max-autotune compile"
    return row


def format_table(rows: list[dict], device: str, ceil: dict) -> str:
    def us(x):
        return "-" if x is None else f"{x * 1e6:.1f} us"
    head = (f"device: {device}; copy {ceil['bandwidth'] / 1e9:.0f} GB/s, bf16 matmul "
            f"{ceil['bf16'] / 1e12:.0f} TFLOP/s (measured)\n\n")
    lines = ["| model | lumc (CUDA graph) | torch eager | torch.compile max-autotune | % copy ceiling "
             "| % matmul ceiling | check | implementations |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | {r['error']} | - |")
            continue
        impl = ", ".join(f"{k} {v}" for k, v in sorted(r["impls"].items()))
        lines.append(f"| {r['model']} | {us(r['lumc_s'])} | {us(r.get('eager_s'))} | "
                     f"{us(r.get('inductor_s'))} | {r['pct_copy']:.0f}% | {r['pct_matmul']:.1f}% | "
                     f"{r['check']} ({r['max_rel_error']:.1e}) | {impl} |")
    return head + "\n".join(lines)


def _write(a, result: dict) -> str:
    table = format_table(result["rows"], result["device"], result["ceilings"])
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1, default=str)
    v = result["versions"]
    with open(a.markdown, "w") as f:
        f.write(f"# GPU results (`make gpu-check`)\n\n{result['date']}, {result['device']}; "
                f"torch {v['torch']}, triton {v['triton']}, python {v['python']}, CUDA {v['cuda']}, "
                f"lumc {v['lumc']}{'' if result['complete'] else ' (incomplete: stopped early)'}\n\n"
                f"Measured on the GPU (not simulated). lumc: the end-to-end CUDA-graph replay of "
                f"the plan its search chose on this GPU; rivals: the same computation in torch.\n\n"
                f"{table}\n")
    return table


def write_candidates(out_dir: str) -> int:
    """Each job's compile for ``sim:h200`` with an empty cache (so its e-graph stage runs) and
    ``LUMC_CARRY_CANDIDATES_TO`` set: the candidates land in ``out_dir`` (one file per model,
    named by its weights), for ``gpu_check.sh`` to carry to the GPU. Exit 1 when a model wrote
    none."""
    import tempfile
    from unittest import mock
    from lumc.compiler.core import carried
    ok = True
    for job in jobs():
        if job["kind"] == "onnx" and job["path"] is None:
            print(f"gpu-candidates: {job['name']}: model not found (make gpu-models)")
            ok = False
            continue
        with tempfile.TemporaryDirectory() as cache, mock.patch.dict(
                os.environ, {"LUMC_CACHE_DIR": cache, carried.WRITE_ENV: out_dir}):
            try:
                cm = _compile(job, "sim:h200", CANDIDATES_BUDGET_S)
                said = (cm.report_dict().get("egraph") or {}).get("carried")
            except Exception as e:  # noqa: BLE001 - one broken model is a line, the others run
                said = f"failed: {type(e).__name__}: {e}"[:300]
        print(f"gpu-candidates: {job['name']}: {said}", flush=True)
        ok = ok and bool(said) and said.startswith("written")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_main", description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all models")
    ap.add_argument("--json", default="build/gpu-check/gpu-main.json")
    ap.add_argument("--markdown", default="docs/gpu-results.md")
    ap.add_argument("--candidates-out", metavar="DIR",
                    help="on a machine with egglog (no GPU needed): run each model's e-graph stage "
                         "and write its candidates to DIR for the GPU image, which has no egglog "
                         "(make gpu-candidates; lumc.compiler.core.carried), then stop")
    a = ap.parse_args(argv)
    if a.candidates_out:
        return write_candidates(a.candidates_out)
    print("gpu-main: the plan, step by step:\n" + plan_text())
    missing = [j["name"] for j in jobs() if j["kind"] == "onnx" and j["path"] is None]
    if missing:
        print(f"gpu-main: models not carried (copy them to build/gpu-models): {', '.join(missing)}")
    import torch
    if not torch.cuda.is_available():
        print("gpu-main: STOP: no CUDA device here (torch.cuda.is_available() is False). Nothing was "
              "compiled or measured on a GPU; run `make gpu-check` on an H100/H200.", file=sys.stderr)
        return NO_GPU_EXIT
    import triton
    from lumc.compiler.runtime.targets import measure_ceilings, versions
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + a.budget
    device = "cuda:0"
    ceil = measure_ceilings(device)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": torch.cuda.get_device_name(0),
              "versions": {"torch": torch.__version__, "triton": triton.__version__,
                           "python": platform.python_version(), "cuda": torch.version.cuda,
                           "lumc": versions(gpu=True)["lumc"]},
              "ceilings": ceil, "rows": [], "complete": False}
    ok = True
    for job in jobs():
        if time.monotonic() > deadline:
            result["rows"].append({"model": job["name"], "error": "skipped: budget spent"})
            ok = False
            continue
        print(f"gpu-main: {job['name']} ...", flush=True)
        try:
            row = run_job(job, device, ceil, deadline)
        except Exception as e:  # noqa: BLE001 - one broken model is a row, the others still run
            row = {"model": job["name"], "error": f"{type(e).__name__}: {e}"[:300]}
        ok = ok and "error" not in row and row.get("check") == "ok"
        result["rows"].append(row)
        torch.cuda.empty_cache()
        _write(a, result)
    result["complete"] = True
    result["seconds"] = time.monotonic() - t0
    print(_write(a, result))
    print(f"gpu-main: wrote {a.json} and {a.markdown} in {result['seconds']:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
