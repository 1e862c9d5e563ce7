"""MultiHeadAttention against torch.nn.MultiheadAttention on copied weights, GQA/MQA, weights."""

from __future__ import annotations

import pytest
import torch

from attnlab import AttnlabError
from attnlab.nn import MultiHeadAttention

from helpers import close


def pair(E=32, H=4, seed=0, **kw):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, H, **kw).eval()
    return ref, MultiHeadAttention.from_torch(ref).eval()


def inputs(B, L, S, E, batch_first, kdim=None, vdim=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    shape = lambda T, d: (B, T, d) if batch_first else (T, B, d)  # noqa: E731
    q = torch.randn(shape(L, E), generator=g)
    k = torch.randn(shape(S, kdim or E), generator=g)
    v = torch.randn(shape(S, vdim or E), generator=g)
    return q, k, v


def padding(B, S, lengths):
    kpm = torch.zeros(B, S, dtype=torch.bool)
    for b, n in enumerate(lengths):
        kpm[b, n:] = True  # True = padding, torch's convention
    return kpm


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("average", [True, False])
def test_self_attention_matches_torch(batch_first, bias, padded, average):
    ref, mha = pair(bias=bias, batch_first=batch_first)
    q, _, _ = inputs(3, 9, 9, 32, batch_first)
    kpm = padding(3, 9, [9, 4, 1]) if padded else None
    want, want_w = ref(q, q, q, key_padding_mask=kpm, average_attn_weights=average)
    got, got_w = mha(q, q, q, key_padding_mask=kpm, average_attn_weights=average)
    close(got, want)
    close(got_w, want_w, what="weights")
    got_default, _ = mha(q, key_padding_mask=kpm)  # key, value default to query
    close(got_default, want)


@pytest.mark.parametrize("padded", [False, True])
def test_cross_attention_with_kdim_vdim_matches_torch(padded):
    ref, mha = pair(E=24, H=3, kdim=10, vdim=14, batch_first=True)
    q, k, v = inputs(2, 5, 11, 24, True, kdim=10, vdim=14)
    kpm = padding(2, 11, [11, 6]) if padded else None
    want, want_w = ref(q, k, v, key_padding_mask=kpm)
    got, got_w = mha(q, k, v, key_padding_mask=kpm)
    close(got, want)
    close(got_w, want_w, what="weights")


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("kind", ["bool", "float", "bool3d"])
def test_attn_mask_conventions_match_torch(kind):
    ref, mha = pair(batch_first=True)
    q, k, v = inputs(2, 6, 8, 32, True)
    g = torch.Generator().manual_seed(5)
    if kind == "float":
        mask = torch.randn(6, 8, generator=g)
    else:
        shape = (2 * 4, 6, 8) if kind == "bool3d" else (6, 8)
        mask = torch.rand(shape, generator=g) < 0.4
        mask[..., 0] = False  # every row keeps a key: torch would give NaN otherwise
    kpm = padding(2, 8, [8, 5])
    want, want_w = ref(q, k, v, attn_mask=mask, key_padding_mask=kpm,
                       average_attn_weights=False)
    got, got_w = mha(q, k, v, attn_mask=mask, key_padding_mask=kpm, average_attn_weights=False)
    close(got, want)
    close(got_w, want_w, what="weights")


def test_fast_path_need_weights_false_matches_torch():
    ref, mha = pair(batch_first=True)
    q, _, _ = inputs(2, 7, 7, 32, True)
    kpm = padding(2, 7, [7, 3])
    with torch.no_grad():  # inference mode: torch takes its own fused fast path here
        want, none_ref = ref(q, q, q, key_padding_mask=kpm, need_weights=False)
        got, none = mha(q, q, q, key_padding_mask=kpm, need_weights=False)
    assert none is None and none_ref is None
    close(got[0], want[0])
    close(got[1, :3], want[1, :3])  # torch's fast path leaves padded query rows unspecified


def test_unbatched_input_matches_torch():
    ref, mha = pair()
    x = torch.randn(5, 32)
    want, want_w = ref(x, x, x)
    got, got_w = mha(x)
    close(got, want)
    close(got_w, want_w, what="weights")


def test_gradients_match_torch():
    ref, mha = pair(batch_first=True)
    q, _, _ = inputs(2, 5, 5, 32, True)
    kpm = padding(2, 5, [5, 3])
    ref(q, q, q, key_padding_mask=kpm)[0].square().sum().backward()
    mha(q, key_padding_mask=kpm)[0].square().sum().backward()
    wq, wk, wv = ref.in_proj_weight.grad.chunk(3)
    close(mha.q_proj.weight.grad, wq, what="q_proj grad")
    close(mha.k_proj.weight.grad, wk, what="k_proj grad")
    close(mha.v_proj.weight.grad, wv, what="v_proj grad")
    close(mha.out_proj.weight.grad, ref.out_proj.weight.grad, what="out_proj grad")


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa_equals_mha_with_repeated_kv_heads(kv_heads):
    torch.manual_seed(3)
    E, H = 32, 4
    gqa = MultiHeadAttention(E, H, num_kv_heads=kv_heads, batch_first=True).eval()
    full = MultiHeadAttention(E, H, batch_first=True).eval()
    D, group = E // H, H // kv_heads
    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(full, name)
            w = src.weight.view(kv_heads, D, E).repeat_interleave(group, dim=0)  # (H, D, E)
            dst.weight.copy_(w.reshape(E, E))
            dst.bias.copy_(src.bias.view(kv_heads, D).repeat_interleave(group, 0).reshape(E))
    x = torch.randn(2, 6, E)
    kpm = padding(2, 6, [6, 2])
    got, got_w = gqa(x, key_padding_mask=kpm, average_attn_weights=False)
    want, want_w = full(x, key_padding_mask=kpm, average_attn_weights=False)
    close(got, want)
    close(got_w, want_w, what="weights")
    assert gqa.k_proj.weight.shape == (kv_heads * D, E)


def test_weights_rows_sum_to_one_and_skip_padding():
    _, mha = pair(batch_first=True)
    q, _, _ = inputs(2, 6, 6, 32, True)
    kpm = padding(2, 6, [6, 2])
    _, w = mha(q, key_padding_mask=kpm, average_attn_weights=False)
    close(w.sum(-1), torch.ones(2, 4, 6), what="row sums")
    assert bool((w[1, :, :, 2:] == 0).all())


def test_fully_masked_row_gives_zeros_not_nan():
    _, mha = pair(batch_first=True)
    q, _, _ = inputs(1, 4, 4, 32, True)
    out, w = mha(q, key_padding_mask=torch.ones(1, 4, dtype=torch.bool))
    assert torch.isfinite(out).all() and bool((w == 0).all())
    close(out, mha.out_proj.bias.expand(1, 4, 32))  # attention output 0, then the projection


def test_causal_flag_masks_the_future():
    _, mha = pair(batch_first=True)
    q, _, _ = inputs(1, 5, 5, 32, True)
    _, w = mha(q, is_causal=True, average_attn_weights=False)
    assert bool((w.triu(1) == 0).all())
    changed = q.clone()
    changed[:, 3:] += 1.0
    a, _ = mha(q, is_causal=True)
    b, _ = mha(changed, is_causal=True)
    close(a[:, :3], b[:, :3])


def test_dropout_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, dropout=0.5, batch_first=True)
    x = torch.randn(1, 6, 16)
    train_out = mha(x, need_weights=False)[0]
    mha.eval()
    eval_a, eval_b = mha(x, need_weights=False)[0], mha(x, need_weights=False)[0]
    close(eval_a, eval_b)
    assert (train_out - eval_a).abs().max() > 1e-3


