"""A tiny name → object registry, used for attention variants, position schemes and presets."""

from __future__ import annotations

import difflib
import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from attnlab.config import finite_number
from attnlab.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; unknown names raise a ConfigError listing the allowed ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        if not isinstance(name, str):  # a list or a number from a config file (lists are not even hashable)
            raise ConfigError(f"a {self.kind} is given by its name (a string), not {name!r}; choose one of: "
                              f"{', '.join(self._items)}")
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(str(name), self._items, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; choose one of: {', '.join(self._items)}"

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def construct(cls: type, what: str, common: dict, options: dict):
    """Call `cls` with the common arguments its constructor takes plus every option (which it must take).

    An option the constructor does not accept raises a ConfigError naming the ones it has, so a typo
    in a config's option table is never silently ignored.
    """
    params = inspect.signature(cls.__init__).parameters
    own = [p for p in params if p != "self" and p not in common]
    for key in options:
        if key not in own:
            raise ConfigError(f"{what} has no option {key!r}; its options: {', '.join(own) or 'none'}")
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # a user's class annotated with names only a type checker imports: unchecked, as before
        hints = {}
    for key, value in options.items():
        _check_option_type(what, key, value, hints.get(key))
    return cls(**{k: v for k, v in common.items() if k in params}, **options)


def _check_option_type(what: str, key: str, value: object, hint: object) -> None:
    """An option's value must have its constructor's type (int, float, bool): a "4" or a 4.5 for an int,
    or a "no" for a bool (truthy), would fail deep inside a forward or silently mean something else. Each
    constructor checks the ranges."""
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = finite_number(value)
    else:
        return
    if not ok:
        kind = {bool: "true or false", int: "an integer", float: "a finite number"}[hint]
        raise ConfigError(f"{what} option {key!r} must be {kind}, got {value!r}")
