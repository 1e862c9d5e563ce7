"""quiet_transformers: no loading progress bars or advisories from transformers around a report."""

from __future__ import annotations


def quiet_transformers() -> None:
    # Loading progress bars and advisories would bury the one table the user asked for.
    try:
        from transformers.utils import logging
    except ImportError:
        return
    logging.disable_progress_bar()
    logging.set_verbosity_error()
