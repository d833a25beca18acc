"""What the first report computes, stored in the run when its last writer exits: a report on a
machine that never saw the run computes nothing and says what the spans say; whatever was written
since is computed from the spans; a writer that is not the last stores nothing, and a store that
cannot be written says so in one line."""

from __future__ import annotations

import fcntl
import json

import rltrace
from rltrace import report, store
from rltrace.analysis import _parts
from rltrace.store import last_writer
from tests.analysis.test_summary_cache import computed  # noqa: F401  (the steps each computation was asked for)

NOW = 2_000_000_000 * 10**9




def _record(run_dir, steps, first=0, role="trainer"):
    rltrace.init(run_dir, role=role, flush_interval=0.05)
    for step in range(first, first + steps):
        with rltrace.phase("rollout", step=step):
            for k in range(3):
                with rltrace.phase("generate", sample_id=k):
                    pass
        with rltrace.phase("train", step=step):
            with rltrace.phase("forward"):
                pass
        rltrace.flush()
    rltrace.shutdown()  # the hook under test runs here
    assert last_writer.wait(run_dir, timeout=300)  # the storing process it may have started is done


def _report(run_dir, cache, monkeypatch) -> str:
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(cache))
    return json.dumps(report.build(store.open(run_dir), now_ns=NOW), sort_keys=True, default=str)


def _from_spans(run_dir, tmp_path, monkeypatch) -> str:
    """The report with nothing cached and nothing stored: everything from the spans."""
    folder, aside = run_dir / _parts.STORED, tmp_path / "aside"
    folder.rename(aside)
    try:
        return _report(run_dir, tmp_path / "from-spans", monkeypatch)
    finally:
        aside.rename(folder)


def test_the_last_writer_stores_what_a_report_on_another_machine_then_reuses(run_dir, tmp_path, monkeypatch, computed):  # noqa: F811
    monkeypatch.setattr(last_writer, "MIN_BYTES", 0)
    _record(run_dir, 4)
    files = {p.name.split(".", 1)[1] for p in (run_dir / _parts.STORED).glob("*.parquet")}
    assert {"parquet", "steps.parquet"} <= files  # the per-step summaries and the per-part step facts
    computed.clear()
    cold = _report(run_dir, tmp_path / "another-machine", monkeypatch)
    assert computed == []  # a machine that never reported on the run computes no step
    assert cold == _from_spans(run_dir, tmp_path, monkeypatch)
    assert computed == [4]  # what it would have computed

    # the run goes on in a writer that stores nothing: the stored steps hold, the new ones are computed
    monkeypatch.setenv("RLTRACE_STORE_SUMMARIES", "0")
    _record(run_dir, 2, first=4)
    computed.clear()
    _report(run_dir, tmp_path / "a-third-machine", monkeypatch)
    assert computed == [2]

    # resumed again, its last writer stores what is new (beside what was stored): nothing to compute
    monkeypatch.delenv("RLTRACE_STORE_SUMMARIES")
    _record(run_dir, 1, first=6)
    computed.clear()
    resumed = _report(run_dir, tmp_path / "a-fourth-machine", monkeypatch)
    assert computed == []
    assert resumed == _from_spans(run_dir, tmp_path, monkeypatch)


def test_a_writer_leaving_while_another_lives_leaves_it_to_that_one(run_dir, monkeypatch):
    monkeypatch.setattr(last_writer, "MIN_BYTES", 0)
    monkeypatch.setenv("RLTRACE_STORE_SUMMARIES", "0")
    _record(run_dir, 2)
    monkeypatch.delenv("RLTRACE_STORE_SUMMARIES")
    with open(run_dir / ".writers" / "rollout0-elsewhere-1.lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # a live writer of the run
        assert last_writer.at_exit(run_dir) is None
        assert not (run_dir / _parts.STORED).exists()
    proc = last_writer.at_exit(run_dir)  # its lock is free now: the last one out has them stored
    assert proc is not None and proc.wait(timeout=300) == 0
    assert last_writer.wait(run_dir, timeout=1)
    assert any((run_dir / _parts.STORED).glob("*.parquet"))


def test_a_small_run_stores_nothing_and_a_store_that_fails_says_so_in_one_line(run_dir, monkeypatch, capfd):
    _record(run_dir, 2)  # far below MIN_BYTES: a report computes it in no time
    assert not (run_dir / _parts.STORED).exists()
    monkeypatch.setattr(last_writer, "MIN_BYTES", 0)
    (run_dir / _parts.STORED).write_text("not a folder")
    capfd.readouterr()
    proc = last_writer.at_exit(run_dir)
    assert proc.wait(timeout=300) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "summaries were not stored" in err[0] and "report_cache" in err[0], err
