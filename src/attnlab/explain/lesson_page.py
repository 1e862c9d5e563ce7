"""`lesson_page()`: the lesson as an explorable page, for Jupyter.

The page itself is drawn by `attnlab.viz.lesson_page`; it is imported when called, so importing
`attnlab.explain` never loads viz (which sits after explain in the data flow).
"""

from __future__ import annotations

from attnlab.errors import AttnlabError


def lesson_page(height: int = 900):
    """The explorable lesson (drag the query, edit the numbers, every percentage live).

    Returns a `LessonPage`: Jupyter shows it in a sandboxed iframe `height` pixels tall;
    `.save("lesson.html")` writes the offline page, `.html` is its text.
    """
    if isinstance(height, bool) or not isinstance(height, int) or height < 100:
        raise AttnlabError(f"height: expected pixels as an int >= 100, got {height!r}")
    from attnlab.viz.lesson_page import LessonPage

    return LessonPage(height)
