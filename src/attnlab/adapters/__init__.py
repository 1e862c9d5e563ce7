"""Integrations with other libraries. `attnlab.adapters.hf`: Hugging Face transformers models run on
attnlab.attention (import it explicitly; it needs the `hf` extra)."""
