"""What the public API's arguments become: integers that fit int64 (steps, weight versions),
attribute values OpenTelemetry holds, metric numbers (0-d tensors and numpy scalars included) and
attributes cut to the span's limit. User mistakes raise here, at the caller's line."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Mapping

from opentelemetry import baggage

from rltrace import _names
from rltrace.store import rows as store_rows

if TYPE_CHECKING:
    from rltrace.run import Run

_INT64_MIN, _INT64_MAX = store_rows.INT64_MIN, store_rows.INT64_MAX


def as_int(name: str, value: Any) -> int:
    """An rltrace integer argument (step, weight_version): an int that fits int64, never a bool."""
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:  # the usual case, first
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r} (a bool is not a {name})")
    item = getattr(value, "item", None)  # numpy / torch scalars
    if item is not None and not isinstance(value, int):
        try:
            scalar = item()
        except (TypeError, ValueError, RuntimeError):  # not a single value
            scalar = None
        if isinstance(scalar, bool):
            raise TypeError(f"{name} must be an integer, got {value!r} (a bool is not a {name})")
        if scalar is not None:
            value = scalar
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})") from None
    if not store_rows.fits_int64(number):
        raise ValueError(f"{name}={store_rows.show(number)} does not fit a 64-bit integer: pass a smaller {name}")
    return number


def attr_value(value: Any):
    """An attribute value OpenTelemetry holds: 0-d tensors and numpy scalars as their numbers (read
    here: OpenTelemetry keeps plain values only, so a device tensor syncs its device at this point)."""
    if isinstance(value, (str, bool, int, float)):
        return value
    number = store_rows.plain(value)
    if number is not value and isinstance(number, (str, bool, int, float)):
        return number
    if isinstance(value, (list, tuple)):
        return [attr_value(v) for v in value]
    return str(value)


def attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """`rl.<key>` attributes, rltrace's own keys (`rl.bytes`, `rl.waiting_for`, ...) first."""
    if not attrs:
        return {}
    out, user = {}, {}
    for key, value in attrs.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"phase attribute keys must be non-empty strings, got {key!r}")
        if value is not None:
            full = _names.attr_key(key)
            (out if full in _names.RESERVED_ATTRS else user)[full] = attr_value(value)
    out.update(user)
    return out


def within_limit(run: Run, attrs: dict[str, Any], present: int, current=None) -> dict[str, Any]:
    """`attrs` cut to the span's attribute limit, rltrace's own keys always kept; cuts are counted.

    `present` user attributes are on the span already (`current` holds them: updating one is free).
    """
    room = run.max_attributes - present
    if len(attrs) <= room:
        return attrs
    kept, cut = {}, 0
    for key, value in attrs.items():
        if key in _names.RESERVED_ATTRS or (current is not None and key in current):
            kept[key] = value
        elif room > 0:
            kept[key] = value
            room -= 1
        else:
            cut += 1
    if cut:
        run.attributes_dropped += cut
        run.drops.add("attributes", cut, f"over the limit of {run.max_attributes} attributes per span (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT)")
    return kept


def baggage_int(key: str) -> int | None:
    """An integer from W3C baggage (another process's text): None unless it is an int64."""
    text = baggage.get_baggage(key)
    try:
        value = int(str(text)) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and store_rows.fits_int64(value) else None


def as_float(name: str, value: Any) -> float:
    try:  # a tensor's number by .item() (store_rows.plain): float() warns for one that needs grad
        return float(value if type(value) in (int, bool) else store_rows.plain(value))
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"log_metrics: {name}={store_rows.show(value)} is not a number a float can hold") from None


_LATER = store_rows.later


def metric_value(name: str, value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value
    if kind is not int and kind is not bool:
        deferred = _LATER(value)  # a 0-d CUDA tensor: copied now, read on the writer thread
        if deferred is not None:
            return deferred
    return as_float(name, value)
