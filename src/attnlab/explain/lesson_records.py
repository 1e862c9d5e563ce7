"""The lesson's sections as records: one dataclass per step, built by
`attnlab.explain.lesson_sections` and drawn by viz (terminal text, drawings, the lesson page);
`to_json()` is what `attnlab lesson --json` prints for it (field order = the JSON's key order).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(kw_only=True)
class Section:
    """What every section has: its step `name` and `title`."""

    name: str
    title: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class TokenSection(Section):
    """A section over a sentence's `tokens`, which its per-token lists follow, in order (scale:
    each token's scores and weights; mask: each token's row; heads: each token's embedding)."""

    tokens: list[str]


@dataclass(kw_only=True)
class CompareRow:
    """One key against the query: the products written out (`arithmetic`) and the `score`."""

    token: str
    key: list[float]
    arithmetic: str
    score: float


@dataclass(kw_only=True)
class Compare(Section):
    """compare: the query against every key (dot products); `best_match` the highest."""

    name: str = "compare"
    query_token: str
    query: list[float]
    rows: list[CompareRow]
    best_match: str


@dataclass(kw_only=True)
class Normalize(Section):
    """normalize: `scores` divided by their `total` (`divided`) against `softmax` of them."""

    name: str = "normalize"
    scores: list[float]
    total: float
    divided: list[float]
    softmax: list[float]
    problem: str
    has_negative: bool


@dataclass(kw_only=True)
class Scale(TokenSection):
    """scale: softmax `weights` of the raw `scores` (summing to `sum`), and of the scores times
    `scale` = 1/sqrt(`head_dim`)."""

    name: str = "scale"
    scores: list[float]
    weights: list[float]
    sum: float
    scale: float
    head_dim: int
    scaled_scores: list[float]
    scaled_weights: list[float]


@dataclass(kw_only=True)
class Share:
    """One value's part of the context vector: weight × value = `contribution`."""

    token: str
    weight: float
    value: list[float]
    contribution: list[float]


@dataclass(kw_only=True)
class Borrow(Section):
    """borrow: the weighted sum of the values is the `context` vector."""

    name: str = "borrow"
    value_meaning: list[str]
    shares: list[Share]
    context: list[float]
    scale: float


@dataclass(kw_only=True)
class Mask(TokenSection):
    """mask: the causal mask (`allowed` (L, S), what each token `sees`) and the weights with it."""

    name: str = "mask"
    allowed: list[list[bool]]
    sees: list[list[str]]
    weights: list[list[float]]


@dataclass(kw_only=True)
class HeadExample:
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


@dataclass(kw_only=True)
class Heads(TokenSection):
    """heads: one sentence, two heads with their own projections, two patterns."""

    name: str = "heads"
    features: list[str]
    embeddings: list[list[float]]
    query_token: str
    scale: float
    heads: list[HeadExample]


@dataclass(kw_only=True)
class Question:
    """A check-yourself question of one `lesson`, its `answer`, and the `numbers` it uses."""

    lesson: str
    question: str
    answer: str
    numbers: dict = field(default_factory=dict)


@dataclass(kw_only=True)
class Check(Section):
    """check: both lessons' questions, answered with the sections' numbers."""

    name: str = "check"
    questions: list[Question]
