"""What one token borrows from the others, in every layer and head of a model run.

Works on `ModelAttention`, so Hugging Face models and GPTs attnlab trained share this code.

    >>> att = run_model("The cat sat on the mat because it was tired.")
    >>> focus = find_token(att.tokens, "it")
    >>> report = explain_token(att, focus, special={"[CLS]", "[SEP]"})
    >>> report.detail.layer, report.detail.head
    >>> report.to_json()          # what `attnlab explain --json` prints

What a weight shows (`READING`): how much one head, in one layer, mixes each token's value into
the focus token; where that head looks, not why the model decides anything, nor what reaches the
output. The report therefore carries attention rollout beside it (`rollout`: every layer, heads
averaged, the residual counted) and the detail head's layer averaged over its heads
(`layer_mean`), so the two answers can be compared.

Ranking ("the top-ranked head"): the head that puts the largest weight on any one other token,
not counting the token itself and the model's special tokens ([CLS], [SEP], <s>...), where many
heads park attention they do not need, and leaving out positional heads: a head whose favourite key
sits at the same offset (previous token, next token) for at least 75% of the text's tokens looks at
that neighbour whatever the word, so it says little about this word.
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.explain.residual import residual_matrices, rollout_of
from attnlab.tracing import jsonable

#: what one attention weight does and does not show, in one line (explain prints it)
READING = ("A weight is how much one head, in one layer, mixes a token's value into {word}: "
           "where that head looks, not why the model decides anything, nor what reaches the "
           "output (other heads, later layers and the residual stream mix everything again).")


@dataclass
class TokenHead:
    """Token `index` and the head (layer, head) giving it the most of the focus token's attention,
    that `weight`, whether it is that head's largest weight (`top_pick`), and whether the focus
    may attend the token at all (`allowed`)."""

    index: int
    token: str
    layer: int
    head: int
    weight: float
    top_pick: bool
    allowed: bool


@dataclass
class RankedHead:
    """A head of the ranking: its largest `weight` on one counted `token` (an index)."""

    layer: int
    head: int
    token: int
    weight: float


@dataclass
class PositionalHead:
    """A head whose favourite key sits `offset` tokens from the query, whatever the word."""

    layer: int
    head: int
    offset: int


@dataclass
class HeadWeights:
    """One head's weights (S,) from the focus token; None where NaN."""

    layer: int
    head: int
    weights: list


@dataclass
class Contribution:
    """weight_j · value_j of token `index`: its length `norm` and its `share`, the projection on
    the context vector (all shares add up to 1)."""

    index: int
    token: str
    weight: float
    norm: float
    share: float


@dataclass
class HeadDetail:
    """The lesson's steps for one head, filled from the model, for the focus token over every key:
    compare (`scores` = q·k), scale (`scaled_scores`, times `scale`), mask (`mask`, True = may
    attend), normalize (`weights`, softmax recomputed in float64; `model_weights` the model's),
    borrow (`contributions`, largest first, and the context vector's length `context_norm`).
    `why` says how the head was chosen."""

    layer: int
    head: int
    scale: float
    scores: list[float]
    scaled_scores: list[float]
    mask: list[bool]
    weights: list[float]
    model_weights: list[float]
    context_norm: float
    contributions: list[Contribution]
    why: str = ""
    head_dim: int | None = None


@dataclass
class ExplainReport:
    """Everything `attnlab explain` shows: the text as `tokens`, the word's `pieces` and the token
    speaking for it (`focus`), the `target`'s pieces (or None), the `special` token indices, every
    head's weights from the focus (`heads`), the best head per token (`per_token`), the `ranking`,
    the `positional_heads` left out of it, and one head in `detail`; `rollout` (S,) is the focus
    token's row of attention rollout (every layer, heads averaged, residual counted; None for a
    cross-attention), `layer_mean` (S,) the detail head's layer with its heads averaged, `also`
    the other tokens spelling the same word (a repeated word: index it to explain another).
    `to_json()` is the JSON of `attnlab explain --json`."""

    model: str
    word: str
    tokens: list[str]
    focus: int
    pieces: list[int]
    target: list[int] | None
    special: list[int]
    causal: bool
    heads: list[HeadWeights]
    per_token: list[TokenHead]
    ranking: list[RankedHead]
    positional_heads: list[PositionalHead]
    detail: HeadDetail
    rollout: list[float] | None = None
    layer_mean: list[float] | None = None
    also: list[list[int]] | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _norm(piece: str) -> str:
    """A token as plain lower-case text: word-piece and space marks (##, ▁, Ġ, ␣) removed."""
    for mark in ("\u2581", "\u0120", "\u2423"):
        piece = piece.replace(mark, "")
    return piece.removeprefix("##").strip().lower()


