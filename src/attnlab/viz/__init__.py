"""Drawing what explain computes: terminal text (and figures, pages)."""
