"""Rerun a frozen batch through a user's function and store what it returns next to the batch.

An entry point is `module:function` or `path/to/file.py:function` with this signature:

    def entry(batch: rltrace.replay.FrozenBatch, **kwargs) -> dict[str, Any]:
        ...   # e.g. recompute rewards, or log-probs with a checkpoint
        return {"reward": rewards, "log_probs": log_probs}

Each returned value holds one value per sample: a [B, ...] tensor/array, or a list of B values
(per-sample tensors, numbers, dicts). `reward` (one number per sample) and `log_probs` (one
array per sample, aligned with `response_tokens`) are what `diff` compares with the recorded
`reward` and `rollout_log_probs`; other names are stored and compared with same-named columns.
Each repeat gets a freshly loaded batch, so an entry that modifies its input cannot leak into
the next repeat. Results go to `RUN_DIR/replays/<step>-<batch_id>-<replay_id>-<repeat>.parquet`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.replay.batch import (
    StoredColumns,
    load,
    read_part,
    user_columns,
    write_options,
)
from rltrace.replay.errors import ReplayError
from rltrace.store import scan
from rltrace.store.parts import write_part

_RESERVED = frozenset(_names.REPLAYS_SCHEMA.names) - {"reward"}


def load_object(spec: str, what: str = "--entry") -> Any:
    """The object named by `module:name` or `path/to/file.py:name` (a clear error otherwise)."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ReplayError(f"{what} {spec!r}: expected module:name or path/to/file.py:name")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise ReplayError(f"{what} {spec!r}: file {path} does not exist")
            _on_path(path.resolve().parent, first=True)  # like `python file.py`: the file's neighbours import
            module_name = f"_rltrace_entry_{abs(hash(str(path.resolve())))}"
            module = sys.modules.get(module_name)
            if module is None:
                loader = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(loader)
                sys.modules[module_name] = module
                loader.loader.exec_module(module)
        else:
            _on_path(Path.cwd(), first=False)  # modules of the current directory import, but never shadow others
            module = importlib.import_module(target)
    except ImportError as exc:
        raise ReplayError(f"{what} {spec!r}: cannot import {target} ({exc})") from None
    if not hasattr(module, name):
        raise ReplayError(f"{what} {spec!r}: {target} has no attribute {name!r}")
    return getattr(module, name)


def _on_path(folder: Path, *, first: bool) -> None:
    """Make `folder` importable: first on sys.path (a script's own folder) or last (the current directory,
    so a stray `json.py` or `torch/` there cannot replace the real one)."""
    if str(folder) in sys.path or (not first and "" in sys.path):
        return
    if first:
        sys.path.insert(0, str(folder))
    else:
        sys.path.append(str(folder))


def portable_spec(spec: str) -> str:
    """`spec` (`module:name` or `file.py:name`, already loaded) named so that it loads again from
    any folder, as stored with a replay or a frozen batch.

    `module:name` stays when the module comes from where a fresh interpreter started in this
    directory looks anyway: the current directory, the standard library, site-packages (and the
    folders their .pth files add, as editable installs do). A module found through PYTHONPATH or
    a folder the program put on sys.path itself becomes `/absolute/path/file.py:name`, its file
    being known; a relative `file.py` becomes absolute.
    """
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        return f"{Path(target).resolve()}:{name}"
    top = sys.modules.get(target.split(".")[0])
    module = sys.modules.get(target)
    file = getattr(module, "__file__", None)
    root = _search_root(top)
    if not file or root is None or root == Path.cwd().resolve() or root in _default_roots():
        return spec
    return f"{Path(file).resolve()}:{name}"


def _search_root(top) -> Path | None:
    """The sys.path folder a top-level module or package was found in (None for a built-in)."""
    file = getattr(top, "__file__", None)
    if file:
        here = Path(file).resolve()
        return here.parent.parent if here.name == "__init__.py" else here.parent
    paths = list(getattr(top, "__path__", []) or [])  # a namespace package
    return Path(paths[0]).resolve().parent if paths else None


