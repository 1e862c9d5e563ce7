"""The attention op and its backends (sdpa, math, reference)."""

from attnlab.ops.api import attention, select_backend
from attnlab.ops.dispatch import BACKENDS, Choice

__all__ = ["BACKENDS", "Choice", "attention", "select_backend"]
