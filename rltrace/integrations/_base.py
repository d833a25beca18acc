"""`BaseInstrumentor`: one class per library, idempotent `instrument()`, undone by `uninstrument()`.

Modelled on OpenTelemetry's `BaseInstrumentor`: `instrumentation_dependencies()` names the
supported versions ("transformers >= 4.40"); `instrument()` checks them, then calls
`_instrument()` once. A library that is not installed is skipped quietly (there is nothing to
trace); one installed at an unsupported version is skipped with one warning that names it.
With `target` set (a module name), the check and the patch wait until the program imports that
module, so a process that never uses the library pays nothing, not even the version lookup.
"""

from __future__ import annotations

import warnings
from typing import Any, Collection

from rltrace.integrations._hooks import when_imported


class DependencyConflict(Exception):
    """An instrumented library is installed at a version the instrumentor does not support."""


def dependency_conflict(requirements: Collection[str]) -> str | None:
    """Why `requirements` are not met ("trl 0.9.0 is installed; needs trl>=1.10,<2"), or None.

    Raises `importlib.metadata.PackageNotFoundError` when a required distribution is not installed.
    """
    from importlib import metadata

    from packaging.requirements import Requirement

    for text in requirements:
        req = Requirement(text)
        version = metadata.version(req.name)
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            return f"{req.name} {version} is installed; this instrumentor supports {req}"
    return None


class BaseInstrumentor:
    """Patch one library so its own loop records rltrace phases. Subclass and implement
    `_instrument` / `_uninstrument`; list supported versions in `instrumentation_dependencies`.

    One instance per class (like OpenTelemetry's), so `HFInstrumentor().instrument()` twice is
    the same as once.
    """

    _instance: BaseInstrumentor | None = None
    #: Module whose import triggers the check and the patch (None: both happen in `instrument()`).
    target: str | None = None

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls.__dict__.get("_instance") is None:
            cls._instance = super().__new__(cls)
            cls._instance._is_instrumented = False
            cls._instance._patched = False
        return cls._instance

    def instrumentation_dependencies(self) -> Collection[str]:
        """Requirement strings of the libraries this instrumentor patches, e.g. ("trl >= 1.10, < 2",)."""
        return ()

    @property
    def is_instrumented(self) -> bool:
        return self._is_instrumented

    def instrument(self, *, skip_dep_check: bool = False, **kwargs: Any) -> bool:
        """Patch the library once (with `target`: once that module is imported).

        Returns False if the library is absent or at an unsupported version (warned), or, with
        `target`, if the module is already imported and the check fails.
        """
        if self._is_instrumented:
            return True
        self._is_instrumented = True
        if self.target is None:
            self._is_instrumented = self._apply(skip_dep_check, kwargs)
        else:
            when_imported(self.target, lambda module: self._apply(skip_dep_check, kwargs))
        return self._is_instrumented

    def _apply(self, skip_dep_check: bool, kwargs: dict) -> bool:
        if not self._is_instrumented or self._patched:
            return self._patched  # uninstrumented before the target was imported, or done already
        if not skip_dep_check:
            from importlib.metadata import PackageNotFoundError

            try:
                conflict = dependency_conflict(self.instrumentation_dependencies())
            except PackageNotFoundError:
                self._is_instrumented = False
                return False
            if conflict:
                self._is_instrumented = False
                warnings.warn(f"rltrace: {type(self).__name__} not applied: {conflict}", RuntimeWarning, stacklevel=3)
                return False
        self._instrument(**kwargs)
        self._patched = True
        return True

    def uninstrument(self, **kwargs: Any) -> None:
        """Undo every patch `instrument` made (or cancel one still waiting for its target)."""
        if self._patched:
            self._uninstrument(**kwargs)
        self._is_instrumented = self._patched = False

    def _instrument(self, **kwargs: Any) -> None:
        raise NotImplementedError

    def _uninstrument(self, **kwargs: Any) -> None:
        raise NotImplementedError
