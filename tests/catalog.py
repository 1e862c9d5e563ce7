"""The tests' catalogue: everything attnlab's paths must run, in one place.

Every public mask factory and composition, every backend, every context-parallel strategy and
layout, every dtype. The sweeps (tests/test_catalog_sweeps.py, tests/distributed/
test_catalog_cp.py, ...) are parametrised from these tables, and tests/test_catalog.py fails when
a public mask factory (anything in `attnlab.masks.__all__` returning a Mask) or a backend of the
dispatch registry has no entry here.

To add a mask kind: append a `MaskCase` to MASKS (its `covers` names the factories and operators
it exercises). To add a backend: add a `Backend` to BACKENDS saying what it runs. Nothing else:
the sweeps pick new entries up.

Sizes: a case is built for one call shape, `build(B, H, L, S) -> Mask`; the sweeps call it with
B = 2, H = 4 (GQA over Hkv = 2) and L ≠ S both ways. `truth(B, H, L, S)`, where given, is the mask
written out independently of the code under test (bool, broadcastable to (B, H, L, S)); else the
mask's own `to_dense` (itself tested pair by pair against definitions in tests/masks).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnlab import masks

# -- masks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskCase:
    name: str
    build: Callable  # (B, H, L, S) -> Mask
    covers: tuple[str, ...]  # public factories and operators ("&", "|", "~") it exercises
    truth: Callable | None = None  # (B, H, L, S) -> bool (B|1, H|1, L, S), written out
    interval: bool = False  # every row attends one key interval (the interval kernel runs it)
    tags: frozenset = field(default_factory=frozenset)  # "per_batch", "per_head", "function", ...


def _grid(B, H, L, S):
    """Broadcast index grids b (B,1,1,1), h (1,H,1,1), i (1,1,L,1), j (1,1,1,S)."""
    return (torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None],
            torch.arange(L)[None, None, :, None], torch.arange(S)[None, None, None, :])


def _docs(n: int, sizes=(7, 12, 3)) -> torch.Tensor:
    """Segment ids over n positions: runs of the given sizes, repeating."""
    ids, seg = [], 0
    while len(ids) < n:
        ids += [seg] * sizes[seg % len(sizes)]
        seg += 1
    return torch.tensor(ids[:n])


def periodic(b, h, q, k):
    """A mask no built-in kind is: every fifth diagonal off."""
    return (q - k) % 5 != 2


def checker(b, h, q, k):
    """Depends on b and h (issue 35 item 1: never evaluated at b = h = 0 only)."""
    return ((q + k + b + 2 * h) % 3 != 0) | (q == k)


def sliding8(b, h, q, k):
    """sliding_window(8) as a function: interval-shaped."""
    return (q >= k) & (q - k < 8)


def _checker_truth(B, H, L, S):
    return checker(*_grid(B, H, L, S))


def _dense_rand(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) > 0.35


def _window_truth(left, right, off=lambda B, L, S: S - L):
    def truth(B, H, L, S):
        _b, _h, i, j = _grid(B, H, L, S)
        o = off(B, L, S)
        return (j >= i + o - left) & (j <= i + o + right)
    return truth


def _lens(B, n, drop):
    """B lengths from n downwards (n, n - drop, ...), at least 1."""
    return [max(1, n - drop * b) for b in range(B)]


def _ragged_q_only_truth(B, H, L, S):
    ql = torch.tensor(_lens(B, L, 4))[:, None, None, None]
    _b, _h, i, j = _grid(B, H, L, S)
    return j <= i + S - ql  # a missing key_lengths is the padded S


def _block_causal_truth(B, H, L, S):
    q_len, k_len = [L // 2, L - L // 2], [S // 3, S - S // 3]
    out = torch.zeros(1, 1, L, S, dtype=torch.bool)
    q0 = k0 = 0
    for ql, kl in zip(q_len, k_len):
        for i in range(ql):
            for j in range(kl):
                out[0, 0, q0 + i, k0 + j] = j <= i + kl - ql
        q0, k0 = q0 + ql, k0 + kl
    return out


#: per-row look-back windows (lo, hi) of a scalar-only mask_mod: `w = BOUNDS[q % 4]; w[0]`
BOUNDS = torch.tensor([[0, 3], [1, 5], [0, 8], [2, 4]])


def lookup_window(b, h, q, k):
    """Keys q - hi .. q - lo, (lo, hi) looked up per row: runs only on scalars (Flex's vmap)."""
    w = BOUNDS[q % 4]
    return (q - k >= w[0]) & (q - k <= w[1])


def _lookup_truth(B, H, L, S):
    _b, _h, i, j = _grid(B, H, L, S)
    w = BOUNDS[i % 4]  # (1, 1, L, 1, 2)
    return (i - j >= w[..., 0]) & (i - j <= w[..., 1])


def flex_block_mask(fn, per_bh=False, block=16):
    """A case built as attnlab.flex_attention receives it: torch's create_block_mask(fn) (B=None,
    H=None unless per_bh), read by attnlab.flex as a Mask (its blocks, fn in its Flex form)."""
    def build(B, H, L, S):
        from attnlab.flex import BlockMaskMask, create_block_mask
        from attnlab.flexfn import Adapted

        bm = create_block_mask(fn, B if per_bh else None, H if per_bh else None, L, S,
                               device="cpu", BLOCK_SIZE=block)
        return BlockMaskMask(bm, Adapted(fn, score=False))
    return build


MASKS: list[MaskCase] = [
    MaskCase("causal", lambda B, H, L, S: masks.causal(), ("causal",), interval=True),
    MaskCase("causal_br", lambda B, H, L, S: masks.causal("bottom_right"), ("causal",),
             interval=True),
    MaskCase("sliding", lambda B, H, L, S: masks.sliding_window(7), ("sliding_window",),
             interval=True),
    MaskCase("sliding_br", lambda B, H, L, S: masks.sliding_window(5, "bottom_right"),
             ("sliding_window",), interval=True),
    MaskCase("prefix_lm", lambda B, H, L, S: masks.prefix_lm(5), ("prefix_lm", "|"),
             interval=True),
    MaskCase("prefix_lm_per_batch", lambda B, H, L, S: masks.prefix_lm(_lens(B, 9, 4)),
             ("prefix_lm", "|"), interval=True, tags=frozenset({"per_batch"})),
    MaskCase("padding_keys", lambda B, H, L, S: masks.padding(key_lengths=_lens(B, S, 5)),
             ("padding",), interval=True, tags=frozenset({"per_batch"})),
    MaskCase("padding_both", lambda B, H, L, S: masks.padding(key_lengths=S - 3,
                                                              query_lengths=_lens(B, L, 6)),
             ("padding",), interval=True, tags=frozenset({"per_batch"})),
    MaskCase("document", lambda B, H, L, S: masks.document(_docs(L), _docs(S, (9, 14, 4))),
             ("document",), interval=True),
    MaskCase("document_per_batch",
             lambda B, H, L, S: masks.document(torch.stack([_docs(L, (3 + b, 11)) for b in
                                                            range(B)])) if L == S else
             masks.document(torch.stack([_docs(L, (3 + b, 11)) for b in range(B)]),
                            torch.stack([_docs(S, (5 + b, 13)) for b in range(B)])),
             ("document",), tags=frozenset({"per_batch"})),
    MaskCase("window", lambda B, H, L, S: masks.window(3, 2), ("window",), interval=True),
    MaskCase("window_br", lambda B, H, L, S: masks.window(4, 1, "bottom_right"), ("window",),
             truth=_window_truth(4, 1), interval=True),
    MaskCase("window_ragged",
             lambda B, H, L, S: masks.window(6, 0, "bottom_right", query_lengths=_lens(B, L, 4),
                                             key_lengths=_lens(B, S, 7)),
             ("window",), interval=True, tags=frozenset({"per_batch"})),
    MaskCase("ragged_causal",
             lambda B, H, L, S: masks.ragged_causal(_lens(B, L, 4), _lens(B, S, 7))
             & masks.padding(key_lengths=_lens(B, S, 7), query_lengths=_lens(B, L, 4)),
             ("ragged_causal", "padding", "&"), interval=True, tags=frozenset({"per_batch"})),
    MaskCase("ragged_causal_q_only",
             lambda B, H, L, S: masks.ragged_causal(query_lengths=_lens(B, L, 4)),
             ("ragged_causal",), truth=_ragged_q_only_truth, interval=True,
             tags=frozenset({"per_batch"})),
    MaskCase("block_diagonal",
             lambda B, H, L, S: masks.block_diagonal([L // 2, L - L // 2], [S // 3, S - S // 3],
                                                     left=5, right=2),
             ("block_diagonal",), interval=True),
    MaskCase("block_causal",
             lambda B, H, L, S: masks.block_causal([L // 2, L - L // 2], [S // 3, S - S // 3],
                                                   "bottom_right"),
             ("block_causal",), truth=_block_causal_truth, interval=True),
    MaskCase("from_dense", lambda B, H, L, S: masks.from_dense(_dense_rand((L, S), 1)),
             ("from_dense",)),
    MaskCase("from_dense_per_head", lambda B, H, L, S: masks.from_dense(_dense_rand((H, L, S), 2)),
             ("from_dense",), tags=frozenset({"per_head"})),
    MaskCase("from_dense_per_batch_head",
             lambda B, H, L, S: masks.from_dense(_dense_rand((B, H, L, S), 3)),
             ("from_dense",), tags=frozenset({"per_batch", "per_head"})),
    MaskCase("function", lambda B, H, L, S: masks.from_function(periodic), ("from_function",),
             tags=frozenset({"function"})),
    MaskCase("function_interval", lambda B, H, L, S: masks.from_function(sliding8),
             ("from_function",), interval=True, tags=frozenset({"function"})),
    MaskCase("function_bh", lambda B, H, L, S: masks.from_function(checker), ("from_function",),
             truth=_checker_truth, tags=frozenset({"function", "per_batch", "per_head"})),
    MaskCase("function_bh_sized",
             lambda B, H, L, S: masks.from_function(checker, batch_size=B, heads=H),
             ("from_function",), truth=_checker_truth,
             tags=frozenset({"function", "per_batch", "per_head"})),
    MaskCase("and", lambda B, H, L, S: masks.causal() & masks.document(_docs(L), _docs(S)),
             ("causal", "document", "&"), interval=True),
    MaskCase("or_prefix_window",
             lambda B, H, L, S: masks.sliding_window(4) | masks.prefix_lm(3),
             ("sliding_window", "prefix_lm", "|")),
    MaskCase("or_two_diagonals",  # at S = L + 2: keys i and i + 2, a one-key gap between
             lambda B, H, L, S: masks.sliding_window(1) | masks.window(0, 0, "bottom_right"),
             ("sliding_window", "window", "|")),
    MaskCase("not", lambda B, H, L, S: ~masks.sliding_window(4), ("sliding_window", "~")),
    MaskCase("function_and_padding",
             lambda B, H, L, S: masks.from_function(checker) & masks.padding(
                 key_lengths=_lens(B, S, 5)),
             ("from_function", "padding", "&"),
             truth=lambda B, H, L, S: _checker_truth(B, H, L, S) & (
                 torch.arange(S)[None, None, None, :]
                 < torch.tensor(_lens(B, S, 5))[:, None, None, None]),
             tags=frozenset({"function", "per_batch", "per_head"})),
    MaskCase("flex_block_mask", flex_block_mask(sliding8), ("flex.BlockMask",), interval=True,
             truth=lambda B, H, L, S: sliding8(*_grid(B, H, L, S)),
             tags=frozenset({"function", "block_mask"})),
    MaskCase("flex_block_mask_vmap", flex_block_mask(lookup_window), ("flex.BlockMask",),
             truth=_lookup_truth, interval=True, tags=frozenset({"function", "block_mask"})),
    MaskCase("flex_block_mask_bh", flex_block_mask(checker), ("flex.BlockMask",),
             truth=_checker_truth, tags=frozenset({"function", "block_mask", "per_batch",
                                                   "per_head"})),
    MaskCase("function_or_window",
             lambda B, H, L, S: masks.from_function(periodic) | masks.window(2, 2),
             ("from_function", "window", "|"), tags=frozenset({"function"})),
]

#: operators every catalogue must exercise alongside the factories
OPERATORS = ("&", "|", "~")


def mask_case(name: str) -> MaskCase:
    return next(c for c in MASKS if c.name == name)


def truth(case: MaskCase, B: int, H: int, L: int, S: int) -> torch.Tensor:
    """bool (B, H, L, S): the case's mask written out (its own to_dense where none is given)."""
    t = case.truth(B, H, L, S) if case.truth is not None else case.build(B, H, L, S).to_dense(L, S)
    while t.dim() < 4:
        t = t[None]
    return t.expand(B, H, L, S)


# -- score modifiers (not masks, but they flow through the same paths) ---------------------------


def rel_bias(s, b, h, q, k):
    """A score_mod reading every index."""
    return s - 0.05 * (q - k).abs() * (h + 1) + 0.01 * b


SCORE_MODS = {
    "none": {},
    "score_mod": {"score_mod": rel_bias},
    "softcap": {"softcap": 3.0},
    "alibi": {"alibi": True},  # built per call: masks.alibi(slopes (H,), ...)
}


# -- learned attention sinks (GPT-OSS; `attention(sinks=)`) ------------------------------------

#: the sinks the sweeps run: none, or one logit per query head (the sweeps' H = 4); every backend
#: must run them (each one's out and lse, the sink joined exactly)
SINKS = {
    "no_sinks": None,
    "sinks": torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64),
}


# -- backends ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    name: str
    grad: bool = True  # runs a backward on CPU
    lse: bool = True  # returns the lse
    dtypes: tuple = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
    mods: tuple = ("none", "score_mod", "softcap", "alibi")  # SCORE_MODS it must run
    env: dict = field(default_factory=dict)  # environment the quick sweep sets (ATTNLAB_...)
    note: str = ""


BACKENDS: dict[str, Backend] = {b.name: b for b in [
    Backend("auto"),
    Backend("sdpa"),
    Backend("math"),
    Backend("tiled"),
    Backend("interval", mods=("none", "softcap"),
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            note="interval-shaped calls only; anything else raises AttnlabError"),
    Backend("decode", mods=("none", "softcap"),
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            note="the decode kernel, forced at any number of rows: interval-shaped calls only"),
    Backend("reference", grad=False, mods=("none",),
            note="NumPy float64: no autograd, no score modifiers (refused)"),
    Backend("flex", grad=False, env={"ATTNLAB_FLEX_COMPILE": "0"},
            note="CPU: forward only; the quick sweep runs torch's eager Flex"),
]}


def registry_backends() -> tuple[str, ...]:
    """The backend names the dispatch registry offers (`attnlab.BACKENDS`)."""
    import attnlab

    return tuple(attnlab.BACKENDS)


def backends() -> list[Backend]:
    """The catalogued backends the registry has (one not merged yet is left out)."""
    have = set(registry_backends())
    return [b for b in BACKENDS.values() if b.name in have]


# -- dtypes ------------------------------------------------------------------------------------

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)

# -- context parallelism -----------------------------------------------------------------------

CP_STRATEGIES = ("ring", "allgather", "ulysses", "hybrid")
CP_LAYOUTS = ("contiguous", "zigzag", "striped")
CP_WORLDS = (1, 2, 3)

# -- sampling ----------------------------------------------------------------------------------


def covering(axes: dict[str, list], seed: int = 0) -> list[dict]:
    """A small sample of the product of `axes` in which every value of every axis appears at
    least once (the longest axis sets the count; the others cycle, shuffled by `seed`), so the
    quick sweep touches everything; the full product runs under the slow mark."""
    rng = random.Random(seed)
    n = max(len(v) for v in axes.values())
    cols = {}
    for name, vals in axes.items():
        order = list(vals)
        rng.shuffle(order)
        cols[name] = [order[i % len(order)] for i in range(n)]
    return [{name: cols[name][i] for name in axes} for i in range(n)]


def product(axes: dict[str, list]) -> list[dict]:
    """Every combination of `axes`."""
    out = [{}]
    for name, vals in axes.items():
        out = [{**d, name: v} for d in out for v in vals]
    return out


def split(axes: dict[str, list], seed: int = 0, ident=None):
    """(quick, slow): the covering sample, and the rest of the product."""
    quick = covering(axes, seed)
    ident = ident or (lambda d: tuple(_key(v) for v in d.values()))
    seen = {ident(d) for d in quick}
    slow = [d for d in product(axes) if ident(d) not in seen]
    return quick, slow


def _key(v):
    return getattr(v, "name", v) if not isinstance(v, torch.dtype) else str(v)


def case_id(d: dict) -> str:
    return "-".join(str(_key(v)).replace("torch.", "") for v in d.values())
