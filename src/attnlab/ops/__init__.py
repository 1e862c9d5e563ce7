"""The attention op and its backends (sdpa, math, tiled, reference), and weights on demand."""

from attnlab.ops.api import attention, select_backend
from attnlab.ops.dispatch import BACKENDS, Choice
from attnlab.ops.weights import attention_weights

__all__ = ["BACKENDS", "Choice", "attention", "attention_weights", "select_backend"]
