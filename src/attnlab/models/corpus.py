"""The bundled public-domain corpus (Shakespeare; see data/SOURCES.txt for source and license)."""

from __future__ import annotations

from importlib import resources

from attnlab.errors import AttnlabError

#: corpus name -> files in attnlab/models/data, joined with a blank line
CORPORA: dict[str, tuple[str, ...]] = {
    "shakespeare": ("tempest.txt", "sonnets.txt"),
    "tempest": ("tempest.txt",),
    "sonnets": ("sonnets.txt",),
}


def load_corpus(name: str = "shakespeare") -> str:
    """The text of a bundled corpus (about 190 kB of English for "shakespeare")."""
    if name not in CORPORA:
        raise AttnlabError(f"corpus: unknown {name!r}; expected one of {sorted(CORPORA)}")
    root = resources.files("attnlab.models") / "data"
    return "\n\n".join(root.joinpath(f).read_text(encoding="utf-8") for f in CORPORA[name])


def corpus_license() -> str:
    """Where the bundled texts come from and why they may be shipped."""
    return (resources.files("attnlab.models") / "data" / "SOURCES.txt").read_text(encoding="utf-8")
