"""The names of the lesson's sections, in order, without computing any (`attnlab.explain.lesson`
holds the sections themselves; the command line lists these names cheaply)."""

SECTIONS = ("compare", "divide", "softmax", "borrow", "causal", "heads", "check")
