"""The lesson past one head: where q, k and v come from, what happens after the heads, and how a
model knows positions, for one token of a real model, in float64, checked against the model's
own forward.

    >>> walk = layer_walk(load_model(None), "The cat sat on the mat because it was tired.",
    ...                   layer=2, head=8, token="it")
    >>> walk.checks["layer_output"]          # max |ours - the model's hidden state|, ~1e-15

For one token i of layer ℓ (d = the model's width, H heads of size D):

1. project: x_in = x (MiniLM, post-norm) or LN₁(x) (attnlab's GPT, pre-norm);
   q = x_in · W_q + b_q, k = x_in · W_k + b_k, v = x_in · W_v + b_v, this head's D columns;
   rotary (attnlab's GPT with rotary): q and k rotated by the position's angles;
2. heads: each head's context vector c_h = Σ_j A_h[i, j] · v_h[j]; concatenated (H·D);
   attention output a = concat · W_o + b_o; residual r = x + a;
   MiniLM: y = LN₁(r), then the feed-forward f = GELU(y · W₁ + b₁) · W₂ + b₂ and the layer's
   output LN₂(y + f); GPT: the layer's output r + MLP(LN₂(r)) (r itself when attention-only);
3. positions: MiniLM's x₀ = LN(word[id] + position[i] + type[0]); GPT: x₀ = word + position
   (learned) or rotations of q and k (rotary), which make q·k depend on i − j only.

Every vector here is computed with NumPy from the model's weights; `checks` are the largest
differences to the model's own forward (torch, float64, hooks on its modules), so a wrong step
shows as a large number. Caution: the model is copied to float64 once per loaded model.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.explain.token import find_word, focus_of


@dataclass
class Positions:
    """How the model put token i's position into its vectors. kind "learned" (x₀ = word +
    position (+ type), then MiniLM's layer norm) or "rotary" (q, k rotated by `angles`)."""

    kind: str
    word: list[float] | None = None
    position: list[float] | None = None
    type: list[float] | None = None
    x0: list[float] | None = None
    x0_error: float | None = None
    angles: list[float] | None = None
    #: rotary: q·k at positions (i, j) and the same vectors moved by `shift`: equal
    rotary_dots: list[float] | None = None
    shift: int | None = None
    #: a previous-token head with the words taken out (learned positions)
    prev_head: dict | None = None


@dataclass
class LayerWalk:
    """One token through one layer (see the module docstring); vectors are float64 lists."""

    model: str
    tokens: list[str]
    layer: int
    head: int
    token: int
    d_model: int
    n_heads: int
    head_dim: int
    norm: str  # "post" (MiniLM: LN after the residual) or "pre" (GPT: LN before attention)
    x: list[float]
    x_in: list[float]
    q: list[float]
    k: list[float]
    v: list[float]
    weights: list[float]
    contexts: list[list[float]]
    concat: list[float]
    attn_out: list[float]
    residual: list[float]
    attn_norm: list[float] | None
    output: list[float]
    positions: Positions
    checks: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    def page_json(self) -> dict:
        """What the view page's step view shows of the walk (every vector but the contexts, the
        vectors rounded to 6 digits)."""
        r = lambda v: None if v is None else [round(float(x), 6) for x in v]  # noqa: E731
        p = self.positions
        return {"layer": self.layer, "head": self.head, "token": self.token, "norm": self.norm,
                "d_model": self.d_model, "n_heads": self.n_heads, "head_dim": self.head_dim,
                **{k: r(getattr(self, k)) for k in ("x", "x_in", "q", "k", "v", "concat",
                                                     "attn_out", "residual", "attn_norm",
                                                     "output")},
                "checks": self.checks,
                "positions": {"kind": p.kind, "x0": r(p.x0), "x0_error": p.x0_error,
                              "prev_head": p.prev_head, "rotary_dots": p.rotary_dots,
                              "shift": p.shift}}


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps)
    return out * w + (0.0 if b is None else b)


_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _np(t):
    return None if t is None else t.detach().cpu().double().numpy()