def _unaccented(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))


def _word_edges(tokens: list[str], normed: list[str]):
    """(starts, ends): may a word start / end at each token? Word pieces ("##red") continue a
    word; in a character-level text, words are the runs between non-letters."""
    n = len(tokens)
    char_level = all(len(t) <= 1 for t in tokens)
    starts, ends = [], []
    for i in range(n):
        cont_next = i + 1 < n and tokens[i + 1].startswith("##")
        if char_level:
            starts.append(i == 0 or not normed[i - 1].isalnum())
            ends.append(i + 1 == n or not normed[i + 1].isalnum())
        else:
            starts.append(not tokens[i].startswith("##"))
            ends.append(not cont_next)
    return starts, ends


def find_word(tokens: list[str], word: str | int) -> list[int]:
    """The positions of `word` in `tokens`: [i] for a whole token or an index, or the run of
    word pieces that spell it ("tired" = "ti", "##red"). Whole words first, then any match;
    first occurrence (pass an index for another). Raises AttnlabError listing the tokens when the
    word is not there."""
    if isinstance(word, int) or (isinstance(word, str) and word.strip().lstrip("-").isdigit()):
        i = int(word)
        if not -len(tokens) <= i < len(tokens):
            raise AttnlabError(f"token index {i}: out of range, the text has {len(tokens)} "
                               f"tokens: {_listing(tokens)}")
        return [i % len(tokens)]
    want = _norm(str(word))
    if not want:
        raise AttnlabError(f"token {word!r}: empty; give a word of the text or a token index")
    normed = [_norm(t) for t in tokens]
    starts, ends = _word_edges(tokens, normed)
    # as written first; then without accents, as an uncased tokenizer reads "café" ("cafe")
    for strip in (lambda x: x, _unaccented):
        w, names = strip(want), [strip(t) for t in normed]
        for whole in (True, False):
            for i in range(len(tokens)):
                if not names[i] or (whole and not starts[i]):
                    continue
                acc = ""
                for j in range(i, len(tokens)):
                    acc += names[j]
                    if acc == w and (ends[j] or not whole):
                        return list(range(i, j + 1))
                    if not w.startswith(acc):
                        break
    raise AttnlabError(f"token {word!r}: not in the text; its tokens are {_listing(tokens)} "
                       "(pass a word from this list or its index)")


def other_occurrences(tokens: list[str], pieces: list[int]) -> list[list[int]]:
    """The other runs of tokens that spell the same word as `pieces` (a repeated word), each as
    its token indices, in text order."""
    normed = [_norm(t) for t in tokens]
    want = [normed[i] for i in pieces]
    n = len(want)
    starts, ends = _word_edges(tokens, normed)
    out = []
    for i in range(len(tokens) - n + 1):
        run = list(range(i, i + n))
        if run != pieces and normed[i:i + n] == want and starts[i] and ends[i + n - 1]:
            out.append(run)
    return out


def _listing(tokens: list[str]) -> str:
    return " ".join(f"{i}:{t}" for i, t in enumerate(tokens))


def focus_of(att: ModelAttention, pieces: list[int]) -> int:
    """The piece whose query stands for a split word: the last one in a causal model (it has
    seen the whole word), the first one otherwise."""
    return pieces[-1] if att.causal else pieces[0]


def _candidates(att: ModelAttention, focus: int, special) -> np.ndarray:
    """Bool (S,): the tokens `focus` may borrow from that count in rankings."""
    keep = att.mask[focus].astype(bool).copy()
    keep[focus] = False
    for j, tok in enumerate(att.tokens):
        if tok in special:
            keep[j] = False
    return keep


