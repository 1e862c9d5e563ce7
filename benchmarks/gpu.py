"""The device check: attnlab on a GPU against SDPA, compiled FlexAttention and flash-attention.

    PYTHONPATH=src python3 benchmarks/gpu.py           # the check, with the python it finds
    PYTHONPATH=src python3 benchmarks/gpu.py --L 4096 16384 --masks causal sliding256
    PYTHONPATH=src python3 benchmarks/gpu.py --dry-run # tiny sizes on CPU: the script works

One command on the device machine (its own Python and torch with CUDA; no pip, no network):
nothing but torch and attnlab's sources is needed (flash-attention is timed when installed). It
stays within --budget-s seconds (default 420: under 8 minutes with the exactness check and the
import): cases left when the budget is spent are listed as skipped, never silently dropped. The
tables go to the terminal and to --out (default gpu-check.md).

Two tables:

1. Speed: for each length, mask (causal, sliding window 256, causal documents, and the sliding
   window as a mask function), mode (fwd, fwd+bwd) and dtype (bf16, fp16): the median time of
   attnlab (backend "auto", with what it picked), SDPA (is_causal, else a dense bool mask while it
   fits), torch's compiled FlexAttention with its own create_block_mask, and flash-attention when
   installed; TFLOP/s from the attended pairs (4·B·H·pairs·D forward, 3.5x that for fwd+bwd) and
   each peer's time over attnlab's.
2. Exactness on the device: attnlab's output and gradients against a float64 run of the same
   call, next to a plain same-dtype implementation's error, with FlashAttention's rule (output
   within 2x, gradients within 3x of the plain error).

Then the targets: causal fwd+bwd within 1.05x of SDPA; structured masks within 1.1x of compiled
Flex and at least 5x faster than SDPA with a dense mask at 16k; bf16 within the rule.
Caution: the first call of each (shape, mask) compiles Flex kernels (tens of seconds each); the
warm-up absorbs it and is not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass

import torch

import attnlab
from attnlab import masks

MASKS = ("causal", "sliding256", "documents", "fn_sliding256")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: SDPA gets a dense bool mask only up to this many entries (L·L): 16k² = 256 MiB of bools
DENSE_LIMIT = 16384 * 16384
WINDOW = 256


@dataclass(frozen=True)
class Case:
    L: int
    mask: str
    mode: str
    dtype: str
    B: int
    H: int
    D: int


def doc_ids(L: int, device) -> torch.Tensor:
    """8 documents of uneven lengths (fixed seed), as segment ids (L,)."""
    g = torch.Generator().manual_seed(8)
    cuts = torch.sort(torch.randperm(L - 1, generator=g)[:7] + 1).values
    ids = torch.zeros(L, dtype=torch.int64)
    ids[cuts] = 1
    return ids.cumsum(0).to(device)


def mask_mod_for(name: str, L: int, device):
    """FlexAttention's mask_mod of a mask (the function masks.from_function takes too)."""
    if name == "causal":
        return lambda b, h, q, k: q >= k
    if name in ("sliding256", "fn_sliding256"):
        return lambda b, h, q, k: (q >= k) & (q - k < WINDOW)
    docs = doc_ids(L, device)
    return lambda b, h, q, k: (docs[q] == docs[k]) & (q >= k)


def attnlab_kwargs(name: str, L: int, device) -> dict:
    if name == "causal":
        return {"is_causal": True}
    if name == "sliding256":
        return {"mask": masks.sliding_window(WINDOW)}
    if name == "documents":
        return {"mask": masks.causal() & masks.document(doc_ids(L, device))}
    return {"mask": masks.from_function(mask_mod_for(name, L, device))}


