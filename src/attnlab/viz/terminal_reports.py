"""The drawings `attnlab explain` and `attnlab lesson` add in a terminal: bars and heatmaps of
the weights their text reports (the text itself comes from the CLI and `lesson_text`)."""

from __future__ import annotations

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.explain.lesson_records import Section
from attnlab.explain.token import ExplainReport
from attnlab.viz.lesson_text import render_lesson
from attnlab.viz.terminal import _rich, bars, heatmap, show

TOP_K = 12  # bars shown for one token before the rest is summarised


def explain_drawing(report: ExplainReport, att: ModelAttention):
    """For the head `attnlab explain` details: the focus token's weights as bars, then the
    whole head as a heatmap (first tokens only when long, with a notice)."""
    Group, _, Text = _rich()
    d, toks = report.detail, report.tokens
    layer, head = d.layer, d.head
    word = toks[report.focus]
    return Group(
        Text(""),
        bars(d.weights, toks, allowed=d.mask, top_k=TOP_K,
             title=f'what "{word}" borrows in layer {layer}, head {head}'),
        Text(""),
        heatmap(np.asarray(att.weights[layer, head]), att.tokens, att.tokens, mask=att.mask,
                title=f"layer {layer}, head {head}: every token (rows) over every token"),
    )


def lesson_drawing(section: Section):
    """A drawing for the lesson sections that have weights to draw, else None."""
    Group = _rich()[0]
    name = section.name
    if name == "scale":
        return Group(bars(section.weights, section.tokens, title="softmax, unscaled"),
                     bars(section.scaled_weights, section.tokens,
                          title=f"softmax after scaling by {section.scale:.3f}"))
    if name == "borrow":
        return bars([s.weight for s in section.shares],
                    [s.token for s in section.shares], title="how much of each value")
    if name == "mask":
        return heatmap(np.asarray(section.weights), section.tokens, section.tokens,
                       mask=np.asarray(section.allowed, dtype=bool),
                       title="causal weights: rows may only look left")
    return None


def show_lesson(sections: list[Section], stream=None) -> None:
    """The lesson's text (unchanged, never re-wrapped) with each section's drawing under it."""
    import sys

    stream = sys.stdout if stream is None else stream
    for i, s in enumerate(sections, 1):
        body = render_lesson([s]).split("\n", 1)[1].rstrip("\n")  # without the "1." numbering
        show(_rich()[2](f"{i}. {s.title}", style="bold"), stream)
        stream.write(body + "\n")
        drawing = lesson_drawing(s)
        if drawing is not None:
            show(drawing, stream)
        stream.write("\n")