def positional_heads(att: ModelAttention, special=(), threshold: float = 0.75) -> dict:
    """{(layer, head): offset} for heads whose favourite other key is at one fixed offset from
    the query for at least `threshold` of the (non-special) tokens."""
    rows = np.array([t not in special for t in att.tokens])
    idx = np.flatnonzero(rows)
    if len(idx) < 4:  # too few tokens to tell a habit from a choice
        return {}
    w = att.weights[:, :, idx[:, None], idx[None, :]].copy()  # (layers, H, n, n)
    n = len(idx)
    w[..., np.arange(n), np.arange(n)] = -1.0  # not itself
    w = np.where(att.mask[idx[:, None], idx[None, :]], w, -1.0)
    offset = idx[w.argmax(axis=-1)] - idx  # (layers, H, n)
    found = {}
    for l in range(att.n_layers):
        for h in range(att.n_heads):
            values, counts = np.unique(offset[l, h], return_counts=True)
            if counts.max() >= threshold * n:
                found[(l, h)] = int(values[counts.argmax()])
    return found


def rank_heads(att: ModelAttention, focus: int, special=()) -> list[tuple[int, int, int, float]]:
    """(layer, head, token, weight) for every head but the positional ones, largest weight on one
    counted token first."""
    skip = positional_heads(att, special)
    keep = _candidates(att, focus, special)
    if not keep.any():
        keep = att.mask[focus].astype(bool)
    w = np.where(keep, att.weights[:, :, focus, :], -1.0)  # (layers, H, S)
    best = w.argmax(axis=-1)  # (layers, H)
    rows = [(l, h, int(best[l, h]), float(w[l, h, best[l, h]]))
            for l in range(att.n_layers) for h in range(att.n_heads) if (l, h) not in skip]
    if not rows:  # every head positional: rank them all rather than none
        rows = [(l, h, int(best[l, h]), float(w[l, h, best[l, h]]))
                for l in range(att.n_layers) for h in range(att.n_heads)]
    return sorted(rows, key=lambda r: -r[3])


