"""Backend "reference": the NumPy float64 oracle behind the public op (no autograd)."""

from __future__ import annotations

import torch

from attnlab import reference
from attnlab.errors import AttnlabError
from attnlab.ops import captured, scores
from attnlab.ops.problem import Problem


def why_not(p: Problem, need_lse: bool = True) -> str | None:
    """Why the oracle cannot run this call (None: it can)."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (p.query, p.key, p.value)):
        return ('backend: "reference" computes in NumPy and has no gradients; use backend="math" '
                "or run under torch.no_grad()")
    if captured.of(p):
        return ('score_mod: reads tensors that need a gradient, and backend "reference" computes '
                'in NumPy with no gradients; use backend="math" or run under torch.no_grad()')
    if p.dropout_p > 0:
        return 'dropout_p: backend "reference" is deterministic; pass dropout_p=0'
    if p.softcap is not None or p.alibi_slopes is not None:
        return 'backend: "reference" has no softcap/alibi_slopes; use backend="math" in float64'
    return None


def forward(p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L)), computed in float64."""
    why = why_not(p)
    if why is not None:
        raise AttnlabError(why)
    allowed, bias = p.dense_masks()
    if p.score_mod is not None:
        bias = _score_mod_bias(p, bias)
    as_np = lambda t: None if t is None else t.detach().cpu().double().numpy()  # noqa: E731
    out, lse = reference.attention(
        as_np(p.query), as_np(p.key), as_np(p.value),
        mask=None if allowed is None else allowed.cpu().numpy(), scale=p.scale, bias=as_np(bias),
    )
    dev = p.query.device
    return torch.from_numpy(out).to(dev, p.query.dtype), torch.from_numpy(lse).to(dev)


def _score_mod_bias(p: Problem, bias):
    """The score_mod as a float64 bias: score_mod(s) - s on the float64 scores s, plus any float
    attn_mask, so the oracle adds it to its own s (exact to float64 rounding)."""
    d = p.dims
    q, k = p.query.detach().cpu().double(), p.key.detach().cpu().double()
    if d.groups > 1:
        k = k.repeat_interleave(d.groups, dim=-3)  # (..., Hkv, S, D) -> (..., H, S, D)
    s = scores.product(q, k, p.scale)  # (..., H, L, S) in float64
    s4 = s.reshape(-1, d.H if d.ndim > 2 else 1, d.L, d.S)  # -> (B, H, L, S)
    mod = scores.apply_score_mod(p.score_mod, s4.to(p.query.device), torch.arange(
        d.L, device=p.query.device), torch.arange(d.S, device=p.query.device))
    extra = (mod.cpu() - s4).reshape(s.shape)  # (..., H, L, S)
    return extra if bias is None else extra + bias.detach().cpu().double()
