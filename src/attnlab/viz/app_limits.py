"""The web app's default limits on what one request may ask for (`attnlab serve` shows them in its
help, so they live apart from the server code)."""

MAX_CHARS = 1000      # characters of text
MAX_TOKENS = 128      # tokens after the model's tokenizer (the page stays responsive)
