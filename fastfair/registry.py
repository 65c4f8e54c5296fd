"""Named registries (timm style): methods, models, data sets, attacks, selection policies."""
from __future__ import annotations

from typing import Callable, Generic, Iterable, Iterator, TypeVar

from fastfair.errors import UserError
from fastfair.suggest import hint

T = TypeVar("T")


def _origin(obj) -> tuple:
    return getattr(obj, "__module__", None), getattr(obj, "__qualname__", None) or id(obj)


def unknown(kind: str, name, known: Iterable[str], aliases: dict[str, str]) -> UserError:
    """The one line that refuses a ``name`` no registry of ``kind`` holds: the hint, then every known name."""
    return UserError(f"unknown {kind} {name!r}.{hint(name, known, aliases)} Known: {', '.join(sorted(known))}")


class Registry(Generic[T]):
    """Maps a name to an object and a one-line description (what it is, which paper)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, tuple[T, str]] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, doc: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            # The same object re-registering (its module reloaded) is fine; another one is a name clash.
            if name in self._items and _origin(self._items[name][0]) != _origin(obj):
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = (obj, doc)
            return obj

        return deco

    def aliases(self, table: dict[str, str]) -> None:
        """What papers and other code bases call an entry: spelling -> a name here, or a sentence saying which
        flags or presets it is (:func:`fastfair.suggest.hint`); shown when that spelling is asked for."""
        self._aliases.update(table)

    def unregister(self, name: str) -> None:
        """Remove a name (a plugin or a test undoing its registration)."""
        self.get(name)
        del self._items[name]

    def get(self, name: str) -> T:
        if name not in self._items:
            raise unknown(self.kind, name, self._items, self._aliases)
        return self._items[name][0]

    @property
    def alias_table(self) -> dict[str, str]:
        """The spellings :meth:`aliases` added (what ``fastfair.known`` copies for the CLI's checks)."""
        return dict(self._aliases)

    def doc(self, name: str) -> str:
        self.get(name)
        return self._items[name][1]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def table(self) -> list[tuple[str, str]]:
        return [(n, self._items[n][1]) for n in self]
