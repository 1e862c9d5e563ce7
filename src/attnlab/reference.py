"""The float64 oracle: attention in NumPy, one lesson step per line.

    compare   scores        = q · k                      (dot product of each query with each key)
    scale     scaled        = scores * scale             (default 1/sqrt(D), cools the scores;
                                                          then softcap·tanh(scaled/softcap) if set)
    mask      masked        = scaled where allowed, else -inf  (+ a float bias if one is given)
    normalize weights       = softmax(masked)            (positive, each row sums to 1)
    borrow    output        = weights @ v                (the context vectors)

Every test in attnlab compares against `attention` here. It is written to be read, not to be fast.
Semantics: a query row that may attend to nothing gets weights 0, output 0 and lse -inf (never NaN);
NaN/Inf in a key or value that no query may attend never reaches the output.

Caution: it builds the full (..., H, L, S) matrix in float64; keep the sizes small.
"""

from __future__ import annotations

import numpy as np


def steps(q, k, v, mask=None, scale=None, bias=None, softcap=None) -> dict[str, np.ndarray]:
    """Every intermediate of attention, float64.

    q: (..., H, L, D); k: (..., Hkv, S, D); v: (..., Hkv, S, Dv), where H is a multiple of Hkv.
    mask: bool, broadcastable to (..., H, L, S), True = may attend. bias: float, added to the scaled
    scores (an SDPA float mask). softcap: a positive number, caps the scaled scores to
    (-softcap, softcap) smoothly (Gemma 2), before the bias. Returns scores, scaled_scores (capped
    when softcap is set), masked_scores, weights, output, lse.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:  # grouped-query attention: share k/v heads
        groups = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, groups, axis=-3)  # (..., Hkv, S, D) -> (..., H, S, D)
        v = np.repeat(v, groups, axis=-3)
    D = q.shape[-1]
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    L, S = q.shape[-2], k.shape[-2]
    allowed = np.ones((L, S), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if bias is not None:
        allowed = allowed & (np.asarray(bias) != -np.inf)

    # NaN/Inf in a key or value that no query may attend to must not leak: 0 * NaN is NaN.
    dead = ~np.broadcast_to(allowed, (*q.shape[:-1], S)).any(axis=-2)  # (..., H, S)
    k = np.where(dead[..., None], 0.0, k)
    v = np.where(dead[..., None], 0.0, v)

    # 1. compare: how well does each query line up with each key?
    scores = q @ np.swapaxes(k, -1, -2)  # (..., H, L, D) @ (..., H, D, S) -> (..., H, L, S)
    # 2. scale: keep the scores from growing with the head dim
    scaled = scores * scale
    if softcap is not None:  # large scores squashed smoothly below the cap
        scaled = float(softcap) * np.tanh(scaled / float(softcap))
    # 3. mask: forbidden pairs get -inf, which softmax turns into exactly 0
    masked = scaled if bias is None else scaled + np.asarray(bias, dtype=np.float64)
    masked = np.where(allowed, masked, -np.inf)
    # 4. normalize: softmax, shifted by the row max for stability
    row_max = masked.max(axis=-1, keepdims=True, initial=-np.inf)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # an all-masked row has no max
    e = np.exp(masked - row_max)
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = (row_max + np.log(total))[..., 0]  # log sum exp; -inf for an all-masked row
    # 5. borrow: each query's context vector is the weighted sum of the values
    output = weights @ v  # (..., H, L, S) @ (..., H, S, Dv) -> (..., H, L, Dv)
    return {
        "scores": scores,
        "scaled_scores": scaled,
        "masked_scores": masked,
        "weights": weights,
        "output": output,
        "lse": lse,
    }


def attention(q, k, v, mask=None, scale=None, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """(output (..., H, L, Dv), lse (..., H, L)) in float64. See `steps` for the arguments."""
    s = steps(q, k, v, mask=mask, scale=scale, bias=bias)
    return s["output"], s["lse"]
