"""The explorable page's "heads together" numbers on the lesson's toy vectors (the oracle the
page's browser test checks against): each head's q, k and v from the four features, its context
vector for "it", the two concatenated, times W_o, plus x (the residual), then a layer norm.

    x (8, 4) features of each token; per head W_q, W_k, W_v (4, 2); W_o (4, 4)
    c_h = softmax(q_h · K_hᵀ / √2) · V_h          q_h = x_it · W_q, K_h = x · W_k, V_h = x · W_v
    a = [c_who?, c_where?] · W_o;  r = x_it + a;  y = (r − mean r) / √(var r + 1e-5)
"""

from __future__ import annotations

import numpy as np

from attnlab.explain.lesson_sections import EMBEDDINGS, HEAD_TOKENS, HEADS, QUERY_TOKEN
from attnlab.reference import steps

#: per head: W_v, rows the four features (creature, place, action, needs a referent); "who?"
#: passes on what a creature is and does, "where?" the place and the action
W_V = {"who?": [[1, 0], [0, 0], [0, 1], [0, 0]], "where?": [[0, 0], [1, 0], [0, 1], [0, 0]]}
#: rows: the concatenated [who?: creature, action, where?: place, action]; columns: the features
W_O = [[1, 0, 0, 0], [0, 0, 0.5, 0], [0, 1, 0, 0], [0, 0, 0.5, 0]]
EPS = 1e-5


def toy_layer(w_q=None, w_k=None, w_v=None, w_o=None) -> dict:
    """Every number of the page's "heads together" block (lists), for the given matrices (None:
    the page's defaults); w_q, w_k, w_v: one (4, 2) per head, w_o (4, 4)."""
    names = list(HEADS)
    w_q = [HEADS[n][1] for n in names] if w_q is None else w_q
    w_k = [HEADS[n][2] for n in names] if w_k is None else w_k
    w_v = [W_V[n] for n in names] if w_v is None else w_v
    w_o = np.asarray(W_O if w_o is None else w_o, dtype=np.float64)
    x = np.array([EMBEDDINGS[t] for t in HEAD_TOKENS], dtype=np.float64)  # (L, 4)
    i = HEAD_TOKENS.index(QUERY_TOKEN)
    heads = []
    for wq, wk, wv in zip(w_q, w_k, w_v):
        q, K, V = x[i] @ np.asarray(wq, float), x @ np.asarray(wk, float), x @ np.asarray(wv, float)
        s = steps(q[None, None], K[None], V[None])  # one head, one query: the oracle's steps
        heads.append({"query": q.tolist(), "values": V.tolist(),
                      "weights": s["weights"][0, 0].tolist(),
                      "context": s["output"][0, 0].tolist()})
    concat = np.concatenate([h["context"] for h in heads])  # (2·2,)
    a = concat @ w_o  # (4,) @ (4, 4) -> (4,)
    r = x[i] + a
    y = (r - r.mean()) / np.sqrt(r.var() + EPS)
    return {"x": x[i].tolist(), "heads": heads, "concat": concat.tolist(), "w_o": w_o.tolist(),
            "attn_out": a.tolist(), "residual": r.tolist(), "output": y.tolist()}


#: the page's positions block: "it" (query [2, 1]) at position 7 and "cat" (key [3, 1]) at 1,
#: turned by position × THETA radians (rotary positions in two dimensions), then both moved SHIFT
POSITIONS = {"i": 7, "j": 1, "shift": 5, "theta": 0.5}


def _turn(v, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s], [s, c]]) @ np.asarray(v, dtype=np.float64)  # (2, 2) @ (2,)


def toy_positions(i: int, j: int, shift: int, theta: float, q=(2.0, 1.0),
                  k=(3.0, 1.0)) -> dict:
    """Rotary positions on the lesson's 2-D vectors: q turned by i·θ, k by j·θ, their dot
    product; the same two moved `shift` further (equal: only i − j counts); and q·k without
    positions (the same wherever the words are)."""
    qi, kj = _turn(q, i * theta), _turn(k, j * theta)
    qs, ks = _turn(q, (i + shift) * theta), _turn(k, (j + shift) * theta)
    return {"q": qi.tolist(), "k": kj.tolist(), "dot": float(qi @ kj),
            "q_moved": qs.tolist(), "k_moved": ks.tolist(), "dot_moved": float(qs @ ks),
            "plain": float(np.dot(q, k)),
            "by_distance": float(np.asarray(q) @ _turn(k, (j - i) * theta))}
