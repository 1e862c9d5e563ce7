"""`attnlab plan-cp`: context-parallel attention planned on paper, for 8-64 machines or any.

For each world size, each strategy's bytes and messages sent per rank (forward; forward +
backward), FLOPs per rank, load balance (max / mean work over ranks), and predicted time on a link
of --link-gbps with --latency-us per message and chips of --tflops, with and without overlapping
communication and compute — the numbers `attnlab.distributed.plan` computes and the tests check
against what the code really sends.

--calibrate measures the link, per-message latency and compute on --calibrate-world local
processes first (`attnlab.distributed.calibrate`) and plans on those numbers.

Masks: full, causal, sliding:W (causal window of W keys), document:N (N equal documents, causal
inside each), prefix:N (prefix-LM with an N-token prefix).
"""

from __future__ import annotations

import json

from attnlab.cli.options import add_alias, add_threads, command

#: --mask document:N builds one id per position: planning stays within a few hundred MB up to this
MAX_DOCUMENT_LEN = 1 << 24


def add_parser(sub):
    p = command(sub, "plan-cp", __doc__, "plan context-parallel attention: bytes, FLOPs, time")
    p.add_argument("--L", type=int, required=True, help="sequence length (queries = keys)")
    heads = p.add_argument("--num-heads", type=int, default=None, metavar="H",
                           help="how many query heads (required; no default)")
    kv = p.add_argument("--num-kv-heads", type=int, default=None, metavar="HKV",
                        help="how many key/value heads (default: H)")
    add_alias(p, "--heads", heads)
    add_alias(p, "--kv-heads", kv)
    p.add_argument("--head-dim", type=int, default=128, help="head dim D (default 128)")
    p.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--world", type=int, nargs="+", default=[8, 16, 32, 64],
                   help="numbers of ranks to plan for (default 8 16 32 64)")
    p.add_argument("--mask", default="causal", help="full | causal | sliding:W | document:N | "
                   "prefix:N (default causal)")
    p.add_argument("--layout", default="zigzag", choices=["zigzag", "contiguous", "striped"],
                   help="which rows each rank holds")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "fp64"],
                   help="the dtype of q, k, v (bytes per value)")
    p.add_argument("--link-gbps", type=float, default=100.0,
                   help="link bandwidth per rank, Gbit/s, each way (default 100)")
    p.add_argument("--tflops", type=float, default=100.0,
                   help="attention throughput per rank, TFLOP/s (default 100)")
    p.add_argument("--latency-us", type=float, default=None,
                   help="latency per message, µs (default 10: a message between machines over "
                   "InfiniBand / RoCE)")
    p.add_argument("--ulysses-size", type=int, default=None, metavar="U",
                   help="also plan strategy hybrid: all-to-all over heads inside groups of U "
                   "ranks, ring across groups (default: no hybrid)")
    p.add_argument("--intra-gbps", type=float, default=None,
                   help="link inside a group of U ranks, Gbit/s (default: the inter link)")
    p.add_argument("--inter-gbps", type=float, default=None,
                   help="link between groups, Gbit/s (default --link-gbps); strategies over "
                   "all ranks run at this one")
    p.add_argument("--calibrate", action="store_true",
                   help="measure link, latency and compute first on local processes (gloo on "
                   "loopback, one thread each) and plan on those numbers instead of --link-gbps, "
                   "--intra/--inter-gbps, --latency-us, --tflops")
    p.add_argument("--calibrate-world", type=int, default=2, metavar="P",
                   help="local processes --calibrate measures on (default 2; with "
                   "--ulysses-size, a multiple of it)")
    p.add_argument("--json", action="store_true", help="print the plans as JSON")
    add_threads(p)
    return p


def parse_mask(spec: str, L: int):
    """(mask, is_causal) from a --mask spec."""
    import torch

    from attnlab import masks
    from attnlab.errors import AttnlabError

    kind, _, arg = spec.partition(":")
    if kind in ("full", "causal") and not arg:
        return None, kind == "causal"
    try:
        n = int(arg)
    except ValueError:
        n = 0
    if n < 1 or kind not in ("sliding", "document", "prefix"):
        raise AttnlabError(f"--mask: expected full, causal, sliding:W, document:N or prefix:N "
                           f"with a positive integer, got {spec!r}")
    if kind == "sliding":
        return masks.sliding_window(n), False
    if kind == "prefix":
        return masks.prefix_lm(n), False
    if L > MAX_DOCUMENT_LEN:  # the mask holds one document id per position
        raise AttnlabError(f"--mask: document:N holds one id per position; --L at most "
                           f"{MAX_DOCUMENT_LEN:,} = 2^24 with it, got {L:,}")
    ids = torch.arange(L) * n // L  # N equal documents
    return masks.document(ids), True


