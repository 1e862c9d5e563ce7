"""attnlab: attention, exactly and in the open.

    >>> import torch, attnlab
    >>> q = k = v = torch.randn(2, 4, 16, 32)           # (B, H, L, D)
    >>> out = attnlab.attention(q, k, v, is_causal=True)  # as F.scaled_dot_product_attention
"""

from attnlab import masks, nn
from attnlab.errors import AttnlabError
from attnlab.ops import BACKENDS, attention, attention_weights, select_backend
from attnlab.trace import Trace, trace

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "AttnlabError",
    "Trace",
    "__version__",
    "attention",
    "attention_weights",
    "masks",
    "nn",
    "select_backend",
    "trace",
]
