"""Imports into a run (`rltrace import metrics`, `rltrace import slime`): what one import command
adds becomes visible together, a file imported once is never imported again, and what an import
leaves out is counted by file, position and reason.

    RUN_DIR/imports/<import id>.json   one record per import that finished: the files it imported
                                       (SHA-256 of the content, path, size), when, what it stored
                                       and what it left out

`Import` hashes the files first: a file whose content a finished import already holds, or that
the command names twice, is skipped. The parts made from the rest are written under hidden temp
names (`stage`), then renamed into place together with the importing process's row, and the
ledger record is written last (`commit`). A failure before the commit (a full disk, an error)
leaves nothing, and an error during the renames takes back the ones done. Only a kill in the
middle of the renames (milliseconds) can leave part of an import visible without its ledger
record; the commit lists the parts it renames in a hidden `imports/.pending-<import id>.json`
first, and the next import into the run removes the parts of a pending commit whose process is
gone (then the retry stores each row once).

`Refused` counts what an import leaves out (a line, record, sample or field), per file and
reason with the first positions, and puts it into the run's drop counts (`rltrace info`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa

from rltrace import _names
from rltrace.store import rows
from rltrace.store.layout import StoreError, create_or_join
from rltrace._names import safe_name
from rltrace.store.parts import received_from, stage_part
from rltrace.store.writer import ProcessInfo

IMPORTS_FOLDER = "imports"  # RUN_DIR/imports/: the ledger of finished imports
#: the service of every importing process: how a report tells imported spans from traced ones
SERVICE_NAME = "rltrace-import"
_SHOWN = 5  # positions kept per (file, reason); the count covers all of them


def file_hash(path: Path) -> str:
    """SHA-256 of a file's content (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_PENDING = ".pending-"  # imports/.pending-<import id>.json: the parts a commit is renaming into place
_STALE_S = 600  # a pending commit this old is dead whatever its host (a commit takes milliseconds)


def _alive(record: dict) -> bool:
    """Whether the process of a pending commit may still be committing."""
    if time.time_ns() - int(record.get("time_ns") or 0) > _STALE_S * 1e9:
        return False
    if record.get("host") != socket.gethostname():
        return True  # another machine's process: wait until it is stale
    try:
        os.kill(int(record.get("pid")), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError, OverflowError):
        return True
    return True


def heal(run_dir: str | Path) -> list[str]:
    """Remove what a commit killed in the middle left visible (its process gone, no ledger record):
    the parts it had renamed, the temp files it had not. Returns the paths removed."""
    folder = Path(run_dir) / IMPORTS_FOLDER
    try:
        pending = [Path(e.path) for e in os.scandir(folder) if e.name.startswith(_PENDING) and e.name.endswith(".json")]
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for path in pending:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        done = (folder / f"{record.get('import')}.json").exists()
        if not done and _alive(record):
            continue
        if not done:
            for name in [*record.get("parts", []), *record.get("temps", [])]:
                target = Path(run_dir) / str(name)
                if ".." not in Path(str(name)).parts and target.parent.parent == Path(run_dir) and target.is_file():  # parts of this run's tables only
                    target.unlink(missing_ok=True)
                    removed.append(str(target))
        path.unlink(missing_ok=True)
    return removed


