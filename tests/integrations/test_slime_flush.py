"""The slime hook records whether slime flushed the engines' prefix cache in a weight update, on
slime's own code: its rollout (tests/replay/slime_run.py) and its `UpdateWeightFromDistributed.
update_weights` calling its `SGLangEngine.flush_cache` against a loopback SGLang stand-in that
empties the stand-in engine's prefix cache (tests/replay/slime_update.py says what stands in).
The report then counts the hits after the update instead of calling them "may be stale"."""

from __future__ import annotations

import json

import pytest

import rltrace
from rltrace import store
from rltrace.cli.report import collect as report
from tests.replay import slime_run, slime_update

pytestmark = pytest.mark.skipif(not slime_run.available(), reason=slime_run.MISSING)


@pytest.fixture(scope="module")
def hooked():
    from rltrace.integrations import slime as hook

    assert hook.instrument()
    try:
        yield slime_update.Slime()
    finally:
        hook.uninstrument()


@pytest.fixture(scope="module")
def flushed_run(hooked, tmp_path_factory):
    """Three rollouts of slime's own rollout code, each followed by slime's weight update inside its
    `update_weights` timer (as `MegatronTrainRayActor.update_weights` runs it): the first from rank 0,
    which flushes; the second from rank 1, which does not (rank 0, in another process, flushed the
    engines: this process cannot know)."""
    from slime.observability.timer import timer

    tmp = tmp_path_factory.mktemp("slime_flush")
    server = slime_update.Server(on_flush=lambda: slime_run._SLIME.engine.seen.clear())
    updater = hooked.updater([hooked.engine(server)])
    flushes = []

    def train(rollout_id):
        hooked.rank = 0 if rollout_id == 0 else 1
        with timer("update_weights"):
            updater.update_weights()
            if hooked.rank != 0:
                slime_run._SLIME.engine.seen.clear()
        flushes.append(server.calls.count("/flush_cache"))

    rltrace.init(tmp / "run", role="rollout")
    try:
        slime_run.run(tmp / "dump", rollouts=3, partial=False, trainer=train)
    finally:
        rltrace.shutdown()
        server.close()
        hooked.rank = 0
    syncs = store.open(tmp / "run").execute(
        "SELECT attributes FROM spans WHERE phase = 'weight_sync' ORDER BY start_ns").fetchall()
    return server, flushes, [json.loads(a).get("rl.cache_flushed") for (a,) in syncs], report(str(tmp / "run"))


def test_slimes_flush_marks_its_weight_sync_and_the_hits_after_it_are_counted(flushed_run):
    server, flushes, flushed, r = flushed_run
    assert flushes == [1, 1, 1]  # slime flushed in the first update only: rank 0's
    assert server.calls[:3] == ["/pause_generation", "/flush_cache", "/continue_generation"]
    assert flushed == [True, None, None]  # rank 1 records nothing, not "false": the engines were flushed elsewhere
    c = r["serving"]["prefix_cache"]
    by_version = {u["weight_version"]: u for u in c["updates"]}
    assert by_version[2]["cache"] == "flushed" and by_version[2]["hits"] > 0  # counted: none stale
    assert (c["stale_hit_count"], c["stale_cached_tokens"]) == (0, 0)
    assert c["per_version"][1]["weight_version"] == 2 and c["per_version"][1]["may_be_stale_cached_tokens"] == 0


def test_a_process_that_did_not_flush_records_nothing_and_its_hits_may_be_stale(flushed_run):
    _, _, _, r = flushed_run
    c = r["serving"]["prefix_cache"]
    by_version = {u["weight_version"]: u for u in c["updates"]}
    assert by_version[3]["cache"] == "not recorded" and by_version[3]["hits"] > 0
    assert c["may_be_stale_hit_count"] == by_version[3]["hits"]
    assert c["may_be_stale_cached_tokens"] == by_version[3]["cached_tokens"]
    assert any("may be stale" in f for f in r["findings"])


def test_an_update_that_fails_records_no_flush_and_slimes_error_reaches_slime(hooked, tmp_path):
    from slime.observability.timer import timer

    def send(pbar):
        raise RuntimeError("NCCL broadcast failed")

    server = slime_update.Server()
    updater = hooked.updater([hooked.engine(server)], send=send)
    rltrace.init(tmp_path / "run", role="trainer")
    try:
        with pytest.raises(RuntimeError, match="NCCL broadcast failed"), timer("update_weights"):
            updater.update_weights()
    finally:
        rltrace.shutdown()
        server.close()
    assert "/flush_cache" in server.calls
    assert "flush_cache" not in vars(updater.rollout_engines[0])  # the handle is slime's again
    (attrs,) = store.open(tmp_path / "run").execute("SELECT attributes FROM spans WHERE phase = 'weight_sync'").fetchone()
    assert "rl.cache_flushed" not in json.loads(attrs)


def test_uninstrument_gives_slime_its_updater_back(hooked):
    from rltrace.integrations import slime as hook

    cls = hooked.updater_module.UpdateWeightFromDistributed
    assert getattr(cls.update_weights, "__rltrace_original__", None) is not None
    hook.uninstrument()
    try:
        assert getattr(cls.update_weights, "__rltrace_original__", None) is None
    finally:
        hook.instrument()  # patches the imported module again at once
    assert getattr(cls.update_weights, "__rltrace_original__", None) is not None
