"""A head's label in words, and why a head has none, on hand-built statistics."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.errors import AttnlabError
from attnlab.explain.head_statistics import STATS, HeadStats, label_heads
from attnlab.explain.head_words import focused_unlabelled, head_words, why_none
from attnlab.explain.probe import repeat_random


def _stats(rows: int, **values) -> HeadStats:
    """One layer, one head: every statistic 0 but those given; `rows` induction rows."""
    stats = {n: np.zeros((1, 1)) for n in STATS}
    stats["entropy_norm"][:] = 0.3
    for k, v in values.items():
        stats[k][:] = v
    extra = {"special_rest": np.zeros((1, 1)), "induction_rows": np.array([float(rows)])}
    return HeadStats(model="m", texts=1, stats=stats, labels=label_heads({**stats, **extra}),
                     extra=extra)


def test_a_label_in_words_with_its_number():
    s = _stats(0, prev=0.9, max=0.9)
    assert s.labels == [["previous-token"]]
    assert head_words(s, 0, 0) == "each token looks at the one before it (prev 0.90 >= 0.5)"


def test_induction_without_enough_rows_is_named_not_counted():
    s = _stats(3, induction=0.7, max=0.2)
    assert s.labels == [["-"]]
    words = head_words(s, 0, 0)
    assert words.startswith("no label: induction 0.70 is not counted, only 3 rows")
    assert _stats(8, induction=0.7).labels == [["induction"]]  # enough rows: the label


def test_focused_without_a_place_picks_by_content():
    s = _stats(0, max=0.7, offset_share=0.2, first=0.4)
    reasons = why_none(s, 0, 0)
    assert reasons[0].startswith("focused (mean largest weight 0.70) but on no fixed place "
                                 "(its commonest offset: 20% of tokens)")
    assert reasons[-1] == "nearest rule: sink / [CLS] (first 0.40 < 0.5)"
    assert focused_unlabelled(s) == [(0, 0)]
    assert focused_unlabelled(_stats(0, max=0.4)) == []


def test_probe_seed_must_be_non_negative():
    with pytest.raises(AttnlabError, match=r"^seed: expected a non-negative"):
        repeat_random(None, 5, seed=-1)
