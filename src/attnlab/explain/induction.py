"""The induction story on a causal model attnlab trained, end to end: find the induction head,
ablate it, watch the loss on the second copy of a repeated random sequence jump while the first
copy's stays, and patch it back.

    >>> story = induction_story(load_model("runs/tiny-induction"), n=30)
    >>> story.rows[1]        # ('layer 2 head 1 (induction) zero-ablated', first, second)

The sequence is n random characters from those that make up most of the training corpus, then
the same n again (`attnlab heads --repeat-random`'s probe). In the first copy nothing can be
predicted from context; in the second, every character after the first can be copied from one
period back: what induction heads do. Loss on the first copy: targets 1..n-1; on the second:
targets n+1..2n-1 (the first character of the second copy is not predictable either).
Rows: the model as trained; the induction head (the highest induction score) zero-ablated and
mean-ablated (its mean over windows of the corpus); every head labelled induction ablated at
once, when there are several; the previous-token head (the highest prev score below it) ablated;
and that ablation again with the induction head's context vector patched back from the run as
trained: the previous-token head matters through the induction head when the second copy's
loss comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.explain.head_statistics import head_stats
from attnlab.explain.model import LoadedModel
from attnlab.explain.probe import _trained_ids, random_tokens, repeat_random
from attnlab.interventions import (
    Ablate,
    HeadOutputs,
    MeanAblate,
    Patch,
    intervene,
    record_heads,
    sweep,
)
from attnlab.interventions.measures import text_loss


@dataclass
class InductionStory:
    """rows: (what, loss on the first copy, loss on the second copy); first / second (layers,
    H): each head's zero ablation's change of the two losses; induction / prev: the (layer,
    head) found and its score."""

    model_name: str
    n: int
    seed: int
    induction: tuple[int, int]
    induction_score: float
    prev: tuple[int, int] | None
    prev_score: float | None
    labels: list[list[str]]
    ids: list[int] = field(default_factory=list)
    rows: list[tuple[str, float, float]] = field(default_factory=list)
    first: np.ndarray | None = None
    second: np.ndarray | None = None

    def to_json(self) -> dict:
        return {"model": self.model_name, "n": self.n, "seed": self.seed, "ids": self.ids,
                "induction": list(self.induction), "induction_score": self.induction_score,
                "prev": None if self.prev is None else list(self.prev),
                "prev_score": self.prev_score,
                "rows": [{"what": w, "first_copy_loss": round(a, 6),
                          "second_copy_loss": round(b, 6)} for w, a, b in self.rows],
                "first_copy_effect": np.round(self.first, 6).tolist(),
                "second_copy_effect": np.round(self.second, 6).tolist()}


def _corpus_windows(loaded: LoadedModel, length: int, k: int = 8) -> list[list[int]]:
    """k windows of `length` ids of the training corpus (evenly spaced), for mean ablation;
    random tokens when the checkpoint names no corpus."""
    from attnlab.models.checkpoint_checks import parse_doc
    from attnlab.models.corpus import load_corpus

    try:
        corpus = ((parse_doc(Path(loaded.path)).get("train") or {}).get("corpus"))
        ids = loaded.tokenizer.encode(load_corpus(corpus))
    except (AttnlabError, AttributeError, KeyError, ValueError, TypeError):
        vocab = loaded.model.config.vocab_size
        g = torch.Generator().manual_seed(0)
        return torch.randint(vocab, (k, length), generator=g).tolist()
    step = max(1, (len(ids) - length) // k)
    return [list(ids[i * step:i * step + length]) for i in range(k)]


@torch.no_grad()
def induction_story(loaded: LoadedModel, n: int = 30, *, seed: int = 0) -> InductionStory:
    if loaded.kind != "attnlab":
        raise AttnlabError(f"--model {loaded.name}: the induction story runs on a causal model "
                           "attnlab trained (attnlab train)")
    model = loaded.model.eval()
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= model.config.block_size // 2:
        raise AttnlabError(f"--repeat-random {n}: expected 2..{model.config.block_size // 2} "
                           f"(two copies in the block size {model.config.block_size})")
    stats = head_stats(repeat_random(loaded, n, seed=seed))
    ind_scores, prev_scores = stats["induction"], stats["prev"]
    il, ih = np.unravel_index(np.nanargmax(ind_scores), ind_scores.shape)
    ind = (int(il), int(ih))
    prev = None
    if il > 0:
        pl, ph = np.unravel_index(np.nanargmax(prev_scores[:il]), prev_scores[:il].shape)
        prev = (int(pl), int(ph))
    seq = random_tokens(_trained_ids(loaded, n), n, seed)
    idx = torch.tensor([seq + seq])
    ids = idx[0]

    def losses(logits) -> tuple[torch.Tensor, torch.Tensor]:
        return text_loss(logits, ids, 1, n), text_loss(logits, ids, n + 1, 2 * n)

    story = InductionStory(model_name=loaded.name, n=n, seed=seed, induction=ind,
                           induction_score=float(ind_scores[ind]), prev=prev,
                           prev_score=None if prev is None else float(prev_scores[prev]),
                           labels=stats.labels, ids=seq + seq)
    with record_heads(model) as clean:
        first, second = losses(model(idx)[0])
    story.rows.append(("as trained", float(first), float(second)))
    name = f"layer {ind[0]} head {ind[1]} (induction {story.induction_score:.2f})"
    with intervene(model, Ablate(*ind)):
        story.rows.append((f"{name} zero-ablated", *map(float, losses(model(idx)[0]))))
    runs = []
    for window in _corpus_windows(loaded, 2 * n):
        with record_heads(model) as rec:
            model(torch.tensor([window]))
        runs.append(rec)
    with intervene(model, MeanAblate(*ind, HeadOutputs.average(runs))):
        story.rows.append((f"{name} mean-ablated (mean over the corpus)",
                           *map(float, losses(model(idx)[0]))))
    labelled = [(lyr, h) for lyr, row in enumerate(stats.labels) for h, tags in enumerate(row)
                if "induction" in tags]
    if len(labelled) > 1:
        with intervene(model, [Ablate(*x) for x in labelled]):
            heads = ", ".join(f"{lyr}.{h}" for lyr, h in labelled)
            story.rows.append((f"every head labelled induction ({heads}) zero-ablated",
                               *map(float, losses(model(idx)[0]))))
    if prev is not None:
        pname = f"layer {prev[0]} head {prev[1]} (previous-token {story.prev_score:.2f})"
        with intervene(model, Ablate(*prev)):
            story.rows.append((f"{pname} zero-ablated", *map(float, losses(model(idx)[0]))))
        with intervene(model, [Ablate(*prev), Patch(*ind, clean)]):
            story.rows.append((f"  and layer {ind[0]} head {ind[1]} patched back from the run "
                               "as trained", *map(float, losses(model(idx)[0]))))
    out, heads = sweep(model, lambda: model(idx)[0])
    f, s = losses(out)
    L, H = ind_scores.shape
    story.first, story.second = np.full((L, H), np.nan), np.full((L, H), np.nan)
    for (lyr, h), a, b in zip(heads, f[1:].tolist(), s[1:].tolist()):
        story.first[lyr, h], story.second[lyr, h] = a - float(f[0]), b - float(s[0])
    return story
