"""Every single-head ablation of one sentence on all-MiniLM-L6-v2 in one batched pass, against one
forward and against the peers: the same 73 rows as a plain batch, and 72 separate ablated runs.

    .venv/bin/python benchmarks/ablate.py                   # 13 tokens, 1 and 2 threads
    .venv/bin/python benchmarks/ablate.py --threads 1 --repeats 5

Rows (median seconds over repeats, each repeat timing every step in turn so a busy machine's load
falls on all alike; ratio = the step's time / one forward's time):
- forward: the model on the sentence, batch of one, no intervention;
- sweep: `attnlab.interventions.sweep`, all 72 heads ablated one per row plus the unablated row,
  the batch growing at each layer (an ablation at layer l starts there);
- plain batch: the same 73 rows as one batch from the embeddings on (what the growing batch saves);
- 72 runs: one `intervene(Ablate(l, h))` forward per head (the loop it replaces).
Work: one forward is 6 layer passes of one row; the sweep 258 (1 + 12·(l + 1) rows at layer l),
the plain batch 438, the loop 432.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from attnlab.bench.timing import interleaved_medians

SENTENCE = "The cat sat on the mat because it was tired."  # 13 tokens with [CLS] and [SEP]


@dataclass(frozen=True)
class Config:
    threads: int
    repeats: int


def steps(loaded):
    from attnlab.interventions import Ablate, intervene, sweep

    model, tok = loaded.model, loaded.tokenizer
    enc = tok(SENTENCE, return_tensors="pt")
    batch = {k: v.expand(73, -1) for k, v in enc.items()}
    heads = [(layer, h) for layer in range(6) for h in range(12)]

    def loop():
        for layer, h in heads:
            with intervene(model, Ablate(layer, h)):
                model(**enc)

    return enc["input_ids"].shape[1], {
        "forward": lambda: model(**enc),
        "sweep": lambda: sweep(model, lambda: model(**enc)),
        "plain batch": lambda: model(**batch),
        "72 runs": loop,
    }



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if args.repeats < 1 or any(t < 1 for t in args.threads):
        p.error("--repeats and --threads: expected positive numbers")
    from attnlab.adapters.quiet import quiet_transformers
    from attnlab.explain.model import load_model

    quiet_transformers()
    loaded = load_model(None)
    before = torch.get_num_threads()
    print(f"all-MiniLM-L6-v2 (6 layers x 12 heads), CPU fp32, {SENTENCE!r}")
    print("| threads | tokens | step | median ms | × forward |")
    print("|---|---|---|---|---|")
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            with torch.no_grad():
                L, fns = steps(loaded)
                t = interleaved_medians(fns, args.repeats)
            for name, sec in t.items():
                print(f"| {threads} | {L} | {name} | {sec * 1e3:.1f} | "
                      f"{sec / t['forward']:.1f} |")
    finally:
        torch.set_num_threads(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
