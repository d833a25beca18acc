"""The per-step summary cache: a report on a live run computes only what changed, and a cached
step never outlives the spans it summarised (no `rltrace compact` involved)."""

import os
import shutil

import pytest

from rltrace import _names, analysis, report, store
from rltrace.analysis import _compute, _parts, summary
from rltrace.cli import main
from rltrace.testing import RunBuilder


@pytest.fixture
def computed(monkeypatch):
    """The number of steps each summary computation was asked for."""
    calls = []
    real = _compute.compute
    monkeypatch.setattr(_compute, "compute", lambda spans, checks, *rest: calls.append(len(checks)) or real(spans, checks, *rest))
    return calls


def _run(tmp_path, steps=4):
    b = RunBuilder(tmp_path / "run")
    trainer, worker = b.process("trainer"), b.process("rollout")
    for step in range(steps):
        _step(trainer, worker, step)
    b.write()
    return b, trainer, worker


def _step(trainer, worker, step):
    o = 10.0 * step
    worker.span("rollout", o, o + 3, step=step)
    trainer.span("wait", o, o + 3, step=step)
    trainer.span("train", o + 3, o + 5, step=step)


def _answer(run_dir):
    """Everything the summaries feed, as plain data."""
    con = store.open(run_dir)
    cm = analysis.cost_model(con).round(9)
    waits = analysis.waits(con)
    waits = waits.sort_values(list(waits.columns[:5])).round(9).reset_index(drop=True)
    return tuple(_Same(f.astype(object).where(f.notna(), -1).to_dict("records")) for f in (cm, waits))


class _Same(list):
    """Plain rows (NaN spelled -1 so that equal answers compare equal)."""


def _fresh(run_dir, tmp_path, monkeypatch):
    """The same run analysed with an empty cache."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "empty-cache"))
    try:
        return _answer(run_dir)
    finally:
        monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))


def test_a_second_report_computes_nothing_and_a_live_run_only_its_new_step(tmp_path, monkeypatch, computed):
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    b, trainer, worker = _run(tmp_path)
    first = report.build(store.open(b.run_dir))
    assert computed == [4]
    assert list((tmp_path / "cache").glob("*.parquet")), "the report left its summaries in the cache"
    computed.clear()
    cache, _ = _files(tmp_path / "cache")
    written = cache.stat().st_mtime_ns
    assert report.build(store.open(b.run_dir))["waits"] == first["waits"]
    assert computed == []
    assert cache.stat().st_mtime_ns == written  # nothing changed: the cache is not written again

    _step(trainer, worker, 4)  # the run goes on: one more step flushed as new parts
    b.write()
    computed.clear()
    again = _answer(b.run_dir)
    assert computed == [1]  # only the new step
    assert again == _fresh(b.run_dir, tmp_path, monkeypatch)


def test_a_late_span_without_a_step_recomputes_the_cached_steps_it_overlaps(tmp_path, monkeypatch, computed):
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    b, trainer, _ = _run(tmp_path)
    _answer(b.run_dir)
    reward = b.process("reward")
    reward.span("reward", 10.5, 12.5)  # a reward server with no step, flushed late, inside step 1's wait
    b.write()
    computed.clear()
    cached = _answer(b.run_dir)
    assert computed == [1]  # step 1 only: the new part's time range touches no other step
    assert cached == _fresh(b.run_dir, tmp_path, monkeypatch)
    waits = analysis.waits(store.open(b.run_dir))
    assert "reward" in set(waits[waits["step"] == 1]["waited_for"].dropna())


def test_a_cache_holds_across_merges_of_its_parts_and_a_damaged_cache_is_ignored(tmp_path, monkeypatch, computed):
    """Writers merge their parts all the while: a part merged from the parts a cache listed holds
    the same spans, so the cache still holds; a part merged with parts the cache never saw may hold
    new spans, and the steps it reaches are computed again."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    b, trainer, _ = _run(tmp_path)
    want = _answer(b.run_dir)
    cache, _ = _files(tmp_path / "cache")

    cache.write_bytes(b"not parquet")
    computed.clear()
    assert _answer(b.run_dir) == want and computed == [4]  # recomputed, and the cache rewritten
    assert cache.read_bytes()[:4] == b"PAR1"

    before = cache.read_bytes()
    assert main(["compact", str(b.run_dir), "--grace", "0"]) == 0
    shutil.rmtree(b.run_dir / _names.STEP_SUMMARY.folder)
    cache.write_bytes(before)  # a cache of the parts before they were merged
    computed.clear()
    assert _answer(b.run_dir) == want and computed == []  # the merged part holds exactly what the cache saw

    trainer.span("reward", 13.5, 14.5, step=1)  # a late span of step 1, then merged with the cached part
    b.write()
    assert main(["compact", str(b.run_dir), "--grace", "0"]) == 0
    shutil.rmtree(b.run_dir / _names.STEP_SUMMARY.folder)
    computed.clear()
    assert _answer(b.run_dir) == _fresh(b.run_dir, tmp_path, monkeypatch)
    assert 1 in {int(s) for s in summary.checks(store.open(b.run_dir)).query("count == 4")["step"]}
    assert computed and sum(computed) <= 4  # the steps the merged part reaches, at most all of them