def _row(P, e, choice):
    mib = 2**20
    if not e.feasible:
        return f"| {P} | {e.strategy} | — | — | — | — | — | — | — | — | — | {e.why_not} |"
    fwd = max(e.fwd_sent) / mib
    tflop = max(e.flops_fwd) / 1e12
    pick = "**auto**" if e.strategy == choice else ""
    return (f"| {P} | {e.strategy} | {fwd:,.1f} | {e.bytes_per_rank() / mib:,.1f} | "
            f"{e.messages_per_rank():,} | {tflop:,.3g} | {e.load:.3f} | {e.comm_s * 1e3:,.1f} | "
            f"{e.compute_s * 1e3:,.1f} | "
            f"{e.time_s * 1e3:,.1f} | {e.serial_s * 1e3:,.1f} | {pick} |")


def _calibrate(args):
    from attnlab.distributed import spawn
    from attnlab.distributed.calibrate import calibrate_worker

    return spawn(calibrate_worker, args.calibrate_world, args.ulysses_size, 1,
                 timeout_s=300.0, group_timeout_s=60.0)[0]


def _links(args, lat, cal) -> str:
    if cal is not None:
        return f"measured: {cal.describe()}"
    inter = args.link_gbps if args.inter_gbps is None else args.inter_gbps
    link = f"link {inter:g} Gbit/s"
    if args.intra_gbps is not None:
        link = f"link {args.intra_gbps:g} Gbit/s inside groups of {args.ulysses_size}, " \
               f"{inter:g} Gbit/s between"
    return f"{link}, {lat:g} µs per message, {args.tflops:g} TFLOP/s per rank"


def run(args) -> int:
    from attnlab.distributed import plan
    from attnlab.distributed.cost import DEFAULT_LATENCY_US
    from attnlab.errors import AttnlabError

    if args.num_heads is None:
        raise AttnlabError("--num-heads: required: how many query heads (H)")
    mask, is_causal = parse_mask(args.mask, args.L)
    lat = DEFAULT_LATENCY_US if args.latency_us is None else args.latency_us
    hkv = args.num_kv_heads or args.num_heads
    cal = _calibrate(args) if args.calibrate else None
    plans = [plan(args.L, args.num_heads, hkv, args.head_dim, P, mask=mask, is_causal=is_causal,
                  layout=args.layout, dtype=args.dtype, batch=args.batch,
                  link_gbps=args.link_gbps, tflops=args.tflops, latency_us=lat,
                  ulysses_size=args.ulysses_size, intra_gbps=args.intra_gbps,
                  inter_gbps=args.inter_gbps, calibration=cal)
             for P in args.world]
    if args.json:
        print(json.dumps([{"world": p.world, "choice": p.choice, "reason": p.reason,
                           "strategies": {s: {k: getattr(e, k) for k in (
                               "feasible", "why_not", "fwd_sent", "fwd_recv", "bwd_sent",
                               "bwd_recv", "fwd_msgs_sent", "fwd_msgs_recv", "bwd_msgs_sent",
                               "bwd_msgs_recv", "flops_fwd", "comm_s", "latency_s",
                               "compute_s")}
                               | {"load": e.load if e.feasible else None,
                                  "time_s": e.time_s if e.feasible else None}
                               for s, e in p.estimates.items()}} for p in plans], indent=1))
        return 0
    print(f"# attnlab plan-cp: L={args.L}, B={args.batch}, H={args.num_heads}, Hkv={hkv}, "
          f"D={args.head_dim}, {args.dtype}, mask {args.mask}, layout {args.layout}; "
          f"{_links(args, lat, cal)}\n")
    print("| ranks | strategy | fwd MiB sent/rank | fwd+bwd MiB sent/rank | fwd+bwd msgs/rank | "
          "fwd TFLOP/rank | load max/mean | comm ms | compute ms | time ms (overlap) | "
          "time ms (serial) | |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in plans:
        for e in p.estimates.values():
            print(_row(p.world, e, p.choice))
    print()
    for p in plans:
        print(f"- {p.world} ranks: {p.reason}")
    return 0
