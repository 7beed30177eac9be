"""E-graph benchmark: the ablation (e-graph vs greedy fusion) and the scale figures. Not a test.

    python tests/bench/bench_egraph.py                 # both tables, H100 SXM ceilings
    python tests/bench/bench_egraph.py --ablation      # the four MODELS.md models
    python tests/bench/bench_egraph.py --scale         # MiniLM-L3, BERT-base, GPT-2 small
    python tests/bench/bench_egraph.py --one gpt2      # one model, JSON
    python tests/bench/bench_egraph.py --layers        # BERT-base at 2 and 24 layers: repeated
                                                       # layers saturated once (issue 12's bar)

Estimated time is the sum of the roofline bounds of a program's kernels (launch overhead
included) on the named device: the figure ``lumc compile --no-egraph`` is compared by. Each model
runs in its own process, so its peak RSS is its own (the process also holds the model's weights
and, for the transformers models, torch). BERT-base (12 layers, hidden 768, sequence 128) and
GPT-2 small (12 layers, sequence 128) are built from ``transformers`` configs with random weights
and captured with ``torch.export`` through lumc's PyTorch frontend; the MODELS.md models are
imported from ONNX (fetched on first use).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ABLATION = ["silero-vad", "magika", "ppocr-det", "minilm-l3"]
SCALE = ["minilm-l3@128", "bert-base", "gpt2"]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_graph(name: str):
    """The primitive graph of a benchmark model."""
    base, _, layers = name.partition(":")     # bert-base:24, a BERT-base of 24 layers
    if base in ("bert-base", "gpt2"):
        import torch
        import transformers
        from transformers.utils import logging as tlog
        from lumc.compiler.frontends.torch_frontend.capture import import_torch
        tlog.set_verbosity_error()
        torch.manual_seed(0)
        if base == "bert-base":
            cfg = transformers.BertConfig(**({"num_hidden_layers": int(layers)} if layers else {}))
            model = transformers.BertModel(cfg).eval()
            args = (torch.randint(0, 30000, (1, 128)), torch.ones(1, 128, dtype=torch.int64))
        else:
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False)).eval()
            args = (torch.randint(0, 50000, (1, 128)),)
        return import_torch(model, args).graph
    from lumc.compiler.frontends.models import fetch_model, model_info
    from lumc.compiler.frontends.onnx_frontend import import_onnx
    base, _, seq = name.partition("@")
    info = model_info(base)
    shapes = dict(info.test_shapes[0])
    if seq:
        shapes = {k: (v[0], int(seq)) for k, v in shapes.items()}
    return import_onnx(str(fetch_model(base)), shapes).graph


def run_one(name: str, device: str) -> dict:
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    from lumc.compiler.core.fusion import greedy_program
    from lumc.compiler.runtime.program import program_time_bound
    t0 = time.perf_counter()
    g = load_graph(name)
    t_import = time.perf_counter() - t0
    rss_before = _rss_mb()
    t0 = time.perf_counter()
    greedy = greedy_program(g)
    t_greedy = time.perf_counter() - t0
    g_bound = program_time_bound(greedy, device)
    t0 = time.perf_counter()
    res = egraph_candidates(g, device, k=8)
    t_eg = time.perf_counter() - t0
    best = res.best
    tot = res.total
    return {
        "model": name, "nodes": len(g), "import_s": round(t_import, 2),
        "greedy_kernels": len(greedy), "greedy_us": round(g_bound * 1e6, 1),
        "greedy_s": round(t_greedy, 2),
        "egraph_kernels": len(best), "egraph_us": round(res.bounds[0] * 1e6, 1),
        "ratio": round(g_bound / res.bounds[0], 3), "best_label": best.label,
        "forms": best.form_counts(), "candidates": len(res.candidates),
        "enodes": tot.enodes, "eclasses": tot.eclasses, "iterations": tot.iterations,
        "regions": len(res.regions), "stop": tot.stop,
        "saturate_s": round(res.seconds["saturate"], 2), "extract_s": round(res.seconds["extract"], 2),
        "decode_s": round(res.seconds.get("decode", 0.0), 2),
        "egraph_s": round(t_eg, 2), "rss_before_mb": round(rss_before), "peak_rss_mb": round(_rss_mb()),
    }


def _child(name: str, device: str) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, __file__, "--one", name, "--device", device],
                       capture_output=True, text=True, env=env)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"model": name, "error": (p.stderr.strip().splitlines() or ["no output"])[-1]}


def _print_ablation(rows: list[dict], device: str) -> None:
    print(f"\nAblation: estimated time (sum of roofline bounds, {device}), greedy fusion vs e-graph")
    print(f"{'model':16s} {'greedy k':>8s} {'greedy us':>10s} {'egraph k':>8s} {'egraph us':>10s} "
          f"{'ratio':>6s}  best forms")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:16s} ERROR {r['error']}")
            continue
        forms = ", ".join(f"{k} {v}" for k, v in sorted(r["forms"].items()))
        print(f"{r['model']:16s} {r['greedy_kernels']:8d} {r['greedy_us']:10.1f} "
              f"{r['egraph_kernels']:8d} {r['egraph_us']:10.1f} {r['ratio']:6.2f}x  {forms}")


def _print_scale(rows: list[dict]) -> None:
    print("\nScale: saturation + extraction at the default limits")
    print(f"{'model':16s} {'nodes':>6s} {'regions':>7s} {'e-nodes':>8s} {'e-classes':>9s} "
          f"{'iters':>5s} {'sat s':>6s} {'extr s':>6s} {'total s':>7s} {'kernels':>7s} "
          f"{'RSS MB':>7s} {'peak MB':>7s} {'greedy us':>9s} {'egraph us':>9s} {'ratio':>6s}  stop")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:16s} ERROR {r['error']}")
            continue
        print(f"{r['model']:16s} {r['nodes']:6d} {r['regions']:7d} {r['enodes']:8d} "
              f"{r['eclasses']:9d} {r['iterations']:5d} {r['saturate_s']:6.2f} "
              f"{r['extract_s']:6.2f} {r['egraph_s']:7.2f} {r['egraph_kernels']:7d} "
              f"{r['rss_before_mb']:7d} {r['peak_rss_mb']:7d} {r['greedy_us']:9.1f} "
              f"{r['egraph_us']:9.1f} {r['ratio']:5.2f}x  {r['stop']}")


def _print_layers(rows: list[dict]) -> None:
    print("\nRepeated layers: saturation + extraction of BERT-base (seq 128) at 2 and 24 layers")
    print(f"{'model':14s} {'nodes':>6s} {'regions':>7s} {'sat s':>6s} {'extr s':>6s} "
          f"{'sat+extr s':>10s} {'decode s':>8s} {'kernels':>7s}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:14s} ERROR {r['error']}")
            continue
        print(f"{r['model']:14s} {r['nodes']:6d} {r['regions']:7d} {r['saturate_s']:6.2f} "
              f"{r['extract_s']:6.2f} {r['saturate_s'] + r['extract_s']:10.2f} "
              f"{r['decode_s']:8.2f} {r['egraph_kernels']:7d}")
    ok = [r for r in rows if "error" not in r]
    if len(ok) == 2:
        a, b = (r["saturate_s"] + r["extract_s"] for r in ok)
        print(f"24 layers / 2 layers: {b / a:.2f}x (issue 12: at most 1.5x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--one", help="run one model in this process and print JSON")
    ap.add_argument("--device", default="h100-sxm")
    ap.add_argument("--json", help="write all rows to this file")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.device)))
        return 0
    if args.layers:
        rows = {"layers": [_child(m, args.device) for m in ("bert-base:2", "bert-base:24")]}
        _print_layers(rows["layers"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    both = not (args.ablation or args.scale)
    rows = {}
    if args.ablation or both:
        rows["ablation"] = [_child(m, args.device) for m in ABLATION]
        _print_ablation(rows["ablation"], args.device)
    if args.scale or both:
        rows["scale"] = [_child(m, args.device) for m in SCALE]
        _print_scale(rows["scale"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
