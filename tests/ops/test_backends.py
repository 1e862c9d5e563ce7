"""The backend registry: one list of names (`attnlab.BACKENDS`), each backend with one call shape
and its "why not" beside it, every name documented where a user looks, and a forced backend that
cannot run a call refused with its reason before anything is computed."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.errors import AttnlabError
from attnlab.ops import backends, dispatch
from attnlab.ops.validate import make_problem

from helpers import qkv, wrap_backends

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_one_list_of_names():
    assert attnlab.BACKENDS == dispatch.BACKENDS == ("auto", *backends.REGISTRY)
    assert {"sdpa", "interval", "tiled", "math", "reference", "flex"} <= set(backends.REGISTRY)
    for name, b in backends.REGISTRY.items():
        assert b.name == name and b.summary
        assert len(inspect.signature(b.forward).parameters) == 2  # (problem, need_lse)
        assert list(inspect.signature(b.why_not).parameters)[:2] == ["p", "need_lse"]


@pytest.mark.parametrize("name", attnlab.BACKENDS)
def test_every_backend_is_documented(name):
    assert f'"{name}"' in attnlab.attention.__doc__
    table = (DOCS / "use" / "backends.md").read_text()
    assert name == "auto" or f'| `"{name}"` |' in table
    assert f'`"{name}"`' in (DOCS / "use" / "op.md").read_text()


def test_select_backend_docstring_names_what_auto_can_choose():
    doc = attnlab.select_backend.__doc__
    chosen = set(re.findall(r'Choice\("(\w+)"', inspect.getsource(dispatch)))
    assert chosen == {"sdpa", "interval", "decode", "tiled", "math", "flex"}
    for name in chosen:
        assert f'"{name}"' in doc


def _problem(**kw):
    q, k, v = qkv(1, 2, 2, 16, 16, 8, dtype=kw.pop("dtype", torch.float32))
    return make_problem(q, k, v, None, kw.pop("dropout_p", 0.0), False, None, False,
                        mask=kw.pop("mask", None), **kw)


@pytest.mark.parametrize("name", list(backends.REGISTRY))
def test_why_not_is_none_or_a_message_naming_the_argument(name):
    b = backends.REGISTRY[name]
    for kw in ({}, {"mask": masks.causal()}, {"dtype": torch.float64},
               {"mask": masks.causal(), "dropout_p": 0.2}):
        why = b.why_not(_problem(**kw), False)
        assert why is None or re.match(r"^(backend|dtype|dropout_p|mask|attn_mask|score_mod): ",
                                       why), why


def test_a_forced_backend_that_cannot_run_is_refused_before_it_computes(monkeypatch):
    def boom(name, f):
        return lambda p, need_lse: pytest.fail(f"{name} ran")

    wrap_backends(monkeypatch, boom)
    q, k, v = qkv(1, 2, 2, 16, 16, 8, dtype=torch.float64)
    with pytest.raises(AttnlabError, match=r'^dtype: backend "interval" takes'):
        attnlab.attention(q, k, v, is_causal=True, backend="interval")
    with pytest.raises(AttnlabError, match=r'^dropout_p: backend "reference"'):
        attnlab.attention(q, k, v, dropout_p=0.5, backend="reference")


def test_auto_picks_interval_only_where_it_would_run(monkeypatch):
    q, k, v = qkv(1, 2, 2, 64, 64, 8)
    m = masks.sliding_window(8)
    c = attnlab.select_backend(q, k, v, mask=m)
    assert c.backend == ("interval" if backends.interval_why_not(
        make_problem(q, k, v, None, 0.0, False, None, False, mask=m), False) is None else "sdpa")
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    assert attnlab.select_backend(q, k, v, mask=m).backend != "interval"
    c = attnlab.select_backend(q.double(), k.double(), v.double(), mask=m)
    assert c.backend != "interval"
