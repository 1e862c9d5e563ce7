"""The catalogue's one-process sweeps: every mask of tests/catalog.py through every backend, dtype
and score modifier — forward, lse, backward and weights on demand against a float64 definition by
the FlashAttention rule; NaN in keys (the CPU policy and the device policy, GQA); the flex backend
on every mask; the HF adapter's masks.

Sampled: the quick set is a covering sample (every mask, backend, dtype, modifier and shape at
least once); the slow set runs every (mask, backend) pair. A backend may refuse a combination it
cannot run exactly with one AttnlabError, never give a wrong number; the catalogue says which
combinations each must run (`must_run`).
"""

from __future__ import annotations

import pytest
import torch

import attnlab
import catalog
from attnlab import AttnlabError, masks

from helpers import SLACK, diff_report

B, H, Hkv, D = 2, 4, 2, 16
SHAPES = [(37, 53), (53, 37)]
MODS = list(catalog.SCORE_MODS)
NEG = float("-inf")


# -- the definition ----------------------------------------------------------------------------


def _grid(L, S):
    return catalog._grid(B, H, L, S)


def definition(q, k, v, allowed, mod: str, scale=None, sinks=None):
    """(out, lse) of softmax(score) @ v in q's dtype (float64 for the oracle), rows with nothing
    to attend: out 0, lse -inf. allowed: bool (B, H, L, S). sinks (H,): GPT-OSS's eager form,
    the sink logit as one more column of the softmax, dropped after it."""
    G = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # (B, Hkv, S, .) -> (B, H, S, .)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ kk.transpose(-1, -2) * scale  # (B, H, L, D) @ (B, H, D, S) -> (B, H, L, S)
    s = _modify(s, mod, q.shape[-2], k.shape[-2])
    if sinks is not None:
        t = sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:-1], 1)  # (B, H, L, 1)
        c = torch.cat([s.masked_fill(~allowed, NEG), t], -1)  # (B, H, L, S + 1)
        lse = torch.logsumexp(c, -1)  # (B, H, L)
        w = torch.exp(c - lse[..., None])[..., :-1]  # the sink's column dropped
        return w @ vv, lse, w  # (B, H, L, S) @ (B, H, S, Dv) -> (B, H, L, Dv)
    s = s.masked_fill(~allowed, NEG)
    alive = allowed.any(-1, keepdim=True)  # (B, H, L, 1)
    s = torch.where(alive, s, 0.0)
    lse = torch.logsumexp(s, -1, keepdim=True)
    w = torch.where(allowed, torch.exp(s - lse), 0.0)  # (B, H, L, S)
    out = w @ vv  # (B, H, L, S) @ (B, H, S, Dv) -> (B, H, L, Dv)
    return out, torch.where(alive, lse, NEG)[..., 0], w


def _modify(s, mod, L, S):
    if mod == "score_mod":
        return catalog.rel_bias(s, *_grid(L, S))
    if mod == "softcap":
        c = catalog.SCORE_MODS["softcap"]["softcap"]
        return c * torch.tanh(s / c)
    if mod == "alibi":
        _b, _h, i, j = _grid(L, S)
        return s + SLOPES.to(s.dtype)[None, :, None, None] * (j - i).to(s.dtype)
    return s


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)


def mod_kwargs(mod: str) -> dict:
    if mod == "alibi":
        return {"score_mod": masks.alibi(SLOPES)}
    return dict(catalog.SCORE_MODS[mod])


