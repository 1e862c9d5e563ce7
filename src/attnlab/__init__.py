"""attnlab: attention, exactly and in the open.

    >>> import torch, attnlab
    >>> q = k = v = torch.randn(2, 4, 16, 32)           # (B, H, L, D)
    >>> out = attnlab.attention(q, k, v, is_causal=True)  # as F.scaled_dot_product_attention

The names below are imported on first use (PEP 562), so `import attnlab` and `attnlab --help`
do not pay for torch until something needs it. Inside IPython / Jupyter, importing attnlab also
registers how a Trace and a ModelAttention are shown (HTML drawn by `attnlab.viz.notebook`): the
records themselves know nothing of drawing.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys
from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnlab.errors import AttnlabError

__version__ = "0.1.0"

#: public name -> the module that defines it ("" = the name is that submodule)
_LAZY = {
    "BACKENDS": "attnlab.ops",
    "Trace": "attnlab.tracing",
    "attention": "attnlab.ops",
    "attention_weights": "attnlab.ops",
    "flex_attention": "attnlab.flex",
    "masks": "",
    "nn": "",
    "select_backend": "attnlab.ops",
    "trace": "attnlab.tracing",
}

__all__ = [
    "BACKENDS",
    "AttnlabError",
    "Trace",
    "__version__",
    "attention",
    "attention_weights",
    "flex_attention",
    "masks",
    "nn",
    "select_backend",
    "trace",
]

if _TYPE_CHECKING:
    from attnlab import masks, nn
    from attnlab.flex import flex_attention
    from attnlab.ops import BACKENDS, attention, attention_weights, select_backend
    from attnlab.tracing import Trace, trace


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:  # a submodule (attnlab.ops, attnlab.reference, ...) imports on first use
        if not name.startswith("_") and _importlib_util.find_spec(f"attnlab.{name}"):
            return _importlib.import_module(f"attnlab.{name}")
        raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
    module = _importlib.import_module(where or f"attnlab.{name}")
    value = module if not where else getattr(module, name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({n for n in globals() if not n.startswith("_") or n.startswith("__")}
                  | set(__all__))


def _in_ipython() -> bool:
    shell = getattr(_sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and hasattr(shell, "display_formatter")


if _in_ipython():  # Jupyter: the records' HTML, registered from the drawing side
    from attnlab.viz.notebook import register as _register

    _register()
