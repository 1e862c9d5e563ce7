"""Attention dropout under context parallelism: whether weight (b, h, i, j) is dropped is a pure
function of (seed, b, h, i, j), so P = 1-4 ranks × layouts × strategies give the dense float64
oracle that applies the same keyed mask (out, lse, dq, dk, dv within 1e-10); the mask's
statistics; p = 0 is the old path bit for bit; bad arguments are named; a GPT under CP with
attention dropout gives the same loss and gradients for P = 1, 2, 4; `attnlab train --cp 2`
trains a preset with dropout."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from attnlab import AttnlabError
from attnlab.distributed import context_parallel_attention, keyed
from distributed.dropout_cases import CONFIGS, LAYOUTS, STRATEGIES, oracle

M = 0xFFFFFFFF


@pytest.fixture(scope="module")
def group():
    """(exact results per rank, p = 0 results per rank, GPT results per rank) on 4 processes."""
    from distributed.dropout_cases import all_cases
    from distributed.harness import run_group

    per_rank = run_group(all_cases, 4, timeout_s=240)
    return tuple([r[what] for r in per_rank] for what in ("exact", "p0", "gpt"))


def test_every_world_size_layout_and_strategy_gives_the_keyed_oracle(group):
    ran = 0
    for name in CONFIGS:
        for P in range(1, 5):
            for lay in LAYOUTS:
                for strat in STRATEGIES:
                    per_rank = [r[(name, P, lay, strat)] for r in group[0][:P]]
                    if per_rank[0] is None:  # ulysses with query heads that do not split
                        assert strat == "ulysses" and CONFIGS[name][0] % P, (name, P)
                        continue
                    ran += 1
                    for rank, errs in enumerate(per_rank):
                        for what, err in errs.items():
                            assert err <= 1e-10, (f"{name} P={P} {lay} {strat} rank {rank} "
                                                  f"{what}: relative error {err:.3e}")
    # GQA (H = 4): no ulysses at P = 3; at P = 4 its Hkv = 2 heads are replicated to 4
    assert ran == len(CONFIGS) * 4 * 3 * 3 - 3


def test_p_zero_is_the_old_path_bit_for_bit(group):
    for rank, res in enumerate(group[1]):
        assert res == {"ring": True, "allgather": True}, (rank, res)


def test_a_gpt_with_attention_dropout_is_the_same_for_any_number_of_ranks(group):
    res = group[2][0]  # rank 0 holds every P's totals
    loss1, grad1 = res[1]
    for P in (2, 4):
        loss, grad = res[P]
        assert abs(loss - loss1) <= 1e-10 * abs(loss1), (P, loss, loss1)
        assert (grad - grad1).abs().max().item() <= 1e-10 * grad1.abs().max().item(), P
    # dropout is on, and the next step drops other weights
    assert abs(res["eval"] - loss1) > 1e-6 and abs(res["step6"] - loss1) > 1e-6, res


# -- the keyed hash -------------------------------------------------------------------------------

def _fmix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M
    return x ^ (x >> 16)


def _keep(seed: int, p: float, b: int, h: int, i: int, j: int) -> bool:
    """The documented formula, one weight at a time, on Python ints."""
    s = _fmix(_fmix((seed & M) ^ 0x9E3779B9) ^ ((seed >> 32) & M))
    s0, s1, s2, s3 = (_fmix(s ^ c) for c in (0x9E3779B9, 0x7F4A7C15, 0x94D049BB, 0x2545F491))
    hb, hh, hi, hj = (_fmix((x + s_) & M) for x, s_ in ((b, s0), (h, s1), (i, s2), (j, s3)))
    r = _fmix(_fmix(hb ^ hh) ^ hi)
    x = _fmix((_fmix(r ^ hj) + hj) & M)
    return x >= round(p * 2 ** 32)


def test_the_tensor_hash_is_the_integer_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randint(0, 2 ** 32, (2000,), generator=g, dtype=torch.int64),
                   torch.tensor([0, 1, 2 ** 16 - 1, 2 ** 16, 2 ** 31, 2 ** 32 - 1])])
    assert keyed.fmix32(x).tolist() == [keyed.fmix32_int(int(v)) for v in x]
    assert [keyed.fmix32_int(v) for v in (0, 1, 2 ** 32 - 1)] == [_fmix(v) for v in
                                                                (0, 1, 2 ** 32 - 1)]
    for seed, p in ((0, 0.5), (2 ** 62 + 12345, 0.1), (987654321, 0.9)):
        rows, cols = torch.tensor([0, 5, 70000, 2 ** 32 - 1]), torch.tensor([3, 4, 4096])
        got = keyed.keep_mask(seed, p, 2, torch.tensor([0, 3]), rows, cols)
        want = [[[[_keep(seed, p, b, h, int(i), int(j)) for j in cols] for i in rows]
                 for h in (0, 3)] for b in range(2)]
        assert got.tolist() == want, (seed, p)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_kept_fraction_is_one_minus_p(p):
    n = 2 * 4 * 512 * 512
    keep = keyed.keep_mask(1, p, 2, torch.arange(4), torch.arange(512), torch.arange(512))
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(keep.double().mean().item() - (1 - p)) < 5 * sd
    # neighbours are independent: adjacent keys and adjacent rows agree as two coin flips do
    same = 1 - 2 * p * (1 - p)
    for a, b in ((keep[..., 1:], keep[..., :-1]), (keep[:, :, 1:], keep[:, :, :-1])):
        assert abs((a == b).double().mean().item() - same) < 6 * math.sqrt(same * (1 - same) / n)


def test_every_coordinate_and_the_seed_change_the_mask():
    def mask(seed=3, b=0, h=0, i0=0, j0=0):
        return keyed.keep_mask(seed, 0.5, b + 1, torch.tensor([h]), torch.arange(i0, i0 + 64),
                               torch.arange(j0, j0 + 64))[b]
    base = mask()
    for other in (mask(seed=4), mask(b=1), mask(h=1), mask(i0=64), mask(j0=64)):
        differ = (other != base).double().mean().item()
        assert 0.4 < differ < 0.6, differ  # two independent masks of p = 0.5 differ in half


def test_the_output_is_unbiased():
    # uniform weights (q = 0): out_i = mean_j(keep_ij · v_j) / (1 − p), expectation mean(v)
    B, H, L, D, p = 2, 4, 64, 4, 0.25
    g = torch.Generator().manual_seed(0)
    v = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    q = torch.zeros(B, H, L, D, dtype=torch.float64)
    seeds = range(20)
    outs = torch.stack([context_parallel_attention(q, q, v, dropout_p=p, dropout_seed=s)
                        for s in seeds])  # (seeds, B, H, L, D)
    err = outs.mean((0, 3)) - v.mean(2)  # (B, H, D): averaged over seeds and rows
    # each out entry: variance p/(1 − p) · mean(v²)/L; averaged over len(seeds)·L of them
    sd = math.sqrt(p / (1 - p) * v.square().mean().item() / L / (len(seeds) * L))
    assert err.abs().max().item() < 5 * sd, (err.abs().max().item(), sd)
    plain = context_parallel_attention(q, q, v)
    assert not torch.allclose(outs[0], plain)  # dropout is on


def test_one_process_matches_the_dense_oracle_and_reuses_a_drawn_seed():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = context_parallel_attention(q, k, v, is_causal=True, dropout_p=0.4, dropout_seed=11)
    allowed = torch.ones(9, 9, dtype=torch.bool).tril()
    torch.testing.assert_close(out, oracle(q, k, v, allowed, None, seed=11, p=0.4)[0],
                               rtol=0, atol=1e-12)
    torch.manual_seed(5)
    a = context_parallel_attention(q, k, v, dropout_p=0.4)
    torch.manual_seed(5)
    assert torch.equal(a, context_parallel_attention(q, k, v, dropout_p=0.4))


@pytest.mark.parametrize("kw, needle", [
    ({"dropout_p": 1.0}, "dropout_p: expected a probability in [0, 1), got 1.0"),
    ({"dropout_p": -0.1}, "dropout_p: expected a probability in [0, 1), got -0.1"),
    ({"dropout_p": math.nan}, "dropout_p: expected a probability in [0, 1), got nan"),
    ({"dropout_p": True}, "dropout_p: expected a probability in [0, 1), got True"),
    ({"dropout_p": "0.1"}, "dropout_p: expected a probability in [0, 1), got '0.1'"),
    ({"dropout_p": 0.1, "dropout_seed": 1.5}, "dropout_seed: expected an int or None, got 1.5"),
    ({"dropout_p": 0.1, "dropout_seed": True}, "dropout_seed: expected an int or None, got True"),
])
def test_bad_dropout_arguments_are_named(kw, needle):
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(AttnlabError) as e:
        context_parallel_attention(q, q, q, **kw)
    assert needle in str(e.value)


@pytest.mark.slow
def test_train_cp2_with_the_small_presets_dropout(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", "train", "--preset", "small", "--nproc", "2", "--cp",
         "2", "--max-steps", "6", "--batch-size", "4", "--warmup-steps", "0", "--lr", "3e-3",
         "--eval-interval", "1000", "--out", str(out), "--quiet", "--timeout", "120"],
        capture_output=True, text=True, timeout=500, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((out / "attnlab.json").read_text())
    assert doc["model"]["dropout"] == 0.1
    losses = [h["loss"] for h in doc["state"]["history"]]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, losses


def test_the_trainer_keys_each_layer_and_step_alike_on_every_run():
    from attnlab.distributed import ContextParallel
    from attnlab.models import GPT, GPTConfig
    from attnlab.models.parallel import Parallel

    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8))
    par = Parallel(0, 2, 1, 2, ContextParallel(), torch.device("cpu"), 30.0)

    def keys(step):
        par.key_dropout(model, 1337, step)
        return [b.attn.dropout_seed for b in model.blocks]

    a = keys(4)
    assert len(set(a)) == 3 and keys(5) != a and keys(4) == a  # a resumed step 4 repeats them
    assert all(0 <= k < 2 ** 63 for k in a)
    # (D, C) = (2, 2): ranks 0, 1 are replica 0 (the keys above), ranks 2, 3 replica 1
    same = Parallel(1, 4, 2, 2, ContextParallel(), torch.device("cpu"), 30.0)
    other = Parallel(2, 4, 2, 2, ContextParallel(), torch.device("cpu"), 30.0)
    same.key_dropout(model, 1337, 4)
    assert [b.attn.dropout_seed for b in model.blocks] == a  # one replica, one mask
    other.key_dropout(model, 1337, 4)
    assert not set(b.attn.dropout_seed for b in model.blocks) & set(a)  # replicas differ
    one = Parallel(0, 1, 1, 1, None, torch.device("cpu"), 30.0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    one.key_dropout(model, 1337, 4)  # no context parallelism: dropout stays torch's stream
    assert model.blocks[0].attn.dropout_seed is None
