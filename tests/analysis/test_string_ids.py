"""Ids of any type: verl's UUID strings, integers, or both from different processes of one run,
read as one `samples` table; no row is dropped for the type of its id, and the sample analyses
(stragglers, staleness) work on them."""

from __future__ import annotations

import uuid

import pyarrow as pa

import rltrace
from rltrace import _names, analysis, store
from rltrace.store.parts import write_part


def test_uuid_and_integer_ids_from_two_processes_read_as_one_table(run_dir):
    uids = [str(uuid.UUID(int=i)) for i in range(8)]
    rltrace.init(run_dir, role="rollout")
    rows = [
        {"sample_id": uid, "group_id": uids[i // 4], "uid": uid, "response_len": 100, "gen_start": 1e9, "gen_end": 1e9 + 1 + i,
         "weight_version": 2, "train_version": 3}
        for i, uid in enumerate(uids)
    ]
    rows[-1].update(response_len=900, gen_end=1e9 + 40)  # the straggler
    rltrace.log_samples(1, rows)
    rltrace.shutdown()
    # a second process of the same run (an older rltrace) wrote integer ids as int64
    old = pa.table(
        {"step": [1, 1], "logged_ns": [0, 0], "sample_id": pa.array([100, 101], pa.int64()),
         "group_id": pa.array([7, 7], pa.int64()), "weight_version": [3, 3], "train_version": [3, 3]}
    )
    write_part(run_dir / "samples", "old-writer-00000000.parquet", old, _names.SAMPLES)

    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM samples").fetchall() == [(10,)]
    ids = {r[0] for r in con.execute("SELECT sample_id FROM samples").fetchall()}
    assert ids == set(uids) | {"100", "101"}
    stragglers = analysis.stragglers(con)
    assert stragglers["sample_id"].tolist() == [uids[-1]]
    stale = analysis.staleness(con).set_index("step")
    assert stale.loc[1, "samples"] == 10 and stale.loc[1, "max"] == 1


def test_ids_of_mixed_types_in_one_call_keep_every_row(run_dir):
    rltrace.init(run_dir)
    rltrace.log_samples(1, [{"sample_id": 1, "group_id": "g-a"}, {"sample_id": "b", "group_id": 2}, {"sample_id": 3.0}])
    rltrace.log_samples(2, {"sample_id": ["x", 5], "request_id": [1, "r"]})
    rltrace.shutdown()
    con = store.open(run_dir)
    rows = con.execute("SELECT step, sample_id, group_id, request_id FROM samples ORDER BY step, sample_id").fetchall()
    assert rows == [(1, "1", "g-a", None), (1, "3", None, None), (1, "b", "2", None), (2, "5", None, "r"), (2, "x", None, "1")]


def test_a_frozen_batch_keeps_string_ids(run_dir):
    from rltrace import replay

    rltrace.init(run_dir)
    uid = str(uuid.uuid4())
    assert replay.freeze(1, [{"sample_id": uid, "group_id": uid, "reward": 1.0}, {"sample_id": uid, "reward": 0.0}])
    replay.flush()
    assert store.open(run_dir).execute("SELECT DISTINCT sample_id FROM batches").fetchall() == [(uid,)]
