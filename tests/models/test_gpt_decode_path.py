"""The GPT's generation runs its decoding steps on the decode kernel (a KV cache of 256 keys or
more, one new token a step), with the tokens the cache-free forward gives."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from attnlab.models import GPT, GPTConfig, generate
from attnlab.ops.kernels import decode


def test_generate_decodes_on_the_decode_kernel():
    torch.manual_seed(3)
    cfg = GPTConfig(vocab_size=11, block_size=320, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                    name="test")
    model = GPT(cfg).eval()
    prompt = torch.randint(0, 11, (decode.MIN_KEYS + 8,)).tolist()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = generate(model, prompt, 4, temperature=1e-6, seed=0)  # all but greedy
    # the kernel's calls, as the decode backend's op or a step plan's C step ("attnlab::decode")
    ran = [e.name for e in prof.events() if e.name.endswith("::decode")]
    assert len(ran) >= 2 * 3  # every layer of each step after the prompt
    with torch.no_grad():  # the same tokens without a cache: each step one full forward
        ids = list(prompt)
        for _ in range(4):
            logits, _ = model(torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
    assert out == ids
