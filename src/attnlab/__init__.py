"""attnlab: attention and Transformer models as small, correct, fast, readable software."""

__version__ = "0.1.0"
