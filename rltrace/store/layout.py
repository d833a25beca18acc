"""Where things live in a run directory, and the `run.json` manifest that makes a folder a run.

    RUN_DIR/
      run.json                  run id, name, created time, schema version, config
      spans/<process>-<seq>.parquet        finished spans, one immutable part per flush
      open_spans/<process>.parquet         spans of that process that started and have not ended
      metrics/…  samples/…                 rows of log_metrics / log_samples, parts as for spans
      processes/<process>.parquet          who wrote, heartbeat, written and dropped counts

Every process of a run appends its own parts; nothing is locked. The first process to call
`rltrace.init` on an empty folder creates `run.json` (atomically, with `os.link`); the others
join the run it names. See docs/store.md.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import time
import uuid
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from rltrace import _json, _names
from rltrace._config import RltraceError


class StoreError(RltraceError):
    """The run directory or one of its files cannot be read; the message names the path."""


_RUN_IDS: dict[str, str] = {}  # run dir -> run id, filled whenever a manifest is made or read


def run_id_of(run_dir: Path) -> str | None:
    """The run id of `run_dir` (stamped into every part written there), or None if it has no manifest."""
    key = os.path.abspath(run_dir)
    found = _RUN_IDS.get(key)
    if found is None:
        try:
            found = read_manifest(Path(run_dir))["run_id"]
        except StoreError:
            return None
    return found


def manifest_path(run_dir: Path) -> Path:
    return Path(run_dir) / _names.RUN_MANIFEST


def table_dir(run_dir: Path, table: _names.Table) -> Path:
    return Path(run_dir) / table.folder


def _jsonable_config(config: Any) -> Any:
    if config is None:
        return {}
    if is_dataclass(config) and not isinstance(config, type):
        config = asdict(config)
    elif hasattr(config, "__dict__") and not isinstance(config, dict):
        config = vars(config)  # argparse.Namespace and similar
    return json.loads(_json.dumps(config, default=str))


def new_manifest(name: str, config: Any) -> dict:
    """A fresh manifest: new run id, created now."""
    now = time.time_ns()
    return {
        "run_id": uuid.uuid4().hex,
        "name": name,
        "created": _dt.datetime.fromtimestamp(now / 1e9, _dt.timezone.utc).isoformat(),
        "created_ns": now,
        "schema_version": _names.RUN_SCHEMA_VERSION,
        "config": _jsonable_config(config),
    }


def manifest_text(manifest: dict) -> str:
    return _json.dumps(manifest, indent=2, sort_keys=True) + "\n"


_MANGLED_URI = ("s3:/",)  # what pathlib makes of "s3://…": a URI passed where only a folder works


def create_or_join(run_dir: Path, *, run_name: str | None, config: Any) -> dict:
    """Create the run in `run_dir` (or join the run already there) and return its manifest."""
    run_dir = Path(run_dir)
    if str(run_dir).startswith(_MANGLED_URI):
        raise StoreError(f"{str(run_dir).replace(':/', '://', 1)}: this command writes into run directories on disk, "
                         "not into object-store runs (see docs/store.md, Runs in object storage)")
    if run_dir.exists() and not run_dir.is_dir():
        raise StoreError(f"{run_dir} is a file, not a run directory: pass a directory path to rltrace.init")
    path = manifest_path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            manifest = new_manifest(run_name or run_dir.resolve().name, config)
            tmp = run_dir / f".run.json.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                tmp.write_text(manifest_text(manifest))
                os.link(tmp, path)  # fails if another process created it first: then join that run
            except FileExistsError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
    except OSError as exc:
        raise unwritable(run_dir, exc) from None
    return read_manifest(run_dir)


def unwritable(run_dir: Path, exc: OSError) -> StoreError:
    """One line for a run directory that cannot be written: a full disk, a read-only filesystem, permissions."""
    why = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
           errno.EROFS: "the filesystem is read-only", errno.EACCES: "permission denied",
           errno.EPERM: "the operation is not permitted"}.get(exc.errno, exc.strerror or type(exc).__name__)
    return StoreError(f"cannot write the run in {run_dir}: {why} ({exc.filename or run_dir}); free space or "
                      "pass a run directory on a writable disk")


def read_manifest(run_dir: Path) -> dict:
    """The manifest of the local run `run_dir`, or a `StoreError` saying why the folder is not a
    readable run (`store.views.read_manifest` also reads `s3://` runs)."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise StoreError(f"run directory {run_dir} does not exist: check the path (a run is made by rltrace.init)")
    if not run_dir.is_dir():
        raise StoreError(f"{run_dir} is a file, not a run directory")
    path = manifest_path(run_dir)
    if not path.exists():
        raise StoreError(f"{run_dir} is not an rltrace run: it has no {_names.RUN_MANIFEST} (made by rltrace.init)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path} is not a readable run manifest ({exc}); restore it or start a new run dir") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("run_id"), str) or not manifest["run_id"]:
        raise StoreError(f"{path} is not an rltrace run manifest: it has no run_id")
    version = manifest.get("schema_version")
    if isinstance(version, str) and version.strip().isdigit():
        version = int(version)  # a hand-edited "1" means 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StoreError(
            f"{path} has schema version {manifest.get('schema_version')!r}, which is not a version number "
            f"(this rltrace reads 1 to {_names.RUN_SCHEMA_VERSION}); restore the file or start a new run dir"
        )
    if version > _names.RUN_SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, newer than this rltrace reads "
            f"({_names.RUN_SCHEMA_VERSION}): upgrade rltrace (pip install -U rltrace)"
        )
    manifest["schema_version"] = version
    _RUN_IDS[os.path.abspath(run_dir)] = manifest["run_id"]
    return manifest
