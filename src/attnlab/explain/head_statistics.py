"""What each head does in general: `head_stats` over one or several texts, and a label per head.

    >>> stats = head_stats([run_model("The cat sat on the mat."), run_model("It was tired.")])
    >>> stats["prev"].shape                      # (layers, heads)
    >>> stats.labels[0][2]                       # 'previous-token'

Every statistic is a (layers, heads) array. For one head, A is its (L, S) weights over the text's
real tokens, rows i = queries, columns j = keys; row i's allowed keys are those its mask allows
(A is 0 elsewhere); a row with no allowed key is left out of every statistic.

- entropy      = mean_i  −Σ_j A_ij · ln A_ij                          (nats; 0 · ln 0 = 0)
- entropy_norm = mean_i [−Σ_j A_ij · ln A_ij] / ln(n_i)               n_i = allowed keys of row i;
                 rows with n_i = 1 left out
- self         = mean_i A_i,i     prev = mean_i A_i,i−1     next = mean_i A_i,i+1
                 (rows whose key i, i−1 or i+1 lies outside the text left out; a masked key
                 counts as 0, so a causal model's `next` is 0)
- first        = mean_{i ≥ 1} A_i,0                                   (the sink / [CLS] mass)
- special      = mean_i Σ_{j special} A_ij       punct = mean_i Σ_{j punctuation} A_ij
- max          = mean_i max_j A_ij
- offset       = the most common o_i = argmax_j A_ij − i (first arg-max in a row; ties between
                 offsets go to the one nearest 0, then the negative one);
  offset_share = the share of rows with o_i = offset
- duplicate    = Σ(A ⊙ P) / ΣA,  P_ij = 1 when token_j = token_i and j < i
- induction    = Σ(A ⊙ P) / ΣA,  P_ij = 1 when token_{j−1} = token_i and j − 1 < i
                 (TransformerLens's "mul" score; P is also restricted to allowed keys, and both
                 sums run over the rows that have at least one such key, so a perfect induction
                 head scores 1 on a repeated sequence where the whole-matrix ratio gives ~½)

Several texts: the mean of the per-text statistics (each text counts once; a statistic a text
cannot define, e.g. `duplicate` without a repeated token, is left out for that text). `offset`:
per text, the share of rows at each offset; the offset with the largest mean share over the texts,
and that mean share as `offset_share`.

Special tokens are the names in `special` (a model's tokenizer knows them: `LoadedModel.
special_tokens`); without it, tokens that look special: [CLS], [SEP], <s>, </s>, <|endoftext|>.
Punctuation tokens: non-empty after word-piece marks are removed, and every character punctuation
(Unicode category P*).
"""

from __future__ import annotations

import math
import re
import unicodedata
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError

#: the statistics, in the order tables, JSON and the page list them
STATS = ("entropy", "entropy_norm", "self", "prev", "next", "first", "special", "punct", "max",
         "offset", "offset_share", "duplicate", "induction")

#: (label, statistic, threshold): a head gets the label whose statistic clears its threshold by
#: the largest factor; "broad" only when no other does; "-" when none does. "special_rest" is the
#: `special` mass on special tokens after position 0 ([SEP], </s>), used only for this label.
LABEL_RULES = (
    ("induction", "induction", 0.4),
    ("previous-token", "prev", 0.5),
    ("next-token", "next", 0.5),
    ("self", "self", 0.5),
    ("sink / [CLS]", "first", 0.5),
    ("[SEP]", "special_rest", 0.5),
    ("punctuation", "punct", 0.5),
    ("broad", "entropy_norm", 0.85),
)
#: "induction" needs this many rows (over all texts) with an induction key: one repeated word in
#: a sentence says nothing; the repeated-random probe (`repeat_random`) gives N such rows
INDUCTION_MIN_ROWS = 8
_SPECIAL = re.compile(r"^(\[[A-Z]+\]|<\|?/?[a-z_]+\|?>)$")


