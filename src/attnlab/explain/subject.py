"""A loaded model made ready for interventions: one way to encode a text and run a batch of one,
whatever the model is.

- a checkpoint attnlab trained: its GPT, character ids, logits (B, L, V);
- a Hugging Face causal language model (config.architectures ends in ForCausalLM or
  LMHeadModel): loaded again with its LM head (`load_model` loads the base model), logits;
- any other Hugging Face model (the packaged all-MiniLM-L6-v2): final hidden states (B, L, C).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.errors import AttnlabError
from attnlab.explain.model import LoadedModel, display_tokens


@dataclass(eq=False)
class Subject:
    loaded: LoadedModel
    model: Any
    causal: bool

    @property
    def name(self) -> str:
        return self.loaded.name

    def encode(self, text: str) -> tuple[dict, list[int], list[str]]:
        """(inputs for `forward`, token ids, display tokens) of `text`."""
        if not isinstance(text, str) or not text.strip():
            raise AttnlabError(f"text: expected a non-empty string, got {text!r}")
        tok = self.loaded.tokenizer
        if self.loaded.kind == "attnlab":
            ids = [int(i) for i in tok.encode(text)]
            tokens = tok.tokens(tok.decode(ids))
            inputs = {"idx": torch.tensor([ids])}
        else:
            inputs = dict(tok(text, return_tensors="pt"))
            ids = inputs["input_ids"][0].tolist()
            tokens = display_tokens(tok, ids)
        limit = self.loaded.max_length
        if limit is not None and len(ids) > limit:
            raise AttnlabError(f"text: {len(ids)} tokens, but {self.name} takes at most {limit}")
        return inputs, ids, tokens

    def forward(self, inputs: dict) -> torch.Tensor:
        """logits (B, L, V) of a causal LM, else the final hidden states (B, L, C)."""
        if self.loaded.kind == "attnlab":
            return self.model(inputs["idx"])[0]
        if self.causal:
            return self.model(**inputs, use_cache=False).logits
        return self.model(**inputs).last_hidden_state

    def token_id(self, word: str) -> int:
        """The one token id of `word` (an answer of a logit difference)."""
        tok = self.loaded.tokenizer
        if self.loaded.kind == "attnlab":
            ids = tok.encode(word)
        else:
            ids = tok(word, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise AttnlabError(f"answer {word!r}: expected one token, it is {len(ids)}")
        return int(ids[0])

    def token_text(self, i: int) -> str:
        tok = self.loaded.tokenizer
        return tok.decode([int(i)])


def subject(loaded: LoadedModel) -> Subject:
    """The model of `loaded` ready for interventions (causal HF models loaded with their head)."""
    if loaded.kind == "attnlab":
        return Subject(loaded, loaded.model.eval(), causal=True)
    archs = getattr(loaded.model.config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return Subject(loaded, _causal_lm(loaded.path), causal=True)
    return Subject(loaded, loaded.model, causal=False)


@functools.lru_cache(maxsize=2)
def _causal_lm(path: str):
    import transformers

    from attnlab.adapters import hf

    hf.register()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, attn_implementation=hf.NAME, use_safetensors=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise AttnlabError(f"model {path}: could not load its language-model head ({e})") \
            from None
    return model.eval()