def _err(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def _softmax(s):
    m = s[np.isfinite(s)].max()
    e = np.where(np.isfinite(s), np.exp(s - m), 0.0)
    return e / e.sum()


_F64: dict[int, object] = {}


def _float64(loaded):
    """The loaded model copied to float64 (once per loaded model)."""
    key = id(loaded.model)
    if key not in _F64:
        _F64.clear()  # one at a time: a float64 copy is twice the model
        _F64[key] = copy.deepcopy(loaded.model).double().eval()
    return _F64[key]


def layer_walk(loaded, text: str, *, layer: int, head: int, token: str | int) -> LayerWalk:
    """Token `token` (a word of `text` or its index) through layer `layer`, head `head` of
    `loaded` (`load_model`): MiniLM-style Hugging Face BERT encoders and attnlab's GPTs."""
    if loaded.kind == "attnlab":
        return _gpt_walk(loaded, text, layer, head, token)
    model = _float64(loaded)
    if not hasattr(model, "encoder") or not hasattr(model.encoder, "layer"):
        raise AttnlabError(f"model {loaded.name}: the layer walk knows BERT-style encoders "
                           f"(MiniLM) and attnlab's GPTs, not {type(model).__name__}")
    return _bert_walk(loaded, model, text, layer, head, token)


def _check_index(name: str, i: int, n: int) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n:
        raise AttnlabError(f"{name} {i!r}: out of range, expected 0..{n - 1}")
    return i % n


def _bert_walk(loaded, model, text, layer, head, token) -> LayerWalk:
    import torch

    cfg = model.config
    H, d = cfg.num_attention_heads, cfg.hidden_size
    D = d // H
    layer = _check_index("layer", layer, cfg.num_hidden_layers)
    head = _check_index("head", head, H)
    enc = loaded.tokenizer(text, return_tensors="pt")
    tokens = loaded.tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    i = focus_of(type("A", (), {"causal": False})(), find_word(tokens, token))
    blk = model.encoder.layer[layer]
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, a, out, n=n: seen.__setitem__(n, out))
             for n, m in (("q", blk.attention.self.query), ("k", blk.attention.self.key),
                          ("v", blk.attention.self.value), ("attn", blk.attention))]
    try:
        with torch.no_grad():
            out = model(**enc, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    hs = [_np(h[0]) for h in out.hidden_states]  # (layers + 1) x (L, d)
    X = hs[layer]  # (L, d): every token's input to the layer
    a = blk.attention
    Wq, bq = _np(a.self.query.weight).T, _np(a.self.query.bias)  # (d, d): x @ W
    Wk, bk = _np(a.self.key.weight).T, _np(a.self.key.bias)
    Wv, bv = _np(a.self.value.weight).T, _np(a.self.value.bias)
    Q, K, V = X @ Wq + bq, X @ Wk + bk, X @ Wv + bv  # (L, d) @ (d, d) -> (L, d)
    mask = enc["attention_mask"][0].numpy().astype(bool)
    scale = 1.0 / math.sqrt(D)
    contexts, weights = [], None
    for h in range(H):
        cols = slice(h * D, (h + 1) * D)
        s = Q[i, cols] @ K[:, cols].T * scale  # (D,) @ (D, L) -> (L,)
        w = _softmax(np.where(mask, s, -np.inf))
        contexts.append(w @ V[:, cols])  # (L,) @ (L, D) -> (D,)
        if h == head:
            weights = w
    concat = np.concatenate(contexts)  # (H·D,)
    Wo, bo = _np(a.output.dense.weight).T, _np(a.output.dense.bias)
    attn_out = concat @ Wo + bo
    residual = X[i] + attn_out
    eps = cfg.layer_norm_eps
    y = _ln(residual, _np(a.output.LayerNorm.weight), _np(a.output.LayerNorm.bias), eps)
    f = _gelu(y @ _np(blk.intermediate.dense.weight).T + _np(blk.intermediate.dense.bias))
    f = f @ _np(blk.output.dense.weight).T + _np(blk.output.dense.bias)
    z = _ln(y + f, _np(blk.output.LayerNorm.weight), _np(blk.output.LayerNorm.bias), eps)
    cols = slice(head * D, (head + 1) * D)
    checks = {"q": _err(Q[i, cols], _np(seen["q"][0])[i, cols]),
              "k": _err(K[i, cols], _np(seen["k"][0])[i, cols]),
              "v": _err(V[i, cols], _np(seen["v"][0])[i, cols]),
              "attention_output": _err(y, _np(seen["attn"][0][0])[i]),
              "layer_output": _err(z, hs[layer + 1][i])}
    return LayerWalk(
        model=loaded.name, tokens=list(tokens), layer=layer, head=head, token=i, d_model=d,
        n_heads=H, head_dim=D, norm="post", x=X[i].tolist(), x_in=X[i].tolist(),
        q=Q[i, cols].tolist(), k=K[i, cols].tolist(), v=V[i, cols].tolist(),
        weights=weights.tolist(), contexts=[c.tolist() for c in contexts],
        concat=concat.tolist(), attn_out=attn_out.tolist(), residual=residual.tolist(),
        attn_norm=y.tolist(), output=z.tolist(),
        positions=_with_rotary(_bert_positions(model, enc, i, hs[0][i], scale, D),
                               Q[i, cols], K[max(i - 1, 0), cols], i), checks=checks)


def _with_rotary(p: Positions, q, k, i: int) -> Positions:
    """MiniLM has learned positions; the walk still shows what rotary would do to its q and k."""
    p.rotary_dots = rotary_dots(q, k, i, max(i - 1, 0))
    return p


def _bert_positions(model, enc, i, x0_model, scale, D) -> Positions:
    e = model.embeddings
    ids = enc["input_ids"][0].numpy()
    word = _np(e.word_embeddings.weight)[ids[i]]
    pos_table = _np(e.position_embeddings.weight)
    typ = _np(e.token_type_embeddings.weight)[0]
    lw, lb, eps = _np(e.LayerNorm.weight), _np(e.LayerNorm.bias), model.config.layer_norm_eps
    x0 = _ln(word + pos_table[i] + typ, lw, lb, eps)
    # the previous-token head with the words taken out: positions (and the type) alone
    blk = model.encoder.layer[0].attention.self
    L = len(ids)
    P = _ln(pos_table[:L] + typ, lw, lb, eps)  # (L, d)
    best = None
    for h in range(model.config.num_attention_heads):
        cols = slice(h * D, (h + 1) * D)
        q = (P @ _np(blk.query.weight).T + _np(blk.query.bias))[:, cols]
        k = (P @ _np(blk.key.weight).T + _np(blk.key.bias))[:, cols]
        s = q @ k.T * scale  # (L, D) @ (D, L) -> (L, L)
        np.fill_diagonal(s, -np.inf)
        hits = int(sum(int(s[r].argmax()) == r - 1 for r in range(1, L)))
        if best is None or hits > best["hits"]:
            best = {"layer": 0, "head": h, "hits": hits, "rows": L - 1}
    return Positions(kind="learned", word=word.tolist(), position=pos_table[i].tolist(),
                     type=typ.tolist(), x0=x0.tolist(), x0_error=_err(x0, x0_model),
                     prev_head=best, angles=rotary_angles([i], D, 10000.0)[0].tolist(), shift=5)


def _gpt_walk(loaded, text, layer, head, token) -> LayerWalk:
    import torch

    model = _float64(loaded)
    cfg = model.config
    tok = loaded.tokenizer
    try:
        ids = tok.encode(text)
    except AttnlabError as e:
        raise AttnlabError(f"TEXT: {e}") from None
    tokens = [tok.decode([t]) for t in ids]
    H, d = cfg.n_head, cfg.n_embd
    D = d // H
    layer = _check_index("layer", layer, cfg.n_layer)
    head = _check_index("head", head, H)
    i = focus_of(type("A", (), {"causal": True})(), find_word(tokens, token))
    blk = model.blocks[layer]
    seen = {}

    def keep(name):
        return lambda mod, args, out: seen.__setitem__(name, out)

    hooks = [blk.register_forward_hook(keep("block")), blk.attn.register_forward_hook(keep("attn")),
             blk.register_forward_pre_hook(lambda mod, args: seen.__setitem__("x", args[0]))]
    record: list = []
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), record=record)
    finally:
        for h in hooks:
            h.remove()
    X = _np(seen["x"][0])  # (L, d)
    xin = _ln(X, _np(blk.ln1.weight), _np(blk.ln1.bias), blk.ln1.eps)
    Hkv = cfg.n_kv_head or H
    W, b = _np(blk.attn.qkv.weight).T, _np(blk.attn.qkv.bias)  # (d, (H + 2·Hkv)·D)
    qkv = xin @ W + (0.0 if b is None else b)  # (L, d) @ (d, ...) -> (L, (H + 2·Hkv)·D)
    Q = qkv[:, :H * D].reshape(len(ids), H, D)
    K = qkv[:, H * D:(H + Hkv) * D].reshape(len(ids), Hkv, D)
    V = qkv[:, (H + Hkv) * D:].reshape(len(ids), Hkv, D)
    rot = blk.attn.rotary
    positions = _gpt_positions(model, ids, i, X, layer, rot, Q, K, head, Hkv, H)
    if rot is not None:
        Q, K = _rotate(Q, rot.base), _rotate(K, rot.base)
    scale = 1.0 / math.sqrt(D)
    contexts, weights = [], None
    for h in range(H):
        g = h // (H // Hkv)
        s = K[:, g] @ Q[i, h] * scale  # (L, D) @ (D,) -> (L,)
        s[i + 1:] = -np.inf  # causal: no peeking ahead
        w = _softmax(s)
        contexts.append(w @ V[:, g])
        if h == head:
            weights = w
    concat = np.concatenate(contexts)
    o = blk.attn.out_proj
    attn_out = concat @ _np(o.weight).T + (0.0 if o.bias is None else _np(o.bias))
    residual = X[i] + attn_out
    out = residual
    if blk.mlp is not None:
        y = _ln(residual, _np(blk.ln2.weight), _np(blk.ln2.bias), blk.ln2.eps)
        f = _gelu(y @ _np(blk.mlp.fc.weight).T + _bias(blk.mlp.fc))
        out = residual + f @ _np(blk.mlp.proj.weight).T + _bias(blk.mlp.proj)
    call = record[layer]
    g = head // (H // Hkv)
    checks = {"q": _err(Q[i, head], _np(call.query[0, head, i])),
              "k": _err(K[i, g], _np(call.key[0, head, i])),
              "v": _err(V[i, g], _np(call.value[0, head, i])),
              "attention_output": _err(attn_out, _np(seen["attn"][0, i])),
              "layer_output": _err(out, _np(seen["block"][0, i]))}
    return LayerWalk(
        model=loaded.name, tokens=tokens, layer=layer, head=head, token=i, d_model=d, n_heads=H,
        head_dim=D, norm="pre", x=X[i].tolist(), x_in=xin[i].tolist(), q=Q[i, head].tolist(),
        k=K[i, g].tolist(), v=V[i, g].tolist(), weights=weights.tolist(),
        contexts=[c.tolist() for c in contexts], concat=concat.tolist(),
        attn_out=attn_out.tolist(), residual=residual.tolist(), attn_norm=None,
        output=out.tolist(), positions=positions, checks=checks)