def test_a_cache_that_cannot_be_written_never_fails_a_report(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(blocked / "summaries"))
    b, _, _ = _run(tmp_path)
    assert report.build(store.open(b.run_dir))["t_sync"]
    assert not os.path.isdir(blocked)
    assert _parts.cache_file(store.open(b.run_dir)).parent == blocked / "summaries"


def test_steps_computed_in_many_batches_on_threads_equal_one_batch(tmp_path, monkeypatch):
    """An async run (rollout of step k+1 overlaps train of step k, a reward server without steps):
    batches of a few spans, computed two at a time, give exactly the summaries of one batch."""
    b = RunBuilder(tmp_path / "run")
    trainer, worker, reward = b.process("trainer"), b.process("rollout"), b.process("reward")
    for step in range(12):
        o = 2.0 * step
        roll = worker.span("rollout", o, o + 2.5, step=step)
        worker.span("generate", o + 0.1, o + 2.4, step=step, parent=roll, thread=2)
        reward.span("reward", o + 2.4, o + 2.6)
        trainer.span("wait", o + 2.5, o + 2.7, step=step)
        train = trainer.span("train", o + 2.7, o + 4.2, step=step)
        trainer.span("forward", o + 2.8, o + 3.5, step=step, parent=train)
    b.write(parts_per_process=3)

    def table(batch):
        monkeypatch.setattr(summary, "BATCH_SPANS", batch)
        monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / f"cache-{batch[0]}"))
        out = summary.table(store.open(b.run_dir)).to_pandas()
        return out.sort_values(list(out.columns[:11]), key=lambda c: c.astype(str)).reset_index(drop=True)

    one, many = table((10**9, 10**9)), table((1, 1))
    assert one["step"].nunique() == 12
    assert one.equals(many)


def test_step_counts_of_parts_seen_before_are_read_not_scanned(tmp_path, monkeypatch):
    """The per-step fingerprints come from a per-part sidecar: parts already seen are not read
    again (a live run of 100M spans scans its last flushes), and a part rewritten is."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    b, trainer, worker = _run(tmp_path)
    summary.checks(store.open(b.run_dir))
    (sidecar,) = (tmp_path / "cache").glob("*.steps.parquet")
    table = pq.read_table(sidecar)
    table = table.set_column(table.schema.get_field_index("total_ns"), "total_ns",
                             pc.if_else(pc.equal(table["step"], 0), 7, table["total_ns"]))
    pq.write_table(table, sidecar)  # marked: step 0's summed durations read 7 ns if taken from here

    _step(trainer, worker, 4)
    b.write()
    checks = summary.checks(store.open(b.run_dir)).set_index("step")
    assert checks.loc[0, "total_ns"] == 14  # step 0 lives in two parts, each read from the sidecar, not scanned
    assert checks.loc[4, "count"] == 3 and checks.loc[4, "total_ns"] == 8 * 10**9  # the new part was scanned

    part = next(p for p in (b.run_dir / "spans").glob("*.parquet") if pq.read_table(p)["step"].to_pylist()[0] == 0)
    rewritten = pq.read_table(part)
    pq.write_table(rewritten, part, compression="none")  # same rows, another size: not the part that was seen
    checks = summary.checks(store.open(b.run_dir)).set_index("step")
    assert checks.loc[0, "total_ns"] in (7 + 3 * 10**9, 7 + 5 * 10**9)  # that part scanned again


def test_a_part_removed_after_it_was_cached(tmp_path, monkeypatch, computed):
    """A part the caches listed disappears (merged away, or deleted by hand): both caches step
    aside and the report is that of the parts present."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    b, trainer, worker = _run(tmp_path)
    _answer(b.run_dir)
    before = set((b.run_dir / "spans").glob("*.parquet"))
    _step(trainer, worker, 4)
    b.write()
    _answer(b.run_dir)
    for part in set((b.run_dir / "spans").glob("*.parquet")) - before:
        part.unlink()
    computed.clear()
    assert _answer(b.run_dir) == _fresh(b.run_dir, tmp_path, monkeypatch)
    assert summary.checks(store.open(b.run_dir))["step"].tolist() == [0, 1, 2, 3]


