"""Model families and named presets.

A family is a (config class, model class) pair registered under a name (`gpt`, `seq2seq`...).
A preset is a named config of some family (`transformer-base`, `gpt-char-tiny`...).
`build_model` rebuilds any model from the JSON written in a checkpoint's `config.json`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from attnlab.config import Config
from attnlab.errors import ConfigError
from attnlab.registry import Registry


@dataclass(frozen=True)
class Family:
    name: str
    config_cls: type[Config]
    model_cls: type[nn.Module]


FAMILIES: Registry[Family] = Registry("model family")
PRESETS: Registry[Callable[[], tuple[str, Config]]] = Registry("preset")


def register_family(name: str, config_cls: type[Config], model_cls: type[nn.Module]) -> None:
    FAMILIES.add(name, Family(name, config_cls, model_cls))


def register_preset(name: str, family: str, make: Callable[[], Config]) -> None:
    PRESETS.add(name, lambda: (family, make()))


def _load_families() -> None:
    # Importing the family modules registers them (and their presets).
    from attnlab.models import bert, encoder, gpt, transformer  # noqa: F401


def get_preset(name: str) -> tuple[str, Config]:
    _load_families()
    return PRESETS.get(name)()


def preset_names() -> list[str]:
    _load_families()
    return PRESETS.names()


def family_of(config: Config) -> str:
    _load_families()
    for name in FAMILIES:
        if type(config) is FAMILIES.get(name).config_cls:
            return name
    raise ConfigError(f"no model family uses {type(config).__name__}")


def config_from_dict(data: dict[str, Any]) -> tuple[str, Config]:
    """Parse `{"family": ..., **fields}` (the format of a checkpoint's config.json)."""
    _load_families()
    data = dict(data)
    family = data.pop("family", None)
    if family is None:
        raise ConfigError("model config has no 'family' key; add family = \"gpt\" (or another family)")
    fam = FAMILIES.get(family)
    return family, fam.config_cls.from_dict(data, where="model")


def config_to_dict(config: Config) -> dict[str, Any]:
    return {"family": family_of(config), **config.to_dict()}


def build_model(config: Config | dict[str, Any]) -> nn.Module:
    if isinstance(config, dict):
        _, config = config_from_dict(config)
    return FAMILIES.get(family_of(config)).model_cls(config)
