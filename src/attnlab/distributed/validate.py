"""One check, across the group, that every rank makes the same call.

Each rank describes its call (shapes but for its own sequence length, dtype, layout, strategy,
mask, scale, ...) and any error its own inputs raised, in a fixed-size buffer; one small
all-gather (P × 4 KiB) hands every rank all descriptions, and every rank then raises the same
AttnlabError, naming the argument and the ranks, instead of some ranks waiting forever for a peer
that already gave up.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections import OrderedDict

import torch

from attnlab.distributed import comm
from attnlab.distributed.layouts import Sharding
from attnlab.errors import AttnlabError
from attnlab.masks import Mask

BUF = 4096


#: attribute values a mask made only of parameters holds (besides tensors and masks)
PLAIN = (int, float, str, bool, type(None), torch.dtype)
#: what `fingerprint` says of a mask holding a function (or any other object): its behaviour is
#: compared once the global lengths are known (`behaviour`)
BY_BEHAVIOUR = "compared by behaviour"
#: query rows of a mask without per-row intervals that `behaviour` evaluates (all keys each)
SAMPLE_ROWS = 256


def fingerprint(mask: Mask | None) -> str | None:
    """What the argument check compares of a mask before the global lengths are known: its kinds
    (the tree of mask types), batch_size, heads, and a digest of its parameters (plain values
    and every tensor's bytes) — attributes whose name starts with "_" are caches of what a rank
    did with the mask, not what it is, and are left out. A mask that holds a function (or any
    other object) ends in BY_BEHAVIOUR instead: `behaviour` compares what it does."""
    if mask is None:
        return None
    h = hashlib.sha1()
    kinds: list[str] = []
    by_behaviour = False

    def walk(obj, depth):
        nonlocal by_behaviour
        kinds.append("  " * depth + type(obj).__name__)
        h.update(type(obj).__name__.encode())
        for name, val in sorted(vars(obj).items()):
            if name.startswith("_"):
                continue
            h.update(name.encode())
            vals = val if isinstance(val, (tuple, list)) else [val]
            for v in vals:
                if isinstance(v, Mask):
                    walk(v, depth + 1)
                elif isinstance(v, torch.Tensor):
                    h.update(_digest(v))
                elif isinstance(v, PLAIN):
                    h.update(repr(v).encode())
                else:  # a function, or an object whose repr may hold its address
                    by_behaviour = True
                    h.update(b"?")

    walk(mask, 0)
    tree = ",".join(k.strip() for k in kinds)[:160]
    size = f"(Bm, Hm) = ({mask.batch_size}, {mask.heads})"
    return f"{tree} {size} " + (BY_BEHAVIOUR if by_behaviour else f"#{h.hexdigest()[:12]}")


def by_behaviour(fp: str | None) -> bool:
    return fp is not None and fp.endswith(BY_BEHAVIOUR)


def behaviour(mask: Mask, L: int, S: int) -> str:
    """A digest of what the mask does on an L × S problem: its per-row key intervals where it has
    them (exact, O(L)), else the mask on every query row against every key, beyond SAMPLE_ROWS
    rows on SAMPLE_ROWS of them (the first, the last, evenly spaced and fixed pseudo-random
    ones), and its batch_size and heads."""
    h = hashlib.sha1(f"{L}x{S} {mask.batch_size} {mask.heads}".encode())
    got = mask.intervals(L, S)
    if got is not None:
        for x in got:
            h.update(_digest(x.contiguous()))
        return f"intervals at {L}x{S} #{h.hexdigest()[:12]}"
    rows = torch.arange(L)  # short: every row
    if L > SAMPLE_ROWS:
        g = torch.Generator().manual_seed(L * 1_000_003 + S)
        n = SAMPLE_ROWS // 2
        rows = torch.cat([torch.linspace(0, L - 1, n).round().long(),
                          torch.randint(0, L, (n,), generator=g)]).unique()
    cols = torch.arange(S)
    per = max(1, (1 << 24) // max(1, mask.batch_size * mask.heads * S))
    for r0 in range(0, len(rows), per):
        blk = mask.block(rows[r0:r0 + per], cols, L, S)  # (Bm, Hm, r, S)
        h.update(blk.contiguous().numpy().tobytes())
    return f"{len(rows)} rows at {L}x{S} #{h.hexdigest()[:12]}"


def check_behaviour(mask: Mask, L: int, S: int, group, device=None) -> str:
    """`behaviour` of the mask on every rank, compared (one more small all-gather; every rank
    raises alike when they differ or one rank's mask raised). Returns the digest."""
    desc: dict = {"error": None, "mask": None}
    try:
        desc["mask"] = behaviour(mask, L, S)
    except Exception as e:  # a function that raises: reported on every rank, none left waiting
        desc["error"] = f"mask: evaluating it raised {type(e).__name__}: {e}"[:600]
    descs = gather_descriptions(desc, group, device)
    check_agreement(descs)
    return descs[0]["mask"]


#: the digests of the most recently fingerprinted tensors: id -> (weak reference, state, digest)
_DIGESTS: OrderedDict = OrderedDict()
DIGEST_CACHE_SIZE = 64


def _digest(x: torch.Tensor) -> bytes:
    """sha1 of the tensor's dtype, shape and bytes; kept while the tensor lives and its version
    counter (bumped by every in-place write through torch) and layout are unchanged, so a mask
    passed call after call is hashed once. Caution: a write torch does not see (through a numpy
    view of the tensor) keeps the old digest."""
    try:
        state = (x._version, x.dtype, tuple(x.shape), x.stride(), x.storage_offset(),
                 x.untyped_storage().data_ptr(), str(x.device))
    except RuntimeError:  # an inference tensor has no version counter: hash it every time
        state = None
    got = _DIGESTS.get(id(x))
    if state is not None and got is not None and got[0]() is x and got[1] == state:
        _DIGESTS.move_to_end(id(x))
        return got[2]
    t = x.detach().cpu().contiguous()
    h = hashlib.sha1(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    d = h.digest()
    if state is not None:
        _DIGESTS[id(x)] = (weakref.ref(x), state, d)
        _DIGESTS.move_to_end(id(x))
        if len(_DIGESTS) > DIGEST_CACHE_SIZE:
            _DIGESTS.popitem(last=False)
    return d


def _encode(desc: dict) -> torch.Tensor:
    raw = json.dumps(desc, sort_keys=True, default=str).encode()
    if len(raw) > BUF - 4:
        raw = json.dumps({"error": "call description too long to compare across ranks"}).encode()
    buf = torch.zeros(BUF, dtype=torch.uint8)
    buf[:4] = torch.tensor(list(len(raw).to_bytes(4, "little")), dtype=torch.uint8)
    buf[4:4 + len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    return buf


def _decode(buf: torch.Tensor) -> dict:
    n = int.from_bytes(bytes(buf[:4].tolist()), "little")
    return json.loads(bytes(buf[4:4 + n].tolist()).decode())


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def gather_descriptions(desc: dict, group, device=None) -> list[dict]:
    world = comm.rank_world(group)[1]
    if world == 1:
        return [desc]
    part = _encode(desc).to(device or "cpu")
    out = part.new_empty(world * BUF)
    comm.all_gather(out, part, group, "validate")  # (P·4096,) uint8: every rank's description
    return [_decode(out[r * BUF:(r + 1) * BUF].cpu()) for r in range(world)]


def check_agreement(descs: list[dict]) -> None:
    """Raise AttnlabError (on every rank alike) if any rank failed or the calls differ."""
    errors = [(r, d["error"]) for r, d in enumerate(descs) if d.get("error")]
    if errors:
        raise AttnlabError("; ".join(f"rank {r}: {msg}" for r, msg in errors))
    for key in sorted(descs[0]):
        if key in ("rows", "error", "drawn_seed"):  # rank 0's draw is every rank's seed
            continue
        values: dict[str, list[int]] = {}
        for r, d in enumerate(descs):
            values.setdefault(json.dumps(d.get(key), default=str), []).append(r)
        if len(values) > 1:
            parts = [f"{_ranks(rs)} {'have' if len(rs) > 1 else 'has'} {v}"
                     for v, rs in values.items()]
            raise AttnlabError(f"{key}: differs across ranks: " + "; ".join(parts))


def check_rows(descs: list[dict], layout: str) -> tuple[int, int]:
    """Global (L, S) from every rank's local lengths, checked against the layout."""
    P = len(descs)
    for i, (name, n) in enumerate((("query", "L"), ("key", "S"))):
        rows = [d["rows"][i] for d in descs]
        total = sum(rows)
        if total == 0:
            raise AttnlabError(f"{name}: the global sequence is empty ({n} = 0 on all {P} ranks)")
        want = [Sharding(total, layout, P).size(r) for r in range(P)]
        if rows != want:
            bad = [r for r in range(P) if rows[r] != want[r]]
            raise AttnlabError(
                f"{name}: {_ranks(bad)} hold {[rows[r] for r in bad]} rows, but layout "
                f"{layout!r} with {n} = {total} over {P} ranks gives them "
                f"{[want[r] for r in bad]} (all ranks: {rows} vs {want}); split with "
                "attnlab.distributed.shard"
            )
    return sum(d["rows"][0] for d in descs), sum(d["rows"][1] for d in descs)


def seq_len_pair(seq_len) -> tuple[int, int] | None:
    """(L, S) from `seq_len` (an int: L = S; a pair (L, S); None: not given)."""
    if seq_len is None:
        return None
    pair = (seq_len, seq_len) if not isinstance(seq_len, (tuple, list)) else tuple(seq_len)
    if len(pair) != 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                             for n in pair):
        raise AttnlabError(f"seq_len: expected a positive int or a pair (L, S) of them, got "
                           f"{seq_len!r}")
    return pair


def check_seq_len(seq_len, L: int, S: int, descs: list[dict]) -> None:
    """Raise when the ranks' shards do not add up to the global length the caller gave."""
    pair = seq_len_pair(seq_len)
    if pair is None:
        return
    for (name, n), got, want in zip((("query", "L"), ("key", "S")), (L, S), pair):
        if got != want:
            rows = [d["rows"][0 if name == "query" else 1] for d in descs]
            raise AttnlabError(
                f"seq_len: the ranks' {name} shards add up to {n} = {got} ({rows} rows on ranks "
                f"0..{len(descs) - 1}), but seq_len gives {n} = {want}: every rank must hold "
                f"its part of one sequence of that length (attnlab.distributed.shard)")
