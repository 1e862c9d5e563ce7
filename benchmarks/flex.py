"""attnlab.flex_attention against the peers a Flex user on a CPU has, side by side (CPU, fp32).

    .venv/bin/python benchmarks/flex.py          # sliding window 256 and documents @ 16k
    .venv/bin/python benchmarks/flex.py --L 4096 --repeats 3
    .venv/bin/python benchmarks/flex.py --mods   # softcap / ALiBi score_mods: fused or not

For each mask, written as a Flex mask_mod and made into a BlockMask by torch's create_block_mask:

- forward: attnlab.flex_attention with that BlockMask; attnlab.attention with the built-in mask
  that equals it (masks.sliding_window / masks.document & masks.causal); torch's compiled
  flex_attention (torch.compile, CPU: forward only);
- forward+backward: attnlab.flex_attention; SDPA with the dense bool mask (PyTorch's one CPU
  path that trains with such a mask).

Medians of --repeats, the steps of one table timed in turn within each repeat, after one
untimed warm-up each (torch.compile's compile and attnlab's BlockMask conversion, both one-off
per shape, are reported apart). Ratios are of times measured in the same run; on a busy machine
only they mean anything.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import attnlab
from attnlab import masks
from attnlab.bench.timing import interleaved_medians
from attnlab.flex import create_block_mask, flex_attention


@dataclass(frozen=True)
class Config:
    L: int
    window: int
    docs: int
    B: int
    H: int
    D: int
    repeats: int
    threads: int



def cases(cfg: Config):
    """(name, mask_mod, the attnlab built-in that equals it, dense bool (L, L))."""
    w = cfg.window

    def sliding(b, h, q, kv):
        return (q >= kv) & (q - kv < w)

    g = torch.Generator().manual_seed(0)
    cuts = torch.randperm(cfg.L - 1, generator=g)[:cfg.docs - 1].sort().values + 1
    ids = torch.zeros(cfg.L, dtype=torch.int64)
    ids[cuts] = 1
    ids = ids.cumsum(0)  # (L,) document of each token

    def document(b, h, q, kv):
        return (ids[q] == ids[kv]) & (q >= kv)

    ar = torch.arange(cfg.L)
    yield (f"sliding window {w}", sliding, masks.sliding_window(w),
           sliding(0, 0, ar[:, None], ar[None, :]))
    yield (f"{cfg.docs} documents, causal", document, masks.document(ids) & masks.causal(),
           document(0, 0, ar[:, None], ar[None, :]))


def run(cfg: Config):
    torch.set_num_threads(cfg.threads)
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    compiled = torch.compile(torch_flex, dynamic=False)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(cfg.B, cfg.H, cfg.L, cfg.D, generator=g) for _ in range(3))
    return [run_case(cfg, compiled, q, k, v, *case) for case in cases(cfg)]


def run_case(cfg: Config, compiled, q, k, v, name, fn, builtin, dense):
    """(name, forward medians, forward+backward medians, one-off costs) of one mask."""
    t0 = time.perf_counter()
    bm = create_block_mask(fn, None, None, cfg.L, cfg.L, device="cpu")
    made = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        flex_attention(q, k, v, block_mask=bm)  # converts the BlockMask, kept with it
    convert = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(q, k, v, block_mask=bm)
    compile_s = time.perf_counter() - t0

    def nograd(f):
        def step():
            with torch.no_grad():
                f()
        return step

    fwd = interleaved_medians({
        "flex": nograd(lambda: flex_attention(q, k, v, block_mask=bm)),
        "builtin": nograd(lambda: attnlab.attention(q, k, v, mask=builtin)),
        "compiled": nograd(lambda: compiled(q, k, v, block_mask=bm)),
    }, cfg.repeats)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]

    def train_flex():
        flex_attention(*xs, block_mask=bm).sum().backward()

    def train_sdpa():
        F.scaled_dot_product_attention(*xs, attn_mask=dense).sum().backward()

    both = interleaved_medians({"flex": train_flex, "sdpa": train_sdpa}, cfg.repeats)
    return name, fwd, both, made, convert, compile_s


def run_mods(cfg: Config):
    """Forward medians of a sliding window with a softcap / ALiBi score_mod: fused into the
    kernel's built-in modifier (what flex_attention does with such a function), called on each
    chunk by the tiled loop (the same function wrapped so it is not fused), torch's compiled
    Flex."""
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    from attnlab.flexfn import Adapted

    torch.set_num_threads(cfg.threads)
    compiled = torch.compile(torch_flex, dynamic=False)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(cfg.B, cfg.H, cfg.L, cfg.D, generator=g) for _ in range(3))
    w = cfg.window
    slopes = torch.exp2(-(torch.arange(cfg.H) + 1.0) * 8.0 / cfg.H)

    def sliding(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < w)

    def softcap(s, b, h, qi, ki):
        return 30.0 * torch.tanh(s / 30.0)

    def alibi(s, b, h, qi, ki):
        return s + (ki - qi) * slopes[h]

    bm = create_block_mask(sliding, None, None, cfg.L, cfg.L, device="cpu")
    rows = []
    for name, mod in (("softcap 30", softcap), ("ALiBi", alibi)):
        plain = Adapted(mod, score=True)  # an Adapted is never fused: the per-chunk path
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = interleaved_medians({
                "fused": lambda mod=mod: flex_attention(q, k, v, score_mod=mod, block_mask=bm),
                "chunks": lambda p=plain: flex_attention(q, k, v, score_mod=p, block_mask=bm),
                "compiled": lambda mod=mod: compiled(q, k, v, score_mod=mod, block_mask=bm),
            }, cfg.repeats)
        rows.append((name, t))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--docs", type=int, default=12)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mods", action="store_true",
                    help="instead: score_mods fused into the kernel vs called on each chunk")
    a = ap.parse_args(argv)
    cfg = Config(a.L, a.window, a.docs, a.B, a.H, a.D, a.repeats, a.threads)
    if a.mods:
        print(f"# sliding window {cfg.window} with a score_mod, forward, L={cfg.L}, B={cfg.B} "
              f"H={cfg.H} D={cfg.D} fp32, {cfg.threads} thread(s), median of {cfg.repeats}\n")
        print("| score_mod | fused (s) | called per chunk (s) | chunks / fused | torch compiled "
              "flex (s) | fused / compiled |")
        print("|---|---|---|---|---|---|")
        for name, t in run_mods(cfg):
            print(f"| {name} | {t['fused']:.4f} | {t['chunks']:.4f} | "
                  f"{t['chunks'] / t['fused']:.2f} | {t['compiled']:.4f} | "
                  f"{t['fused'] / t['compiled']:.2f} |")
        return 0
    rows = run(cfg)
    print(f"# L={cfg.L}, B={cfg.B} H={cfg.H} D={cfg.D} fp32, {cfg.threads} thread(s), "
          f"median of {cfg.repeats}\n")
    print("| mask | fwd: flex_attention (s) | fwd: attention, built-in (s) | flex / built-in | "
          "fwd: torch compiled flex (s) | flex / compiled | fwd+bwd: flex_attention (s) | "
          "fwd+bwd: SDPA dense mask (s) | flex / SDPA |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, f, b, *_ in rows:
        print(f"| {name} | {f['flex']:.4f} | {f['builtin']:.4f} | {f['flex'] / f['builtin']:.2f} "
              f"| {f['compiled']:.4f} | {f['flex'] / f['compiled']:.2f} | {b['flex']:.3f} | "
              f"{b['sdpa']:.3f} | {b['flex'] / b['sdpa']:.2f} |")
    print("\none-off costs per shape (s), outside the medians:\n")
    print("| mask | create_block_mask | attnlab's first call (BlockMask conversion) | "
          "torch.compile's first call |")
    print("|---|---|---|---|")
    for name, _, _, made, convert, compile_s in rows:
        print(f"| {name} | {made:.2f} | {convert:.2f} | {compile_s:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