def rules_text() -> str:
    """The label rules with their thresholds, one line (the heads table and the page show it)."""
    parts = []
    for label, stat, t in LABEL_RULES:
        extra = f" (over >= {INDUCTION_MIN_ROWS} rows)" if label == "induction" else ""
        what = "special after position 0" if stat == "special_rest" else stat
        parts.append(f"{label}: {what} >= {t}{extra}")
    return "; ".join(parts)


def looks_special(token: str) -> bool:
    """[CLS], [SEP], [PAD], <s>, </s>, <pad>, <|endoftext|>: the usual special-token spellings."""
    return bool(_SPECIAL.match(token))


def is_punct(token: str) -> bool:
    """True for a token made only of punctuation ("." "," "##." "?!"), word-piece marks removed."""
    text = token
    for mark in ("\u2581", "\u0120", "\u2423"):
        text = text.replace(mark, "")
    text = text.removeprefix("##").strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


@dataclass
class HeadStats:
    """Per-head statistics (each a (layers, heads) float array; NaN where no row defines it) and
    a label per head. `texts` is how many texts they average; `thresholds` the label rules."""

    model: str
    texts: int
    stats: dict[str, np.ndarray]
    labels: list[list[str]]
    thresholds: tuple = LABEL_RULES
    tokens: list[list[str]] = field(default_factory=list)
    #: what labels also read: special_rest (layers, heads), induction_rows (layers,)
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def n_layers(self) -> int:
        return self.stats["entropy"].shape[0]

    @property
    def n_heads(self) -> int:
        return self.stats["entropy"].shape[1]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.stats:
            raise AttnlabError(f"statistic {name!r}: expected one of {', '.join(STATS)}")
        return self.stats[name]

    def ranked(self, sort: str) -> list[tuple[int, int]]:
        """(layer, head) pairs by statistic `sort` descending; NaN last; ties in layer, head
        order (the rows of the heads table)."""
        values = self[sort]
        pairs = [(l, h) for l in range(self.n_layers) for h in range(self.n_heads)]

        def key(p):
            v = float(values[p])
            return (math.isnan(v), -v if not math.isnan(v) else 0.0, p)

        return sorted(pairs, key=key)

    def to_json(self) -> dict:
        """{"model", "texts", "layers", "heads", "stats": {name: [[value per head] per layer]},
        "labels": [[...]]}; NaN becomes null, offsets are ints."""
        def value(name, x):
            if not np.isfinite(x):
                return None
            return int(x) if name == "offset" else round(float(x), 6)

        return {
            "model": self.model, "texts": self.texts, "layers": self.n_layers,
            "heads": self.n_heads,
            "stats": {name: [[value(name, x) for x in row] for row in self.stats[name]]
                      for name in STATS},
            "labels": [list(row) for row in self.labels],
        }


def head_stats(captures: ModelAttention | Sequence[ModelAttention], *,
               special: Iterable[str] | None = None) -> HeadStats:
    """The statistics in this module's docstring for every head, over one or several texts."""
    items = [captures] if hasattr(captures, "weights") else list(captures)
    if not items:
        raise AttnlabError("captures: expected a ModelAttention or a non-empty list of them")
    shape = items[0].weights.shape[:2]
    for k, c in enumerate(items):
        if not hasattr(c, "weights") or c.weights.shape[:2] != shape:
            got = getattr(getattr(c, "weights", None), "shape", type(c).__name__)
            raise AttnlabError(f"captures[{k}]: expected (layers, heads) = {tuple(shape)} like "
                               f"captures[0], got {got}")
    names = None if special is None else frozenset(special)
    per_text = []
    for c in items:
        is_special = [looks_special(t) if names is None else t in names for t in c.tokens]
        masks = c.layer_masks if c.layer_masks is not None else c.mask
        per_text.append(text_stats(c.weights, masks, c.tokens, is_special))
    combined = combine(per_text)
    stats = {name: combined[name] for name in STATS}
    return HeadStats(model=items[0].model_name, texts=len(items), stats=stats,
                     labels=label_heads(combined), tokens=[list(c.tokens) for c in items],
                     extra={k: combined[k] for k in ("special_rest", "induction_rows")})


