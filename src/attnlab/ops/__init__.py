"""The attention op and its backends (sdpa, math, tiled, reference), and weights on demand.

A call is validated once into a Problem (`validate`), dispatched (`dispatch`) to a backend
(`sdpa`, `plain` for "math", the `tiled` package, `numpy_ref` for "reference"); every path computes
scores through one pipeline (`scores`); `weights` recomputes exact rows of weights from the lse.
"""

from attnlab.ops.api import attention, attention_with_weights, select_backend
from attnlab.ops.dispatch import BACKENDS, Choice
from attnlab.ops.weights import attention_weights

__all__ = ["BACKENDS", "Choice", "attention", "attention_weights", "attention_with_weights",
           "select_backend"]
