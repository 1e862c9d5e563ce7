"""attnlab: attention, exactly and in the open.

    >>> import torch, attnlab
    >>> q = k = v = torch.randn(2, 4, 16, 32)           # (B, H, L, D)
    >>> out = attnlab.attention(q, k, v, is_causal=True)  # as F.scaled_dot_product_attention

The names below are imported on first use (PEP 562), so `import attnlab` and `attnlab --help`
do not pay for torch until something needs it.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys
import types as _types
from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnlab.errors import AttnlabError

__version__ = "0.1.0"

#: public name -> the module that defines it ("" = the name is that submodule)
_LAZY = {
    "BACKENDS": "attnlab.ops",
    "Trace": "attnlab.trace",
    "attention": "attnlab.ops",
    "attention_weights": "attnlab.ops",
    "masks": "",
    "nn": "",
    "select_backend": "attnlab.ops",
    "trace": "attnlab.trace",
}

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

if _TYPE_CHECKING:
    from attnlab import masks, nn
    from attnlab.ops import BACKENDS, attention, attention_weights, select_backend
    from attnlab.trace import Trace, trace


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


class _Package(_types.ModuleType):
    """Importing the submodule attnlab.trace sets the package's attribute `trace` to that module;
    the public `attnlab.trace` is the function, so it is kept."""

    def __setattr__(self, name: str, value) -> None:
        if name == "trace" and isinstance(value, _types.ModuleType):
            value = value.trace  # the submodule has run to its end when the import sets this
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
