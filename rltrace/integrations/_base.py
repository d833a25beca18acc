"""`BaseInstrumentor`: one class per library, idempotent `instrument()`, undone by `uninstrument()`.

Modelled on OpenTelemetry's `BaseInstrumentor`: `instrumentation_dependencies()` names the
supported versions ("transformers >= 4.40"); `instrument()` checks them, then calls
`_instrument()` once. A library that is not installed is skipped quietly (there is nothing to
trace); one installed at an unsupported version is skipped with one warning that names it.
"""

from __future__ import annotations

import warnings
from importlib import metadata
from typing import Any, Collection


class DependencyConflict(Exception):
    """An instrumented library is installed at a version the instrumentor does not support."""


def dependency_conflict(requirements: Collection[str]) -> str | None:
    """Why `requirements` are not met ("trl 0.9.0 is installed; needs trl>=1.10,<2"), or None.

    Raises `metadata.PackageNotFoundError` when a required distribution is not installed at all.
    """
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

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls.__dict__.get("_instance") is None:
            cls._instance = super().__new__(cls)
            cls._instance._is_instrumented = False
        return cls._instance

    def instrumentation_dependencies(self) -> Collection[str]:
        """Requirement strings of the libraries this instrumentor patches, e.g. ("trl >= 1.10, < 2",)."""
        return ()

    @property
    def is_instrumented(self) -> bool:
        return self._is_instrumented

    def instrument(self, *, skip_dep_check: bool = False, **kwargs: Any) -> bool:
        """Patch the library (once); False if it is absent or at an unsupported version (warned)."""
        if self._is_instrumented:
            return True
        if not skip_dep_check:
            try:
                conflict = dependency_conflict(self.instrumentation_dependencies())
            except metadata.PackageNotFoundError:
                return False
            if conflict:
                warnings.warn(f"rltrace: {type(self).__name__} not applied: {conflict}", RuntimeWarning, stacklevel=2)
                return False
        self._instrument(**kwargs)
        self._is_instrumented = True
        return True

    def uninstrument(self, **kwargs: Any) -> None:
        """Undo every patch `instrument` made."""
        if self._is_instrumented:
            self._uninstrument(**kwargs)
            self._is_instrumented = False

    def _instrument(self, **kwargs: Any) -> None:
        raise NotImplementedError

    def _uninstrument(self, **kwargs: Any) -> None:
        raise NotImplementedError