def _bias(lin):
    return 0.0 if lin.bias is None else _np(lin.bias)


def rotary_angles(positions, D: int, base: float) -> np.ndarray:
    """(L, D) angles: position · base^(−2m/D) for pair m, both halves of a pair sharing it (as
    `attnlab.nn.rotary`)."""
    inv = base ** (-np.arange(0, D, 2) / D)  # (D/2,)
    a = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]  # (L, D/2)
    return np.concatenate([a, a], axis=-1)


def _rotate(X, base: float, positions=None) -> np.ndarray:
    """Rotate X (L, heads, D) by each row's position: x·cos + rotate_half(x)·sin."""
    L, _, D = X.shape
    a = rotary_angles(np.arange(L) if positions is None else positions, D, base)[:, None, :]
    half = np.concatenate([-X[..., D // 2:], X[..., :D // 2]], axis=-1)
    return X * np.cos(a) + half * np.sin(a)


def rotary_dots(q, k, i: int, j: int, base: float = 10000.0, shift: int = 5) -> list[float]:
    """q·k with q rotated for position i and k for j, then both moved `shift` further: equal,
    since a rotation by the same angle leaves a dot product unchanged (rotary positions)."""
    q, k = np.asarray(q, dtype=np.float64)[None, None], np.asarray(k, dtype=np.float64)[None, None]
    return [float(_rotate(q, base, [a])[0, 0] @ _rotate(k, base, [b])[0, 0])
            for a, b in ((i, j), (i + shift, j + shift))]


def _gpt_positions(model, ids, i, X, layer, rot, Q, K, head, Hkv, H) -> Positions:
    if rot is None:
        word = _np(model.wte.weight)[ids[i]]
        pos = _np(model.wpe.weight)[i]
        x0 = word + pos
        err = _err(x0, X[i]) if layer == 0 else None
        return Positions(kind="learned", word=word.tolist(), position=pos.tolist(), x0=x0.tolist(),
                         x0_error=err)
    D = Q.shape[-1]
    g = head // (H // Hkv)
    return Positions(kind="rotary", angles=rotary_angles([i], D, rot.base)[0].tolist(),
                     rotary_dots=rotary_dots(Q[i, head], K[max(i - 1, 0), g], i, max(i - 1, 0),
                                             rot.base), shift=5)
