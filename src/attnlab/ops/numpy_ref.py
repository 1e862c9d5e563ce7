"""Backend "reference": the NumPy float64 oracle behind the public op (no autograd)."""

from __future__ import annotations

import torch

from attnlab import reference
from attnlab.errors import AttnlabError
from attnlab.ops.problem import Problem


def forward(p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    if torch.is_grad_enabled() and any(x.requires_grad for x in (p.query, p.key, p.value)):
        raise AttnlabError(
            'backend: "reference" computes in NumPy and has no gradients; use backend="math" '
            "or run under torch.no_grad()"
        )
    if p.dropout_p > 0:
        raise AttnlabError('dropout_p: backend "reference" is deterministic; pass dropout_p=0')
    if p.has_modifiers:
        raise AttnlabError(
            'backend: "reference" has no softcap/alibi_slopes; use backend="math" in float64'
        )
    allowed, bias = p.dense_masks()
    as_np = lambda t: None if t is None else t.detach().cpu().double().numpy()  # noqa: E731
    out, lse = reference.attention(
        as_np(p.query), as_np(p.key), as_np(p.value),
        mask=None if allowed is None else allowed.cpu().numpy(), scale=p.scale, bias=as_np(bias),
    )
    dev = p.query.device
    return torch.from_numpy(out).to(dev, p.query.dtype), torch.from_numpy(lse).to(dev)
