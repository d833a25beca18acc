"""Property: whatever lines, records and samples a log or dump holds, and however an import fails
part-way (a full disk while parts are written, an error while they are renamed into place), every
good one is stored exactly once across any number of retries, and every bad one is counted with a
reason (`rltrace info`), as on the live write path (tests/test_write_path_property.py).

Formats: JSONL and CSV metric logs, TensorBoard event files (records framed by hand, as TFRecord
writes them), slime rollout dumps (slime's format: tests/replay/slime_dumps.py)."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rltrace import store
from rltrace.cli.info import collect
from rltrace.importers.metrics import import_metrics
from rltrace.store import imports

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAMES = ("m/a", "m/b", "m/c")  # names no framework maps: stored once each, no alias rows, no spans
values = st.floats(allow_nan=False, allow_infinity=False, width=32)
#: a good record: its values by name (its step is its place among the good ones)
good = st.dictionaries(st.sampled_from(NAMES), values, min_size=1).map(lambda v: ("good", v))
bad_record = st.sampled_from(["not json", "a list", "step 2**70", "step 1.5"]).map(lambda k: ("bad", k))
text_value = st.sampled_from(NAMES).map(lambda n: ("text", n))  # a good record with one value that is not a number
records = st.lists(st.one_of(good, good, bad_record, text_value), min_size=1, max_size=8)
#: how the first tries fail: (where, at which call), None for no failure; then up to two more plain retries
failures = st.lists(st.one_of(st.none(), st.tuples(st.sampled_from(["write", "rename"]), st.integers(1, 4))), min_size=1, max_size=3)


@contextmanager
def _failing(where: str | None, at: int):
    """pq.write_table (staging a part) or os.replace (committing) raising a full disk at call `at`."""
    target, attr = (pq, "write_table") if where == "write" else (imports.os, "replace")
    real, calls = getattr(target, attr), [0]

    def flaky(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    if where is not None:
        setattr(target, attr, flaky)
    try:
        yield
    finally:
        setattr(target, attr, real)


def _import_with_failures(run_import, tries, nothing_good: bool = False) -> None:
    """Run the import under each try's failure, then once more without one (the retry that finishes).
    With `nothing_good`, every try is a one-line error (nothing to import) that writes nothing."""
    from rltrace.importers.scalars import MetricsImportError

    for failure in [*tries, None]:
        with _failing(*(failure or (None, 0))):
            try:
                run_import()
                assert not nothing_good
            except OSError as exc:
                assert exc.errno == 28, exc
            except MetricsImportError as exc:
                assert nothing_good and "no scalars in" in str(exc), exc


def _dropped(run) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in collect(str(run))["drop_reasons"]:
        assert r["reason"], r
        out[r["table"]] = out.get(r["table"], 0) + r["count"]
    return out


def _expected(recs) -> tuple[list[tuple[int, str, float]], int, int]:
    """(step, name, value) of every good value, bad records, values that are not numbers."""
    rows, bad, text, step = [], 0, 0, 0
    for kind, payload in recs:
        if kind == "bad":
            bad += 1
            continue
        vals = payload if kind == "good" else {n: 1.0 for n in NAMES if n != payload}
        rows += [(step, n, float(np.float32(v))) for n, v in vals.items()]
        text += kind == "text"
        step += 1
    return sorted(rows), bad, text


def _jsonl(recs) -> str:
    lines, step = [], 0
    for kind, payload in recs:
        if kind == "bad":
            lines.append({"not json": "{not json", "a list": "[1, 2]", "step 2**70": json.dumps({"_step": 2**70, "m/a": 1.0}),
                          "step 1.5": json.dumps({"_step": 1.5, "m/a": 1.0})}[payload])
            continue
        vals = {n: float(np.float32(v)) for n, v in payload.items()} if kind == "good" else {n: 1.0 for n in NAMES if n != payload} | {payload: "text"}
        lines.append(json.dumps({"_step": step, **vals}))
        step += 1
    return "\n".join(lines) + "\n"


def _csv(recs) -> str:
    lines, step = [",".join(("_step", *NAMES))], 0
    for kind, payload in recs:
        if kind == "bad":
            lines.append({"not json": "1,2", "a list": "1,2,3,4,5", "step 2**70": f"{2**70},1,1,1", "step 1.5": "1.5,1,1,1"}[payload])
            continue
        vals = {n: repr(float(np.float32(v))) for n, v in payload.items()} if kind == "good" else {n: "1.0" for n in NAMES} | {payload: "text"}
        lines.append(",".join((str(step), *(vals.get(n, "") for n in NAMES))))
        step += 1
    return "\n".join(lines) + "\n"


@contextmanager
def _workdir():
    path = Path(tempfile.mkdtemp())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@SETTINGS
@given(recs=records, fmt=st.sampled_from(["jsonl", "csv"]), cut=st.booleans(), tries=failures)
def test_text_logs_store_each_good_line_once_and_count_each_bad_one(recs, fmt, cut, tries):
    with _workdir() as tmp:
        text = _jsonl(recs) if fmt == "jsonl" else _csv(recs)
        log = tmp / f"log.{fmt}"
        log.write_text(text + ('{"_step": 99, "m/a"' if fmt == "jsonl" else "99,1.0") if cut else text)  # a killed writer's last line
        run = tmp / "run"
        rows, bad, nonnumeric = _expected(recs)
        _import_with_failures(lambda: import_metrics([log], run, framework="slime"), tries + [None], nothing_good=not rows)  # and once more
        _check(run, log, rows, bad + cut, nonnumeric)


def _check(run: Path, log: Path, rows: list, bad: int, nonnumeric: int) -> None:
    """Every good value stored once, every bad line / record / value counted in the run; a log with
    nothing good is a one-line error that names its first bad line and writes no run."""
    if not rows:
        from rltrace.importers.scalars import MetricsImportError

        assert not (run / "run.json").exists()
        with pytest.raises(MetricsImportError, match=f"no scalars in {log} \\({log}, (lines?|bytes?) "):
            import_metrics([log], run, framework="slime")
        return
    assert store.open(run).execute("SELECT step, name, value FROM metrics ORDER BY ALL").fetchall() == rows
    dropped = _dropped(run)
    assert dropped.get("metric log records", 0) == bad
    assert dropped.get("metric log values", 0) == nonnumeric


def _frame(payload: bytes) -> bytes:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", masked_crc32c(head)) + payload + struct.pack("<I", masked_crc32c(payload))


def _events(recs) -> bytes:
    """An event file: the file_version record, then one event per good record; a bad record is a
    payload that does not parse (or, for "step 2**70", a record whose header checksum is damaged)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    out = [_frame(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())]
    step = 0
    for kind, payload in recs:
        if kind == "bad":
            frame = bytearray(_frame(b"\xff\xff\xff\xff"))
            if payload == "step 2**70":
                frame[9] ^= 0x10  # the header's checksum
            out.append(bytes(frame))
            continue
        vals = payload if kind == "good" else {n: 1.0 for n in NAMES if n != payload}
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=n, simple_value=v) for n, v in vals.items()])
        if kind == "text":  # a histogram where a scalar was expected: a value that is not a number
            summary.value.add(tag=payload, histo=summary_pb2.HistogramProto(min=0, max=1, num=1))
        out.append(_frame(event_pb2.Event(wall_time=1.7e9 + step, step=step, summary=summary).SerializeToString()))
        step += 1
    return b"".join(out)


