"""The one generic registry class behind every geoserve registry.

A registry maps string names to values. Strings, because a name must fit in a config file, a CLI
flag and an HTTP request. Registering a name twice is an error unless ``override=True``: with
third-party plugins, a silently replaced processor would produce wrong pixels instead of a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from geoserve.errors import RegistryError, UnknownNameError

T = TypeVar("T")
V = TypeVar("V")


class Registry(Generic[T]):
    """A named collection of ``T`` with strict duplicate handling and helpful lookups.

    Args:
        label: What the registry holds, used in error messages ("model", "input processor").
        not_found: Exception factory for unknown names; defaults to :class:`UnknownNameError`.
    """

    def __init__(
        self,
        label: str,
        *,
        not_found: Callable[[str, list[str]], Exception] | None = None,
    ) -> None:
        self.label = label
        self._items: dict[str, T] = {}
        self._not_found = not_found

    def add(self, name: str, value: T, *, override: bool = False) -> T:
        """Register ``value`` under ``name`` and return it.

        Raises:
            RegistryError: if ``name`` is empty or already registered and ``override`` is false.
        """
        if not isinstance(name, str) or not name.strip():
            raise RegistryError(f"{self.label} name must be a non-empty string, got {name!r}")
        if name in self._items and not override:
            raise RegistryError(
                f"{self.label} {name!r} is already registered; pass override=True to replace it"
            )
        self._items[name] = value
        return value

    def register(self, name: str, *, override: bool = False) -> Callable[[V], V]:
        """Decorator form of :meth:`add`; returns the decorated object unchanged."""

        def decorator(obj: V) -> V:
            self.add(name, obj, override=override)  # type: ignore[arg-type]
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Return the value registered under ``name``.

        Raises:
            UnknownNameError: (or the registry's own subclass) listing the known names.
        """
        try:
            return self._items[name]
        except KeyError:
            known = sorted(self._items)
            if self._not_found is not None:
                raise self._not_found(name, known) from None
            raise UnknownNameError(self.label, name, known) from None

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return its value (for tests and plugin reloads)."""
        value = self.get(name)
        del self._items[name]
        return value

    def names(self) -> list[str]:
        """Return the registered names, sorted."""
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """Return ``(name, value)`` pairs, sorted by name."""
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.label!r}, {self.names()})"
