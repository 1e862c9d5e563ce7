"""attnlab.flex_attention's call: torch's signature and return forms, the BlockMask's meaning
(the blocks decide, as compiled Flex), attnlab masks and attnlab-made BlockMasks, the paths it
takes and says, captured gradients, max_scores, errors, and the CUDA hand-off."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.flex import (
    AuxOutput,
    AuxRequest,
    BlockMask,
    api,
    create_block_mask,
    flex_attention,
    noop_mask,
    select_backend,
)
from flex_gallery import causal, dense_reference

from helpers import close


def qkv(B=2, H=2, L=100, S=100, D=8, Hkv=None, Bkv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)
    k = torch.randn(Bkv or B, Hkv or H, S, D, generator=g)
    v = torch.randn(Bkv or B, Hkv or H, S, D, generator=g)
    return q, k, v


def window(b, h, q, kv):
    return (q >= kv) & (q - kv < 16)


def test_the_top_level_name_is_the_flex_module_function():
    assert attnlab.flex_attention is flex_attention


def test_return_forms_match_torch():
    q, k, v = qkv()
    bm = create_block_mask(window, None, None, 100, 100, device="cpu")
    out = flex_attention(q, k, v, block_mask=bm)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 2, 100, 8)
    o2, lse = flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert lse.shape == (2, 2, 100) and lse.dtype == torch.float32
    _, aux = flex_attention(q, k, v, block_mask=bm, return_aux=AuxRequest(lse=True))
    assert isinstance(aux, AuxOutput) and aux.max_scores is None
    close(o2, out, atol=0)
    close(aux.lse, lse, atol=0)
    _, aux = flex_attention(q, k, v, block_mask=bm, return_aux=AuxRequest(max_scores=True))
    assert aux.lse is None and aux.max_scores.shape == (2, 2, 100)


def test_max_scores_are_the_largest_modified_masked_score_of_each_row():
    q, k, v = qkv(L=70, S=90)

    def mod(s, b, h, qi, ki):
        return s * 1.5 - 0.01 * (qi - ki).abs()

    def mask(b, h, qi, ki):
        return (ki <= qi) & (qi % 7 != 3)  # every 7th row sees nothing

    bm = create_block_mask(mask, None, None, 70, 90, device="cpu")
    _, aux = flex_attention(q, k, v, score_mod=mod, block_mask=bm,
                            return_aux=AuxRequest(lse=True, max_scores=True))
    s = (q.double() @ k.double().transpose(-1, -2)) * 8 ** -0.5
    i, j = torch.arange(70)[:, None], torch.arange(90)[None, :]
    s = torch.where(mask(0, 0, i, j), mod(s, 0, 0, i, j), float("-inf"))
    want = s.amax(-1)
    live = torch.isfinite(want)
    assert torch.equal(torch.isfinite(aux.max_scores), live)
    close(aux.max_scores[live], want[live], atol=1e-5, what="max_scores")


@pytest.mark.parametrize("fused", [False, True])
def test_max_scores_with_a_fused_score_mod(fused):
    q, k, v = qkv(L=50, S=60)
    slopes = torch.tensor([0.5, 0.25])

    def alibi(s, b, h, qi, ki):
        return s + (ki - qi) * slopes[h]

    mod = alibi if fused else api.Adapted(alibi, score=True)  # an Adapted is never fused
    _, aux = flex_attention(q, k, v, score_mod=mod, return_aux=AuxRequest(max_scores=True))
    s = (q.double() @ k.double().transpose(-1, -2)) * 8 ** -0.5
    s = s + (torch.arange(60)[None, :] - torch.arange(50)[:, None]) * slopes.double()[:, None, None]
    close(aux.max_scores, s.amax(-1), atol=1e-5, what="max_scores")


def test_the_blocks_decide_as_in_compiled_flex():
    """A BlockMask listing some blocks with a mask_mod that allows everything: only the listed
    blocks attend (compiled Flex's meaning), FULL ones without mask_mod, PARTIAL with it."""
    L = S = 256  # 2×2 blocks of 128
    num = torch.tensor([[[1, 1]]], dtype=torch.int32)  # (1, 1, nQ): one partial block per row
    idx = torch.tensor([[[[0, 1], [0, 1]]]], dtype=torch.int32)  # block 0 for both rows
    full_num = torch.tensor([[[0, 1]]], dtype=torch.int32)
    full_idx = torch.tensor([[[[0, 0], [1, 0]]]], dtype=torch.int32)  # row 1: block 1 is full

    def odd_keys(b, h, qi, ki):
        return ki % 2 == 1

    bm = BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=128,
                                  mask_mod=odd_keys, seq_lengths=(L, S))
    q, k, v = qkv(B=1, H=1, L=L, S=S)
    allowed = torch.zeros(L, S, dtype=torch.bool)
    allowed[:, :128] = torch.arange(128) % 2 == 1  # the partial blocks: odd keys
    allowed[128:, 128:] = True  # the full block
    want, _ = dense_reference(q.double(), k.double(), v.double(),
                              lambda b, h, qi, ki: allowed[qi, ki])
    close(flex_attention(q, k, v, block_mask=bm), want, atol=1e-5)


