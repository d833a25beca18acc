"""`rltrace import slime` into the same run again, or after a failure: every sample is stored once.

Dumps in slime's own format (tests/replay/slime_dumps.py; slime's rollout code itself in
test_slime_exact.py)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import rltrace
import rltrace.replay as replay
from rltrace.cli.info import collect
from rltrace.replay.slime import import_slime
from tests.replay.slime_dumps import rollout_dump, train_dump


def _counts(run) -> tuple[int, int, int]:
    con = rltrace.store.open(run)
    return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("batches", "samples", "spans"))


@pytest.fixture
def dumps(tmp_path):
    root = tmp_path / "dump"
    first = rollout_dump(root / "rollout_data" / "0.pt", 0, n=3)
    rollout_dump(root / "rollout_data" / "1.pt", 1, n=2)
    train_dump(root / "train_data" / "0.pt", 0, first)
    return root


def test_a_failed_import_leaves_nothing_and_the_retry_stores_each_sample_once(tmp_path, dumps, monkeypatch):
    """The disk fills while the second step is written: nothing of the import is visible (not the
    first step either), and the retry stores the 5 samples once (not 7 rows for 5 samples)."""
    real, calls = pq.ParquetWriter.write_table, []

    def full_disk(writer, table, *args, **kwargs):  # every part file is written through a ParquetWriter
        calls.append(writer.where)
        if len(calls) == 5:  # the first step's batch, spans and samples are written by now
            raise OSError(28, "No space left on device")
        return real(writer, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    with pytest.raises(OSError, match="No space left"):
        import_slime([dumps], tmp_path / "run")
    monkeypatch.setattr(pq.ParquetWriter, "write_table", real)
    assert _counts(tmp_path / "run") == (0, 0, 0)
    result = import_slime([dumps], tmp_path / "run")
    assert [(b["step"], b["samples"]) for b in result["batches"]] == [(0, 3), (1, 2)]
    assert _counts(tmp_path / "run") == (5, 5, 10)
    assert replay.load(tmp_path / "run", 0)["train_log_probs"] is not None
    assert len(collect(str(tmp_path / "run"))["processes"]) == 1


def test_importing_the_same_dumps_again_adds_nothing(tmp_path, dumps):
    import_slime([dumps], tmp_path / "run")
    before = _counts(tmp_path / "run")
    again = import_slime([dumps], tmp_path / "run")
    assert again["batches"] == [] and len(again["already"]) == 3 and _counts(tmp_path / "run") == before
    assert all("already imported into this run" in line for line in again["already"])
    (dumps / "rollout_data" / "2.pt").parent.mkdir(exist_ok=True)
    rollout_dump(dumps / "rollout_data" / "2.pt", 2, n=2)  # a new dump beside them: only it is imported
    more = import_slime([dumps], tmp_path / "run")
    assert [b["step"] for b in more["batches"]] == [2] and _counts(tmp_path / "run") == (before[0] + 2, before[1] + 2, before[2] + 4)


def test_an_import_that_keeps_nothing_of_its_files_exits_non_zero(tmp_path, capsys):
    """Every sample of the dump lacks `tokens`: each is left out with its reason, and the command
    says nothing was imported and fails (a script must not take it for a success)."""
    import torch

    from rltrace.cli import main
    from tests.replay.slime_dumps import sample_dict

    path = tmp_path / "dump" / "rollout_data" / "0.pt"
    path.parent.mkdir(parents=True)
    samples = [{k: v for k, v in sample_dict(i, start=1_790_000_000.0 + i).items() if k != "tokens"} for i in range(3)]
    torch.save({"rollout_id": 0, "samples": samples}, path)
    assert main(["import", "slime", str(path), "--out", str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert "nothing imported" in out and "tokens" in out
