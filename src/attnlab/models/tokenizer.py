"""Tokenizers: text <-> ids, and a display string per id. Character-level now; the spec/registry
lets checkpoints name other kinds later (`tokenizer_from_spec({"kind": ..., ...})`)."""

from __future__ import annotations

from attnlab.errors import AttnlabError

# how whitespace ids show in token lists (heatmap axes must show something visible)
_DISPLAY = {"\n": "\\n", "\t": "\\t", " ": "␣"}


class CharTokenizer:
    """One id per character of a fixed alphabet (sorted, so the same text gives the same ids)."""

    kind = "char"

    def __init__(self, chars: str):
        if not chars or len(set(chars)) != len(chars):
            raise AttnlabError("chars: expected a non-empty string of distinct characters")
        self.chars = chars
        self._ids = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted({c for c in text if c not in self._ids})
        if unknown:
            raise AttnlabError(f"text: characters {''.join(unknown)!r} are not in the "
                               f"tokenizer's alphabet {self.chars!r}")
        return [self._ids[c] for c in text]

    def decode(self, ids) -> str:
        try:
            return "".join(self.chars[int(i)] for i in ids)
        except IndexError:
            bad = [int(i) for i in ids if not 0 <= int(i) < self.vocab_size]
            raise AttnlabError(f"ids: {bad[:5]} outside the vocabulary 0..{self.vocab_size - 1}")\
                from None

    def tokens(self, text: str) -> list[str]:
        """One display string per id of `text` (whitespace made visible)."""
        self.encode(text)  # same checks as encode
        return [_DISPLAY.get(c, c) for c in text]

    def spec(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}

    @classmethod
    def from_spec(cls, spec: dict) -> CharTokenizer:
        if not isinstance(spec.get("chars"), str):
            raise AttnlabError(f"tokenizer: 'chars' must be a string, got "
                               f"{spec.get('chars')!r:.80}")
        return cls(spec["chars"])

    def __repr__(self):
        return f"CharTokenizer(vocab_size={self.vocab_size})"


TOKENIZERS = {"char": CharTokenizer}


def tokenizer_from_spec(spec: dict):
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind not in TOKENIZERS:
        raise AttnlabError(f"tokenizer: unknown kind {kind!r}; expected one of "
                           f"{sorted(TOKENIZERS)}")
    return TOKENIZERS[kind].from_spec(spec)