def pairs(name: str, L: int, device) -> int:
    if name == "causal":
        return L * (L + 1) // 2
    if name in ("sliding256", "fn_sliding256"):
        w = min(WINDOW, L)
        return w * (w + 1) // 2 + (L - w) * w
    counts = torch.bincount(doc_ids(L, "cpu"))
    return int((counts * (counts + 1) // 2).sum())


def dense_mask(name: str, L: int, device) -> torch.Tensor:
    i = torch.arange(L, device=device)
    return mask_mod_for(name, L, device)(0, 0, i[:, None], i[None, :])  # (L, L) bool


# -- the implementations: each returns a callable running one forward (and backward) ---------------

def impl_attnlab(case, q, k, v, device):
    kw = attnlab_kwargs(case.mask, case.L, device)
    picked = attnlab.select_backend(q, k, v, **kw).backend
    return (lambda: attnlab.attention(q, k, v, **kw)), f"attnlab (auto→{picked})"


def impl_sdpa(case, q, k, v, device):
    F = torch.nn.functional
    if case.mask == "causal":
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), "sdpa"
    if case.L * case.L > DENSE_LIMIT:
        return None, "sdpa (dense mask too big)"
    m = dense_mask(case.mask, case.L, device)
    return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m)), "sdpa+dense mask"


def impl_flex(case, q, k, v, device):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None, "flex (not in this torch)"
    if device.type == "cpu":  # the dry run: eager Flex (compiling on CPU takes minutes)
        fn, name = flex_attention, "flex (eager, CPU)"
        if case.mode == "fwd+bwd":
            return None, "flex (no CPU backward)"
    else:
        fn, name = _compiled_flex(), "flex (compiled)"
    bm = create_block_mask(mask_mod_for(case.mask, case.L, device), None, None, case.L, case.L,
                           device=device)
    return (lambda: fn(q, k, v, block_mask=bm)), name


_FLEX = []


def _compiled_flex():
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention
        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _FLEX[0]


def impl_flash(case, q, k, v, device):
    try:
        from flash_attn import flash_attn_func, flash_attn_varlen_func
    except ImportError:
        return None, "flash-attn (not installed)"
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, L, H, D), flash's layout
    if case.mask == "causal":
        return (lambda: flash_attn_func(qt, kt, vt, causal=True)), "flash-attn"
    if case.mask in ("sliding256", "fn_sliding256"):
        return (lambda: flash_attn_func(qt, kt, vt, causal=True, window_size=(WINDOW - 1, 0))), \
            "flash-attn"
    if case.B != 1:
        return None, "flash-attn (varlen: B = 1 only here)"
    counts = torch.bincount(doc_ids(case.L, "cpu"))
    cu = torch.nn.functional.pad(counts.cumsum(0), (1, 0)).to(device, torch.int32)
    n = int(counts.max())
    q1, k1, v1 = (x[0] for x in (qt, kt, vt))  # (L, H, D)
    return (lambda: flash_attn_varlen_func(q1, k1, v1, cu, cu, n, n, causal=True)), \
        "flash-attn (varlen)"


IMPLS = (impl_attnlab, impl_sdpa, impl_flex, impl_flash)


# -- timing --------------------------------------------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, mode: str, inputs, device, warmup: int, repeats: int) -> float:
    """Median seconds of fn() (and its backward for fwd+bwd)."""
    def step():
        out = fn()
        if mode == "fwd+bwd":
            out.backward(torch.ones_like(out))
            for x in inputs:
                x.grad = None
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def speed_rows(cfg, device, skipped: list | None = None):
    """The speed table's rows; cases that would start after cfg.deadline (time.monotonic) go to
    `skipped` instead (the budget of the whole check)."""
    rows = []
    for L in cfg.L:
        for mask in cfg.masks:
            for mode in cfg.modes:
                for dt in cfg.dtypes:
                    case = Case(L, mask, mode, dt, cfg.B, cfg.H, cfg.D)
                    if time.monotonic() > getattr(cfg, "deadline", float("inf")):
                        if skipped is not None:
                            skipped.append(case)
                        continue
                    rows += run_case(case, cfg, device)
    return rows


