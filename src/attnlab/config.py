"""Configuration dataclasses: JSON round-trip with validation of keys, types and choices.

Every model family and the trainer keep their settings in a dataclass derived from `Config`.
Choices such as the attention variant are plain strings checked against a registry in
`__post_init__`, so configs serialise to JSON and a typo fails at construction with a message
naming the allowed values.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import math
import numbers
import operator
import os
import types
import typing
from typing import Any, TypeVar

from attnlab.errors import ConfigError

C = TypeVar("C", bound="Config")


def is_unset(value: Any) -> bool:
    """None, or the words that stand for it on the command line (TOML has no null): none, null."""
    return value is None or (isinstance(value, str) and value.lower() in ("none", "null"))


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Check `value` against a (simple) type annotation, converting ints to floats where fitting."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        # TOML has no null: `--set train.decay_steps=none` unsets what a config file set. Not for settings that
        # take text (a file may be called "none").
        if type(None) in args and str not in args and is_unset(value):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(name, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{name}: bad value {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            raise ConfigError(f"{name}: {value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        (item,) = typing.get_args(annotation)[:1] or (Any,)
        out = [_coerce(f"{name}[]", v, item) for v in value]
        return tuple(out) if origin is tuple else out
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            empty = f"; for no entries, give an empty table: --set {name}={{}}" if is_unset(value) else ""
            raise ConfigError(f"{name}: expected a table/dict, got {value!r}{empty}")
        return value
    if annotation is Any:
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return value
    if annotation is int:
        if not isinstance(value, int) and hasattr(value, "__index__"):  # numpy's integers, ids.max() + 1 in torch
            try:
                value = operator.index(value)
            except TypeError:  # a float tensor
                pass
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        if not -2**63 <= value < 2**63:  # torch and numpy hold 64 bits: larger ones failed with tracebacks
            digits = len(str(abs(value))) if abs(value) < 10**4000 else None  # str() refuses over 4,300 digits
            shown = value if digits and digits <= 24 else f"an integer of {digits or 'over 4,000'} digits"
            raise ConfigError(f"{name}: {shown} does not fit in 64 bits; give an integer from -2**63 to 2**63 - 1")
        return value
    if annotation is float:
        if isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):  # numpy's float32
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # an integer of 400 digits
            raise ConfigError(f"{name}: {str(value)[:12]}... is too large for a number") from None
    if annotation is str:
        if isinstance(value, os.PathLike):  # a pathlib.Path given in Python, for a folder or file setting
            value = os.fspath(value)
        if not isinstance(value, str):
            # What TOML read unquoted as another type; not echoed back (1.10 came back as "1.1", 0x1F as "31").
            quoted = isinstance(value, (int, float, datetime.date, datetime.time))
            hint = f"; write it in double quotes (on the command line: --set {name}='\"...\"')" if quoted else ""
            raise ConfigError(f"{name}: expected a string, got {value!r}{hint}")
        return value
    return value


@dataclasses.dataclass
class Config:
    """Base for every config dataclass: `to_dict`, `from_dict` (validating), `replace`.

    Built directly too, every setting is checked against its type (as `from_dict` checks it) before the class's
    own `__post_init__` runs: `steps=2.5`, `bias="no"` or a `Path` had been taken as given, the last two written
    into a checkpoint that could not be read back (or, a Path, not written at all, after the whole run)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None and not getattr(own, "_checks_types", False):
            def __post_init__(self, _own=own) -> None:
                self._check_types()
                _own(self)

            __post_init__._checks_types = True  # type: ignore[attr-defined]
            cls.__post_init__ = __post_init__  # type: ignore[method-assign]

    def __post_init__(self) -> None:
        self._check_types()

    def _check_types(self) -> None:
        hints = _type_hints(type(self))
        for field in dataclasses.fields(self):
            if field.init and field.name in hints:
                value = getattr(self, field.name)
                checked = _coerce(field.name, value, hints[field.name])
                if checked is not value:
                    object.__setattr__(self, field.name, checked)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any], *, where: str = "") -> C:
        """Build a config from a dict, rejecting unknown keys and values of the wrong type."""
        prefix = f"{where}." if where else ""
        if not isinstance(data, dict):
            raise ConfigError(f"{where or cls.__name__}: expected a table of settings, got {data!r}")
        hints = typing.get_type_hints(cls)
        names = cls.field_names()
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
                raise ConfigError(
                    f"unknown setting {prefix}{key}{hint}; known settings: {', '.join(names)}"
                )
            kwargs[key] = _coerce(prefix + key, value, hints[key])
        try:
            return cls(**kwargs)
        except ConfigError as e:
            if prefix and not str(e).startswith(prefix):
                raise ConfigError(f"{prefix}{e}") from None
            raise

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_choice(name: str, value: str, allowed: typing.Iterable[str]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{name}: unknown value {value!r}{hint}; choose one of: {', '.join(allowed)}")


FRACTION_SETTINGS = ("dropout", "attention_dropout", "classifier_dropout", "label_smoothing")


def check_fractions(config: object, names: typing.Iterable[str] = FRACTION_SETTINGS) -> None:
    """Each named setting that the config has and that is not None (by default the model families' dropout
    rates and label smoothing) must be a probability below 1: in [0, 1)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"{name} must be at least 0 and below 1, got {value}")


def finite_number(value: Any) -> bool:
    """Whether `value` is a finite int or float (not a boolean). An integer too large for a float is not: files
    read back (configs, trainer states, metrics) may hold one, and math.isfinite would raise on it."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        return False


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """`value` must be above 0 (at least 0 with `allow_zero`) and finite: NaN and infinity are refused."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite {'non-negative' if allow_zero else 'positive'} number, "
                          f"got {value}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
