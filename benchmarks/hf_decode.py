"""A Hugging Face Llama-shaped model on attnlab, SDPA and eager: prefill and greedy decoding (CPU).

    .venv/bin/python benchmarks/hf_decode.py                    # prompts of 2k and 8k tokens
    .venv/bin/python benchmarks/hf_decode.py --prompt 2048 --tokens 32 --threads 1

The model: transformers' LlamaForCausalLM from a local LlamaConfig (no hub), random weights
(fixed seed), hidden 512, 8 layers, 8 query / 2 key-value heads (head dim 64), float32. For each
prompt length and each attention implementation ("attnlab", "sdpa", "eager") in turn:

- prefill: one forward over the prompt (B = 1), and over a left-padded batch of two (the second
  sequence a quarter shorter, padded on the left, as `generate` pads) — SDPA then gets
  transformers' dense (B, 1, L, S) mask, attnlab a structured one (`adapters/hf_masks.py`);
- decode: greedy steps with the KV cache (DynamicCache), one token each, timed after the prefill:
  tokens/s; and the tokens themselves, compared with eager's.

Attention's share of a step: the same step with the attention replaced by a function that
returns zeros of the right shape ("none": no attention at all), share = 1 - t(none) / t(impl).
Medians over --repeats, every implementation (and "none") timed in turn within each repeat, on
the same inputs in one process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

IMPLS = ("attnlab", "sdpa", "eager")


def model_of(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                      max_position_embeddings=16384, torch_dtype=torch.float32)
    return LlamaForCausalLM(cfg).eval()


def no_attention(module, query, key, value, attention_mask, **kwargs):
    """A stand-in attention that computes nothing: (B, L, H, D) zeros, no weights."""
    B, H, L, D = query.shape
    return query.new_zeros(B, L, H, D), None


def register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from attnlab.adapters import hf

    hf.register()
    AttentionInterface.register("none", no_attention)
    AttentionMaskInterface.register("none", lambda *a, **k: None)


def timed(fn, repeats: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def decode(model, ids, mask, tokens: int):
    """(seconds per decoded token, the tokens): prefill untimed, then `tokens` greedy steps."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        got = [nxt]
        t0 = time.perf_counter()
        for _ in range(tokens - 1):
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
            out = model(input_ids=nxt, attention_mask=mask, cache=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            got.append(nxt)
        dt = (time.perf_counter() - t0) / max(1, tokens - 1)
    return dt, torch.cat(got, 1)


def prefill(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, -1]


def run(prompt: int, tokens: int, repeats: int, impls) -> list[str]:
    model = model_of()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 32000, (1, prompt), generator=g)
    one = torch.ones_like(ids)
    batch = torch.randint(3, 32000, (2, prompt), generator=g)
    padded = torch.ones_like(batch)
    padded[1, :prompt // 4] = 0  # left padding, as generate pads a batch
    rows, times, toks_of = [], {}, {}
    for _ in range(repeats):  # every implementation in turn in each repeat: the load falls alike
        for impl in (*impls, "none"):
            model.set_attn_implementation(impl)
            t_pre, _ = timed(lambda: prefill(model, ids, one), 1)
            t_pad, _ = timed(lambda: prefill(model, batch, padded), 1) if impl != "none" \
                else (float("nan"), None)
            t_tok, toks_of[impl] = decode(model, ids, one, tokens)
            times.setdefault(impl, []).append((t_pre, t_pad, t_tok))
    res = {impl: (*(statistics.median(x) for x in zip(*t)), toks_of[impl])
           for impl, t in times.items()}
    none_pre, _, none_tok, _ = res["none"]
    eager_toks = res["eager"][3] if "eager" in res else None
    for impl in impls:
        t_pre, t_pad, t_tok, toks = res[impl]
        same = "—" if eager_toks is None else ("yes" if torch.equal(toks, eager_toks) else "NO")
        rows.append(
            f"| {prompt} | {impl} | {t_pre * 1e3:.0f} | {1 - none_pre / t_pre:.0%} | "
            f"{t_pad * 1e3:.0f} | {1 / t_tok:.1f} | {t_tok * 1e3:.1f} | "
            f"{1 - none_tok / t_tok:.0%} | {same} |")
    a = res.get("attnlab")
    if a and "sdpa" in res and "eager" in res:
        s, e = res["sdpa"], res["eager"]
        rows.append(f"| {prompt} | attnlab ÷ | prefill {s[0] / a[0]:.2f}× SDPA | | padded "
                    f"{s[1] / a[1]:.2f}× SDPA | decode {s[2] / a[2]:.2f}× SDPA, "
                    f"{e[2] / a[2]:.2f}× eager | | | |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens decoded per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    a = ap.parse_args(argv)
    if min([*a.prompt, a.tokens, a.repeats]) < 2:
        ap.error("--prompt, --tokens and --repeats take numbers >= 2")
    if a.threads:
        torch.set_num_threads(a.threads)
    register()
    print(f"# HF Llama-shaped model (hidden 512, 8 layers, 8/2 heads, fp32, random weights); "
          f"{torch.get_num_threads()} threads; torch {torch.__version__}; medians of "
          f"{a.repeats}; decode: {a.tokens} greedy tokens after the prefill")
    print("| prompt | attention | prefill ms | attention share | left-padded batch of 2 "
          "prefill ms | decode tokens/s | ms/token | attention share | tokens = eager's |")
    print("|---|---|---|---|---|---|---|---|---|")
    for prompt in a.prompt:
        for r in run(prompt, a.tokens, a.repeats, a.impls):
            print(r, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
