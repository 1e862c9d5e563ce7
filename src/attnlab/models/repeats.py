"""Training windows of text that repeats itself: the `repeat_prob` option of TrainConfig.

    >>> x, y = batch(data, 16, 128, seed, step)
    >>> x, y = repeat_windows(x, y, prob=0.5, seed=seed, index=step)

Each window (a row of x with its last target: block_size + 1 characters of the corpus) is, with
probability `prob`, replaced by its own first `n` characters repeated until the window is full,
with the period n uniform in [`min_period`, (block_size + 1) // 2] (so at least two copies).
After the first copy every character can be predicted by looking back to where the current
character came one period earlier and reading the character after it: what induction heads do
(Olsson et al. 2022). The period changes from window to window, so counting positions does not
work; matching content does. Plain Shakespeare repeats itself too (names, words, refrains), but
rarely at length: in a small model on a CPU the copying circuit forms there only slowly.

Like `batches.batch`, the choices depend only on (seed, index), drawn from a generator of their
own, so a resumed run sees the same windows. Validation windows are never repeated.
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError

#: salt of the repeats' generator: never the stream `batch` draws its windows from
_SALT = 7_919


def repeat_periods(B: int, L: int, *, prob: float, seed: int, index: int,
                   min_period: int = 8) -> list[int | None]:
    """Per row of a (B, L) batch, the period `repeat_windows` gives it (None: left as it was)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + index) * _SALT + 1)
    picks = torch.rand(B, generator=g) < prob
    u = torch.rand(B, generator=g)
    longest = (L + 1) // 2
    return [min_period + int(u[r] * (longest - min_period + 1)) if picks[r] else None
            for r in range(B)]


def repeat_windows(x: torch.Tensor, y: torch.Tensor, *, prob: float, seed: int, index: int,
                   min_period: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) (B, L) with each row, with probability `prob`, made of its first n characters
    repeated (`repeat_periods`); new tensors, the inputs are not changed."""
    if x.shape != y.shape or x.dim() != 2:
        raise AttnlabError(f"x, y: expected two (B, L) batches, got {tuple(x.shape)} and "
                           f"{tuple(y.shape)}")
    if isinstance(prob, bool) or not 0.0 <= prob <= 1.0:
        raise AttnlabError(f"prob: expected a probability in [0, 1], got {prob!r}")
    B, L = x.shape
    if not 1 <= min_period <= (L + 1) // 2:
        raise AttnlabError(f"min_period: expected 1..{(L + 1) // 2} (two copies in a window of "
                           f"{L + 1}), got {min_period}")
    window = torch.cat([x, y[:, -1:]], dim=1)  # (B, L + 1): the corpus text of each row
    for r, n in enumerate(repeat_periods(B, L, prob=prob, seed=seed, index=index,
                                         min_period=min_period)):
        if n is not None:
            window[r] = window[r, :n].repeat(-(-(L + 1) // n))[:L + 1]  # (n,) -> (L + 1,)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()
