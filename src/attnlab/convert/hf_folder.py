"""Reading a HF transformers model folder as `save_pretrained` writes it: `config.json` and
`model.safetensors`, or its shards and their index (a pickled `pytorch_model.bin` is never read: unpickling
runs code), and reading the values of its `config.json`.

A `config.json` can be edited by hand or come from another model, and the model constructors would take a
"16" or a 16.0 as a size and fail deep inside PyTorch with a TypeError. The `config_*` readers check each
value's JSON type (an integer is neither a bool, a float nor a string) and range first and raise a one-line
CheckpointError naming the file, the key and the value as written in the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from attnlab.config import finite_number
from attnlab.errors import CheckpointError
from attnlab.files import check_readable

REQUIRED: Any = object()  # the `default` of a key that has none


def read_hf_folder(model_dir: str | Path, what: str) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config dict, state dict) of the folder; `what` names the model in messages ("BERT", "GPT-2").

    Raises:
        CheckpointError: a file is missing (with a hint where only `pytorch_model.bin` is there) or unreadable.
    """
    from safetensors.torch import load_file

    folder = Path(model_dir)
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    index_path = folder / "model.safetensors.index.json"
    if folder.is_file():  # config.json itself, or the weights file, given for the folder
        raise CheckpointError(f"{folder} is a file; give the {what} model's folder (the one holding config.json "
                              "and model.safetensors)")
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no config.json")
    if not weights_path.is_file() and not index_path.is_file():
        hint = " (pytorch_model.bin is not read: convert it to safetensors)" \
            if (folder / "pytorch_model.bin").exists() or (folder / "pytorch_model.bin.index.json").exists() else ""
        raise CheckpointError(f"{folder}: no model.safetensors{hint}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if weights_path.is_file():
            check_readable(weights_path)  # safetensors says "No such file" where reading is not allowed
            state = load_file(str(weights_path))
        else:
            state = _read_shards(index_path, load_file)
    except CheckpointError:
        raise
    except Exception as e:  # JSON, OS, Unicode and safetensors' own error types
        raise CheckpointError(f"cannot read {what} weights from {folder}: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} is not a JSON object")
    return config, state


def _read_shards(index_path: Path, load_file) -> dict[str, Tensor]:
    """The weights of a sharded folder (`model-00001-of-00002.safetensors`... and the index that maps each weight
    to its file, as `save_pretrained` writes beyond its shard size): every listed file, each read once, each
    weight where the index says it is."""
    index = json.loads(index_path.read_text(encoding="utf-8"))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(f, str) and f and Path(f).name == f for f in weight_map.values()):
        raise CheckpointError(f"{index_path} has no valid weight_map (weight name -> a file in its folder): "
                              "re-save the model with save_pretrained")
    state: dict[str, Tensor] = {}
    for file in sorted(set(weight_map.values())):
        shard = index_path.parent / file
        if not shard.is_file():
            raise CheckpointError(f"{index_path.parent}: {file}, named in {index_path.name}, is missing")
        check_readable(shard)
        for name, tensor in load_file(str(shard)).items():
            if weight_map.get(name) == file:
                state[name] = tensor
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise CheckpointError(f"{index_path.parent}: the shards lack {', '.join(missing[:4])}"
                              + (" ..." if len(missing) > 4 else "") + f", which {index_path.name} lists")
    return state


def _shown(value: Any) -> str:
    """The value as the JSON file spells it ("16", 16.0, true, null), so the user can find it there."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


# HF's activation names (`hidden_act`, `activation_function`) → attnlab's, for BERT and GPT-2 alike.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu-tanh",
    "gelu_pytorch_tanh": "gelu-tanh",
    "gelu_fast": "gelu-tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def require_keys(hf_config: dict[str, Any], keys: tuple[str, ...], source: str, what: str) -> None:
    """CheckpointError naming every one of `keys` that the config lacks (all at once, not one per run)."""
    missing = [k for k in keys if k not in hf_config]
    if missing:
        raise CheckpointError(f"{source}: the {what} config lacks {', '.join(missing)}: use the config.json "
                              "saved with these weights")


def config_int(hf_config: dict[str, Any], key: str, source: str, default: Any = REQUIRED, *,
               minimum: int = 1) -> Any:
    """hf_config[key] as an int of at least `minimum`; `default` where the key is absent or null (HF writes
    null for "unset"). Bools are refused although Python counts them as ints, and so are integral floats:
    a size written 16.0 or "16" was not written by `save_pretrained`, so the file was edited or mixed up."""
    value = hf_config.get(key)
    if value is None and default is not REQUIRED:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"{source}: {key} is {_shown(value)}; it must be an integer of at least {minimum}, "
                              "written without quotes or a decimal point")
    return value


def config_float(hf_config: dict[str, Any], key: str, source: str, default: Any, *, minimum: float = 0.0,
                 below: float | None = None) -> Any:
    """hf_config[key] as a finite float in [minimum, below); `default` where absent or null."""
    value = hf_config.get(key)
    if value is None:
        return default
    if not finite_number(value) or value < minimum or (below is not None and value >= below):
        bound = f"at least {minimum:g}" + (f" and below {below:g}" if below is not None else "")
        raise CheckpointError(f"{source}: {key} is {_shown(value)}; it must be a number {bound}, "
                              "written without quotes")
    return float(value)


def _config_of_type(hf_config: dict[str, Any], key: str, source: str, default: Any, kind: type, wanted: str) -> Any:
    """hf_config[key] if it is a `kind`; `default` where absent or null; else CheckpointError saying `wanted`."""
    value = hf_config.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise CheckpointError(f"{source}: {key} is {_shown(value)}; it must be {wanted}")
    return value


def config_bool(hf_config: dict[str, Any], key: str, source: str, default: bool) -> bool:
    """hf_config[key] as a bool; `default` where absent or null. A string "false" would be truthy."""
    return _config_of_type(hf_config, key, source, default, bool, "true or false, without quotes")


def config_str(hf_config: dict[str, Any], key: str, source: str, default: str) -> str:
    """hf_config[key] as a string; `default` where absent or null."""
    return _config_of_type(hf_config, key, source, default, str, "a string")


def check_model_type(hf_config: dict[str, Any], expected: str, source: str, what: str) -> None:
    """CheckpointError unless the config's model_type (absent: taken as `expected`) is `expected`. Converters
    call it first, so that another model's config is named as such, not as a `what` config lacking keys."""
    if not isinstance(hf_config, dict):  # a transformers config object (model.config) failed in its own words
        hint = ": give hf_model.config.to_dict()" if hasattr(hf_config, "to_dict") else ""
        raise CheckpointError(f"{source}: the {what} config must be a dict (config.json as read by json.load), got "
                              f"{type(hf_config).__name__}{hint}")
    kind = hf_config.get("model_type", expected)
    if kind != expected:
        raise CheckpointError(f"{source}: model_type is {kind!r}, not {expected!r}: these are not {what} weights")


def shape_mismatch(key: str, config_shape: tuple[int, ...], weights_shape: tuple[int, ...], source: str) -> str:
    """The message for a weight whose shape is not the one the config gives: a config.json from another
    checkpoint (another vocabulary, width or length) that would otherwise fail in `load_state_dict` with a
    many-line RuntimeError, or worse in a reshape."""
    return (f"{key}: the config says {tuple(config_shape)}; the weights say {tuple(weights_shape)}: "
            f"{source} does not belong to these weights")
