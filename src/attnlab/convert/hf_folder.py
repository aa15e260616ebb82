"""Reading a HF transformers model folder as `save_pretrained` writes it: `config.json` and
`model.safetensors` (a pickled `pytorch_model.bin` is never read: unpickling runs code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from attnlab.errors import CheckpointError


def read_hf_folder(model_dir: str | Path, what: str) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config dict, state dict) of the folder; `what` names the model in messages ("BERT", "GPT-2").

    Raises:
        CheckpointError: a file is missing (with a hint where only `pytorch_model.bin` is there) or unreadable.
    """
    from safetensors.torch import load_file

    folder = Path(model_dir)
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no config.json")
    if not weights_path.is_file():
        hint = " (pytorch_model.bin is not read: convert it to safetensors)" \
            if (folder / "pytorch_model.bin").exists() else ""
        raise CheckpointError(f"{folder}: no model.safetensors{hint}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        state = load_file(str(weights_path))
    except Exception as e:  # JSON, OS, Unicode and safetensors' own error types
        raise CheckpointError(f"cannot read {what} weights from {folder}: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} is not a JSON object")
    return config, state
