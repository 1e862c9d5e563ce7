"""What a model's tokenizer did to a text that a reader should know before reading its attention:
words it has no pieces for ([UNK]), accents it dropped, case it ignored.

    >>> vocabulary_warnings("Le café était fermé 🙂", tokenize, "[UNK]", "all-MiniLM-L6-v2")
    ['all-MiniLM-L6-v2 is an uncased English model: it reads "café" as "cafe", ...',
     '"🙂" became [UNK] (wholly or in part): ...']

`tokenize` is any function from a word to its tokens (a Hugging Face tokenizer's `tokenize`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable


def _plain(piece: str) -> str:
    for mark in ("\u2581", "\u0120", "\u2423"):
        piece = piece.replace(mark, "")
    return piece.removeprefix("##")


def _unaccented(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", word)
                   if not unicodedata.combining(c))


def vocabulary_warnings(text: str, tokenize: Callable[[str], list[str]], unk: str | None,
                        model: str) -> list[str]:
    """One line per kind of loss in `text` under `tokenize`: accents dropped, words (or
    characters) that became `unk`. An empty list when the text came through whole."""
    accents, unknown = [], []
    for word in text.split():
        pieces = tokenize(word)
        if unk is not None and unk in pieces:
            unknown.append(word)
            continue
        spelled = "".join(_plain(p) for p in pieces)
        if spelled.lower() != word.lower() and spelled.lower() == _unaccented(word).lower():
            accents.append((word, spelled))
    out = []
    if accents:
        shown = ", ".join(f'"{w}" as "{s}"' for w, s in accents[:4])
        more = f" (and {len(accents) - 4} more)" if len(accents) > 4 else ""
        out.append(f"{model} is an uncased English model: it reads {shown}{more}; the accents "
                   "are gone before attention sees the text")
    if unknown:
        shown = ", ".join(f'"{w}"' for w in unknown[:6])
        more = f" (and {len(unknown) - 6} more)" if len(unknown) > 6 else ""
        out.append(f"{shown}{more} became {unk} (wholly or in part): {model}'s vocabulary has "
                   f"no piece for {'them' if len(unknown) > 1 else 'it'} (it knows English, "
                   f"lower-cased); every {unk} is the same token, so its attention says nothing "
                   "about the word")
    return out
