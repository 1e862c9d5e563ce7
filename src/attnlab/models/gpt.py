"""A small GPT: token (+ learned position) embeddings, pre-norm blocks of causal self-attention
and an MLP, a final LayerNorm and a linear head. nanoGPT's shape on attnlab.nn modules.

Positions are learned embeddings, or rotary (config.rotary) applied inside attention. With
config.attn_only the blocks have no MLP (and no second LayerNorm): attention-only transformers.

Context parallel: a GPT handed an `attnlab.distributed.ContextParallel` (`GPT(cfg,
context_parallel=h)` or `model.set_context_parallel(h)`; the model never imports
torch.distributed) takes the whole sequences on every rank of the handle's group, keeps this
rank's rows (`h.positions(L)`, global positions for the learned or rotary embeddings) and attends
across the group. Its loss is this rank's share of the mean over all B·L tokens: summed over the
group it is the one-process loss.
Caution: learned positions stop at block_size; `attnlab.models.generate` slides the window.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.models.config import GPTConfig
from attnlab.nn import CausalSelfAttention, KVCache


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg.n_embd, cfg.n_head, cfg.n_kv_head, bias=cfg.bias,
                                        dropout=cfg.dropout, rotary=cfg.rotary,
                                        rope_base=cfg.rope_base)
        self.drop = nn.Dropout(cfg.dropout)
        self.ln2 = None if cfg.attn_only else nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = None if cfg.attn_only else MLP(cfg)

    def forward(self, x, cache=None, record=None, positions=None):
        x = x + self.drop(self.attn(self.ln1(x), cache, record, positions))
        return x if self.mlp is None else x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT language model over token ids (B, L) -> next-token logits (B, L, vocab_size)."""

    def __init__(self, config: GPTConfig, *, context_parallel=None):
        super().__init__()
        self.config = config
        self.context_parallel = None
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = None if config.rotary else nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        for i, b in enumerate(self.blocks):
            b.attn.layer_idx = i  # what attnlab.interventions addresses
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance flat
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.set_context_parallel(context_parallel)

    def set_context_parallel(self, handle) -> GPT:
        """Split sequences across `handle`'s group (an attnlab.distributed.ContextParallel), or,
        with None, keep them whole in this process. The weights are untouched."""
        self.context_parallel = handle
        for b in self.blocks:
            b.attn.context_parallel = handle
        return self

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_caches(self, batch_size: int = 1, max_length: int | None = None) -> list[KVCache]:
        """One empty KVCache per layer, for up to max_length (default block_size) positions."""
        n = max_length or self.config.block_size
        return [b.attn.new_cache(batch_size, n) for b in self.blocks]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                caches: list[KVCache] | None = None, record: list | None = None):
        """(logits (B, L, V), loss or None). With `caches`, idx are the tokens after the cached
        ones; with `record` (a list), each layer appends its AttentionCall."""
        if idx.dim() != 2:
            raise AttnlabError(f"idx: expected token ids (B, L), got shape {tuple(idx.shape)}")
        B, L = idx.shape
        if self.context_parallel is not None:
            return self._forward_cp(idx, targets, caches, record)
        start = caches[0].length if caches else 0
        if self.wpe is not None and start + L > self.config.block_size:
            raise AttnlabError(f"idx: positions up to {start + L} exceed block_size "
                               f"{self.config.block_size}")
        x = self.wte(idx)  # (B, L, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + L, device=idx.device))  # + (L, C)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches else None, record)
        logits = self.lm_head(self.ln_f(x))  # (B, L, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * L, -1), targets.reshape(B * L))
        return logits, loss

    def _forward_cp(self, idx, targets, caches, record):
        """This rank's rows of the logits (B, L_local, V) and its share of the mean loss."""
        B, L = idx.shape
        if caches or record is not None:
            raise AttnlabError("context_parallel: KV caches and records need the whole sequence "
                               "in one process (set_context_parallel(None))")
        if self.wpe is not None and self.config.block_size < L:
            raise AttnlabError(f"idx: positions up to {L} exceed block_size "
                               f"{self.config.block_size}")
        pos = self.context_parallel.positions(L).to(idx.device)  # (L_local,) global positions
        x = self.wte(idx[:, pos])  # (B, L_local, C)
        if self.wpe is not None:
            x = x + self.wpe(pos)  # + (L_local, C)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, positions=pos)
        logits = self.lm_head(self.ln_f(x))  # (B, L_local, V)
        loss = None
        if targets is not None:
            # summed here, divided by every token of the group's sequences: the group's sum is
            # the mean over the whole sequence, not a mean of per-shard means
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   targets[:, pos].reshape(-1), reduction="sum") / (B * L)
        return logits, loss
