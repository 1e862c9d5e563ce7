"""Models the intervention tests share: tiny GPT-2- and Llama-shaped (GQA) transformers models with
random weights (no hub), attnlab's GPT, and each one's eager reference: the same weights with a
head's slice of the output projection's input zeroed by a forward pre-hook, attention written out
by hand (`handwritten`: softmax(q kᵀ · scale + mask) v in the input's dtype; transformers' own
eager path takes Llama's softmax in float32, so it is no float64 reference)."""

from __future__ import annotations

import torch

from attnlab.adapters import hf
from attnlab.models import GPT, GPTConfig

VOCAB = 61


def gpt2(dtype=torch.float32):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    hf.register()
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=3, n_head=4,
                     initializer_range=0.2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=1, eos_token_id=2)
    return _on_attnlab(GPT2LMHeadModel(cfg), dtype)


def llama(dtype=torch.float32):  # 4 query heads share 2 key/value heads
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    hf.register()
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      initializer_range=0.2)
    return _on_attnlab(LlamaForCausalLM(cfg), dtype)


def _on_attnlab(model, dtype):
    model.set_attn_implementation("attnlab")
    return model.eval().to(dtype)


def gpt(dtype=torch.float32, **kw):
    torch.manual_seed(3)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=3, n_head=4, n_embd=32, **kw)
    return GPT(cfg).eval().to(dtype)


HANDWRITTEN = "handwritten"


def handwritten(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                is_causal=None, **kwargs):
    """Attention as the lesson writes it, for transformers: q (B, H, L, D), k/v (B, Hkv, S, D)
    -> (out (B, L, H, D), weights (B, H, L, S))."""
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)  # (B, Hkv, S, D) -> (B, H, S, D)
    v = value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    s = query @ k.transpose(-1, -2) * scale  # (B, H, L, D) @ (B, H, D, S) -> (B, H, L, S)
    L, S = s.shape[-2:]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            s = s.masked_fill(~attention_mask, float("-inf"))
        else:
            s = s + attention_mask
    elif (is_causal if is_causal is not None else getattr(module, "is_causal", False)) and L > 1:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(S - L), float("-inf"))
    w = s.softmax(-1)
    return (w @ v).transpose(1, 2).contiguous(), w  # (B, H, L, S) @ (B, H, S, D) -> (B, L, H, D)


def register_handwritten() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(HANDWRITTEN, handwritten)
    AttentionMaskInterface.register(HANDWRITTEN, sdpa_mask)
    return HANDWRITTEN


def out_proj(model, layer: int):
    """The module whose input is layer `layer`'s merged heads (B, L, H·Dv)."""
    if hasattr(model, "blocks"):
        return model.blocks[layer].attn.out_proj
    if hasattr(model, "transformer"):  # GPT-2
        return model.transformer.h[layer].attn.c_proj
    if hasattr(model, "encoder"):  # BERT / MiniLM
        return model.encoder.layer[layer].attention.output.dense
    return model.model.layers[layer].self_attn.o_proj  # Llama


def zero_slice(model, layer: int, head: int, head_dim: int):
    """A forward pre-hook zeroing head `head`'s slice of the output projection's input; returns
    the handle."""
    def pre(module, args):
        x = args[0].clone()
        x[..., head * head_dim:(head + 1) * head_dim] = 0
        return (x, *args[1:])
    return out_proj(model, layer).register_forward_pre_hook(pre)


def eager_gpt(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """attnlab's GPT written out by hand in plain torch (softmax(q kᵀ / √D + causal) v), learned
    positions, no dropout: logits (B, L, V). Runs the model's own modules only for the linear
    and norm layers, so a pre-hook on out_proj applies."""
    B, L = idx.shape
    x = model.wte(idx) + model.wpe(torch.arange(L))  # (B, L, C)
    for block in model.blocks:
        a = block.attn
        H, Hkv, D = a.n_heads, a.n_kv_heads, a.head_dim
        q, k, v = a.qkv(block.ln1(x)).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = k.view(B, L, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        v = v.view(B, L, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        s = q @ k.transpose(-1, -2) / D ** 0.5  # (B, H, L, D) @ (B, H, D, L) -> (B, H, L, L)
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
        z = s.softmax(-1) @ v  # (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)
        x = x + a.out_proj(z.transpose(1, 2).reshape(B, L, H * D))
        if block.mlp is not None:
            x = x + block.mlp(block.ln2(x))
    return model.lm_head(model.ln_f(x))


def tiny_checkpoint(path, text: str = "the cat sat on the mat. <b>it</b> was tired & so: "):
    """A random-weight attnlab GPT saved as a checkpoint over `text`'s characters (no
    training): what `--model DIR` reads."""
    from attnlab.models import save_checkpoint
    from attnlab.models.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text(text)
    torch.manual_seed(4)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=4,
                          n_embd=32))
    save_checkpoint(path, model, tok)
    return path


def gpt2_dir(path):
    """A random-weight GPT-2 LM saved with a word-level tokenizer of its own (no hub): what a
    local Hugging Face causal LM directory holds."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tk_models
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "the", "cat", "sat", "on", "mat", "it", "was", "tired", "dog", "."]
    tk = Tokenizer(tk_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    model = gpt2()
    model.resize_token_embeddings(len(words))
    model.config.architectures = ["GPT2LMHeadModel"]
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
