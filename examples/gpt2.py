"""GPT-2 (small config, random weights) from ``transformers``, compiled with lumc and checked
against PyTorch eager.

    python examples/gpt2.py                 # 12 layers, 768 wide, vocab 50257 (124M parameters)
    python examples/gpt2.py --layers 2      # a quicker run

The sequence length is a named dynamic dim: two lengths are run, each lowered and compiled once
(e-graph candidates, roofline-pruned kernel search; without a GPU the kernel times are simulated
for an H200 and the model runs on the CPU executor). Prints the max error relative to the largest
logit and the compile report.
"""
import argparse
import time

import torch
from torch.export import Dim
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

import lumc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--lengths", default="16,41", help="sequence lengths to run, comma-separated")
    ap.add_argument("--budget", default="90s", help="compile budget (one compile for all lengths)")
    args = ap.parse_args()
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, use_cache=False)     # GPT-2 small otherwise
    t0 = time.perf_counter()
    model = GPT2LMHeadModel(config).eval()
    print(f"GPT-2 small config, {args.layers} layers, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, random weights "
          f"({time.perf_counter() - t0:.1f} s)")

    lengths = [int(t) for t in args.lengths.split(",")]
    # the range compiled (its numerics checks run its ends on the reference executor: keep it short)
    seq = Dim("seq", min=2, max=max(128, *lengths))
    ids = torch.randint(0, config.vocab_size, (1, lengths[0]))
    t0 = time.perf_counter()
    # one compile for every length of the Dim's range; the attention mask is passed because without
    # one transformers looks for packed sequences over L + 1 positions, a size that does not re-size
    compiled = lumc.compile(model, budget=args.budget, example_inputs=(ids,),
                            example_kwargs={"attention_mask": torch.ones_like(ids)},
                            dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    print(f"compiled in {time.perf_counter() - t0:.1f} s")

    worst = 0.0
    with torch.no_grad():
        for t in lengths:
            ids = torch.randint(0, config.vocab_size, (1, t))
            t0 = time.perf_counter()
            logits = compiled(ids, attention_mask=torch.ones_like(ids)).logits   # its output class
            t_lumc = time.perf_counter() - t0
            ref = model(ids).logits
            err = ((logits - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, err)
            print(f"seq {t:4d}: logits {tuple(logits.shape)}, max error {err:.2e} "
                  f"(relative to max |logit| {ref.abs().max().item():.3g}); lumc run {t_lumc:.2f} s")
    print(f"max error over all lengths: {worst:.2e} ({'ok' if worst <= 1e-4 else 'ABOVE 1e-4'})")
    print(compiled.report())


if __name__ == "__main__":
    main()
