"""Non-finite ALiBi slopes are refused, naming the argument and showing the values (a slope of
inf or NaN gave each backend its own answer for that head: inf - inf, 0 · inf)."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops.api import attention_with_weights

BAD = [float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("backend", ["auto", "math", "tiled", "sdpa"])
def test_attention_refuses_non_finite_slopes(bad, backend):
    q = torch.randn(1, 3, 5, 8)
    slopes = torch.tensor([0.5, bad, 0.25])
    with pytest.raises(AttnlabError, match=r"alibi_slopes: expected finite values, got "
                                           r"\[0\.5, (-?inf|nan), 0\.25\].*index \[1\]"):
        attnlab.attention(q, q, q, is_causal=True, alibi_slopes=slopes, backend=backend)


@pytest.mark.parametrize("bad", BAD)
def test_every_entry_point_refuses(bad):
    q = torch.randn(1, 2, 4, 8)
    slopes = torch.tensor([bad, 1.0])
    with pytest.raises(AttnlabError, match="alibi_slopes"):
        attnlab.select_backend(q, q, q, alibi_slopes=slopes)
    with pytest.raises(AttnlabError, match="alibi_slopes"):
        attention_with_weights(q, q, q, alibi_slopes=slopes)
    with pytest.raises(AttnlabError, match="alibi_slopes"):
        attnlab.attention_weights(q, q, torch.zeros(1, 2, 4), alibi_slopes=slopes)
    with pytest.raises(AttnlabError, match="slopes: expected finite"):
        masks.alibi(slopes)


def test_finite_slopes_still_run():
    q = torch.randn(1, 2, 4, 8)
    out = attnlab.attention(q, q, q, alibi_slopes=torch.tensor([-3.0, 1e30]), backend="math")
    assert torch.isfinite(out).all()
