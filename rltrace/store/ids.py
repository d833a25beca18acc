"""Span and trace ids: stored as integers, shown as hex.

OpenTelemetry span ids are 64-bit and trace ids 128-bit numbers. Parts store a span id (and a
parent span id) as a 64-bit integer, the same 64 bits read as signed (int64: the type every
engine reads), and a trace id as 16 bytes (big-endian, as in OTLP). Hex text (16 and 32 digits,
as OTel tools print them) exists only where people and other formats meet the ids: the `spans`
view, OTLP JSON, the Perfetto export, `rltrace info`. Parts written before (schema version 1)
hold hex text; readers convert it (`SQL_MACROS`).

Producers may pass ids as integers, hex text or bytes (`span_int`, `trace_bytes`); text that is
not hex (a framework's own ids) becomes a stable hash of it (the first 8 bytes of its MD5, the
whole MD5 for a trace id; the same in Python and in SQL).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SPAN_TYPE = pa.int64()
TRACE_TYPE = pa.binary(16)
_HEX16 = re.compile(r"^[0-9a-fA-F]{1,16}$")
_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")
_U64 = 1 << 64


def span_int(value: Any) -> int | None:
    """A span id as stored: int64 (an unsigned 64-bit id wraps to negative)."""
    if value is None:
        return None
    if type(value) is int:
        value &= _U64 - 1
    elif isinstance(value, (bytes, bytearray)) and len(value) == 8:
        value = int.from_bytes(value, "big")
    else:
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
        value = int(text, 16) if _HEX16.match(text) else int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "big")
    return value - _U64 if value >= 1 << 63 else value


def span_hex(value: Any) -> str | None:
    """16 hex digits of a span id (stored int64, an OTel int, or already text)."""
    if value is None or isinstance(value, str):
        return value
    return f"{int(value) & (_U64 - 1):016x}"


def trace_bytes(value: Any) -> bytes | None:
    """A trace id as stored: 16 bytes, big-endian."""
    if value is None:
        return None
    if type(value) is int:
        return (value & ((1 << 128) - 1)).to_bytes(16, "big")
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return bytes(value)
    text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return bytes.fromhex(text) if _HEX32.match(text) else hashlib.md5(text.encode()).digest()


def trace_hex(value: Any) -> str | None:
    """32 hex digits of a trace id (stored bytes, an OTel int, or already text)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return f"{int(value) & ((1 << 128) - 1):032x}"


def span_ints(values: Any) -> pa.Array:
    """A column of span ids (OTel ints, int64s, hex text, bytes) as int64, nulls kept. Arrow
    columns of int64 pass as they are; of hex text are parsed at once."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if pa.types.is_int64(values.type):
            return values
        if pa.types.is_null(values.type):
            return pa.nulls(len(values), SPAN_TYPE)
        if pa.types.is_integer(values.type):
            return values.cast(SPAN_TYPE)
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            parsed = _hex_column(values)
            if parsed is not None:
                return parsed
        values = values.to_pylist()
    return pa.array([span_int(v) for v in values], SPAN_TYPE)


def _hex_column(values: pa.Array) -> pa.Array | None:
    """Text of exactly 16 hex digits per row (nulls allowed) as int64, or None if any row is not."""
    valid = values.is_valid()
    filled = values.fill_null("0" * 16)
    if not pc.all(pc.equal(pc.utf8_length(filled), 16)).as_py():
        return None
    joined = "".join(filled.to_pylist())
    try:
        raw = bytes.fromhex(joined)
    except ValueError:
        return None
    ints = np.frombuffer(raw, dtype=">u8").astype(np.uint64).view(np.int64)
    return pa.array(ints, SPAN_TYPE, mask=~valid.to_numpy(zero_copy_only=False))


def trace_column(values: Any) -> pa.Array:
    """A column of trace ids (OTel ints, 16 bytes, hex text) as binary(16), nulls kept."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if values.type == TRACE_TYPE:
            return values
        if pa.types.is_null(values.type):
            return pa.nulls(len(values), TRACE_TYPE)
        values = values.to_pylist()
    return pa.array([trace_bytes(v) for v in values], TRACE_TYPE)


#: DuckDB macros every connection of `rltrace.store.open` has: the hex text of stored ids, and
#: the stored ids of hex text (parts of schema version 1, and hex ids people pass in queries).
SQL_MACROS = (
    "CREATE MACRO span_hex(id) AS printf('%016x', id)",
    "CREATE MACRO trace_hex(id) AS lower(hex(id))",
    """CREATE MACRO _rltrace_u64(h) AS CAST(CAST(CAST(('0x' || h) AS UBIGINT) AS HUGEINT)
        - CASE WHEN CAST(('0x' || h) AS UBIGINT) >= 9223372036854775808 THEN 18446744073709551616 ELSE 0 END AS BIGINT)""",
    """CREATE MACRO span_int(t) AS CASE WHEN t IS NULL THEN NULL
        ELSE _rltrace_u64(CASE WHEN regexp_full_match(t, '[0-9a-fA-F]{1,16}') THEN t ELSE left(md5(t), 16) END) END""",
    """CREATE MACRO trace_bytes(t) AS CASE WHEN t IS NULL THEN NULL
        WHEN regexp_full_match(t, '[0-9a-fA-F]{32}') THEN unhex(t) ELSE unhex(md5(t)) END""",
)