def imported(run_dir: str | Path) -> dict[str, dict]:
    """SHA-256 -> {path, import, imported} for every file a finished import put into `run_dir`."""
    folder = Path(run_dir) / IMPORTS_FOLDER
    try:
        entries = sorted(e.path for e in os.scandir(folder) if e.name.endswith(".json") and not e.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found: dict[str, dict] = {}
    for path in entries:
        try:
            record = json.loads(Path(path).read_text())
            files = record["files"]
            for f in files:
                found.setdefault(f["sha256"], {"path": f.get("path"), "import": record.get("import"), "imported": record.get("imported")})
        except (OSError, ValueError, KeyError, TypeError):
            raise StoreError(f"{path}: not a readable import record; restore it, or delete it to import its files "
                             "again (their rows are then stored twice)") from None
    return found


# --- what an import leaves out --------------------------------------------------------------------
def _where(unit: str | None, numbers: list[int], count: int) -> str:
    if unit is None or not numbers:
        return ""
    if len(numbers) == 1 and count == 1:
        return f"{unit} {numbers[0]}"
    shown = [str(n) for n in numbers]
    if count > len(numbers):
        return f"{unit}s {', '.join(shown)}, … ({count:,} in all)"
    return f"{unit}s {', '.join(shown[:-1])} and {shown[-1]}"


class Refused:
    """Lines, records, samples and fields an import left out: per (kind, file, reason) a count and
    the first positions. Kinds are drop-count tables (`rltrace.store.convert.describe` names them)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str, str], list] = {}  # key -> [count, unit, first positions]

    def add(self, kind: str, file: Any, reason: str, position: tuple[str, int] | None = None, count: int = 1) -> None:
        """Count `count` things of `kind` left out of `file`; `position`: (unit, number), e.g. ("line", 21)."""
        if count <= 0:
            return
        item = self._items.setdefault((kind, rows.text(str(file)), rows.text(str(reason))), [0, None, []])
        item[0] += count
        if position is not None:
            item[1] = position[0]
            if len(item[2]) < _SHOWN:
                item[2].append(int(position[1]))

    def add_many(self, kind: str, file: Any, reason: str, unit: str, numbers: Iterable[int]) -> None:
        """Count one thing of `kind` at each position `unit` `numbers` (e.g. "byte", [120, 512])."""
        numbers = list(numbers)
        for n in numbers[:_SHOWN]:
            self.add(kind, file, reason, (unit, n))
        self.add(kind, file, reason, count=len(numbers) - min(len(numbers), _SHOWN))

    def update(self, other: "Refused") -> None:
        for (kind, file, reason), (count, unit, numbers) in other._items.items():
            mine = self._items.setdefault((kind, file, reason), [0, unit, []])
            mine[0] += count
            mine[1] = mine[1] or unit
            mine[2].extend(numbers[: _SHOWN - len(mine[2])])

    def total(self, kind: str | None = None) -> int:
        return sum(item[0] for (k, _, _), item in self._items.items() if kind is None or k == kind)

    def __bool__(self) -> bool:
        return bool(self._items)

    def records(self) -> list[dict]:
        """{kind, file, where, reason, count} per file and reason, in the order first seen."""
        return [{"kind": kind, "file": file, "where": _where(unit, numbers, count), "reason": reason, "count": count}
                for (kind, file, reason), (count, unit, numbers) in self._items.items()]

    def sentences(self) -> list[str]:
        """One line per file and reason: "log.jsonl, line 21: not JSON (...)" (with the count when above one)."""
        out = []
        for r in self.records():
            head = ", ".join(x for x in (r["file"], r["where"]) if x)
            many = f" ({r['count']:,} {r['kind']})" if r["count"] > 1 and not r["where"] else ""
            out.append(f"{head}: {r['reason']}{many}")
        return out

    def into(self, drops: rows.Drops) -> None:
        """Add each record to `drops` (table = kind; the reason names file and positions)."""
        for r in self.records():
            drops.add(r["kind"], r["count"], f"{', '.join(x for x in (r['file'], r['where']) if x)}: {r['reason']}")


# --- one import command -----------------------------------------------------------------------------
class Import:
    """One import command into one run directory: which files are new, and their parts staged and
    committed together (see the module docstring). Use as a context manager: leaving it by an
    exception removes whatever was staged."""

    def __init__(self, run_dir: str | Path, kind: str, paths: Iterable[Path]):
        self.run_dir = Path(run_dir)
        self.kind = kind
        heal(self.run_dir)  # an import killed while committing: its parts go, so this one stores them once
        known = imported(self.run_dir)
        self.files: list[tuple[Path, str]] = []  # (path, sha256) of the files to import
        self.skipped: list[str] = []  # "path: why" for files already in the run
        given: dict[str, Path] = {}
        for path in paths:
            digest = file_hash(path)
            if digest in known:
                before = known[digest]
                self.skipped.append(f"{path}: already imported into this run (same content as {before.get('path')}, "
                                    f"imported {before.get('imported')}): nothing added")
            elif digest in given:
                self.skipped.append(f"{path}: same content as {given[digest]}, given in this command too")
            else:
                given[digest] = path
                self.files.append((path, digest))
        # the import's id (and its part names) follow from what it imports: a retry writes the same names
        self.key = hashlib.sha256(("\n".join([kind, *sorted(given)])).encode()).hexdigest()
        self.refused = Refused()
        self.drops = rows.Drops()  # rows the row builders dropped (spans, samples), reasons naming the file
        self.process: ProcessInfo | None = None
        self._staged: list[tuple[Path, Path]] = []  # (temp, final)
        self._seq = itertools.count()

    def leave_out(self, path: Path) -> None:
        """A file that gave nothing (not a log, not a dump): not recorded as imported, so it can be
        imported once it reads. The import's id stays: a retry of the same files writes the same names."""
        self.files = [(p, d) for p, d in self.files if p != path]

    def begin(self, role: str, config: dict) -> ProcessInfo:
        """Create (or join) the run and name the importing process; its id is the import's."""
        manifest = create_or_join(self.run_dir, run_name=None, config=config)
        self.process = ProcessInfo(run_id=manifest["run_id"], role=role, rank=None, service_name=SERVICE_NAME,
                                   process_id=f"{safe_name(role)}-{self.key[:16]}")
        return self.process

    def part_name(self, tag: str = "") -> str:
        """The next part name of this import (the same on a retry of the same files)."""
        return f"{self.process.process_id}-{safe_name(tag) + '-' if tag else ''}{next(self._seq):06d}.parquet"

    def stage(self, spec: _names.Table, table: pa.Table, *, name: str | None = None, write_options: dict | None = None) -> None:
        """Write `table` as a hidden part of table `spec`, made visible by `commit`."""
        name = name or self.part_name()
        folder = self.run_dir / spec.folder
        footer = received_from([self.process.process_id]) if spec is _names.SPANS else None  # an import may be run twice
        self._staged.append((stage_part(folder, name, table, spec, footer, write_options=write_options), folder / name))

    def commit(self, *, rows_written: int, spans_written: int, summary: dict | None = None) -> None:
        """Make every staged part visible, with this process's row, then record the files as imported."""
        drops = rows.Drops()
        for r in self.drops.records():
            drops.add(r["table"], r["count"], r["reason"], r.get("column"))
        self.refused.into(drops)
        now = time.time_ns()
        spans_dropped = drops.total("spans")
        table = rows.process_table(
            self.process, run_id=self.process.run_id, service_name=self.process.service_name, started_ns=now,
            heartbeat_ns=now, ended_ns=now, spans_written=spans_written, spans_dropped=spans_dropped,
            rows_written=rows_written, rows_dropped=drops.total() - spans_dropped, drop_reasons=drops.to_json(),
            argv=sys.argv, resource={"service.name": self.process.service_name},
        )
        self.stage(_names.PROCESSES, table, name=f"{self.process.process_id}.parquet")
        record = {
            "import": self.process.process_id,
            "kind": self.kind,
            "imported": _dt.datetime.fromtimestamp(now / 1e9, _dt.timezone.utc).isoformat(timespec="seconds"),
            "imported_ns": now,
            "files": [{"sha256": digest, "path": rows.text(str(path)), "size": path.stat().st_size} for path, digest in self.files],
            "stored": {"rows": rows_written, "spans": spans_written, **(summary or {})},
            "left_out": self.refused.records() + [{"kind": r["table"], "reason": r["reason"], "count": r["count"]}
                                                  for r in self.drops.records()],
        }
        folder = self.run_dir / IMPORTS_FOLDER
        pending = folder / f"{_PENDING}{self.process.process_id}.json"
        relative = [(str(tmp.relative_to(self.run_dir)), str(final.relative_to(self.run_dir))) for tmp, final in self._staged]
        _write_record(pending, {"import": self.process.process_id, "host": socket.gethostname(), "pid": os.getpid(),
                                "time_ns": time.time_ns(), "parts": [f for _, f in relative], "temps": [t for t, _ in relative]})
        done: list[Path] = []
        try:
            for tmp, final in self._staged:
                os.replace(tmp, final)
                done.append(final)
            _write_record(folder / f"{self.process.process_id}.json", record)
        except BaseException:
            for final in done:  # take back what this commit made visible: all or nothing
                final.unlink(missing_ok=True)
            raise
        finally:
            pending.unlink(missing_ok=True)
            self.abort()

    def abort(self) -> None:
        """Remove the staged parts not yet committed."""
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged = []

    def __enter__(self) -> "Import":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.abort()


def _write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(rows.dumps(record) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
