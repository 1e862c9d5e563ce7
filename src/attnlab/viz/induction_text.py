"""The induction story (`attnlab.explain.induction.InductionStory`) in the terminal: the losses on
the two copies under each intervention, and every head's zero ablation's effect on them."""

from __future__ import annotations

import textwrap

from attnlab.explain.induction import InductionStory
from attnlab.viz.effects_text import CAVEAT


def render_story(story: InductionStory) -> str:
    lines = [f"# {story.model_name}: {story.n} random characters, then the same {story.n} "
             f"again (seed {story.seed})", ""]
    width = max(len(w) for w, _, _ in story.rows)
    lines.append(f"loss on each copy{'':<{width - 17}}   first   second")
    for what, first, second in story.rows:
        lines.append(f"{what:<{width}}   {first:>5.3f}   {second:>6.3f}")
    lines += ["", "each head zero-ablated alone: change of the loss on the second copy "
              "(first copy in brackets)",
              f"(induction head: layer {story.induction[0]} head {story.induction[1]})"]
    L, H = story.second.shape
    lines.append("layer " + "".join(f"{'h' + str(h):>16}" for h in range(H)))
    for layer in range(L):
        cells = "".join(f"{story.second[layer, h]:>+8.3f} ({story.first[layer, h]:+.3f})"
                        for h in range(H))
        lines.append(f"{layer:>5} {cells}")
    lines += ["", *textwrap.wrap(CAVEAT, 79)]
    return "\n".join(lines) + "\n"
