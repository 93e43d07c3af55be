"""Registries of the engine's strategies: commit strategies, drafters, step schedules, acceptance rules, draft-length
policies.

A strategy is an object registered under its name (papermill's engine registry is the model):
RunConfig's allowed values, the checks, the cost model and the report ask the registry what a
strategy does, never compare its name. The built-in ones register when `mtplab.engine` is imported.
Strategies of your own: register them in a module and name it in $MTPLAB_PLUGINS (comma-separated
module names) or in the `mtplab.plugins` entry-point group; the registries import those modules the
first time they are read, so a sweep's points and its report, which run in processes of their
own, see them too.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from importlib import metadata
from typing import Generic, TypeVar

T = TypeVar("T")
PLUGINS_ENV = "MTPLAB_PLUGINS"
PLUGINS_GROUP = "mtplab.plugins"
_plugins_loaded = False


class PluginError(ImportError):
    """A plugin module named in $MTPLAB_PLUGINS or the entry points does not import."""


def load_plugins() -> list[str]:
    """Import the plugin modules ($MTPLAB_PLUGINS, then the `mtplab.plugins` entry points), once; their names."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True  # before the imports: a plugin that reads a registry while it loads does not recurse
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    names += [ep.module for ep in metadata.entry_points(group=PLUGINS_GROUP)]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            _plugins_loaded = False  # every later read says so again, rather than "unknown strategy"
            raise PluginError(f"{PLUGINS_ENV} / {PLUGINS_GROUP} names {name!r}, which does not import: {err}") from err
    return names


class Registry(Generic[T]):
    """Strategies of one kind by name, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, item: T, replace: bool = False) -> T:
        """Add a strategy under its `name` (refused if the name is taken, unless replace=True); returns it."""
        name = getattr(item, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string `name` (got {name!r})")
        if name in self._items and not replace and self._items[name] is not item:
            raise ValueError(f"a {self.kind} named {name!r} is already registered (replace=True to replace it)")
        self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        """The strategy registered as `name`; ValueError naming the registered ones otherwise."""
        load_plugins()
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}: registered are {list(self.names())} (strategies of your "
                             f"own: a module that registers them, named in ${PLUGINS_ENV})") from None

    def find(self, name: str) -> T | None:
        """The strategy registered as `name`, or None (a stored result may name one this process lacks)."""
        load_plugins()
        return self._items.get(name) if isinstance(name, str) else None

    def names(self) -> tuple[str, ...]:
        load_plugins()
        return tuple(self._items)

    def values(self) -> list[T]:
        return [self._items[n] for n in self.names()]

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        """The names, like a dict's keys."""
        return iter(self.names())


COMMITS: Registry = Registry("commit strategy")
DRAFTERS: Registry = Registry("drafter")
SCHEDULES: Registry = Registry("schedule")
ACCEPTANCE: Registry = Registry("acceptance rule")
K_POLICIES: Registry = Registry("draft-length policy")