def with_induction(stats: HeadStats, probe: HeadStats) -> HeadStats:
    """`stats` with `duplicate` and `induction` taken from `probe` (the repeated-random probe's
    statistics: its `induction` is the induction score), labels recomputed."""
    if probe.stats["induction"].shape != stats.stats["induction"].shape:
        raise AttnlabError(f"probe: expected (layers, heads) = {stats.stats['induction'].shape}, "
                           f"got {probe.stats['induction'].shape}")
    new = {**stats.stats, "duplicate": probe.stats["duplicate"],
           "induction": probe.stats["induction"]}
    extra = {**stats.extra, "induction_rows": probe.extra["induction_rows"]}
    return HeadStats(model=stats.model, texts=stats.texts, stats=new,
                     labels=label_heads({**new, **extra}), tokens=stats.tokens, extra=extra)


def text_stats(weights, mask, tokens: Sequence, special: Sequence[bool]) -> dict:
    """Statistics of one text: weights (layers, H, L, S), mask (L, S) or (layers, L, S) bool
    (True = may attend), tokens (S,) compared by equality, special (S,) bool. Returns {name:
    (layers, H)} plus "_offset_shares": {offset: (layers, H) share of rows}."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4:
        raise AttnlabError(f"weights: expected (layers, H, L, S), got shape {w.shape}")
    n_layers, H, L, S = w.shape
    m = np.asarray(mask, dtype=bool)
    if m.shape not in ((L, S), (n_layers, L, S)):
        raise AttnlabError(f"mask: expected (L, S) = {(L, S)} or (layers, L, S) = "
                           f"{(n_layers, L, S)}, got {m.shape}")
    if len(tokens) != S or len(special) != S:
        raise AttnlabError(f"tokens: expected {S} (one per key), got {len(tokens)} tokens and "
                           f"{len(special)} special flags")
    m = np.broadcast_to(m, (n_layers, L, S))[:, None]  # (layers, 1, L, S)
    w = np.where(m, w, 0.0)
    rows = m.any(-1)  # (layers, 1, L): rows with an allowed key
    rows_h = np.broadcast_to(rows, (n_layers, H, L))

    def mean_rows(x, keep):  # x (layers, H, L), keep broadcastable: mean over kept rows
        keep = np.broadcast_to(keep, x.shape) & rows_h
        count = keep.sum(-1)
        total = np.where(keep, x, 0.0).sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), np.nan)

    out = {}
    plogp = np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)
    ent = -plogp.sum(-1)  # (layers, H, L)
    out["entropy"] = mean_rows(ent, True)
    n_allowed = m.sum(-1)  # (layers, 1, L)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["entropy_norm"] = mean_rows(ent / np.log(np.maximum(n_allowed, 2)), n_allowed >= 2)
    i = np.arange(L)
    for name, d in (("self", 0), ("prev", -1), ("next", 1)):
        j = i + d
        ok = (j >= 0) & (j < S)
        diag = np.zeros((n_layers, H, L))
        diag[..., ok] = w[..., i[ok], j[ok]]
        out[name] = mean_rows(diag, ok)
    out["first"] = mean_rows(w[..., 0], i >= 1)
    sp = np.asarray(special, dtype=bool)
    pu = np.array([is_punct(str(t)) for t in tokens])
    out["special"] = mean_rows(w[..., sp].sum(-1), True)
    out["punct"] = mean_rows(w[..., pu].sum(-1), True)
    out["special_rest"] = mean_rows(w[..., sp & (np.arange(S) > 0)].sum(-1), True)
    out["max"] = mean_rows(w.max(-1), True)
    offsets = w.argmax(-1) - i  # (layers, H, L)
    shares = {}
    for o in np.unique(offsets[rows_h]):
        shares[int(o)] = mean_rows((offsets == o).astype(float), True)
    out["_offset_shares"] = shares
    out["offset"], out["offset_share"] = _mode(shares, (n_layers, H))
    toks = list(tokens)
    same = np.array([[toks[a] == toks[b] for b in range(S)] for a in range(L)], dtype=bool)
    earlier = np.arange(S)[None, :] < i[:, None]  # (L, S): j < i
    dup = same & earlier
    ind = np.zeros((L, S), dtype=bool)  # token_{j-1} == token_i and j-1 < i
    ind[:, 1:] = dup[:, :-1]
    out["duplicate"] = _pattern_score(w, dup & m)
    out["induction"] = _pattern_score(w, ind & m)
    out["induction_rows"] = (ind & m).any(-1).sum(-1)[:, 0].astype(float)  # (layers,)
    return out


def _pattern_score(w: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Σ(A ⊙ P) / ΣA over the rows where P has a 1; (layers, H); NaN when no row has one."""
    keep = np.broadcast_to(p.any(-1), w.shape[:-1])  # (layers, 1|H, L)
    hit = np.where(keep, (w * p).sum(-1), 0.0).sum(-1)
    total = np.where(keep, w.sum(-1), 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, hit / np.where(total > 0, total, 1.0), np.nan)