@SETTINGS
@given(recs=records, cut=st.booleans(), tries=failures)
def test_event_files_store_each_good_record_once_and_count_each_bad_one(recs, cut, tries):
    pytest.importorskip("tensorboard")
    with _workdir() as tmp:
        log = tmp / "events.out.tfevents.1.host"
        data = _events(recs)
        log.write_bytes(data + _frame(b"\x08\x01")[:-5] if cut else data)  # a record cut off by a killed writer
        run = tmp / "run"
        rows, bad, nonnumeric = _expected(recs)
        # records in a row whose headers are damaged are one damaged stretch, counted once with the
        # bytes skipped (past a damaged header no length can be trusted, so neither can a count)
        runs = sum(1 for k, r in enumerate(recs) if r == ("bad", "step 2**70") and (k == 0 or recs[k - 1] != r))
        bad -= sum(r == ("bad", "step 2**70") for r in recs) - runs
        _import_with_failures(lambda: import_metrics([log], run, framework="slime"), tries, nothing_good=not rows)
        _check(run, log, rows, bad + cut, nonnumeric)


def _sample(kind: str, i: int):
    from tests.replay.slime_dumps import sample_dict

    s = sample_dict(i)
    if kind == "long":
        s["response_length"] = 2**70
    elif kind == "no status":
        del s["status"]
    elif kind == "not a dict":
        return [i]
    elif kind == "odd field":  # a good sample with one field of another kind than its column
        s["rollout_log_probs"] = "not numbers"
    elif kind == "surrogate":
        s["prompt"] = "\udcff"
    return s


samples = st.lists(st.sampled_from(["good", "good", "surrogate", "odd field", "long", "no status", "not a dict"]), min_size=1, max_size=4)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(dumps=st.lists(samples, min_size=1, max_size=3), tries=failures)
def test_slime_dumps_store_each_good_sample_once_and_count_each_bad_one(dumps, tries):
    torch = pytest.importorskip("torch")
    from rltrace.replay.slime import import_slime

    with _workdir() as tmp:
        index = 0
        for rid, kinds in enumerate(dumps):
            made = []
            for kind in kinds:
                made.append(_sample(kind, index))
                index += 1
            torch.save({"rollout_id": rid, "samples": made}, tmp / f"{rid}.pt")
        run = tmp / "run"
        _import_with_failures(lambda: import_slime([tmp], run), tries)
        flat = [k for kinds in dumps for k in kinds]
        good_ids = sorted(str(i) for i, k in enumerate(flat) if k in ("good", "surrogate", "odd field"))
        con = store.open(run)
        assert sorted(r for (r,) in con.execute("SELECT sample_id::VARCHAR FROM batches").fetchall()) == good_ids
        assert sorted(r for (r,) in con.execute("SELECT sample_id FROM samples").fetchall()) == good_ids
        dropped = _dropped(run)
        assert dropped.get("slime samples", 0) == sum(k in ("long", "no status", "not a dict") for k in flat)
        # a field of another kind than most of its column's values is left out of its sample (the
        # fewer of the two kinds: a dump of mostly odd ones keeps them and leaves out the others)
        odd_or_normal = [(kinds.count("odd field"), kinds.count("good") + kinds.count("surrogate")) for kinds in dumps]
        assert dropped.get("slime fields", 0) == sum(min(o, n) for o, n in odd_or_normal)
