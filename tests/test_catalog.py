"""The catalogue (tests/catalog.py) is complete, and each of its masks is what it says: its dense
matrix, per-row intervals and tile classes agree with the case written out, at L < S, L > S and
S = L + 2 (where two diagonals leave a one-key gap), for every batch and head of the call."""

from __future__ import annotations

import inspect
import typing

import pytest
import torch

import catalog
from attnlab import masks
from attnlab.masks import PARTIAL, Mask

from helpers import tiles_from_dense

B, H = 2, 4
SHAPES = [(37, 53), (53, 37), (20, 22)]


def public_mask_factories() -> set[str]:
    """Every public function of attnlab.masks that returns a Mask (by its annotation)."""
    out = set()
    for name in masks.__all__:
        obj = getattr(masks, name)
        if inspect.isclass(obj) or not callable(obj):
            continue
        ret = typing.get_type_hints(obj).get("return")
        if inspect.isclass(ret) and issubclass(ret, Mask):
            out.add(name)
    return out


def test_every_public_mask_factory_is_catalogued():
    found = public_mask_factories()
    assert {"causal", "from_function", "window", "block_causal"} <= found  # the finder works
    covered = {c for case in catalog.MASKS for c in case.covers}
    missing = sorted(found - covered)
    assert not missing, f"public mask factories with no entry in tests/catalog.py: {missing}"


def test_every_operator_and_form_is_catalogued():
    covered = {c for case in catalog.MASKS for c in case.covers}
    assert set(catalog.OPERATORS) <= covered
    tags = set().union(*(c.tags for c in catalog.MASKS))
    assert {"per_batch", "per_head", "function"} <= tags
    names = [c.name for c in catalog.MASKS]
    assert len(names) == len(set(names)), "two catalogue cases share a name"


def test_every_backend_is_catalogued():
    missing = sorted(set(catalog.registry_backends()) - set(catalog.BACKENDS))
    assert not missing, f"backends of the dispatch registry with no entry in tests/catalog.py: " \
                        f"{missing}"


def test_every_cp_strategy_and_layout_is_catalogued():
    from attnlab.distributed import LAYOUTS
    from attnlab.distributed.cost import STRATEGIES

    assert set(catalog.CP_LAYOUTS) == set(LAYOUTS)
    assert set(catalog.CP_STRATEGIES) == set(STRATEGIES)


def test_a_new_factory_without_an_entry_fails(monkeypatch):
    """The completeness test can fail: a public factory added to attnlab.masks is caught."""

    def stripes(n: int) -> Mask:
        return masks.from_function(lambda b, h, q, k: (k // n) % 2 == 0)

    monkeypatch.setattr(masks, "stripes", stripes, raising=False)
    monkeypatch.setattr(masks, "__all__", [*masks.__all__, "stripes"])
    with pytest.raises(AssertionError, match="stripes"):
        test_every_public_mask_factory_is_catalogued()


def test_covering_sample_touches_every_value():
    axes = {"a": [1, 2, 3], "b": ["x", "y"], "c": [None]}
    quick, slow = catalog.split(axes)
    assert len(quick) == 3 and len(quick) + len(slow) == 6
    for name, vals in axes.items():
        assert {d[name] for d in quick} == set(vals)


@pytest.mark.parametrize("L,S", SHAPES)
@pytest.mark.parametrize("case", catalog.MASKS, ids=lambda c: c.name)
def test_mask_is_its_definition(case, L, S):
    """to_dense (at the call's B and H), intervals and tiles at two block shapes agree with the
    case written out."""
    want = catalog.truth(case, B, H, L, S)  # (B, H, L, S)
    m = case.build(B, H, L, S)
    dense = _at_call(m, B, H).to_dense(L, S)
    assert torch.equal(dense.expand(B, H, L, S), want), f"{case.name}: to_dense"
    iv = _at_call(m, B, H).intervals(L, S)
    if case.interval:
        assert iv is not None, f"{case.name}: interval-shaped but intervals() is None"
    if iv is not None:
        lo, hi = (x.long().expand(B, H, L) for x in iv)
        j = torch.arange(S)
        got = (j >= lo[..., None]) & (j < hi[..., None])
        assert torch.equal(got, want), f"{case.name}: intervals do not describe the mask"
    combined = "&" in case.covers or "|" in case.covers
    for bq, bk in ((16, 8), (16, 32), (7, 5)):  # the same mask object, block sizes in turn
        t = _at_call(m, B, H).tiles(L, S, bq, bk)
        t, exact = t.expand(B, H, *t.shape[2:]), tiles_from_dense(want, bq, bk)
        if combined:  # & and | are conservative: EMPTY and FULL exact, PARTIAL may be either
            t = torch.where(t == PARTIAL, exact, t)
        assert torch.equal(t, exact), f"{case.name}: tiles at ({bq}, {bk})"


def _at_call(m: Mask, B: int, H: int) -> Mask:
    """The mask as a call of B batch elements and H heads sees it."""
    bind = getattr(m, "for_call", None)
    return bind(B, H) if bind is not None else m


@pytest.mark.parametrize("case", catalog.MASKS, ids=lambda c: c.name)
def test_mask_mod_is_the_mask(case):
    """Mask.mask_mod, how FlexAttention sees each mask, equals the mask on broadcast indices
    (the form attnlab's paths call it in) and on single scalar indices (Flex's vmap form)."""
    L, S = 37, 53
    m = _at_call(case.build(B, H, L, S), B, H)
    mod = m.mask_mod(L, S)
    want = catalog.truth(case, B, H, L, S)
    got = mod(*catalog._grid(B, H, L, S))
    assert torch.equal(got.expand(B, H, L, S), want)
    for b, h, i, j in ((1, 3, 36, 52), (0, 2, 5, 0), (1, 0, 20, 30)):
        t = lambda x: torch.tensor(x)  # noqa: E731
        assert bool(mod(t(b), t(h), t(i), t(j))) == bool(want[b, h, i, j])


def test_flex_asks_each_mask_for_its_mask_mod(monkeypatch):
    """ops.flex has no list of mask kinds: a new kind's own mask_mod is what Flex runs."""
    from attnlab.ops import flex

    seen = []

    class Stripes(Mask):
        def _block(self, rows, cols, L, S):
            return (cols[None, :] % 2 == 0).expand(len(rows), -1)

        def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
            return torch.ones(q_lo.shape[0], k_lo.shape[1], dtype=torch.int8)  # PARTIAL

        def mask_mod(self, L, S, device=None):
            seen.append((L, S))
            return lambda b, h, q, k: k % 2 == 0

    flex.mask_mod_of(Stripes(), 8, 9)
    assert seen == [(8, 9)]
