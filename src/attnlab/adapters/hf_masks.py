"""Structured masks for transformers models on attnlab: the mask builder `hf.register()` installs.

transformers builds each forward's mask once (`create_causal_mask`, through the builder
registered under the attention implementation's name) and hands it to every attention call.
Its SDPA builder materialises a (B, 1, L, S) bool matrix; this one gives an attnlab `Mask`
instead wherever the call is one that attnlab says exactly:

- causal (transformers' `causal_mask_function`) or a causal sliding window
  (`sliding_window_causal_mask_function(w)`: key j with q - w < j <= q), aligned top-left
  (a prefill) or bottom-right (queries after a cache);
- padding from the 2-D attention mask when each sequence's real keys are one run of positions
  (left or right padding): keys start[b] <= j < end[b].

So a padded batch's prefill runs the interval kernel and its decoding steps the decode kernel,
with no (B, 1, L, S) matrix. Anything else (bidirectional encoders, packed sequences, chunked or
blockwise overlays, a 2-D mask with holes) gets transformers' own SDPA mask, as before.
Caution: a query row at a padded position (left padding) attends nothing here and gets output 0;
transformers' eager path gives such rows a uniform mix instead. Real tokens are unaffected.
"""

from __future__ import annotations

import functools

import torch

from attnlab.masks import Mask, causal, window
from attnlab.masks.band import Band


class KeyRange(Band):
    """Keys start[b] <= j < end[b] for every query row of batch element b: the real tokens of a
    left- or right-padded sequence."""

    def __init__(self, start: torch.Tensor, end: torch.Tensor):
        self.start = start.detach().to(torch.int64).clone()  # (B,)
        self.end = end.detach().to(torch.int64).clone()  # (B,)
        self.batch_size = int(self.start.numel())

    def _bounds(self, rows, L, S):
        n = rows.numel()
        lo = self.start.to(rows.device).clamp(0, S).view(-1, 1, 1).expand(-1, 1, n)  # (B, 1, R)
        hi = self.end.to(rows.device).clamp(0, S).view(-1, 1, 1).expand(-1, 1, n)
        return lo, hi

    def mask_mod(self, L, S, device=None):
        start, end = self.start.to(device), self.end.to(device)
        return lambda b, h, q, k: (k >= start[b]) & (k < end[b])

    def __repr__(self):
        return f"key_range(start={self.start.tolist()}, end={self.end.tolist()})"


def _window_of(mask_function, local_size) -> int | None:
    """w when mask_function is transformers' sliding_window_causal_mask_function(w), else None
    (read from its closure: and_masks(sliding_window_overlay(w), causal_mask_function))."""
    from transformers.masking_utils import causal_mask_function

    cells = getattr(mask_function, "__closure__", None) or ()
    parts = next((c.cell_contents for c in cells if isinstance(c.cell_contents, tuple)), None)
    if not parts or len(parts) != 2 or parts[1] is not causal_mask_function:
        return None
    overlay = parts[0]
    if "sliding_window_overlay" not in getattr(overlay, "__qualname__", ""):
        return None
    w = [c.cell_contents for c in overlay.__closure__ or ()]
    if len(w) != 1 or not isinstance(w[0], int) or (local_size is not None and w[0] != local_size):
        return None
    return w[0]


def _key_range(attention_mask, batch_size: int, kv_length: int, kv_offset: int):
    """(start, end) (B,) of each sequence's one run of real keys among [kv_offset, kv_offset +
    kv_length), as indices into the keys; None when every key is real; False when a sequence's
    real keys are not one run (holes: not one interval)."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import prepare_padding_mask

    real = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    real = real[:, kv_offset:kv_offset + kv_length].bool()  # (B, S)
    if real.shape[0] != batch_size:
        return False
    if bool(real.all()):
        return None
    count = real.sum(-1)  # (B,)
    pos = torch.arange(kv_length, device=real.device)
    start = torch.where(real, pos, kv_length).min(-1).values
    end = torch.where(real, pos + 1, 0).max(-1).values
    if not bool(((count == 0) | (end - start == count)).all()):
        return False
    start = torch.where(count == 0, 0, start)
    end = torch.where(count == 0, 0, end)
    return start, end


def structured_or_none(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                       mask_function=None, attention_mask=None, local_size=None) -> Mask | None:
    """The attnlab Mask that says this call exactly, or None when it is not one of the kinds
    above (the caller then builds transformers' dense mask)."""
    from transformers.masking_utils import causal_mask_function

    if not isinstance(q_offset, int) or not isinstance(kv_offset, int):
        return None  # a tensor offset (compiled generation): leave it to transformers
    w = None
    if mask_function is not causal_mask_function:
        w = _window_of(mask_function, local_size)
        if w is None:
            return None
    off = q_offset - kv_offset  # key j (position j + kv_offset) <= query i (i + q_offset)
    if off == kv_length - q_length:
        align = "bottom_right"
    elif off == 0:
        align = "top_left"
    else:
        return None
    rng = _key_range(attention_mask, batch_size, kv_length, kv_offset)
    if rng is False:
        return None
    m = _shared(align, w)
    return m if rng is None else m & KeyRange(*rng)


@functools.cache
def _shared(align: str, w: int | None) -> Mask:
    """The one causal(align) (w None) or causal window of w keys aligned `align` handed out: a
    mask is a value (these hold no tensor), and attention keeps its plans per mask object, so
    every forward of a model (each decoding step) finds the plans of the one before it, its first
    layer's included; a mask keeps its intervals per (L, S, device) (`Mask.intervals`)."""
    return causal(align) if w is None else window(left=w - 1, right=0, align=align)


def attnlab_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    """transformers' mask builder interface: an attnlab Mask where one says the call exactly
    (`structured_or_none`), else transformers' `sdpa_mask` with the same arguments."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    fn = causal_mask_function if mask_function is None else mask_function
    got = structured_or_none(batch_size, q_length, kv_length, q_offset, kv_offset, fn,
                             attention_mask, local_size)
    if got is not None:
        return got
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                     q_offset=q_offset, kv_offset=kv_offset, mask_function=fn,
                     attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)
