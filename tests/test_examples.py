"""The notebooks in examples/ run top to bottom (nbclient, a fresh kernel of this interpreter) and
show their views: HTML that carries the text's tokens, and no error anywhere."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# notebook -> what its HTML outputs must carry: the lesson's token headers, the pages' tokens
WANT = {
    "01_lesson_numbers.ipynb": ["<th>cat</th>", "<th>mat</th>", "<th>because</th>"],
    "02_explain_minilm.ipynb": ['"tokens":["[CLS]","the","cat","sat","on","the","mat","because"',
                                '"name":"Sentence A \\u2192 Sentence B","set":0,"rows":[0,9]'],
    "03_tiny_gpt_causal_heads.ipynb": ['"tokens":["F","u","l","l",', '"f","a","t","h","o","m"'],
    "04_induction_ablation.ipynb": ['"kind":"ablate"', '"measure":"loss"', '"lens":{"top":'],
}


def test_every_example_is_checked_and_stored_without_outputs():
    import nbformat

    assert sorted(p.name for p in EXAMPLES.glob("*.ipynb")) == sorted(WANT)
    for name in WANT:
        nb = nbformat.read(EXAMPLES / name, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells), f"{name}: outputs are committed"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WANT))
def test_example_runs_and_shows_its_views(name, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    if name == "04_induction_ablation.ipynb":  # its run, trained here once (minutes) when the
        from attnlab.models.cached_run import cached_run  # docs build has not cached it yet

        cached_run("induction", max_steps=1500)
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    pages = [o.data["text/html"] for o in outputs
             if o.output_type in ("display_data", "execute_result") and "text/html" in o.data]
    assert pages, f"{name}: no HTML output"
    text = "".join(pages) + "".join(html.unescape(p) for p in pages)  # a page: in an srcdoc
    for want in WANT[name]:
        assert want in text, (name, want)
