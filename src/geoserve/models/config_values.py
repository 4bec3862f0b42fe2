"""Values taken from an untrusted model config file, each checked for type and range.

:class:`Values` knows the file and the section it reads from, so every refusal names both:
``cfg.yaml: model.init_args.model_args.num_classes: must be an integer from 1 to 1024, not
'two'``. Only plain data passes (numbers, strings, booleans, short lists of them): nothing read
here is ever imported, called or used as a path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from geoserve.errors import WeightsError

T = TypeVar("T")
#: A check of one value: ``check(value, key)`` returns it (or a normalised form) or raises.
Check = Callable[[Any, str], Any]

#: Longest list and string taken from a config file.
MAX_ITEMS = 1024
MAX_TEXT = 200
#: Largest integer taken as an argument of a library's constructor (channels, depths, ...).
MAX_INT = 8192


class Values:
    """Checked reads of one section of a config file (see the module docstring)."""

    def __init__(self, path: Path, where: str) -> None:
        self.path = path
        self.where = where

    def error(self, key: str, why: str) -> WeightsError:
        """The error for ``key``: ``<file>: <section>.<key>: <why>``."""
        return WeightsError(f"{self.path}: {self.where}.{key}: {why}")

    def _bad(self, key: str, what: str, value: Any) -> WeightsError:
        return self.error(key, f"must be {what}, not {_short(value)}")

    def text(self, value: Any, key: str) -> str:
        """A non-empty string of at most :data:`MAX_TEXT` characters."""
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
            raise self._bad(key, "a name (a short string)", value)
        return value

    def choice(self, value: Any, key: str, options: Sequence[T]) -> T:
        """One of ``options`` (the message lists them)."""
        for option in options:
            if value == option and type(value) is type(option):
                return option
        listing = ", ".join(map(str, options))
        if value is None:
            raise self.error(key, f"is missing; supported: {listing}")
        raise self.error(key, f"{_short(value)} is not supported; supported: {listing}")

    def integer(self, value: Any, key: str, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]`` (a boolean is not one)."""
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise self._bad(key, f"an integer from {lo} to {hi}", value)
        return value

    def number(self, value: Any, key: str, lo: float, hi: float) -> float:
        """A finite number in ``[lo, hi]``."""
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or not lo <= value <= hi:
            raise self._bad(key, f"a number from {lo:g} to {hi:g}", value)
        return float(value)

    def boolean(self, value: Any, key: str) -> bool:
        """A boolean (true or false)."""
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def integers(self, value: Any, key: str, lo: int, hi: int) -> list[int]:
        """A non-empty list of integers in ``[lo, hi]``."""
        items = self._list(value, key, "a list of integers")
        return [self.integer(item, f"{key}[{i}]", lo, hi) for i, item in enumerate(items)]

    def numbers(self, value: Any, key: str) -> list[float]:
        """A non-empty list of finite numbers."""
        items = self._list(value, key, "a list of numbers")
        return [self.number(item, f"{key}[{i}]", -1e30, 1e30) for i, item in enumerate(items)]

    def plain(self, value: Any, key: str) -> Any:
        """A number, string, boolean or null, or a list of those (an architecture argument)."""
        if isinstance(value, list):
            items = self._list(value, key, "a list")
            return [self.plain(item, f"{key}[{i}]") for i, item in enumerate(items)]
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            return self.integer(value, key, -MAX_INT, MAX_INT)
        if isinstance(value, float):
            return self.number(value, key, -1e30, 1e30)
        if isinstance(value, str):
            return self.text(value, key)
        raise self._bad(key, "a number, string, boolean or a list of them", value)

    def only(
        self, given: Mapping[str, Any], checks: Mapping[str, Check], prefix: str, what: str
    ) -> dict[str, Any]:
        """``given``, each value through its check; a key without one is refused.

        ``checks``: key -> ``check(value, key)`` (a method of this object, say), which returns
        the value or raises.
        """
        out = {}
        for key, value in given.items():
            if key not in checks:
                listing = ", ".join(prefix + a for a in checks)
                raise self.error(
                    f"{prefix}{str(key)[:60]}", f"is not supported for {what}; supported: {listing}"
                )
            out[key] = checks[key](value, prefix + key)
        return out

    def _list(self, value: Any, key: str, what: str) -> list[Any]:
        if not isinstance(value, list | tuple) or not value or len(value) > MAX_ITEMS:
            raise self._bad(key, f"{what} (1 to {MAX_ITEMS} items)", value)
        return list(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