def best_head_per_token(att: ModelAttention, focus: int) -> list[TokenHead]:
    """For each token: the head giving it the most of `focus`'s attention, that weight, and
    whether it is that head's largest weight (`top_pick`: the head borrows mostly from it)."""
    w = att.weights[:, :, focus, :].reshape(-1, att.weights.shape[-1])  # (layers*H, S)
    top = w.argmax(axis=0)
    favourite = w.argmax(axis=1)  # (layers*H,)
    return [TokenHead(index=j, token=tok, layer=int(top[j] // att.n_heads),
                      head=int(top[j] % att.n_heads), weight=float(w[top[j], j]),
                      top_pick=bool(favourite[top[j]] == j), allowed=bool(att.mask[focus, j]))
            for j, tok in enumerate(att.tokens)]


def target_head(att: ModelAttention, focus: int, target: list[int]) -> tuple[int, int]:
    """The head whose weights from `focus` to the target's pieces add up highest."""
    total = att.weights[:, :, focus, :][..., target].sum(axis=-1)  # (layers, H)
    l, h = np.unravel_index(int(total.argmax()), total.shape)
    return int(l), int(h)


def head_detail(att: ModelAttention, focus: int, layer: int, head: int,
                top: int = 5) -> HeadDetail:
    """The lesson's table for one head, filled from the model: focus's score with every key,
    scaled, masked, as a percentage, and the largest contributions to its context vector.

    A contribution is weight_j * value_j; its `share` is its projection on the context vector
    (all shares add up to 1), its `norm` its length.
    """
    layer, head = _check_head(att, layer, head)
    t = att.head_trace(layer, head)
    context = t.output[focus]  # (Dv,)
    parts = t.weights[focus][:, None] * t.value  # (S, 1) * (S, Dv) -> (S, Dv)
    denom = float(context @ context) or 1.0
    share = parts @ context / denom  # (S,)
    norm = np.linalg.norm(parts, axis=-1)
    order = np.argsort(-norm)[: max(int(top), 0)]
    return HeadDetail(
        layer=layer, head=head, scale=float(att.scale),
        scores=t.scores[focus].tolist(), scaled_scores=t.scaled_scores[focus].tolist(),
        mask=att.layer_mask(layer)[focus].astype(bool).tolist(),
        weights=t.weights[focus].tolist(),
        model_weights=att.weights[layer, head, focus].tolist(),
        head_dim=None if att.queries is None else int(np.asarray(att.queries).shape[-1]),
        context_norm=float(np.sqrt(denom)) if context.any() else 0.0,
        contributions=[Contribution(index=int(j), token=att.tokens[j],
                                    weight=float(t.weights[focus][j]), norm=float(norm[j]),
                                    share=float(share[j])) for j in order],
    )


def _check_head(att: ModelAttention, layer: int, head: int) -> tuple[int, int]:
    """(layer, head) as 0-based indices; negative ones count from the last, as in Python."""
    if not -att.n_layers <= layer < att.n_layers:
        raise AttnlabError(f"layer {layer}: out of range, {att.model_name} has layers "
                           f"0..{att.n_layers - 1} (or -{att.n_layers}..-1 from the last)")
    if not -att.n_heads <= head < att.n_heads:
        raise AttnlabError(f"head {head}: out of range, {att.model_name} has heads "
                           f"0..{att.n_heads - 1} (or -{att.n_heads}..-1 from the last)")
    return layer % att.n_layers, head % att.n_heads


def explain_token(att: ModelAttention, word: str | int, *, target: str | int | None = None,
                  layer: int | None = None, head: int | None = None, top: int = 5,
                  special=()) -> ExplainReport:
    """Everything `attnlab explain` shows, as an `ExplainReport`.

    The detail head is (layer, head) when both are given, else the head that borrows most from
    `target`, else the top-ranked head (see the module docstring). `special`: token strings left
    out of the ranking.
    """
    if (layer is None) != (head is None):
        raise AttnlabError("layer and head: give both (0-based) or neither")
    pieces = find_word(att.tokens, word)
    focus = focus_of(att, pieces)
    ranking = rank_heads(att, focus, special)
    target_pieces = None
    if layer is not None:
        chosen, why = _check_head(att, layer, head), "chosen with --layer/--head"
    elif target is not None:
        target_pieces = find_word(att.tokens, target)
        chosen = target_head(att, focus, target_pieces)
        why = f"the head that borrows most from {target!r}"
    else:
        l, h, j, w = ranking[0]
        chosen = (l, h)
        why = f"the top-ranked head: {100 * w:.1f}% on {att.tokens[j]!r}"
    detail = head_detail(att, focus, *chosen, top=top)
    detail.why = why
    return ExplainReport(
        model=att.model_name, word=str(word), tokens=list(att.tokens), focus=focus,
        pieces=pieces, target=target_pieces,
        special=[j for j, t in enumerate(att.tokens) if t in special],
        causal=bool(att.causal),
        heads=[HeadWeights(layer=l, head=h, weights=jsonable(att.weights[l, h, focus]))
               for l in range(att.n_layers) for h in range(att.n_heads)],
        per_token=best_head_per_token(att, focus),
        ranking=[RankedHead(layer=l, head=h, token=j, weight=w)
                 for l, h, j, w in ranking[: max(int(top), 1)]],
        positional_heads=[PositionalHead(layer=l, head=h, offset=o)
                          for (l, h), o in sorted(positional_heads(att, special).items())],
        detail=detail,
        rollout=_rollout_row(att, focus),
        layer_mean=np.nan_to_num(att.weights[detail.layer, :, focus]).mean(0).tolist(),
        also=other_occurrences(att.tokens, pieces),
    )


def _rollout_row(att: ModelAttention, focus: int) -> list[float] | None:
    """Row `focus` of attention rollout (every layer, heads averaged), or None when the capture
    is not a self-attention."""
    w = np.nan_to_num(np.asarray(att.weights, dtype=np.float64))
    if w.shape[-1] != w.shape[-2] or getattr(att, "query_tokens", None) is not None:
        return None
    return rollout_of(residual_matrices(w))[focus].tolist()