def inputs(L, S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return mk(B, H, L, D), mk(B, Hkv, S, D), mk(B, Hkv, S, D)


def must_run(backend: catalog.Backend, case: catalog.MaskCase, mod: str, dtype) -> bool:
    """The combinations a backend must compute (elsewhere it may refuse with AttnlabError)."""
    if dtype not in backend.dtypes or mod not in backend.mods:
        return False
    if backend.name in ("interval", "decode"):  # the compiled kernels: one interval per row
        return case.interval
    return True


def _err(x, ref, live):
    d = (x.detach().double() - ref.detach().double()).abs()[live]
    return float(torch.nan_to_num(d, nan=float("inf")).max()) if d.numel() else 0.0


def fa_rule(name, got, plain, ref, live, factor, dtype):
    e, e_plain = _err(got, ref, live), _err(plain, ref, live)
    assert e <= factor * e_plain + SLACK[dtype] * (1 + float(ref.detach().abs().max())), (
        f"{name}: error {e:.3e} vs the float64 definition exceeds {factor}x the plain {dtype} "
        f"implementation's {e_plain:.3e} ({diff_report(got[live], ref[live])})")


# -- one process -------------------------------------------------------------------------------

AXES = {"case": catalog.MASKS, "backend": catalog.backends(), "dtype": list(catalog.DTYPES),
        "mod": MODS, "shape": SHAPES, "sinks": list(catalog.SINKS)}
QUICK = catalog.covering(AXES)
_SEEN = {catalog.case_id({k: d[k] for k in ("case", "backend")}) for d in QUICK}
SLOW = [{"case": c, "backend": b, "dtype": catalog.DTYPES[i % 2], "mod": MODS[i % len(MODS)],
         "shape": SHAPES[i % 2], "sinks": list(catalog.SINKS)[i // 2 % len(catalog.SINKS)]}
        for i, (c, b) in enumerate((c, b) for c in catalog.MASKS for b in catalog.backends())
        if catalog.case_id({"case": c, "backend": b}) not in _SEEN]


def _params(quick, slow):
    return ([pytest.param(d, id=catalog.case_id(d)) for d in quick]
            + [pytest.param(d, id=catalog.case_id(d), marks=pytest.mark.slow) for d in slow])


@pytest.fixture
def backend_env(monkeypatch):
    def set_for(backend: catalog.Backend):
        for k, v in backend.env.items():
            monkeypatch.setenv(k, v)
    return set_for


@pytest.mark.parametrize("combo", _params(QUICK, SLOW))
def test_one_process(combo, backend_env):
    case, backend, dtype, mod = combo["case"], combo["backend"], combo["dtype"], combo["mod"]
    L, S = combo["shape"]
    backend_env(backend)
    allowed = catalog.truth(case, B, H, L, S)
    m = case.build(B, H, L, S)
    t64 = catalog.SINKS[combo.get("sinks", "no_sinks")]
    t64 = None if t64 is None else t64.clone().requires_grad_(True)
    q64, k64, v64 = (t.requires_grad_(True) for t in inputs(L, S, torch.float64))
    ref_out, ref_lse, ref_w = definition(q64, k64, v64, allowed, mod, sinks=t64)
    q, k, v = (t.detach().to(dtype) for t in (q64, k64, v64))
    sinks = None if t64 is None else t64.detach().to(dtype)
    plain_out, plain_lse, _ = definition(q, k, v, allowed, mod, sinks=sinks)
    kw = dict(mask=m, enable_gqa=True, **mod_kwargs(mod))
    grad = backend.grad
    if grad:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        sinks = None if sinks is None else sinks.requires_grad_(True)
    try:
        with torch.set_grad_enabled(grad):
            out, lse = attnlab.attention(q, k, v, backend=backend.name, return_lse=True,
                                         sinks=sinks, **kw)
    except AttnlabError as e:
        assert not must_run(backend, case, mod, dtype), f"{backend.name} refused: {e}"
        return
    live = allowed.any(-1)  # (B, H, L)
    dead = ~live
    assert (out[dead] == 0).all(), "a row with nothing to attend is not 0"
    if sinks is None:
        assert torch.isneginf(lse[dead]).all(), "a row with nothing to attend has a finite lse"
    else:  # the sink takes all the mass: lse = the sink's logit
        want_dead = sinks.detach().float()[None, :, None].expand(B, H, L)[dead]
        assert torch.equal(lse[dead].float(), want_dead), "a row with only the sink: lse"
    fa_rule("out", out, plain_out, ref_out, live, 2, dtype)
    fa_rule("lse", lse, plain_lse, ref_lse, live, 2, dtype)
    rows = torch.tensor([0, L // 2, L - 1])
    w = attnlab.attention_weights(q.detach(), k.detach(), lse.detach(), rows=rows, **kw)
    assert (w.double() - ref_w[:, :, rows]).abs().max() <= (
        2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5), "weights on demand"
    if not grad:
        return
    g = torch.Generator().manual_seed(5)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    extra = () if t64 is None else (t64,)  # the sinks' gradient too
    want = torch.autograd.grad(ref_out, (q64, k64, v64, *extra), dout)
    qp, kp, vp = (t.detach().to(dtype).requires_grad_(True) for t in (q64, k64, v64))
    tp = () if t64 is None else (t64.detach().to(dtype).requires_grad_(True),)
    plain = torch.autograd.grad(definition(qp, kp, vp, allowed, mod, sinks=(tp or (None,))[0])[0],
                                (qp, kp, vp, *tp), dout.to(dtype))
    got = torch.autograd.grad(out, (q, k, v, *(() if sinks is None else (sinks,))),
                              dout.to(dtype))
    for name, a, p, r in zip(("dq", "dk", "dv", "dsinks"), got, plain, want):
        fa_rule(name, a, p, r, torch.ones(r.shape, dtype=torch.bool), 3, dtype)


# -- NaN in keys and values ----------------------------------------------------------------------

NAN_AXES = {"case": catalog.MASKS, "backend": catalog.backends(),
            "dtype": [torch.float64, torch.float32]}
NAN_QUICK = catalog.covering(NAN_AXES, seed=1)


def _poisoned(L, S, dtype, pos):
    q, k, v = (t.to(dtype) for t in inputs(L, S, dtype, seed=2))
    k[1, 1, pos, 3] = float("nan")  # batch 1, key/value head 1: query heads 2 and 3 read it
    v[0, 0, pos + 1, 0] = float("inf")  # batch 0, key/value head 0: query heads 0 and 1
    return q, k, v


def _nan_expectation(allowed, L, S, pos):
    """(rows that must be NaN (B, H, L), allowed with the poisoned positions taken out)."""
    nan = torch.zeros(B, H, L, dtype=torch.bool)
    nan[1, 2:4] = allowed[1, 2:4, :, pos]
    nan[0, 0:2] = allowed[0, 0:2, :, pos + 1]
    clean = allowed.clone()
    clean[1, 2:4, :, pos] = False
    clean[0, 0:2, :, pos + 1] = False
    return nan, clean


@pytest.mark.parametrize("combo", _params(NAN_QUICK, []))
def test_nan_in_keys(combo, backend_env):
    """A row is NaN exactly when it may attend a poisoned key or value (GQA: the query heads of
    that key/value head, interleaved); every other row is as if the position were masked."""
    case, backend, dtype = combo["case"], combo["backend"], combo["dtype"]
    L, S = 37, 53
    pos = S // 2
    backend_env(backend)
    allowed = catalog.truth(case, B, H, L, S)
    q, k, v = _poisoned(L, S, dtype, pos)
    try:
        with torch.no_grad():
            out = attnlab.attention(q, k, v, mask=case.build(B, H, L, S), enable_gqa=True,
                                    backend=backend.name)
    except AttnlabError:
        assert not must_run(backend, case, "none", dtype)
        return
    nan, clean = _nan_expectation(allowed, L, S, pos)
    _check_nan(out, nan, clean, q, k, v)


def _check_nan(out, nan, clean, q, k, v):
    assert torch.equal(out.isnan().any(-1), nan), "NaN rows differ from the rows that may " \
                                                  "attend a poisoned position"
    k0, v0 = (torch.nan_to_num(x, nan=0.0, posinf=0.0) for x in (k, v))
    want = definition(q.double(), k0.double(), v0.double(), clean, "none")[0]
    ok = ~nan
    tol = 1e-4 if q.dtype == torch.float32 else 1e-10
    assert (out.double() - want).abs()[ok].max() <= tol


@pytest.mark.parametrize("causal", [False, True], ids=["no_mask", "is_causal"])
@pytest.mark.parametrize("backend", catalog.backends(), ids=lambda b: b.name)
def test_nan_in_keys_without_a_mask(backend, causal, backend_env):
    """The same rule with no mask object at all (every row attends every key, or is_causal):
    the compiled kernels' max ignores a NaN score, so they must not be left to propagate it."""
    L, S = 37, 53
    pos = S // 2 if causal else S - 2
    backend_env(backend)
    allowed = torch.ones(B, H, L, S, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    q, k, v = _poisoned(L, S, torch.float32, pos)
    try:
        with torch.no_grad():
            out = attnlab.attention(q, k, v, is_causal=causal, enable_gqa=True,
                                    backend=backend.name)
    except AttnlabError:
        assert backend.name in ("reference",) or not causal, f"{backend.name} refused"
        return
    bad, clean = _nan_expectation(allowed, L, S, pos)
    # no mask: the rows that read a poisoned position are not finite (NaN, or ±Inf where the
    # backend lets an Inf value through unmixed); every other row is exact
    assert torch.equal(~out.isfinite().all(-1), bad), "non-finite rows differ from the rows " \
                                                      "that read a poisoned position"
    k0, v0 = (torch.nan_to_num(x, nan=0.0, posinf=0.0) for x in (k, v))
    want = definition(q.double(), k0.double(), v0.double(), clean, "none")[0]
    assert (out.double() - want).abs()[~bad].max() <= 1e-4


@pytest.mark.parametrize("case", catalog.MASKS, ids=lambda c: c.name)
def test_device_nan_policy_on_cpu(case):
    """ops.nonfinite_device's clean / poison (the CUDA path's rule, no host syncs) called directly
    on a CPU problem with H != Hkv: the same rows as the CPU rule."""
    from attnlab.ops import nonfinite_device, plain
    from attnlab.ops.validate import make_problem

    L, S = 37, 53
    pos = S // 2
    q, k, v = _poisoned(L, S, torch.float64, pos)
    p = make_problem(q, k, v, None, 0.0, False, None, True, mask=case.build(B, H, L, S))
    p2, bad = nonfinite_device.clean(p)
    out, lse = plain.forward(p2)
    out, lse = nonfinite_device.poison(p2, bad, out, lse)
    nan, clean = _nan_expectation(catalog.truth(case, B, H, L, S), L, S, pos)
    _check_nan(out, nan, clean, q, k, v)


# -- the flex backend on every mask ------------------------------------------------------------


#: the quick set: per-batch and per-head forms, functions, ragged windows; the rest is slow
FLEX_QUICK = {"padding_both", "function_bh", "window_ragged", "document_per_batch",
              "or_two_diagonals", "from_dense_per_batch_head"}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[] if c.name in FLEX_QUICK
                                               else [pytest.mark.slow]) for c in catalog.MASKS])
def test_flex_every_mask(case, monkeypatch):
    """backend="flex" (torch's eager Flex on CPU: attnlab's BlockMask and mask_mod) equals the
    definition on every catalogue mask, with a score_mod, lse included."""
    if "flex" not in catalog.registry_backends():
        pytest.skip("no flex backend")
    monkeypatch.setenv("ATTNLAB_FLEX_COMPILE", "0")
    L, S = 53, 37
    q, k, v = inputs(L, S, torch.float64, seed=3)
    allowed = catalog.truth(case, B, H, L, S)
    want, want_lse, _ = definition(q, k, v, allowed, "score_mod")
    out, lse = attnlab.attention(q, k, v, mask=case.build(B, H, L, S), enable_gqa=True,
                                 backend="flex", return_lse=True, score_mod=catalog.rel_bias)
    assert (out - want).abs().max() < 1e-10
    assert torch.equal(lse.isinf(), want_lse.isinf())
    fin = want_lse.isfinite()
    assert (lse[fin].double() - want_lse[fin]).abs().max() < 1e-5  # Flex's lse is float32


# -- the HF adapter ----------------------------------------------------------------------------

HF_FORMS = ("bool", "neg_inf", "finfo_min")
HF_QUICK = catalog.covering({"case": catalog.MASKS, "form": list(HF_FORMS),
                             "weights": [False, True]}, seed=2)


@pytest.mark.parametrize("combo", _params(HF_QUICK, []))
def test_hf_adapter_masks(combo):
    """transformers' attention interface with each catalogue mask in the forms models pass it
    (bool, additive -inf, additive finfo.min), against eager's formula on the rows that attend."""
    from attnlab.adapters import hf

    case, form = combo["case"], combo["form"]
    L = S = 41
    allowed = catalog.truth(case, B, H, L, S)
    q, k, v = (t.float() for t in inputs(L, S, torch.float32, seed=4))
    if form == "bool":
        mask = allowed
    else:
        fill = NEG if form == "neg_inf" else torch.finfo(torch.float32).min
        mask = torch.zeros(B, H, L, S).masked_fill(~allowed, fill)
    module = torch.nn.Module()
    module.is_causal = False
    out, w = hf.attnlab_attention_forward(module, q, k, v, mask, scaling=D ** -0.5,
                                          output_attentions=combo["weights"])
    want, _, want_w = definition(q.double(), k.double(), v.double(), allowed, "none")
    live = allowed.any(-1)  # (B, H, L)
    got = out.transpose(1, 2)  # (B, L, H, D) -> (B, H, L, D)
    assert (got.double() - want).abs()[live].max() < 1e-5
    if form != "finfo_min":  # eager's finfo.min rows average every key; attnlab's too, unchecked
        assert (got[~live] == 0).all()
    if combo["weights"]:
        assert (w.double() - want_w).abs()[live].max() < 1e-5


def test_quick_sweeps_cover_the_catalogue():
    for quick, axes in ((QUICK, AXES), (NAN_QUICK, NAN_AXES)):
        for name, vals in axes.items():
            assert {catalog.case_id({name: d[name]}) for d in quick} == \
                {catalog.case_id({name: x}) for x in vals}
