"""Converters from other libraries' checkpoints to attnlab models.

Imported lazily: `from attnlab.convert import load_hf_bert` loads only the BERT converter, `load_hf_gpt2`
only the GPT-2 one.
"""

from __future__ import annotations

import importlib

# Public name → the module that defines it.
_EXPORTS = {
    "bert_from_hf": "attnlab.convert.bert",
    "bert_config_from_hf": "attnlab.convert.bert",
    "load_hf_bert": "attnlab.convert.bert",
    "gpt2_config": "attnlab.convert.gpt2",
    "gpt2_from_hf": "attnlab.convert.gpt2",
    "gpt_from_hf": "attnlab.convert.gpt2",
    "load_hf_gpt2": "attnlab.convert.gpt2",
    "save_hf_as_run": "attnlab.convert.to_run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnlab.convert' has no attribute {name!r}")


def __dir__() -> list[str]:  # the lazy names too: a notebook's tab completion and dir() list them
    return sorted([*globals(), *__all__])
