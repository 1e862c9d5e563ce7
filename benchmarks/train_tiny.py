"""Train the `tiny` GPT preset on the bundled corpus and report what it costs on a small CPU.

Prints: validation loss after a fixed number of steps, wall time, training tokens/s, and training
throughput of the same model with attention through attnlab.attention vs torch's
scaled_dot_product_attention called directly (same weights, same batches, measured in this run);
writes a loss-curve PNG and a JSON of the numbers.

    python benchmarks/train_tiny.py                 # the preset's 600 steps, 2 threads
    python benchmarks/train_tiny.py --steps 100 --threads 1 --out /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.models import Trainer, generate
from attnlab.nn import CausalSelfAttention


@dataclass(frozen=True)
class Bench:
    preset: str = "tiny"
    steps: int | None = None  # None: the preset's max_steps
    threads: int = 2
    warmup_steps: int = 3  # throughput: untimed steps first
    timed_steps: int = 40  # throughput: timed steps per kernel (median)
    out: str = "runs/bench"


def torch_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False,
               mask=None):
    """The peer: PyTorch's fused kernel, called directly (training passes no structured mask)."""
    assert mask is None, "the throughput comparison runs without a KV cache"
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, enable_gqa=enable_gqa)


def train(b: Bench) -> tuple[Trainer, float]:
    overrides = {} if b.steps is None else {"max_steps": b.steps}
    t = Trainer.start(b.preset, out=Path(b.out) / f"{b.preset}-checkpoint", progress=True,
                      **overrides)
    t0 = time.perf_counter()
    t.run()
    return t, time.perf_counter() - t0


def throughput(b: Bench) -> dict[str, float]:
    """Training tokens/s (forward, backward, AdamW) for each attention kernel: the two models take
    steps in turn, so a burst of load from other processes hits both; median over steps."""
    times: dict[str, list[float]] = {"attnlab.attention": [], "torch SDPA": []}
    trainers = {}
    for name in times:
        t = Trainer.start(b.preset)  # same seed: same weights and batches for both
        for m in t.model.modules():
            if isinstance(m, CausalSelfAttention):
                m.kernel = torch_sdpa if name == "torch SDPA" else None
        for _ in range(b.warmup_steps):
            t.train_step()
        trainers[name] = t
    order = list(trainers.items())
    for i in range(b.timed_steps):
        for name, t in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            t.train_step()
            times[name].append(time.perf_counter() - t0)
    tokens = {n: t.config.batch_size * t.model.config.block_size for n, t in trainers.items()}
    return {n: tokens[n] / statistics.median(v) for n, v in times.items()}


def plot(t: Trainer, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in t.history]
    loss = [h["loss"] for h in t.history]
    smooth, ema = [], 0.0
    for i, x in enumerate(loss, 1):
        ema = 0.95 * ema + 0.05 * x
        smooth.append(ema / (1 - 0.95**i))  # bias-corrected, as Adam's moments
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, color="tab:blue", alpha=0.25, lw=0.8, label="train (per step)")
    ax.plot(steps, smooth, color="tab:blue", lw=1.8, label="train (EMA 0.95)")
    ax.plot([v["step"] for v in t.val_history], [v["val_loss"] for v in t.val_history], "o-",
            color="tab:orange", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / character)")
    ax.set_title(f"attnlab GPT '{t.model.config.name}': {t.model.num_params():,} parameters, "
                 "bundled Shakespeare")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    d = Bench()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=d.preset)
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--threads", type=int, default=d.threads)
    ap.add_argument("--out", default=d.out)
    ap.add_argument("--timed-steps", type=int, default=d.timed_steps)
    ap.add_argument("--throughput-only", action="store_true", help="skip the training run")
    args = vars(ap.parse_args())
    only = args.pop("throughput_only")
    b = Bench(**{**asdict(d), **args})
    torch.set_num_threads(b.threads)
    out = Path(b.out)
    out.mkdir(parents=True, exist_ok=True)

    if only:
        for name, v in throughput(b).items():
            print(f"{name:<28}{v:>16,.0f} train tokens/s")
        return
    t, wall = train(b)
    val = t.val_history[-1]["val_loss"]
    tps = t.tokens_seen / t.elapsed_s
    tp = throughput(b)
    png = out / f"train_{b.preset}_loss.png"
    plot(t, png)
    tok = t.tokenizer
    sample = tok.decode(generate(t.model, tok.encode("PROSPERO.\n"), 200, temperature=0.8,
                                 top_k=10, seed=0))

    print(f"\npreset {b.preset}: {t.model.num_params():,} parameters, {t.step} steps of "
          f"{t.config.batch_size}x{t.model.config.block_size} tokens, {b.threads} threads, "
          f"torch {torch.__version__}")
    print(f"{'final train loss':<28}{t.history[-1]['loss']:>12.4f}")
    print(f"{'validation loss':<28}{val:>12.4f}")
    print(f"{'wall time (s)':<28}{wall:>12.1f}")
    print(f"{'training tokens/s':<28}{tps:>12,.0f}")
    print(f"\n{'attention kernel':<28}{'train tokens/s':>16}{'ratio':>8}")
    base = tp["torch SDPA"]
    for name, v in tp.items():
        print(f"{name:<28}{v:>16,.0f}{v / base:>8.2f}")
    print(f"\nloss curve: {png}\nsample (seed 0, T=0.8, top-k 10):\n{sample}")
    record = {"bench": asdict(b), "params": t.model.num_params(), "steps": t.step,
              "train_loss": t.history[-1]["loss"], "val_loss": val, "wall_s": wall,
              "train_tokens_per_s": tps, "throughput": tp, "val_history": t.val_history,
              "sample": sample, "torch": torch.__version__}
    (out / f"train_{b.preset}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