def _default_roots() -> set[Path]:
    """Folders every interpreter of this environment searches, whatever PYTHONPATH or the program say."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    sites = set(site.getsitepackages()) | {site.getusersitepackages()}
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)} | sites
    for folder in sites:
        for pth in Path(folder).glob("*.pth") if Path(folder).is_dir() else ():
            try:
                lines = pth.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:  # each line a folder to add, unless it is code or a comment
                line = line.strip()
                if line and not line.startswith(("#", "import ", "import\t")) and (Path(folder) / line).is_dir():
                    roots.add(str(Path(folder) / line))
    return {Path(r).resolve() for r in roots}


def load_entry(spec: str) -> Callable[..., Mapping[str, Any]]:
    """The entry-point function named by `module:function` or `file.py:function`."""
    fn = load_object(spec, "--entry")
    if not callable(fn):
        raise ReplayError(f"--entry {spec!r} is not a function")
    return fn


def load_tokenizer(spec: str) -> Any:
    """A tokenizer named by `module:name`; a factory function (no arguments) is called."""
    obj = load_object(spec, "--tokenizer")
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "decode")):
        obj = obj()  # a class or a factory
    if not hasattr(obj, "decode"):
        raise ReplayError(f"--tokenizer {spec!r}: {type(obj).__name__} has no decode() method")
    return obj


class Replay(StoredColumns):
    """One stored repeat of one replay: `replay["log_probs"]` as the entry returned it."""

    def __init__(self, table: pa.Table, path: Path):
        super().__init__(table, path)
        h = self._header
        self.replay_id: str = h["replay_id"]
        self.step: int = h["step"]
        self.batch_id: str = h["batch_id"]
        self.entry: str = h.get("entry") or ""
        self.label: str = h.get("label") or self.entry
        self.repeat: int = h.get("repeat") or 0
        self.n_repeats: int = h.get("n_repeats") or 1
        self.duration_s: float = h.get("duration_s") or 0.0
        try:
            self.args: dict = json.loads(h.get("args") or "{}")
        except json.JSONDecodeError:
            raise ReplayError(f"{self.path}: field args is not valid JSON; the part is damaged") from None

    def __repr__(self) -> str:
        return f"Replay({self.replay_id}, step={self.step}, entry={self.entry!r}, repeat={self.repeat}/{self.n_repeats})"


@dataclass
class ReplayRun:
    """What `run_entry` did: the stored repeats, in order."""

    replay_id: str
    entry: str
    label: str
    args: dict
    repeats: list[Replay] = field(default_factory=list)


def _table(out: Mapping[str, Any], n: int, header: dict[str, Any], where: str) -> pa.Table:
    if not isinstance(out, Mapping) or not out:
        raise ReplayError(f"{where} must return a non-empty dict of per-sample results, got {type(out).__name__}")
    clash = sorted(_RESERVED.intersection(out))
    if clash:
        raise ReplayError(f"{where} returned column(s) {clash}, which rltrace uses itself; rename them")
    try:
        for name, column in out.items():
            rows = len(column) if not hasattr(column, "shape") else (column.shape[0] if column.shape else 0)
            if rows != n:
                raise ReplayError(f"{where} returned {name!r} with {rows} rows; the batch has {n} samples")
        arrays, specs = user_columns("columns", dict(out), n)
    except (TypeError, ValueError) as exc:
        raise ReplayError(f"{where}: cannot store its result ({exc})") from None
    header = {**header, "codec": json.dumps(specs, separators=(",", ":"))}
    columns: dict[str, pa.Array] = {}
    for f in _names.REPLAYS_SCHEMA:
        if f.name in arrays:
            continue
        value = np.arange(n) if f.name == "sample_index" else [header.get(f.name)] * n
        columns[f.name] = pa.array(value, f.type)
    columns.update(arrays)
    return pa.table(columns)


def run_entry(
    run_dir: str | Path,
    step: int,
    entry: str,
    *,
    repeat: int = 1,
    kwargs: Mapping[str, Any] | None = None,
    batch_id: str | None = None,
    label: str | None = None,
    tokenizer: Any = None,
    on_repeat: Callable[[int], None] | None = None,
) -> ReplayRun:
    """Run `entry` on the batch frozen at `step`, `repeat` times; store and return each result."""
    if repeat < 1:
        raise ReplayError(f"--repeat must be >= 1, got {repeat}")
    fn = load_entry(entry)
    label = label or entry  # as the user named it; the entry is stored so that it loads from any folder
    entry = portable_spec(entry)
    kwargs = dict(kwargs or {})
    replay_id = uuid.uuid4().hex[:12]
    result = ReplayRun(replay_id, entry, label, kwargs)
    folder = Path(run_dir) / _names.REPLAYS.folder
    for r in range(repeat):
        batch = load(run_dir, step, batch_id=batch_id, tokenizer=tokenizer)  # fresh: the entry may modify it
        started = time.time_ns()
        t0 = time.perf_counter()
        try:
            out = fn(batch, **kwargs)
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            raise ReplayError(
                f"entry {entry} failed on repeat {r + 1}: {type(exc).__name__}: {exc} ({frame.filename}:{frame.lineno})"
            ) from exc
        duration = time.perf_counter() - t0
        header = {
            "replay_id": replay_id,
            "step": batch.step,
            "batch_id": batch.batch_id,
            "entry": entry,
            "label": result.label,
            "args": json.dumps(kwargs, default=str),
            "repeat": r,
            "n_repeats": repeat,
            "started_ns": started,
            "duration_s": duration,
        }
        table = _table(out, len(batch), header, f"entry {entry}")
        name = f"{batch.step:010d}-{batch.batch_id}-{replay_id}-{r}.parquet"
        path = write_part(folder, name, table, _names.REPLAYS, write_options=write_options(table))
        result.repeats.append(Replay(pq.read_table(path), path))
        if on_repeat is not None:
            on_repeat(r)
    return result


def load_replays(run_dir: str | Path, *, step: int | None = None, replay_id: str | None = None) -> list[Replay]:
    """Stored replays (every repeat), oldest first; filtered by step and/or replay id."""
    snap = scan(run_dir, skip_corrupt=True, tables={"replays": _names.REPLAYS})
    out = []
    for part in snap.parts["replays"]:
        pieces = part.path.stem.split("-")
        if len(pieces) != 4:
            continue
        if step is not None and pieces[0] != f"{step:010d}":
            continue
        if replay_id is not None and pieces[2] != replay_id:
            continue
        out.append(Replay(read_part(part.path), part.path))
    out.sort(key=lambda r: (r._header.get("started_ns") or 0, r.repeat))
    if replay_id is not None and not out:
        raise ReplayError(f"{Path(run_dir) / 'replays'}: no replay {replay_id}" + (f" at step {step}" if step is not None else ""))
    return out


def latest_replay(run_dir: str | Path, step: int) -> list[Replay]:
    """Every repeat of the most recent replay of `step`."""
    replays = load_replays(run_dir, step=step)
    if not replays:
        raise ReplayError(f"{Path(run_dir)}: no replay of step {step} yet; run `rltrace replay run RUN_DIR --step {step} --entry ...`")
    last = replays[-1].replay_id
    return [r for r in replays if r.replay_id == last]

