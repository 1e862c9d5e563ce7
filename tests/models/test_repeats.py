"""Training windows of text that repeats itself (`TrainConfig.repeat_prob`,
`attnlab.models.repeats`)."""

from __future__ import annotations

import pytest
import torch

from attnlab import AttnlabError
from attnlab.models import Trainer
from attnlab.models.batches import batch
from attnlab.models.config import TrainConfig
from attnlab.models.repeats import repeat_periods, repeat_windows

DATA = torch.arange(5000) % 97  # no character comes twice inside a window of 64


def _xy(index=3, B=32, L=64):
    return batch(DATA, B, L, seed=5, index=index)


def test_each_picked_window_is_its_first_characters_repeated():
    x, y = _xy()
    rx, ry = repeat_windows(x, y, prob=0.5, seed=5, index=3)
    periods = repeat_periods(32, 64, prob=0.5, seed=5, index=3)
    assert 4 < sum(n is not None for n in periods) < 28
    assert len({n for n in periods if n is not None}) > 3  # the period changes
    for r, n in enumerate(periods):
        before = torch.cat([x[r], y[r, -1:]])  # the window's 65 characters of text
        after = torch.cat([rx[r], ry[r, -1:]])
        assert torch.equal(rx[r, 1:], ry[r, :-1])  # still inputs and next-character targets
        if n is None:
            assert torch.equal(after, before)
            continue
        assert 8 <= n <= 32
        assert torch.equal(after[:n], before[:n])
        assert all(after[k] == after[k - n] for k in range(n, 65))


def test_repeats_are_seeded_and_leave_their_inputs_alone():
    x, y = _xy()
    x0, y0 = x.clone(), y.clone()
    first = repeat_windows(x, y, prob=0.5, seed=5, index=3)
    again = repeat_windows(x, y, prob=0.5, seed=5, index=3)
    other = repeat_windows(x, y, prob=0.5, seed=5, index=4)
    assert torch.equal(x, x0) and torch.equal(y, y0)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    none = repeat_windows(x, y, prob=0.0, seed=5, index=3)
    assert torch.equal(none[0], x) and torch.equal(none[1], y)
    assert all(n is not None for n in repeat_periods(32, 64, prob=1.0, seed=5, index=3))


def test_repeat_windows_checks_its_arguments():
    x, y = _xy()
    with pytest.raises(AttnlabError, match="prob"):
        repeat_windows(x, y, prob=1.5, seed=0, index=0)
    with pytest.raises(AttnlabError, match=r"x, y"):
        repeat_windows(x, y[:, :10], prob=0.5, seed=0, index=0)
    with pytest.raises(AttnlabError, match="min_period"):
        repeat_windows(x[:, :10], y[:, :10], prob=0.5, seed=0, index=0, min_period=8)
    for bad in (2.0, -0.1, True):
        with pytest.raises(AttnlabError, match="repeat_prob"):
            TrainConfig(repeat_prob=bad)


def test_the_trainer_repeats_training_windows_and_validates_on_plain_text(monkeypatch):
    import attnlab.models.trainer as trainer_mod

    seen = []
    monkeypatch.setattr(trainer_mod, "repeat_windows",
                        lambda *xy, **k: seen.append(k) or repeat_windows(*xy, **k))
    tr = Trainer.start("tiny", model_overrides={"n_layer": 1, "n_embd": 16, "block_size": 32},
                       max_steps=2, batch_size=2, eval_interval=2, eval_batches=1,
                       repeat_prob=0.5)
    tr.run()
    assert seen == [{"prob": 0.5, "seed": tr.config.seed, "index": i} for i in (0, 1)]
    assert TrainConfig.from_dict(tr.config.to_dict()).repeat_prob == 0.5
    assert TrainConfig.from_dict({}).repeat_prob == 0.0  # configs saved before the option
