"""The names of the head statistics, in order, without computing any (`attnlab.explain.heads`
defines them; the command line lists these names cheaply)."""

STATS = ("entropy", "entropy_norm", "self", "prev", "next", "first", "special", "punct", "max",
         "offset", "offset_share", "duplicate", "induction")
