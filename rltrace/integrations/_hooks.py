"""`when_imported(name, fn)`: call `fn(module)` once module `name` has been imported.

An instrumentor registers its patch here instead of importing the library itself, so loading
every instrumentor at interpreter start-up costs nothing for libraries the program never uses.
A meta-path finder notices the import, lets the real loader run the module, then calls the
hooks; the module keeps its own loader and spec. A failing hook warns and never breaks the import.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import warnings
from types import ModuleType
from typing import Callable

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.RLock()
_finding = threading.local()  # names this thread is looking up through the rest of sys.meta_path


def when_imported(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Run `fn(module)` after module `name` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(fn)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
            return
    _call(name, fn, module)


def _call(name: str, fn: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        fn(module)
    except Exception as exc:  # a broken patch costs its telemetry, never the user's import
        where = getattr(fn, "__qualname__", repr(fn))
        warnings.warn(f"rltrace: patching {name} failed in {where}: {type(exc).__name__}: {exc}; "
                      "it runs without that instrumentation", RuntimeWarning, stacklevel=2)


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    for fn in hooks:
        _call(name, fn, module)


class _HookLoader:  # duck-typed: importlib.abc would import importlib.resources at start-up
    """Runs the real loader, puts it back on the module, then the hooks."""

    def __init__(self, loader, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, attr: str):
        return getattr(self._loader, attr)


class _PostImportFinder:
    def find_spec(self, fullname, path, target=None):
        if fullname not in _hooks:
            return None
        busy = _finding.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _HookLoader(spec.loader, fullname)
        return spec