def _mode(shares: dict, shape) -> tuple[np.ndarray, np.ndarray]:
    """(offset, share): per head the offset with the largest share, ties to the nearest 0."""
    offset = np.full(shape, np.nan)
    best = np.full(shape, -1.0)
    for o in sorted(shares, key=lambda o: (abs(o), o)):
        s = np.nan_to_num(shares[o], nan=-1.0)
        better = s > best
        offset = np.where(better, o, offset)
        best = np.where(better, s, best)
    return offset, np.where(best >= 0, best, np.nan)


def combine(per_text: list[dict]) -> dict:
    """The mean over texts of each statistic (NaN-aware); offset from the mean offset shares."""
    out = {}
    with warnings.catch_warnings():  # all-NaN heads stay NaN: no "Mean of empty slice"
        warnings.simplefilter("ignore", RuntimeWarning)
        for name in (*STATS, "special_rest"):
            if name in ("offset", "offset_share"):
                continue
            out[name] = np.nanmean(np.stack([t[name] for t in per_text]), axis=0)
        keys = sorted({o for t in per_text for o in t["_offset_shares"]})
        shape = out["entropy"].shape
        mean_shares = {}
        for o in keys:
            stack = np.stack([t["_offset_shares"].get(o, _zeros_where(t, shape)) for t in per_text])
            mean_shares[o] = np.nanmean(stack, axis=0)
    out["offset"], out["offset_share"] = _mode(mean_shares, shape)
    out["induction_rows"] = sum(t["induction_rows"] for t in per_text)
    return {name: out[name] for name in (*STATS, "special_rest", "induction_rows")}


def _zeros_where(t: dict, shape) -> np.ndarray:
    """A text that never had offset o: share 0 where it has rows, NaN where it has none."""
    return np.where(np.isnan(t["entropy"]), np.nan, np.zeros(shape))


def label_heads(stats: dict) -> list[list[str]]:
    """A label per head from LABEL_RULES (thresholds shown there and in `attnlab heads`)."""
    n_layers, H = stats["entropy"].shape
    labels = []
    for l in range(n_layers):
        row = []
        for h in range(H):
            best, factor = "-", 0.0
            for label, rule, threshold in LABEL_RULES:
                v = float(stats[rule][l, h])
                if label == "broad" and best != "-":
                    continue
                if label == "induction" and stats["induction_rows"][l] < INDUCTION_MIN_ROWS:
                    continue
                if math.isfinite(v) and v >= threshold and v / threshold > factor:
                    best, factor = label, v / threshold
            row.append(best)
        labels.append(row)
    return labels