def run_case(case: Case, cfg, device):
    g = torch.Generator(device=device).manual_seed(0)
    grad = case.mode == "fwd+bwd"
    q, k, v = (torch.randn(case.B, case.H, case.L, case.D, generator=g, device=device,
                           dtype=DTYPES[case.dtype]).requires_grad_(grad) for _ in range(3))
    flops = 4 * case.B * case.H * pairs(case.mask, case.L, device) * case.D
    flops *= 3.5 if grad else 1.0
    out, base = [], None
    for impl in IMPLS:
        try:
            fn, name = impl(case, q, k, v, device)
            t = None if fn is None else timed(fn, case.mode, (q, k, v), device, cfg.warmup,
                                              cfg.repeats)
        except Exception as e:  # a peer that fails here is reported, not fatal
            t, name = None, f"{impl.__name__[5:]} (failed: {type(e).__name__})"
        if impl is impl_attnlab:
            base = t
        out.append((case, name, t, flops))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return [(c, n, t, f, base) for c, n, t, f in out]


def print_speed(rows):
    print("| L | mask | mode | dtype | implementation | ms | TFLOP/s | time / attnlab |")
    print("|---|---|---|---|---|---|---|---|")
    for case, name, t, flops, base in rows:
        ms = "—" if t is None else f"{t * 1e3:.2f}"
        tf = "—" if t is None else f"{flops / t / 1e12:.1f}"
        ratio = "—" if t is None or base is None else f"{t / base:.2f}"
        print(f"| {case.L} | {case.mask} | {case.mode} | {case.dtype} | {name} | {ms} | {tf} | "
              f"{ratio} |")


# -- exactness against float64 on the device -------------------------------------------------------

def exactness_rows(cfg, device):
    rows = []
    for mask in cfg.masks:
        for dt in cfg.dtypes:
            rows.append(check_exact(mask, dt, cfg, device))
    return rows


def check_exact(mask: str, dt: str, cfg, device):
    L, dtype = cfg.check_L, DTYPES[dt]
    g = torch.Generator(device=device).manual_seed(1)
    base = [torch.randn(1, cfg.H, L, cfg.D, generator=g, device=device, dtype=torch.float64)
            for _ in range(3)]
    dout = torch.randn(1, cfg.H, L, cfg.D, generator=g, device=device, dtype=torch.float64)
    kw = attnlab_kwargs(mask, L, device)
    allowed = dense_mask(mask, L, device)

    def grads(fn, xs):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        out = fn(*xs)
        out.backward(dout.to(out.dtype))
        return [out.detach(), *(x.grad for x in xs)]

    ref = grads(lambda q, k, v: attnlab.attention(q, k, v, backend="math", **kw), base)
    low = [x.to(dtype) for x in base]
    got = grads(lambda q, k, v: attnlab.attention(q, k, v, **kw), low)

    def plain(q, k, v):
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v

    naive = grads(plain, low)
    errs = [float((a.double() - r).abs().max()) for a, r in zip(got, ref)]
    plain_errs = [float((a.double() - r).abs().max()) for a, r in zip(naive, ref)]
    ok = all(e <= f * p + 1e-6 for e, p, f in zip(errs, plain_errs, (2, 3, 3, 3)))
    return mask, dt, L, errs, plain_errs, ok


def print_exact(rows):
    print("| mask | dtype | L | err out / dq / dk / dv | plain same-dtype err | within rule |")
    print("|---|---|---|---|---|---|")
    for mask, dt, L, errs, plain_errs, ok in rows:
        e = " / ".join(f"{x:.1e}" for x in errs)
        p = " / ".join(f"{x:.1e}" for x in plain_errs)
        print(f"| {mask} | {dt} | {L} | {e} | {p} | {'yes' if ok else 'NO'} |")