def test_an_attnlab_mask_and_an_attnlab_block_mask_take_the_built_in_path():
    from attnlab.ops import flex as backend

    q, k, v = qkv(L=300, S=300)
    m = masks.sliding_window(16)
    want = attnlab.attention(q, k, v, mask=m)
    close(flex_attention(q, k, v, block_mask=m), want, atol=1e-6)
    bm = backend.block_mask(m, 300, 300, "cpu")  # a BlockMask attnlab made from m
    assert api.mask_of(bm, q, k) is m
    close(flex_attention(q, k, v, block_mask=bm), want, atol=1e-6)


def test_a_block_mask_allowing_everything_is_no_mask():
    q, k, v = qkv()
    bm = create_block_mask(noop_mask, None, None, 100, 100, device="cpu")
    assert api.mask_of(bm, q, k) is None
    assert select_backend(q, k, v, block_mask=bm).backend == "sdpa"
    close(flex_attention(q, k, v, block_mask=bm), attnlab.attention(q, k, v), atol=1e-6)


def test_gqa_and_a_broadcast_key_batch():
    q, k, v = qkv(B=3, H=4, Hkv=2, Bkv=1)
    bm = create_block_mask(causal, None, None, 100, 100, device="cpu")
    want, _ = dense_reference(q.double(), k.double(), v.double(), causal)
    close(flex_attention(q, k, v, block_mask=bm, enable_gqa=True), want, atol=1e-5)


def test_rows_with_nothing_to_attend_give_zero_output_lse_minus_inf_and_zero_gradient():
    def late(b, h, qi, ki):
        return ki < qi - 10  # rows 0..10 see nothing

    q, k, v = (t.requires_grad_() for t in qkv(L=64, S=64))
    bm = create_block_mask(late, None, None, 64, 64, device="cpu")
    out, lse = flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert (out[:, :, :11] == 0).all() and (lse[:, :, :11] == float("-inf")).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, :, :11] == 0).all()


def test_captured_tensors_get_their_gradient():
    table = torch.randn(2, dtype=torch.float64, requires_grad=True)

    def head_scale(s, b, h, qi, ki):
        return s * table[h]

    q, k, v = (t.double().requires_grad_() for t in qkv(L=40, S=50))
    bm = create_block_mask(window, None, None, 40, 50, device="cpu")
    assert select_backend(q, k, v, score_mod=head_scale, block_mask=bm).backend == "tiled"
    flex_attention(q, k, v, score_mod=head_scale, block_mask=bm).sum().backward()
    ref, _ = dense_reference(q, k, v, window, head_scale)
    want = torch.autograd.grad(ref.sum(), table)[0]
    close(table.grad, want, atol=1e-10, what="gradient of the captured table")


def test_a_function_decides_its_form_once_per_shape():
    calls = []

    def counted(b, h, qi, ki):
        calls.append(qi.shape)
        return qi >= ki

    q, k, v = qkv(L=64, S=64)
    bm = create_block_mask(counted, None, None, 64, 64, device="cpu")
    flex_attention(q, k, v, block_mask=bm)
    n = len(calls)
    flex_attention(q, k, v, block_mask=bm)  # the mask is kept with the BlockMask: no new call
    assert len(calls) == n


