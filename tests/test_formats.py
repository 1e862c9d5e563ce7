"""attnlab.formats: one spelling of percentages and vectors for every text report."""

from attnlab.formats import pct, vec


def test_pct_and_vec():
    assert pct(0.0731) == "  7.3%" and pct(1.0) == "100.0%" and pct(0.0731, 0) == "7.3%"
    assert vec([1, 0.25, 1 / 3]) == "[1, 0.25, 0.333]" and vec([]) == "[]"