def _files(cache_dir):
    """(the full cache file, the additions) in a cache folder."""
    additions = sorted(p for p in cache_dir.glob("*.new-*.parquet") if p.name.split(".")[1].startswith("new-"))
    (full,) = [p for p in cache_dir.glob("*.parquet") if p.name.count(".") == 1]  # not a per-part sidecar
    return full, additions


def test_a_live_run_adds_its_new_steps_beside_the_cache_and_folds_them_in_later(tmp_path, monkeypatch, computed):
    """A live run of many steps: each report writes only its new steps (an addition), not every
    step again; later reports read the full file and the additions; after `_parts.ADDITIONS` of them,
    everything is folded into the full file."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_parts, "ADDITIONS", 2)
    b, trainer, worker = _run(tmp_path, steps=12)
    _answer(b.run_dir)
    full, additions = _files(tmp_path / "cache")
    assert additions == []
    written = full.stat().st_mtime_ns

    for step, n_additions in ((12, 1), (13, 2)):
        _step(trainer, worker, step)
        b.write()
        computed.clear()
        got = _answer(b.run_dir)
        assert computed == [1]  # only the new step: the earlier ones come from the full file and the additions
        assert full.stat().st_mtime_ns == written  # the full file was not rewritten
        assert len(_files(tmp_path / "cache")[1]) == n_additions
        assert got == _fresh(b.run_dir, tmp_path, monkeypatch)
    computed.clear()
    _answer(b.run_dir)
    assert computed == [] and len(_files(tmp_path / "cache")[1]) == 2  # nothing new: nothing written

    _step(trainer, worker, 14)  # a third addition would pass the limit: every step goes to the full file
    b.write()
    computed.clear()
    got = _answer(b.run_dir)
    assert computed == [1]
    assert full.stat().st_mtime_ns != written and _files(tmp_path / "cache")[1] == []
    assert got == _fresh(b.run_dir, tmp_path, monkeypatch)
    computed.clear()
    _answer(b.run_dir)
    assert computed == []


def test_a_step_recomputed_into_an_addition_wins_over_the_full_file(tmp_path, monkeypatch, computed):
    """A late stepless span touches a step of the full file: the recomputed step goes to an
    addition, and later reports use that version (the full file's one no longer holds)."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    b, trainer, worker = _run(tmp_path, steps=12)
    _answer(b.run_dir)
    b.process("reward").span("reward", 10.5, 12.5)  # inside step 1's wait
    b.write()
    want = _fresh(b.run_dir, tmp_path, monkeypatch)
    computed.clear()
    assert _answer(b.run_dir) == want and computed == [1]
    assert len(_files(tmp_path / "cache")[1]) == 1
    computed.clear()
    assert _answer(b.run_dir) == want and computed == []  # step 1 from the addition, the rest from the full file
    waits = analysis.waits(store.open(b.run_dir))
    assert "reward" in set(waits[waits["step"] == 1]["waited_for"].dropna())


def test_progress_is_told_after_each_batch_of_computed_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(summary, "BATCH_SPANS", (3, 3))  # one step a batch
    b, _, _ = _run(tmp_path)
    told = []
    with summary.progress(lambda done, total: told.append((done, total))):
        summary.rows(store.open(b.run_dir))
    assert told == [(1, 4), (2, 4), (3, 4), (4, 4)]
    told.clear()
    with summary.progress(lambda done, total: told.append((done, total))):
        summary.rows(store.open(b.run_dir))
    assert told == []  # every step from the cache: nothing computed, nothing to tell
    summary.rows(store.open(b.run_dir))  # outside the block nobody is told
    assert told == []


def test_summary_rows_come_in_one_order_whatever_order_they_were_stored_in(tmp_path, monkeypatch):
    """Rows that tie on step and kind (a step's waits, its phases) come in the same order from a
    cache filled in another order: what the report picks "first" among them does not change
    between reports."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    b = RunBuilder(tmp_path / "run")
    trainer, workers = b.process("trainer"), [b.process("rollout", rank=r) for r in range(3)]
    for step in range(3):
        o = 10.0 * step
        for r, worker in enumerate(workers):
            worker.span("rollout", o, o + 3 + r, step=step)
            worker.span("reward", o + 3 + r, o + 4 + r, step=step)
        trainer.span("wait", o, o + 6, step=step)
        trainer.span("train", o + 6, o + 8, step=step)
    b.write()
    con = store.open(b.run_dir)
    first = summary.rows(con)
    assert first.duplicated(["step", "kind"]).any()  # there are ties to order
    for seed in (1, 2, 3):
        con.execute(f"SELECT setseed(0.{seed})")
        con.execute(f"CREATE OR REPLACE TEMP TABLE {summary._CACHE} AS SELECT * FROM {summary._CACHE} ORDER BY random()")
        shuffled = summary.rows(con)
        assert shuffled.equals(first)