def print_targets(rows, exact):
    """The issue's targets, from the rows just measured."""
    def time_of(case_pred, name_pred):
        for case, name, t, _, _ in rows:
            if case_pred(case) and name_pred(name) and t is not None:
                yield case, t

    mine = time_of(lambda c: True, lambda n: n.startswith("attnlab"))
    at = {(c.L, c.mask, c.mode, c.dtype): t for c, t in mine}
    print("\nTargets (ratio = attnlab time / peer time; lower is better):")
    for c, t in time_of(lambda c: c.mask == "causal" and c.mode == "fwd+bwd",
                        lambda n: n == "sdpa"):
        r = at[(c.L, c.mask, c.mode, c.dtype)] / t
        print(f"  causal fwd+bwd L={c.L} {c.dtype}: {r:.3f}x SDPA (target <= 1.05): "
              f"{'met' if r <= 1.05 else 'NOT met'}")
    for c, t in time_of(lambda c: c.mask != "causal", lambda n: n.startswith("flex (compiled")):
        r = at[(c.L, c.mask, c.mode, c.dtype)] / t
        print(f"  {c.mask} {c.mode} L={c.L} {c.dtype}: {r:.3f}x compiled Flex (target <= 1.1): "
              f"{'met' if r <= 1.1 else 'NOT met'}")
    for c, t in time_of(lambda c: c.mask != "causal" and c.L == 16384,
                        lambda n: n == "sdpa+dense mask"):
        r = t / at[(c.L, c.mask, c.mode, c.dtype)]
        print(f"  {c.mask} {c.mode} L=16384 {c.dtype}: {r:.1f}x faster than SDPA with a dense "
              f"mask (target >= 5): {'met' if r >= 5 else 'NOT met'}")
    for mask, dt, _, _, _, ok in exact:
        if dt == "bf16":
            print(f"  {mask} bf16 error within FlashAttention's rule: {'met' if ok else 'NOT met'}")


# -- command line ------------------------------------------------------------------------------

def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--L", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--masks", nargs="+", choices=MASKS, default=list(MASKS))
    ap.add_argument("--modes", nargs="+", choices=("fwd", "fwd+bwd"), default=["fwd", "fwd+bwd"])
    ap.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=["bf16"])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--check-L", type=int, default=4096, help="length of the exactness check")
    ap.add_argument("--no-exact", action="store_true", help="skip the exactness table")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds the speed table may take; later cases are listed as skipped")
    ap.add_argument("--out", default="gpu-check.md", help="file the tables are written to")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes on CPU (no device needed): checks that the script runs")
    cfg = ap.parse_args(argv)
    if cfg.dry_run:
        cfg.L, cfg.B, cfg.H, cfg.D = [256, 320], 1, 2, 32
        cfg.warmup, cfg.repeats, cfg.check_L = 0, 1, 192
    if min(cfg.L) < 16 or min(cfg.B, cfg.H, cfg.D, cfg.repeats, cfg.check_L) < 1:
        ap.error("--L must be >= 16 and --B, --H, --D, --repeats, --check-L positive")
    if not cfg.budget_s > 0:
        ap.error("--budget-s takes a positive number of seconds")
    return cfg


class Tee:
    """Writes to the terminal and to the --out file at once."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def main(argv=None) -> int:
    cfg = parse(sys.argv[1:] if argv is None else argv)
    cfg.deadline = time.monotonic() + cfg.budget_s
    with open(cfg.out, "w") as f, contextlib.redirect_stdout(Tee(sys.stdout, f)):
        return check(cfg)


def check(cfg) -> int:
    if cfg.dry_run:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu.py: no CUDA device here; run with --dry-run to check the script on CPU",
              file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(f"# attnlab device check on {name}, torch {torch.__version__}, B={cfg.B} H={cfg.H} "
          f"D={cfg.D}, median of {cfg.repeats}\n")
    skipped = []
    rows = speed_rows(cfg, device, skipped)
    print_speed(rows)
    if skipped:
        print(f"\nskipped (the --budget-s {cfg.budget_s:.0f} s was spent): " +
              ", ".join(f"{c.L} {c.mask} {c.mode} {c.dtype}" for c in skipped))
    exact = [] if cfg.no_exact else exactness_rows(cfg, device)
    if exact:
        print()
        print_exact(exact)
    print_targets(rows, exact)
    return 0 if all(r[-1] for r in exact) else 1


if __name__ == "__main__":
    sys.exit(main())
