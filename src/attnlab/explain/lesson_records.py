"""The lesson's sections as records: one keyword-only dataclass per step, built by
`attnlab.explain.lesson_sections` and drawn by viz (terminal text, drawings, the lesson page);
`to_json()` is what `attnlab lesson --json` prints for it (field order = the JSON's key order).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar, dataclass_transform


@dataclass_transform(kw_only_default=True)
class Record:
    """A record of the lesson: every subclass is a keyword-only dataclass."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclass(kw_only=True)(cls)


class Section(Record):
    """What every section has: its step `name` (`class Compare(Section, step="compare")`) and
    `title`."""

    name: ClassVar[str] = ""
    title: str

    def __init_subclass__(cls, step: str | None = None, **kwargs):
        if step is not None:
            cls.name = step
        super().__init_subclass__(**kwargs)

    def to_json(self) -> dict:
        return {"name": self.name, **asdict(self)}


class TokenSection(Section):
    """A section over a sentence's `tokens`, which its per-token lists follow, in order (scale:
    each token's scores and weights; mask: each token's row; heads: each token's embedding)."""

    tokens: list[str]


class CompareRow(Record):
    """One key against the query: the products written out (`arithmetic`) and the `score`."""

    token: str
    key: list[float]
    arithmetic: str
    score: float


class Compare(Section, step="compare"):
    """compare: the query against every key (dot products); `best_match` the highest."""

    query_token: str
    query: list[float]
    rows: list[CompareRow]
    best_match: str


class Normalize(Section, step="normalize"):
    """normalize: `scores` divided by their `total` (`divided`) against `softmax` of them."""

    scores: list[float]
    total: float
    divided: list[float]
    softmax: list[float]
    problem: str
    has_negative: bool


class Scale(TokenSection, step="scale"):
    """scale: softmax `weights` of the raw `scores` (summing to `sum`), and of the scores times
    `scale` = 1/sqrt(`head_dim`)."""

    scores: list[float]
    weights: list[float]
    sum: float
    scale: float
    head_dim: int
    scaled_scores: list[float]
    scaled_weights: list[float]


class Share(Record):
    """One value's part of the context vector: weight × value = `contribution`."""

    token: str
    weight: float
    value: list[float]
    contribution: list[float]


class Borrow(Section, step="borrow"):
    """borrow: the weighted sum of the values is the `context` vector."""

    value_meaning: list[str]
    shares: list[Share]
    context: list[float]
    scale: float


class Mask(TokenSection, step="mask"):
    """mask: the causal mask (`allowed` (L, S), what each token `sees`) and the weights with it."""

    allowed: list[list[bool]]
    sees: list[list[str]]
    weights: list[list[float]]


class HeadExample(Record):
    """One of the two heads: its projections, the query's scores and weights, its top token."""

    name: str
    looks_for: str
    w_q: list[list[float]]
    w_k: list[list[float]]
    query: list[float]
    keys: list[list[float]]
    scores: list[float]
    weights: list[float]
    top_token: str
    top_weight: float


class Heads(TokenSection, step="heads"):
    """heads: one sentence, two heads with their own projections, two patterns."""

    features: list[str]
    embeddings: list[list[float]]
    query_token: str
    scale: float
    heads: list[HeadExample]


class Question(Record):
    """A check-yourself question of one `lesson`, its `answer`, and the `numbers` it uses."""

    lesson: str
    question: str
    answer: str
    numbers: dict = field(default_factory=dict)


class Check(Section, step="check"):
    """check: both lessons' questions, answered with the sections' numbers."""

    questions: list[Question]
