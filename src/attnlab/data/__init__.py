"""Data: tokenizers, corpora as memory-mapped ids, and batch sources for every objective.

Names are imported lazily on first use, so `import attnlab.data` stays cheap (no torch, no HF).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "tokenizers": [
        "BPETokenizer",
        "CharTokenizer",
        "SpecialTokens",
        "Tokenizer",
        "WordPieceTokenizer",
        "WordTokenizer",
        "load_tokenizer",
        "train_tokenizer",
    ],
    "text_files": [
        "ClassificationData",
        "iter_text_blocks",
        "read_classification_file",
        "read_lines",
        "read_text",
        "split_documents",
    ],
    "corpus": ["TokenFile", "build_token_file", "pydoc_corpus"],
    "sources": [
        "BatchSource",
        "BertSource",
        "CausalLMSource",
        "ClassificationSource",
        "MLMSource",
        "MaskSpec",
        "NSPPairs",
        "ParallelTextSource",
        "mask_tokens",
        "pad_batch",
    ],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'attnlab.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"attnlab.data.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