@pytest.mark.parametrize("bad, what", [
    (dict(query=torch.zeros(2, 5, 8)), "query: flex_attention takes 4-D"),
    (dict(block_mask="causal"), "block_mask: expected a torch BlockMask"),
    (dict(kernel_options=[1]), "kernel_options: expected a dict"),
    (dict(return_lse=True, return_aux=AuxRequest(lse=True)), "return_lse: pass either"),
    (dict(return_aux=True), "return_aux: expected torch's AuxRequest"),
])
def test_bad_calls_name_the_argument(bad, what):
    q, k, v = qkv()
    kw = dict(query=q, key=k, value=v, **{n: x for n, x in bad.items() if n != "query"})
    kw["query"] = bad.get("query", q)
    with pytest.raises(AttnlabError, match=what.replace("(", r"\(")):
        flex_attention(**kw)


def test_a_block_mask_for_other_lengths_is_refused():
    q, k, v = qkv()
    bm = create_block_mask(causal, None, None, 128, 128, device="cpu")
    with pytest.raises(AttnlabError, match=r"made for \(Q_LEN, KV_LEN\) = \(128, 128\)"):
        flex_attention(q, k, v, block_mask=bm)


def test_kernel_options_are_accepted_on_the_cpu():
    q, k, v = qkv()
    close(flex_attention(q, k, v, kernel_options={"BLOCK_M": 64}), flex_attention(q, k, v),
          atol=0)


def test_on_cuda_the_call_goes_to_torch_compiled_flex_as_given(monkeypatch):
    seen = {}

    def fake(*args, **kw):
        seen["args"], seen["kw"] = args, kw
        return "torch's answer"

    monkeypatch.setattr(api, "on_cuda", lambda query: True)
    monkeypatch.setattr(api, "_compiled", lambda: fake)
    q, k, v = qkv()
    bm = create_block_mask(causal, None, None, 100, 100, device="cpu")
    aux = AuxRequest(lse=True)
    got = flex_attention(q, k, v, score_mod=window, block_mask=bm, scale=0.3,
                         kernel_options={"BLOCK_M": 32}, return_aux=aux)
    assert got == "torch's answer" and seen["args"] == (q, k, v)
    assert seen["kw"] == dict(score_mod=window, block_mask=bm, scale=0.3, enable_gqa=False,
                              return_lse=False, kernel_options={"BLOCK_M": 32}, return_aux=aux)


def test_a_broadcast_block_mask_runs_its_mask_mod_at_every_batch_and_head():
    """create_block_mask(B=None, H=None) lists blocks at b = h = 0; Flex's kernels still call
    mask_mod with each b and h in the partial blocks, and so does attnlab."""
    def per_bh(b, h, qi, ki):
        return (qi >= ki) & ((qi - ki) % (2 + b + h) == 0)

    q, k, v = qkv(B=2, H=3, L=64, S=64)
    bm = create_block_mask(per_bh, None, None, 64, 64, device="cpu")
    want, _ = dense_reference(q.double(), k.double(), v.double(), per_bh)
    close(flex_attention(q, k, v, block_mask=bm), want, atol=1e-5)


def test_attnlab_attention_runs_scalar_only_functions_too():
    """The failures that motivated the adapter: attention-gym's Flamingo mask as a mask function
    and its MLA score_mod, through attnlab.attention itself, forward and backward."""
    from flex_gallery import CASES

    flam, mla = CASES["gym flamingo"].mask_mod, CASES["gym mla rope"].score_mod
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 97, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 4, 33, 8, generator=g, dtype=torch.float64) for _ in range(2))
    m = masks.from_function(flam)
    why = attnlab.select_backend(q, k, v, mask=m, score_mod=mla).reason
    assert why.count("vmap form") == 2, why
    out = attnlab.attention(q, k, v, mask=m, score_mod=mla)
    want, _ = dense_reference(q, k, v, flam, mla)
    close(out, want, atol=1e-10)
    g1 = torch.autograd.grad(out.sum(), q)[0]
    g2 = torch.autograd.grad(want.sum(), q)[0]
    close(g1, g2, atol=1e-10, what="dq")