def test_need_weights_in_training_with_dropout():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, dropout=0.5, batch_first=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    out, w = mha(x, is_causal=True, average_attn_weights=False)
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    close(w.sum(-1), torch.ones(2, 2, 5), what="row sums")  # probabilities before dropout
    assert bool((w.triu(1) == 0).all())


@pytest.mark.parametrize("make, message", [
    (lambda: MultiHeadAttention(30, 4), "embed_dim 30 is not divisible by num_heads 4"),
    (lambda: MultiHeadAttention(32, 4, num_kv_heads=3), "not a multiple of num_kv_heads 3"),
    (lambda: MultiHeadAttention(32, 4, dropout=1.5), "dropout"),
    (lambda: MultiHeadAttention.from_torch(torch.nn.Linear(2, 2)), "MultiheadAttention"),
    (lambda: MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True)),
     "add_bias_kv"),
])
def test_bad_construction(make, message):
    with pytest.raises(AttnlabError, match=message):
        make()


def test_bad_mask_shapes_name_the_argument():
    _, mha = pair(batch_first=True)
    q, _, _ = inputs(2, 5, 5, 32, True)
    with pytest.raises(AttnlabError, match=r"key_padding_mask: expected \(B, S\) = \(2, 5\)"):
        mha(q, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(AttnlabError, match=r"attn_mask: expected \(L, S\) = \(5, 5\)"):
        mha(q, attn_mask=torch.zeros(4, 5, dtype=torch.bool))
    with pytest.raises(AttnlabError, match="query: expected"):
        mha(torch.randn(2, 5, 6, 32))
