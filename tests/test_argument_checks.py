"""One check per argument kind, one rule, one wording, wherever the argument is taken: the op
(`attnlab.attention`), the interval kernel's public API (`ops.kernels`) and context parallelism
(`distributed.api`, whose per-rank check is `_describe`). A number is a real number, never a
bool or a string; NaN/Inf are refused where they mean nothing."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import attnlab
from attnlab.errors import AttnlabError, check_dropout, check_int, check_scale, check_softcap

from helpers import qkv

NAN, INF = float("nan"), float("inf")


def _op(**kw):
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    attnlab.attention(q, k, v, backend="math", **kw)


def _kernel_api(**kw):
    from attnlab.ops import kernels

    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    lo, hi = torch.zeros(1, 1, 8, dtype=torch.int32), torch.full((1, 1, 8), 8, dtype=torch.int32)
    kw.setdefault("scale", 0.5)
    if "alibi_slopes" in kw:
        kw["alibi"] = kw.pop("alibi_slopes")
    from attnlab.ops.kernels import gate  # the API's one check, before any build

    gate.check(q, k, v, lo, hi, **kw)
    assert callable(kernels.interval_forward)


def _cp(**kw):
    from attnlab.distributed.api import _describe

    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    args = dict(layout="zigzag", strategy="auto", mask=None, is_causal=False, scale=None,
                enable_gqa=False, softcap=None)
    args.update(kw)
    err = _describe(q, k, v, **args)["error"]
    if err:
        raise AttnlabError(err)


ENTRIES = {"op": _op, "kernel API": _kernel_api, "context parallel": _cp}

BAD = [  # (argument, value, where it is taken, the message)
    *((("softcap", v, ("op", "kernel API", "context parallel"),
        r"^softcap: expected a positive finite number or None, got "))
      for v in (True, "2.0", NAN, INF, -1.0, 0, [2.0], torch.tensor([1.0, 2.0]))),
    *((("scale", v, ("op", "kernel API", "context parallel"),
        r"^scale: expected a finite number( or None)?, got "))  # the kernel's has no default
      for v in (True, "0.5", NAN, -INF, torch.tensor([0.5, 0.5]))),
    *((("dropout_p", v, ("op",), r"^dropout_p: expected a probability in \[0, 1\], got "))
      for v in (True, "0.1", NAN, -0.1, 1.5)),
    *((("dropout_p", v, ("context parallel",),
        r"^dropout_p: expected a probability in \[0, 1\), got "))
      for v in (True, "0.1", NAN, -0.1, 1.0)),
    *((("alibi_slopes", v, ("op", "kernel API"), r"^alibi(_slopes)?: expected "))
      for v in (torch.tensor([0.5, NAN]), torch.tensor([INF, 1.0]), torch.ones(3))),
    # the op takes a float tensor; the kernel API also a list or an integer tensor (as_tensor)
    *((("alibi_slopes", v, ("op",), r"^alibi_slopes: expected a float tensor of shape \(H,\)"))
      for v in (torch.tensor([1, 2]), [0.5, 0.25])),
    *((("q_pos0", v, ("kernel API",), r"^q_pos0: expected an int, got "))
      for v in (True, 1.5, "3")),
    *((("dropout_seed", v, ("context parallel",), r"^dropout_seed: expected an int or None, "))
      for v in (True, 1.5, "3")),
]


@pytest.mark.parametrize("arg, value, where, says", BAD,
                         ids=[f"{a}={v!r}"[:40] for a, v, _, _ in BAD])
def test_bad_values_are_refused_alike_everywhere(arg, value, where, says):
    for name in where:
        with pytest.raises(AttnlabError, match=says) as got:
            ENTRIES[name](**{arg: value})
        first = str(got.value).split(":")[0]
        assert re.fullmatch(r"\w+", first), f"{name}: {got.value}"


@pytest.mark.parametrize("arg, value", [
    ("softcap", 2), ("softcap", 2.5), ("softcap", np.float32(2.0)), ("softcap", torch.tensor(2.0)),
    ("scale", 0), ("scale", -0.5), ("scale", np.float64(0.1)), ("scale", torch.tensor(0.3)),
])
def test_real_numbers_in_any_form_are_taken(arg, value):
    for name in ENTRIES:
        ENTRIES[name](**{arg: value})


def test_the_checks_return_plain_values():
    assert check_softcap(np.float32(2.0)) == 2.0 and type(check_softcap(2)) is float
    assert check_scale(None, 16) == 0.25 and check_scale(torch.tensor(0.5), 16) == 0.5
    assert check_dropout(1.0) == 1.0
    with pytest.raises(AttnlabError):
        check_dropout(1.0, below_one=True)
    assert check_int("n", np.int64(3)) == 3 and check_int("n", None, none=True) is None
    with pytest.raises(AttnlabError, match=r"^n: expected an int, got tensor of shape \(\)|"
                                           r"^n: expected an int, got Tensor"):
        check_int("n", torch.tensor(1.5))
