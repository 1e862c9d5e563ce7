"""Integrations with other libraries. `attnlab.adapters.hf`: Hugging Face transformers models run on
attnlab.attention (it needs the `hf` extra); `attnlab.adapters.recording`: what each attention
call did. Submodules import on first use, so `import attnlab` then `attnlab.adapters.hf` works."""

import importlib as _importlib

_SUBMODULES = ("hf", "quiet", "recording")
__all__ = list(_SUBMODULES)


def __getattr__(name: str):
    if name not in _SUBMODULES:
        raise AttributeError(f"module 'attnlab.adapters' has no attribute {name!r}")
    return _importlib.import_module(f"attnlab.adapters.{name}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
