"""Ablation through attnlab equals the eager model with that head's slice of the output
projection's input zeroed, for MiniLM, GPT-2- and Llama-shaped (GQA) models and attnlab's GPT:
in float64 within 1e-12 (of the output's largest magnitude, when above 1); in float32 by the
house rule against that float64 answer (error ≤ 2× the float32 eager model's + 1e-6), since the
float32 eager model and transformers' own SDPA path already differ by ~2e-6 on outputs near 4;
the batched sweep's rows equal one run per head; patching a run from its own recording changes
nothing, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab import AttnlabError
from attnlab.interventions import (
    Ablate,
    FixPattern,
    HeadOutputs,
    MeanAblate,
    Patch,
    intervene,
    record_heads,
    sweep,
)
from attnlab.models import GPT
from interventions import models

from helpers import diff_report

TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
IDS = torch.tensor([[5, 17, 3, 44, 17, 3, 9, 28, 5, 17, 3]])


def _close(actual, expected, dtype, what):
    scale = expected.abs().max().item()
    worst = (actual - expected).abs().max().item()
    assert worst <= TOL[dtype] * max(scale, 1.0), f"{what}: {diff_report(actual, expected)}"


def _hf_out(model, **kw):
    out = model(**kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _eager(model, run, layer, head, head_dim):
    """The eager model's output with (layer, head) zeroed at the output projection's input."""
    if isinstance(model, GPT):
        h = models.zero_slice(model, layer, head, head_dim)
        try:
            return run(eager=True)
        finally:
            h.remove()
    model.set_attn_implementation(models.register_handwritten())
    h = models.zero_slice(model, layer, head, head_dim)
    try:
        return run()
    finally:
        h.remove()
        model.set_attn_implementation("attnlab")


def _cases():
    return ["minilm", "gpt2", "llama", "gpt"]


def _model(name, dtype, minilm):
    if name == "minilm":
        model = copy.deepcopy(minilm.model).to(dtype)
        enc = minilm.tokenizer("The cat sat on the mat because it was tired.",
                               return_tensors="pt")
        return model, (lambda: _hf_out(model, **enc)), 32
    if name == "gpt":
        model = models.gpt(dtype)
        return model, (lambda eager=False: models.eager_gpt(model, IDS) if eager
                       else model(IDS)[0]), 8
    model = getattr(models, name)(dtype)
    return model, (lambda: _hf_out(model, input_ids=IDS, use_cache=False)), 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", _cases())
@torch.no_grad()
def test_ablation_equals_the_eager_model_with_the_head_zeroed(name, dtype, minilm):
    model, run, head_dim = _model(name, dtype, minilm)
    layer, head = 1, 2
    with intervene(model, Ablate(layer, head)):
        ablated = run()
    expected = _eager(model, run, layer, head, head_dim)
    if dtype == torch.float64:
        _close(ablated, expected, dtype, f"{name} ablated")
    else:  # the house rule against the float64 eager answer
        model.double()
        oracle = _eager(model, run, layer, head, head_dim)
        model.float()
        ours, eagers = (ablated.double() - oracle).abs().max(), (expected - oracle).abs().max()
        assert ours <= 2 * eagers + 1e-6, f"{name}: attnlab {ours:.3e}, eager {eagers:.3e}"
    assert (ablated - run()).abs().max() > 1e3 * TOL[dtype]  # the head mattered
    out, rows = sweep(model, run)
    i = rows.index((layer, head))
    _close(out[1 + i], ablated[0], dtype, f"{name} sweep row")
    _close(out[0], run()[0], dtype, f"{name} sweep row 0")


@pytest.mark.parametrize("name", _cases())
@torch.no_grad()
def test_patching_a_run_from_its_own_recording_changes_nothing(name, minilm):
    model, run, _ = _model(name, torch.float32, minilm)
    with record_heads(model) as rec:
        plain = run()
    n_layers, n_heads = len(rec.z), rec.z[0].shape[1]
    every = [Patch(lyr, h, rec) for lyr in range(n_layers) for h in range(n_heads)]
    with intervene(model, every):
        patched = run()
    assert torch.equal(patched, plain)
    out, _ = sweep(model, run, values=rec)
    assert (out - plain).abs().max() <= TOL[torch.float32] * plain.abs().max()


@torch.no_grad()
def test_patching_from_another_input_puts_its_z_there():
    model = models.gpt2()
    other = IDS.flip(-1)
    with record_heads(model) as corrupt:
        model(input_ids=other, use_cache=False)
    with intervene(model, [Patch(1, h, corrupt) for h in range(4)]), \
            record_heads(model) as seen:
        model(input_ids=IDS, use_cache=False)
    with record_heads(model) as clean:
        model(input_ids=IDS, use_cache=False)
    assert torch.equal(seen.z[0], clean.z[0])  # recorded before the edit; layer 0 untouched
    with intervene(model, [Patch(0, h, corrupt) for h in range(4)]), \
            record_heads(model) as seen:
        model(input_ids=IDS, use_cache=False)
    assert not torch.equal(seen.z[1], clean.z[1])  # layer 1 now sees the patched layer 0


@torch.no_grad()
def test_mean_ablation_replaces_z_by_its_mean_over_the_references():
    model = models.gpt()
    runs = []
    for ids in (IDS, IDS[:, :7], IDS.flip(-1)):
        with record_heads(model) as rec:
            model(ids)
        runs.append(rec)
    means = HeadOutputs.average(runs)
    z = torch.cat([r.z[2][:, 1].reshape(-1, 8) for r in runs])  # (tokens, Dv)
    assert torch.allclose(means.z[2][0, 1, 0], z.mean(0), atol=1e-7)
    with intervene(model, MeanAblate(2, 1, means)), record_heads(model) as seen:
        model(IDS)
    with intervene(model, MeanAblate(2, 1, means)):
        logits = model(IDS)[0]
    mean_vec = means.z[2][:, 1:2]  # (1, 1, 1, Dv)
    h = models.out_proj(model, 2).register_forward_pre_hook(
        lambda m, a: (torch.cat([a[0][..., :8], mean_vec[0, 0].expand(*a[0].shape[:-1], 8),
                                 a[0][..., 16:]], -1),))
    try:
        expected = models.eager_gpt(model, IDS)
    finally:
        h.remove()
    _close(logits, expected, torch.float32, "mean ablation")
    assert seen.z[2].shape == (1, 4, 11, 8)


@torch.no_grad()
def test_a_fixed_pattern_borrows_by_it():
    model = models.llama(torch.float64)
    L = IDS.shape[1]
    own = torch.eye(L, dtype=torch.float64)  # every token borrows only its own value
    with intervene(model, FixPattern(0, 3, own)):
        fixed = model(input_ids=IDS, use_cache=False).logits
    # by hand: head 3 (k/v head 1 under GQA) outputs its values, z = own @ v = v
    x = model.model.layers[0].input_layernorm(model.model.embed_tokens(IDS))
    v = model.model.layers[0].self_attn.v_proj(x).view(1, L, 2, 8)[:, :, 1]  # (1, L, Dv)

    def pre(module, args):
        y = args[0].clone()
        y[..., 24:32] = v
        return (y,)
    model.set_attn_implementation(models.register_handwritten())
    h = models.out_proj(model, 0).register_forward_pre_hook(pre)
    try:
        expected = model(input_ids=IDS, use_cache=False).logits
    finally:
        h.remove()
        model.set_attn_implementation("attnlab")
    _close(fixed, expected, torch.float64, "fixed pattern")
    assert (fixed - model(input_ids=IDS, use_cache=False).logits).abs().max() > 1e-3


def test_bad_edits_are_one_error_naming_the_argument():
    model = models.gpt()
    with pytest.raises(AttnlabError, match=r"head: expected an index in 0\.\.3"), \
            intervene(model, Ablate(0, 4)):
        pass
    with pytest.raises(AttnlabError, match="edited twice"), \
            intervene(model, [Ablate(0, 1), Ablate(0, 1, 0.5)]):
        pass
    with record_heads(model) as rec:
        model(IDS)
    with pytest.raises(AttnlabError, match="does not fit"), torch.no_grad(), \
            intervene(model, Patch(0, 1, rec)):
        model(IDS[:, :5])
    lm = models.gpt2()
    lm.set_attn_implementation("eager")
    with pytest.raises(AttnlabError, match="runs on 'eager'"), intervene(lm, Ablate(0, 0)):
        pass
