"""The context-parallel block backward now (`attnlab.distributed.blocks.block_backward`, on
attnlab's tiled backward) against the route it took before (PyTorch's flash backward on the whole
block for equal heads without softcap or lse gradient; otherwise whole-block plain-PyTorch
matmuls, k/v grouped by head), on one block of the sizes a ring or all-gather step computes; and
the cost of an lse gradient in `attnlab.attention`'s backward.

    .venv/bin/python benchmarks/block_backward.py                  # ~1 minute
    .venv/bin/python benchmarks/block_backward.py --rows 1024 --keys 2048 --threads 2

Times are the median of --repeats runs after one warm-up, one thread unless --threads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnlab
from attnlab.distributed import blocks
from attnlab.ops import fused_cpu, scores


def before_block_backward(q, k, v, allowed, scale, softcap, out, lse, dout, dlse):
    """The route the blocks took before: PyTorch's flash backward on the whole block for equal
    heads without softcap or lse gradient, else `plain_block_backward`; both after the same
    zeroing of dead rows and keys as now."""
    q, k, v = blocks._sanitize(q, k, v, allowed)
    if q.shape[1] == k.shape[1] and softcap is None and not bool(dlse.any()):
        bias = None
        if allowed is not None:
            bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        return fused_cpu.backward(dout, q, k, v, out, lse, scale=scale, attn_mask=bias)
    return plain_block_backward(q, k, v, allowed, scale, softcap, out, lse, dout, dlse)


def plain_block_backward(q, k, v, allowed, scale, softcap, out, lse, dout, dlse):
    """The block backward as whole-block matmuls over (B, Hkv, G·Lb, ·), for comparison."""
    B, H, Lb, _ = q.shape
    Hkv = k.shape[1]

    def grouped(x):  # (B, H, Lb, X) -> (B, Hkv, G·Lb, X)
        return x.reshape(B, Hkv, -1, x.shape[-1])

    def ungrouped(x):  # (B, Hkv, G·Lb, X) -> (B, H, Lb, X)
        return x.reshape(B, H, Lb, x.shape[-1])

    s = ungrouped(scores.product(grouped(q), k, scale))  # (B, H, Lb, Sb)
    s, t = scores.modify(s, softcap=softcap, allowed=allowed)
    p = s.sub_(scores.lse_for_exp(lse)[..., None]).exp_()
    dp = ungrouped(grouped(dout) @ v.transpose(-1, -2))  # (B, H, Lb, Sb)
    delta = (dout * out).sum(-1, keepdim=True) - dlse[..., None]
    ds = dp.sub_(delta).mul_(p)
    if t is not None:
        ds.mul_(1 - t * t)
    ds.mul_(scale)
    dq = ungrouped(grouped(ds) @ k)
    dk = grouped(ds).transpose(-1, -2) @ grouped(q)
    dv = grouped(p).transpose(-1, -2) @ grouped(dout)
    return dq, dk, dv


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _block_case(H, Hkv, rows, keys, D, causal, seed=0):
    """q, k, v, allowed, out, lse, dout, dlse of one block: rows × keys, global out and lse."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, rows, D, generator=g)
    k, v = (torch.randn(1, Hkv, keys, D, generator=g) for _ in range(2))
    allowed = None
    if causal:  # the diagonal block of a causal mask: a PARTIAL pair
        allowed = (torch.arange(keys)[None, :] <= torch.arange(rows)[:, None] + keys - rows)
        allowed = allowed[None, None]  # (1, 1, rows, keys)
    out = torch.randn(1, H, rows, D, generator=g) * 0.1
    lse = torch.randn(1, H, rows, generator=g) + 8.0  # other blocks contributed too
    dout = torch.randn(1, H, rows, D, generator=g)
    dlse = torch.randn(1, H, rows, generator=g)
    return q, k, v, allowed, out, lse, dout, dlse


def bench_blocks(args) -> None:
    print(f"block backward, fp32, {args.rows} query rows x {args.keys} keys, D {args.D}, "
          f"{args.threads} thread(s), median of {args.repeats}")
    print("| case | H | Hkv | softcap | mask | dlse | before ms | now ms | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    cases = [("GQA", 8, 2, None), ("MQA", 8, 1, None), ("softcap", 8, 8, 30.0),
             ("GQA+softcap", 8, 2, 30.0), ("MHA", 8, 8, None)]
    for name, H, Hkv, softcap in cases:
        for causal in (False, True):
            for with_dlse in (False, True):
                q, k, v, allowed, out, lse, dout, dlse = _block_case(
                    H, Hkv, args.rows, args.keys, args.D, causal)
                d = dlse if with_dlse else torch.zeros_like(dlse)
                a = (q, k, v, allowed, args.D ** -0.5, softcap, out, lse, dout, d)
                t_plain = _median_ms(lambda a=a: before_block_backward(*a), args.repeats)
                t_new = _median_ms(lambda a=a: blocks.block_backward(*a), args.repeats)
                print(f"| {name} | {H} | {Hkv} | {softcap or '-'} | "
                      f"{'diagonal' if causal else 'none'} | {'yes' if with_dlse else 'no'} | "
                      f"{t_plain:.1f} | {t_new:.1f} | {t_plain / t_new:.2f}x |")


def bench_lse_gradient(args) -> None:
    print(f"\nattnlab.attention backward with and without an lse gradient, fp32, L {args.L}, "
          f"H 8, Hkv 2, D {args.D}, sliding window 512")
    print("| backend | dout only ms | dout + dlse ms | ratio |")
    print("|---|---|---|---|")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 8, args.L, args.D, generator=g).requires_grad_()
    k, v = (torch.randn(1, 2, args.L, args.D, generator=g).requires_grad_() for _ in range(2))
    mask = attnlab.masks.sliding_window(512)
    for backend in ("tiled", "sdpa"):
        out, lse = attnlab.attention(q, k, v, mask=mask, enable_gqa=True, return_lse=True,
                                     backend=backend)
        w, u = torch.randn_like(out), torch.randn_like(lse)

        def grads(outputs, seeds):
            return lambda: torch.autograd.grad(outputs, (q, k, v), seeds, retain_graph=True)

        only = _median_ms(grads([out], [w]), args.repeats)
        both = _median_ms(grads([out, lse], [w, u]), args.repeats)
        print(f"| {backend} | {only:.0f} | {both:.0f} | {both / only:.2f} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=512, help="query rows of the block")
    ap.add_argument("--keys", type=int, default=1024, help="keys of the block")
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--L", type=int, default=2048, help="length for the lse-gradient table")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench_blocks(args)
    bench_lse_gradient(args)


if __name__ == "__main__":
    main()
