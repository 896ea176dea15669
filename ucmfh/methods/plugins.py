"""Hashing methods of other packages: entry points of the group ``ucmfh.methods`` (docs/methods.md).

A package adds a method to every front door (``--method``, ``grid --methods``, ``compare``, checkpoints) by
naming it in its packaging metadata::

    [project.entry-points."ucmfh.methods"]
    my-method = "my_package.my_method"            # a module whose import registers it (@register)
    # or "my_package.my_method:MyMethod": a Method subclass, registered here if it is not yet

:func:`load_plugins` runs once, when :mod:`ucmfh.methods` is imported, after the methods of ucmfh. A plugin
that fails to load (its import raises, it names no method, its name is taken) is left out and its failure
kept in :data:`PLUGIN_ERRORS`, by entry point name: the other methods work as before, the front doors say
why it is missing.
"""
from __future__ import annotations

import inspect
from importlib import metadata
from typing import Dict, Iterable, List, Optional

from ucmfh.methods.base import Method
from ucmfh.methods.registry import METHODS, PLUGIN_ERRORS, NameTaken, register

GROUP = "ucmfh.methods"
PLUGINS: Dict[str, str] = {}  # method name -> the entry point's value ("package.module" or "module:Class")


def _entry_points() -> List[metadata.EntryPoint]:
    found = metadata.entry_points()
    if hasattr(found, "select"):  # Python >= 3.10
        return list(found.select(group=GROUP))
    return list(found.get(GROUP, ()))  # Python 3.9: a dict by group


def load_plugins(entry_points: Optional[Iterable[metadata.EntryPoint]] = None) -> List[str]:
    """Register the methods of the installed packages' ``ucmfh.methods`` entry points (``entry_points``:
    these instead); returns the names registered. A failure is recorded in :data:`PLUGIN_ERRORS`, not raised."""
    added: List[str] = []
    appeared: Dict[str, str] = {}  # a method registered while an entry point loaded -> that entry point's value
    contested: Dict[str, List[str]] = {}  # a name another package's method holds -> the entry points refused it
    for point in _entry_points() if entry_points is None else entry_points:
        before = set(METHODS)
        try:
            loaded = point.load()
            if inspect.isclass(loaded) and issubclass(loaded, Method):
                if loaded.name in before and type(METHODS[loaded.name]) is not loaded:
                    raise NameTaken(loaded.name)
                if loaded.name not in METHODS:  # not registered by its module's import
                    register(loaded)
                own = [loaded.name]
            elif inspect.ismodule(loaded):
                new = [name for name in METHODS if name not in before]
                # its own: the methods of classes of the module or its package, whenever imported (another
                # plugin's import of it, an entry point of several methods of one module); else those it registered
                own = [name for name in METHODS if _within(type(METHODS[name]).__module__, loaded.__name__)
                       and not _within(type(METHODS[name]).__module__, "ucmfh")] or new
            else:
                raise TypeError(f"it names {type(loaded).__name__} {getattr(loaded, '__name__', loaded)!r}, "
                                "not a module or a Method subclass")
        except Exception as err:  # noqa: BLE001 - anything a foreign import raises leaves the others working
            for name in set(METHODS) - before:  # registered before failing: half a plugin is none
                del METHODS[name]
            if isinstance(err, NameTaken) and not _within(type(METHODS[err.name]).__module__, "ucmfh"):
                contested.setdefault(err.name, []).append(point.value)
            PLUGIN_ERRORS[point.name] = f"{point.value}: {type(err).__name__}: {' '.join(str(err).split())}"
            continue
        for name in METHODS:
            if name not in before:
                appeared[name] = point.value
        if not own:
            PLUGIN_ERRORS[point.name] = (f"{point.value}: registers no method (a name of its own, a Method "
                                         "subclass decorated with @register)")
        for name in own:
            PLUGINS[name] = point.value
        added += [name for name in own if name not in added]
    for name, value in appeared.items():  # registered by a module no entry point names: where it appeared
        if name not in PLUGINS:
            PLUGINS[name] = value
            added.append(name)
    for name, values in contested.items():  # which loaded first is no choice: a run of one would be the other's
        module = type(METHODS.pop(name)).__module__
        holder = PLUGINS.pop(name, module)
        PLUGIN_ERRORS[name] = (f"registered by {len(values) + 1} installed packages ({', '.join([holder, *values])}): "
                               "neither is loaded, as a run of one would be taken for the other's; uninstall one")
        added = [each for each in added if each != name]
    return added


def _within(module: str, package: str) -> bool:
    """``module`` is ``package`` or one of its submodules."""
    return module == package or module.startswith(package + ".")
