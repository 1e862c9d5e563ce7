"""PyTorch's private fused CPU flash kernel, behind one gate.

`aten._scaled_dot_product_flash_attention_for_cpu` (and its `_backward`) computes attention in
cache-sized tiles and, unlike the public SDPA, returns the log-sum-exp of every row. attnlab's
`sdpa` backend (with `return_lse=True`) and the tiled backend's fused chunks call it; they call it
only through this module, which owns:

- whether it applies (`applies`): a CPU tensor, the op present in this PyTorch, D == Dv > 0, no
  dropout, no softcap/ALiBi, a float dtype it implements, and no empty dim;
- the layouts it can take (`laid_out`): it reads the last dim as if its stride were 1, so a query,
  key, value or output whose last dim has another stride (sliced, transposed, expanded) gets a
  contiguous copy here; every other stride (batch, head, row; 0 included) it honours;
- its lse conventions: it reports lse 0 for a row its mask leaves empty, which attnlab reports as
  -inf (`forward`), and its backward needs +inf there so exp(s - lse) = 0 (`backward`);
- the lse gradient, which its backward has no argument for (`with_lse_grad`, below).

The lse gradient: with lse_i = log Σ_j exp(s_ij), d lse_i / d s_ij = P_ij, so a gradient dlse
only changes the backward's row term, δ_i = rowsum(dO_i · out_i) − dlse_i. The kernel computes δ
from the dO and out it is given and reads out nowhere else, so one more column carries the
term in exactly: q, k and v get a zero column (scores and dP = dO·vᵀ unchanged), dO a 1 and out
−dlse (two columns for fp16/bf16, −dlse split into a high and a low part, so it keeps fp32's
precision); the extra columns of dq, dk and dv are dropped.

Caution: the op is private to PyTorch; `available()` is False where a build lacks it, and every
caller then takes a plain-PyTorch path with the same semantics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.ops.scores import lse_for_exp

FWD = "_scaled_dot_product_flash_attention_for_cpu"
BWD = "_scaled_dot_product_flash_attention_for_cpu_backward"
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def available(device: torch.device) -> bool:
    """The kernel exists in this PyTorch for this device."""
    return device.type == "cpu" and hasattr(torch.ops.aten, FWD) and hasattr(torch.ops.aten, BWD)


def applies(p) -> bool:
    """The kernel computes exactly this problem (`p`: an `ops.problem.Problem`), masks aside."""
    d = p.dims
    return (
        available(p.query.device)
        and p.query.dtype in DTYPES
        and d.Dv == d.D > 0
        and p.dropout_p == 0
        and not p.has_modifiers
        and p.query.numel() > 0  # H = 0 crashes the kernel (integer division by zero)
        and p.key.numel() > 0
    )


def laid_out(x: torch.Tensor) -> torch.Tensor:
    """x itself when the kernel reads it right, else a contiguous copy.

    The kernel indexes the last dim with stride 1 whatever the tensor says: a sliced (stride 2),
    transposed (stride L) or expanded (stride 0) last dim would be read as other numbers or from
    outside the tensor. Rows that overlap (row stride below the row length) are copied too.
    """
    if x.dim() == 0:
        return x
    last_ok = x.stride(-1) == 1 or x.shape[-1] <= 1
    rows_ok = x.dim() < 2 or x.shape[-2] <= 1 or x.stride(-2) == 0 or x.stride(-2) >= x.shape[-1]
    return x if last_ok and rows_ok else x.contiguous()


def forward(q, k, v, *, scale: float, attn_mask=None, is_causal: bool = False,
            row_alive: torch.Tensor | None = None):
    """(out (B, H, L, Dv) in q's dtype, lse (B, H, L)) of 4-D q (B, H, L, D), k, v (B, H, S, D).

    attn_mask: float, broadcastable to (B, H, L, S) (-inf = masked). row_alive: bool
    broadcastable to (B, H, L), False for rows the mask leaves empty (their lse becomes -inf);
    derived from attn_mask when not given.
    """
    q, scale = fold_scale(q, scale, is_causal)
    q, k, v = laid_out(q), laid_out(k), laid_out(v)
    out, lse = getattr(torch.ops.aten, FWD)(q, k, v, 0.0, is_causal, attn_mask=attn_mask,
                                             scale=scale)  # (B, H, L, Dv), (B, H, L)
    if row_alive is None and attn_mask is not None:
        row_alive = (attn_mask != float("-inf")).any(dim=-1)  # (B|1, H|1, L|1)
    if row_alive is not None:  # unconditional: asking whether every row is alive costs a sync
        lse = torch.where(row_alive, lse, float("-inf"))
    return out, lse


def backward(dout, q, k, v, out, lse, *, scale: float, attn_mask=None, is_causal: bool = False,
             dlse: torch.Tensor | None = None):
    """(dq, dk, dv) of `forward`, given the (global) out and lse of the rows in q and the
    gradients dout and dlse (None: zero) of both.

    A row with lse -inf (nothing to attend) gets zero gradient.
    """
    extra, given = 0, scale
    q, scale = fold_scale(q, scale, is_causal)
    if dlse is not None:
        q, k, v, out, dout, extra = with_lse_grad(q, k, v, out, dout, dlse)
    q, k, v, out, dout = (laid_out(x) for x in (q, k, v, out, dout))
    lse = lse_for_exp(lse)  # dead rows: +inf, so exp(s - lse) = 0
    dq, dk, dv = getattr(torch.ops.aten, BWD)(dout, q, k, v, out, lse, 0.0, is_causal,
                                              attn_mask=attn_mask, scale=scale)
    if extra:
        dq, dk, dv = (x[..., :-extra] for x in (dq, dk, dv))  # (.., D + extra) -> (.., D)
    if scale != given:  # folded: the kernel's q was q·scale
        dq = dq * given
    return dq, dk, dv


def fold_scale(q: torch.Tensor, scale: float, is_causal: bool) -> tuple[torch.Tensor, float]:
    """(q, scale) as PyTorch's fused kernels compute them right: with is_causal they mask the
    scores before scaling, so a scale <= 0 turns the masked −inf into +inf or NaN (every row
    NaN). There the scale goes into q (q·scale, then scale 1): the same scores up to one
    rounding, within the FlashAttention rule."""
    if is_causal and not scale > 0:
        return q * scale, 1.0
    return q, scale


def lse_columns(dtype: torch.dtype) -> int:
    """Columns `with_lse_grad` appends: 1, or 2 where −dlse is split into high and low parts."""
    return 1 if dtype in (torch.float32, torch.float64) else 2


def with_lse_grad(q, k, v, out, dout, dlse):
    """(q, k, v, out, dout, extra): the backward's inputs with `extra` columns that make the
    kernel's row term rowsum(dO·out) − dlse (see the module docstring).

    q (.., L, D), k, v (.., S, D), out, dout (.., L, D), dlse (.., L) broadcastable to out's rows.
    """
    n = lse_columns(q.dtype)
    q, k, v = (F.pad(x, (0, n)) for x in (q, k, v))  # (.., D) -> (.., D + n): zero columns
    minus = -dlse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
    hi = minus.to(q.dtype)
    parts = [hi] if n == 1 else [hi, (minus - hi.to(minus.dtype)).to(q.dtype)]  # hi + lo
    cols = torch.stack(parts, -1).expand(*out.shape[:-1], n)  # (.., L, n)
    out = torch.cat([out.to(q.dtype), cols], -1)  # (.., L, D) -> (.., L, D + n)
    ones = torch.ones((), dtype=q.dtype, device=q.device).expand(*dout.shape[:-1], n)
    dout = torch.cat([dout.to(q.dtype), ones], -1)  # (.., L, D) -> (.., L, D + n)
    return q, k, v, out, dout, n
