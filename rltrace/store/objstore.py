"""Runs in object storage: a run dir given as `s3://bucket/prefix/run`.

Writers keep writing parts exactly as for a local run, into a local *spool* folder (one per
process); an uploader thread puts each finished file into the bucket as one object (a PUT is
atomic: readers see a part whole or not at all), deletes the spooled copy of immutable parts,
and re-uploads the records overwritten in place (`open_spans/`, `processes/`) when they change.
If the store is unreachable the files wait in the spool and are retried with backoff; a spool
over `RLTRACE_SPOOL_MAX_MB` drops its oldest parts, counted with their reason. A spool left by
a process that died is uploaded by the next process of the same run on that host.

The process merges its own parts as on disk (`rltrace.store.merge`): an uploaded flush part is
kept in the spool (`.kept/`) until a merged part replaces it; once the merged part is up, the parts
it replaces are deleted from the bucket after the merge grace (readers that listed them can still
fetch them), and from the spool. Until a replaced part is known to be gone from the bucket (a
delete that failed, a part whose PUT failed after the store may have taken it, a merged part
merged again before it went up), each later merge of the part hiding it names it too
(`Spool.covered`), so no span is ever read twice.

Readers copy the run's objects into a local cache folder (only new or changed ones) and read
that copy as a local run, so every view and check is the same as for a run on disk.
Credentials and endpoint: the standard AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, …).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rltrace import _names
from rltrace._config import resolve
from rltrace._names import safe_name
from rltrace.store import layout, rows

logger = logging.getLogger("rltrace")

SCHEMES = ("s3://",)
#: Folders whose files are rewritten in place by their process: kept in the spool, re-uploaded on change.
MUTABLE = frozenset((_names.OPEN_SPANS.folder, _names.PROCESSES.folder))
_CANDIDATES = "_rltrace_new_run"  # manifests proposed by processes racing to create the run
_OWNER = ".owner"
_KEPT = ".kept"  # uploaded flush parts waiting for the merge that replaces them
_KEPT_MAX_AGE_S = 900  # kept longer than this, a part is an orphan (of a forked child that died)
_SETTLE_S = 1.0  # the uploader leaves a file this long after its last change
_DELETE_RETRY_S = 30.0  # a replaced part whose delete failed is tried again this much later


def _mergeable(rel: str) -> bool:
    """Whether a spooled file is a flush part its process merges later (kept after upload until then)."""
    folder, _, name = rel.partition("/")
    return folder in _MERGED_FOLDERS and _names.is_flush_part(name)


_MERGED_FOLDERS = frozenset(_names.TABLES[t].folder for t in _names.COMPACTABLE)


def is_uri(run_dir: Any) -> bool:
    return isinstance(run_dir, str) and run_dir.startswith(SCHEMES)


def split(uri: str) -> str:
    """`bucket/prefix/run` (pyarrow's path) of `s3://bucket/prefix/run`, or a StoreError."""
    parsed = urlparse(uri)
    path = (parsed.netloc + "/" + parsed.path.strip("/")).strip("/")
    if not parsed.netloc or "/" not in path:
        raise layout.StoreError(f"{uri}: an object-store run needs a bucket and a path, e.g. s3://bucket/runs/exp1")
    return path


def filesystem(attempts: int = 3):
    """A pyarrow S3 filesystem from the standard AWS environment variables.

    Short timeouts (a request that moves no byte for 5 s fails); the uploader makes one attempt
    per request and retries on its own schedule. Delayed open: a small part is one PutObject."""
    from pyarrow import fs

    kwargs: dict[str, Any] = {"connect_timeout": 3, "request_timeout": 5, "allow_delayed_open": True,
                              "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=attempts)}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else "https://" + endpoint)
        kwargs["endpoint_override"] = parsed.netloc
        kwargs["scheme"] = parsed.scheme
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return fs.S3FileSystem(**kwargs)


def put(s3, key: str, data: bytes) -> None:
    with s3.open_output_stream(key) as out:
        out.write(data)


def _get(s3, key: str) -> bytes | None:
    try:
        with s3.open_input_stream(key) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _parse_manifest(uri: str, data: bytes) -> dict:
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise layout.StoreError(f"{uri}/{_names.RUN_MANIFEST} is not a readable run manifest ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("run_id"), str):
        raise layout.StoreError(f"{uri}/{_names.RUN_MANIFEST} is not an rltrace run manifest: it has no run_id")
    return manifest


def unreachable(uri: str, exc: Exception) -> layout.StoreError:
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return layout.StoreError(f"{uri}: object store not reachable or access refused ({why[:200]}); "
                             "check AWS_ENDPOINT_URL and the AWS credentials")


def _no_bucket(uri: str, s3, base: str) -> layout.StoreError | None:
    """The error for a run whose bucket does not exist (None when it does)."""
    from pyarrow import fs

    bucket = base.split("/", 1)[0]
    if s3.get_file_info(bucket).type != fs.FileType.NotFound:
        return None
    where = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
    return layout.StoreError(f"{uri}: the bucket {bucket!r} does not exist at {where}; check its name and "
                             "AWS_ENDPOINT_URL, or create the bucket")


def read_manifest(uri: str) -> dict:
    """The manifest of the run at `uri` (validated as for a local run, from the reader's cache copy)."""
    return layout.read_manifest(mirror(uri, tables=()))


def create_or_join(uri: str, *, run_name: str | None, config: Any) -> dict:
    """Create the run at `uri` or join the one there. Processes racing to create it each propose
    a manifest; the earliest proposal wins and every racer adopts it."""
    base, s3 = split(uri), filesystem()
    key = f"{base}/{_names.RUN_MANIFEST}"
    try:
        data = _get(s3, key)
        if data is None:
            missing = _no_bucket(uri, s3, base)
            if missing is not None:
                raise missing
            mine = layout.new_manifest(run_name or base.rsplit("/", 1)[-1], config)
            put(s3, f"{base}/{_CANDIDATES}/{mine['created_ns']:020d}-{mine['run_id']}.json",
                 layout.manifest_text(mine).encode())
            time.sleep(0.5)  # let racing processes propose theirs
            data = _get(s3, key)
            if data is None:
                from pyarrow import fs

                names = sorted(i.path for i in s3.get_file_info(fs.FileSelector(f"{base}/{_CANDIDATES}")))
                data = _get(s3, names[0]) or layout.manifest_text(mine).encode()
                put(s3, key, data)  # every racer writes the same winner
    except layout.StoreError:
        raise
    except OSError as exc:
        raise unreachable(uri, exc) from None
    return _parse_manifest(uri, data)


def _default_root(setting: str, sub: str) -> Path:
    value = resolve(setting)
    return Path(value) if value else Path(os.path.expanduser("~/.cache/rltrace")) / sub


def _run_key(uri: str) -> str:
    base = split(uri)
    where = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "") + "|" + base
    return f"{safe_name(base.rsplit('/', 1)[-1])[:40]}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"


def _owners(folder: Path) -> tuple[str | None, list[int]]:
    try:
        owner = json.loads((folder / _OWNER).read_text())
        return owner.get("host"), [p for p in owner.get("pids", []) if isinstance(p, int)]
    except (OSError, ValueError, AttributeError):
        return None, []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spool:
    """This process's local copy of what it writes to an object-store run, and its uploader thread."""

    def __init__(self, uri: str, manifest: dict, *, drops: rows.Drops | None = None, interval: float = 0.5):
        self.uri, self.base, self.manifest = uri, split(uri), manifest
        self.drops = drops if drops is not None else rows.Drops()
        self.max_bytes = int(resolve("spool_max_mb") * 1e6)
        self.root = _default_root("spool_dir", "spool") / _run_key(uri)
        self.dir = self.root / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._own(add=os.getpid())
        (self.dir / _names.RUN_MANIFEST).write_text(layout.manifest_text(manifest))
        layout.read_manifest(self.dir)  # registers the run id for the parts' footers
        self.interval = interval
        self.uploaded_bytes = 0
        self.spans_dropped = 0
        self.rows_dropped = 0
        self.failures = 0
        self._failing = False
        self._s3 = filesystem(attempts=1)
        self._sent: dict[str, tuple[int, int]] = {}  # key -> (mtime_ns, size) of mutable files uploaded
        self._lock = threading.Lock()
        self.grace_s = 5.0  # replaced parts stay in the bucket this long after the merged part is up
        self._reset_replaced()
        self._start()

    def _reset_replaced(self) -> None:
        """What this process's merges replaced that may still be in the bucket, by the merged part
        that hides it (`covered`: a later merge of that part names them again in its footer)."""
        self._retire_after: dict[str, list[str]] = {}  # merged part not up yet (rel) -> parts to delete once it is
        self._retiring: list[tuple[float, str, list[str]]] = []  # (delete from the bucket after, merged part, rels)
        self._undeleted: dict[str, str] = {}  # replaced part whose delete failed -> the merged part hiding it
        self._retry_at = 0.0  # when those are tried again
        self._said_undeleted = False
        self._maybe_up: set[str] = set()  # waiting parts whose PUT failed: the store may hold them all the same

    def _start(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._backoff = 0.0
        self._thread = threading.Thread(target=self._loop, name="rltrace-uploader", daemon=True)
        self._thread.start()

    def _own(self, *, add: int | None = None, remove: int | None = None) -> list[int]:
        """The processes writing into this spool (a forked child shares its parent's), updated."""
        pids = _owners(self.dir)[1]
        pids = [p for p in pids if p != remove] + ([add] if add is not None and add not in pids else [])
        tmp = self.dir / f".owner.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"host": socket.gethostname(), "pids": pids}))
        os.replace(tmp, self.dir / _OWNER)
        return pids

    def after_fork(self) -> None:
        """In a forked child: a fresh uploader thread over the same spool folder."""
        self._lock = threading.Lock()
        self._reset_replaced()
        self.spans_dropped = self.rows_dropped = self.failures = self.uploaded_bytes = 0  # the child's own counts
        self._own(add=os.getpid())
        self._start()

    # --- the uploader --------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(max(self.interval, self._backoff))
            self._wake.clear()
            try:
                ok = self.upload_once(min_age_s=_SETTLE_S)
            except Exception:  # never let the thread die
                logger.exception("rltrace: uploading to %s failed", self.uri)
                ok = False
            self._backoff = 0.0 if ok else min(30.0, max(1.0, self._backoff * 2))

    def _folders(self) -> list[Path]:
        """This spool, then spools of this run left on this host by processes that died."""
        out = [self.dir]
        host = socket.gethostname()
        try:
            siblings = list(self.root.iterdir())
        except OSError:
            return out
        for d in siblings:
            if d == self.dir or not d.is_dir():
                continue
            owner_host, pids = _owners(d)
            if owner_host == host and pids and not any(_alive(p) for p in pids):
                out.append(d)
        return out

    def _files(self, folder: Path) -> list[tuple[Path, str, os.stat_result]]:
        found = []
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue  # temp files being written, the owner record
                path = Path(dirpath) / name
                rel = path.relative_to(folder).as_posix()
                if rel == _names.RUN_MANIFEST:
                    continue
                try:
                    found.append((path, rel, path.stat()))
                except FileNotFoundError:
                    continue
        return sorted(found, key=lambda f: f[2].st_mtime_ns)

    def upload_once(self, min_age_s: float = 0.0) -> bool:
        """One pass over the spool; False if the store could not be reached (retried later).

        The background pass leaves files younger than `min_age_s` for the next one, so a writer
        that looks at its part right after writing it (its size) still finds it."""
        with self._lock:
            ok = True
            young = time.time_ns() - int(min_age_s * 1e9)
            for folder in self._folders():
                files = self._files(folder)
                self._trim(files)
                for path, rel, st in files:
                    if folder == self.dir and st.st_mtime_ns > young:  # a dead process's files are settled
                        continue
                    mutable = rel.split("/", 1)[0] in MUTABLE
                    state = (st.st_mtime_ns, st.st_size)
                    if mutable and self._sent.get(f"{folder}/{rel}") == state:
                        continue
                    try:
                        data = path.read_bytes()
                    except FileNotFoundError:
                        continue
                    try:
                        put(self._s3, f"{self.base}/{rel}", data)
                    except OSError as exc:
                        if folder == self.dir and not mutable:  # a timeout may come after the store took it
                            self._maybe_up.add(rel)
                        self.failures += 1
                        if not self._failing:  # once per outage, not once per retry
                            self._failing = True
                            logger.warning("rltrace: %s unreachable, parts kept in %s for later (%s)",
                                           self.uri, folder, str(exc).splitlines()[0][:200] if str(exc) else exc)
                        return False
                    self.uploaded_bytes += len(data)
                    self._maybe_up.discard(rel)
                    if self._failing:
                        self._failing = False
                        logger.warning("rltrace: %s reachable again, uploading the spooled parts", self.uri)
                    if mutable and folder == self.dir:
                        self._sent[f"{folder}/{rel}"] = state
                    elif folder == self.dir and _mergeable(rel):  # until the merge that replaces it
                        kept = self.dir / _KEPT / rel
                        kept.parent.mkdir(parents=True, exist_ok=True)
                        with contextlib.suppress(FileNotFoundError):  # a forked process sharing the spool moved it
                            os.replace(path, kept)
                    else:
                        path.unlink(missing_ok=True)
                    replaced = self._retire_after.pop(rel, None) if folder == self.dir else None
                    if replaced:
                        self._retiring.append((time.monotonic() + self.grace_s, rel, replaced))
                if folder != self.dir:  # an orphan spool, fully uploaded
                    shutil.rmtree(folder, ignore_errors=True)
            self._retire(time.monotonic())
            return ok

    # --- merged parts ------------------------------------------------------------------------------
    def source(self, folder: str, name: str) -> Path | None:
        """Where a part of this spool is now (still waiting, or kept after upload), fetched from the
        bucket if neither (a merged part, merged again); None if it cannot be had."""
        rel = f"{folder}/{name}"
        with self._lock:  # not while the uploader moves it
            for path in (self.dir / rel, self.dir / _KEPT / rel):
                if path.exists():
                    return path
        dest = self.dir / _KEPT / rel
        try:
            data = _get(self._s3, f"{self.base}/{rel}")
        except OSError:
            return None
        if data is None:
            return None
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest

    def replaced(self, folder: str, names: list[str], by: str) -> None:
        """Parts of this spool that the merged part `by` replaces: those not uploaded yet never will
        be (the merged part holds their rows); the others, and those a part not uploaded yet was to
        delete, are deleted from the bucket `grace_s` after `by` is up, and from the spool. A part
        whose upload failed counts as uploaded: the store may have taken it before the error."""
        with self._lock:
            by_rel = f"{folder}/{by}"
            uploaded: list[str] = []
            for name in names:
                rel = f"{folder}/{name}"
                waiting = self.dir / rel
                inherited = self._retire_after.pop(rel, [])  # it never goes up now: `by` deletes them
                if waiting.exists() and rel not in self._maybe_up:
                    waiting.unlink(missing_ok=True)
                else:
                    if waiting.exists():
                        waiting.unlink(missing_ok=True)
                        self._maybe_up.discard(rel)
                    uploaded.append(rel)
                uploaded += inherited
                for i, (due, hider, rels) in enumerate(self._retiring):  # hidden by `by` too from now on
                    if hider == rel:
                        self._retiring[i] = (due, by_rel, rels)
                for other, hider in self._undeleted.items():
                    if hider == rel:
                        self._undeleted[other] = by_rel
            uploaded = list(dict.fromkeys(uploaded))
            if not uploaded:
                return
            if (self.dir / by_rel).exists():
                self._retire_after[by_rel] = list(dict.fromkeys(self._retire_after.get(by_rel, []) + uploaded))
            else:  # the merged part is up already
                self._retiring.append((time.monotonic() + self.grace_s, by_rel, uploaded))

    def covered(self, folder: str, names: list[str]) -> list[str]:
        """The parts of `folder` that the parts `names` hid and that may still be in the bucket
        (not deleted yet: waiting for their grace, or their delete failed). A merge of `names`
        names them in its footer too, so they stay hidden once `names` leave the bucket, and
        whatever path left them there (a failed delete, a part merged again before it was
        uploaded) never makes a span count twice."""
        rels = {f"{folder}/{n}" for n in names}
        with self._lock:
            found = [r for rel in rels for r in self._retire_after.get(rel, [])]
            found += [r for _, hider, replaced in self._retiring if hider in rels for r in replaced]
            found += [r for r, hider in self._undeleted.items() if hider in rels]
        prefix = folder + "/"
        return list(dict.fromkeys(r[len(prefix):] for r in found if r.startswith(prefix) and r not in rels))

    def _retire(self, now: float, everything: bool = False) -> None:
        """Delete from the bucket (and the spool) the replaced parts whose grace is over; those
        whose delete fails stay hidden (`covered`) and are tried again `_DELETE_RETRY_S` later."""
        due = [r for r in self._retiring if everything or r[0] <= now]
        self._retiring = [r for r in self._retiring if not (everything or r[0] <= now)]
        todo = [(rel, hider) for _, hider, rels in due for rel in rels]
        if self._undeleted and (everything or now >= self._retry_at):
            todo += list(self._undeleted.items())
        failed = None
        for rel, hider in todo:
            if failed is not None:  # the store is failing: the rest waits for the next try
                self._undeleted[rel] = hider
                continue
            try:
                self._s3.delete_file(f"{self.base}/{rel}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed = exc
                self._undeleted[rel] = hider
                continue
            self._undeleted.pop(rel, None)
            (self.dir / _KEPT / rel).unlink(missing_ok=True)
        if failed is not None:
            self._retry_at = now + _DELETE_RETRY_S
            if not self._said_undeleted:  # once until deletes work again: the parts stay hidden meanwhile
                self._said_undeleted = True
                logger.warning("rltrace: could not delete %d replaced parts from %s (%s); they stay hidden and "
                               "are deleted later", len(self._undeleted), self.uri, str(failed).splitlines()[0][:200]
                               if str(failed) else type(failed).__name__)
        elif not self._undeleted:
            self._said_undeleted = False
        kept = self.dir / _KEPT
        if kept.is_dir():
            old = time.time() - _KEPT_MAX_AGE_S
            for path in kept.rglob("*.parquet"):
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < old:
                        path.unlink()

    def _trim(self, files: list[tuple[Path, str, os.stat_result]]) -> None:
        """Over the size limit: drop the oldest immutable parts, counted with their reason.

        Files a writer derives from a span part (its per-part summary, its engine request rows)
        go first, uncounted: they hold no row of their own, and a report computes them again
        from the span part when they are missing."""
        total = sum(st.st_size for _, _, st in files)
        if total <= self.max_bytes:
            return
        import pyarrow.parquet as pq

        by_folder = {t.folder: t for t in _names.TABLES.values()}
        derived = {t.folder for t in _names.SPAN_SIDECARS}
        reason = "object store unreachable and the local spool is full (raise RLTRACE_SPOOL_MAX_MB)"
        oldest_first = sorted(files, key=lambda f: f[1].split("/", 1)[0] not in derived)  # stable: by age within each
        for path, rel, st in oldest_first:
            if total <= self.max_bytes:
                break
            folder = rel.split("/", 1)[0]
            if folder in MUTABLE:
                continue
            if folder in derived:
                path.unlink(missing_ok=True)
                files.remove((path, rel, st))
                total -= st.st_size
                replaced = self._retire_after.pop(rel, None)  # the files it replaced in the bucket ...
                if replaced:  # ... go once its span part is up instead (or now, if it is)
                    part = f"{_names.SPANS.folder}/{rel.split('/', 1)[1]}"
                    if part in self._retire_after:
                        self._retire_after[part] = [*self._retire_after[part], *replaced]
                    else:
                        self._retiring.append((time.monotonic() + self.grace_s, part, replaced))
                logger.debug("rltrace: spool full, %s left out (reports compute it from its span part)", rel)
                continue
            try:
                n = pq.read_metadata(path).num_rows if rel.endswith(".parquet") else 0
            except Exception:
                n = 0
            path.unlink(missing_ok=True)
            files.remove((path, rel, st))
            total -= st.st_size
            self._retire_after.pop(rel, None)  # what it was to replace stays in the bucket, in force
            self._maybe_up.discard(rel)
            table = by_folder.get(folder)
            self.drops.add(table.name if table else folder, n, reason)
            if table is _names.SPANS:
                self.spans_dropped += n
            else:
                self.rows_dropped += n
            logger.warning("rltrace: dropped %d %s rows: %s", n, folder, reason)

    def flush(self, timeout: float = 30.0) -> bool:
        """Upload what is spooled now, retrying until `timeout`; True if all of it went up."""
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            if self.upload_once() and self.pending() == 0:
                return True
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def pending(self) -> int:
        """Immutable files still waiting in the spool."""
        return sum(1 for _, rel, _ in self._files(self.dir) if rel.split("/", 1)[0] not in MUTABLE)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after a last upload; what could not go up stays in the spool for the
        next process of this run on this host."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout)
        if not self.flush(max(deadline - time.monotonic(), 1.0)):
            logger.warning("rltrace: %s still unreachable; %d parts kept in %s, uploaded by the next "
                           "process of this run on this host", self.uri, self.pending(), self.dir)
            return
        with self._lock:  # the process is leaving: replaced parts wait out a short grace, not all of it
            wait = max((t for t, _, _ in self._retiring), default=0.0) - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 1.0))
            self._retire(time.monotonic(), everything=True)
        if not any(_alive(p) for p in self._own(remove=os.getpid())):  # a forked child may still write here
            shutil.rmtree(self.dir, ignore_errors=True)


# --- readers ---------------------------------------------------------------------------------
def mirror(uri: str, *, tables: tuple[str, ...] | None = None) -> Path:
    """Bring the run at `uri` into the local cache (new and changed objects only) and return the
    cache folder, a local run dir. `tables=()` fetches only the manifest."""
    from pyarrow import fs

    base, s3 = split(uri), filesystem()
    local = _default_root("cache_dir", "runs") / _run_key(uri)
    try:
        info = s3.get_file_info(f"{base}/{_names.RUN_MANIFEST}")
        if info.type == fs.FileType.NotFound:
            raise _no_bucket(uri, s3, base) or layout.StoreError(
                f"{uri} is not an rltrace run: it has no {_names.RUN_MANIFEST} (made by rltrace.init)")
        listing = [info]
        if tables is None or tables:
            try:
                found = s3.get_file_info(fs.FileSelector(base, recursive=True))
            except FileNotFoundError:
                found = []
            wanted = None if tables is None else set(tables)
            listing += [
                i for i in found
                if i.type == fs.FileType.File and not i.base_name.startswith(".")
                and i.path != info.path and not i.path[len(base) + 1:].startswith(_CANDIDATES + "/")
                and (wanted is None or i.path[len(base) + 1:].split("/", 1)[0] in wanted)
            ]
    except layout.StoreError:
        raise
    except OSError as exc:
        raise unreachable(uri, exc) from None
    local.mkdir(parents=True, exist_ok=True)
    keep = set()
    todo = []
    for i in listing:
        rel = i.path[len(base) + 1:]
        if ".." in rel.split("/"):
            continue
        dest = local / rel
        keep.add(dest)
        mtime_ns = i.mtime_ns or 0
        try:
            st = dest.stat()
            if st.st_size == i.size and st.st_mtime_ns == mtime_ns:
                continue
        except FileNotFoundError:
            pass
        todo.append((i.path, dest, mtime_ns))

    def fetch(item) -> None:
        key, dest, mtime_ns = item
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with s3.open_input_stream(key) as src:
                tmp.write_bytes(src.read())
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
            os.replace(tmp, dest)
        except FileNotFoundError:
            keep.discard(dest)  # removed (compacted) since listed
        finally:
            tmp.unlink(missing_ok=True)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(fetch, todo))
    except OSError as exc:
        raise unreachable(uri, exc) from None
    if tables is None:  # a full listing: drop local copies of objects gone from the store
        for dirpath, _, filenames in os.walk(local):
            for name in filenames:
                path = Path(dirpath) / name
                if path not in keep and not name.startswith("."):
                    path.unlink(missing_ok=True)
    return local


# --- compaction --------------------------------------------------------------------------------
def upload(uri: str, local_run: Path, path: Path) -> None:
    """Put a file of the reader's local copy `local_run` of the run at `uri` into the bucket."""
    rel = Path(path).relative_to(local_run).as_posix()
    try:
        put(filesystem(), f"{split(uri)}/{rel}", Path(path).read_bytes())
    except OSError as exc:
        raise unreachable(uri, exc) from None
