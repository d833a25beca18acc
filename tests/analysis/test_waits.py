"""Waits are attributed to the right phase and process; the critical path follows the chain."""

import pandas as pd
import pytest

from rltrace import analysis, store
from rltrace.testing import RunBuilder


@pytest.fixture(scope="module")
def disaggregated(tmp_path_factory):
    """Sync, disaggregated: rollout worker generates, a reward worker scores, trainer trains and syncs.

    step 1 (0..10): rollout [0,4] with generate [0,3.5] (thread 2); reward [4,5] on reward0;
    trainer: step container [0,10], train [5,8] (forward/backward), a declared wait [8,8.5]
    for weight_sync, weight_sync [8.5,9.5]; rollout0 receives weights in weight_sync [8.5,9.5]
    and waits inside it [8.5,9] (undeclared); nothing is recorded anywhere in [9.5,10], where the
    trainer is in its own step: that is the step's own work, not a wait.
    """
    b = RunBuilder(tmp_path_factory.mktemp("runs") / "run")
    tr, ro, rw = b.process("trainer"), b.process("rollout"), b.process("reward")
    st = tr.span("step", 0, 10, step=1)
    r = ro.span("rollout", 0, 4, step=1, parent=st)
    ro.span("generate", 0, 3.5, step=1, parent=r, thread=2)
    rw.span("reward", 4, 5, step=1, parent=st)
    t = tr.span("train", 5, 8, step=1, parent=st)
    tr.span("forward", 5, 6, step=1, parent=t)
    tr.span("backward", 6, 8, step=1, parent=t)
    tr.span("wait", 8, 8.5, step=1, parent=st, waiting_for="weight_sync")
    tr.span("weight_sync", 8.5, 9.5, step=1, parent=st, bytes=10)
    ws = ro.span("weight_sync", 8.5, 9.5, step=1, parent=st)
    ro.span("wait", 8.5, 9, step=1, parent=ws)
    tr.span("eval", 10, 10.0, step=1)  # a zero-length span at the end keeps the window [0, 10]
    b.write()
    return store.open(b.run_dir), {p.role: p.process_id for p in b.processes}


def _seconds(w, **match):
    sel = w
    for key, value in match.items():
        sel = sel[sel[key] == value]
    return sel["seconds"].sum()


def test_trainer_idle_time_is_attributed_to_rollout_and_reward(disaggregated):
    con, pid = disaggregated
    w = analysis.waits(con)
    trainer = w[(w["process_id"] == pid["trainer"]) & (w["kind"] == "idle")]
    assert _seconds(trainer, waited_for="generate") == pytest.approx(3.5, abs=1e-9)
    assert _seconds(trainer, waited_for="rollout") == pytest.approx(0.5, abs=1e-9)  # rollout with no generate
    assert _seconds(trainer, waited_for="reward") == pytest.approx(1.0, abs=1e-9)
    assert _seconds(trainer, waited_for="untraced") == 0  # [9.5, 10]: inside its own step, nothing ran anywhere
    rollout_untraced = w[(w["process_id"] == pid["rollout"]) & (w["waited_for"] == "untraced")]
    # rollout0 has no step span: idle while the trainer sits in its declared wait [8, 8.5] and in [9.5, 10]
    assert rollout_untraced["seconds"].sum() == pytest.approx(1.0, abs=1e-9)
    gen = trainer[trainer["waited_for"] == "generate"].iloc[0]
    assert gen["waited_for_process"] == pid["rollout"] and gen["waited_for_group"] == "rollout"
    reward = trainer[trainer["waited_for"] == "reward"].iloc[0]
    assert reward["waited_for_process"] == pid["reward"]


def test_declared_and_measured_wait_spans(disaggregated):
    con, pid = disaggregated
    w = analysis.waits(con)
    declared = w[w["kind"] == "declared"]
    assert declared[["process_id", "in_phase", "waited_for"]].values.tolist() == [[pid["trainer"], "step", "weight_sync"]]
    assert declared["seconds"].iloc[0] == pytest.approx(0.5, abs=1e-9)
    # rollout0's wait inside its own weight_sync: its thread waits there (the enclosing span is not
    # work meanwhile), for the trainer's weight_sync
    inside = w[w["kind"] == "wait_span"]
    assert inside[["process_id", "in_phase", "waited_for", "waited_for_process"]].values.tolist() == [
        [pid["rollout"], "weight_sync", "weight_sync", pid["trainer"]]
    ]
    assert inside["seconds"].iloc[0] == pytest.approx(0.5, abs=1e-9)
    rollout_idle = w[(w["process_id"] == pid["rollout"]) & (w["kind"] == "idle")]
    assert _seconds(rollout_idle, waited_for_group="train") == pytest.approx(3.0, abs=1e-9)
    assert _seconds(rollout_idle, waited_for="reward") == pytest.approx(1.0, abs=1e-9)
    assert _seconds(rollout_idle, waited_for="weight_sync") == 0  # it was in weight_sync itself


def test_top_waits_name_the_stage_and_process_in_words(disaggregated):
    con, _ = disaggregated
    top = analysis.top_waits(con, n=2)
    assert set(top["step"]) == {1} and len(top) == 2
    trainer = top[top["role"] == "trainer"].iloc[0]
    assert trainer["waited_for"] == "rollout" and trainer["seconds"] == pytest.approx(4.0, abs=1e-9)
    assert trainer["text"] == "trainer0 idle 4.00 s (40% of step 1) waiting for rollout on rollout0"


def test_critical_path_crosses_processes(disaggregated):
    con, pid = disaggregated
    cp = analysis.critical_path(con)
    assert cp["phase"].tolist() == ["rollout", "reward", "train", "weight_sync", "eval"]
    assert cp["process_id"].tolist()[:3] == [pid["rollout"], pid["reward"], pid["trainer"]]
    assert cp.loc[0, "ended_by"] == "generate"
    assert cp.loc[4, "gap_before_s"] == pytest.approx(0.5, abs=1e-9)
    assert analysis.common_paths(con)["path"].iloc[0] == "rollout → reward → train → weight_sync → eval"


def test_critical_path_picks_the_straggling_worker(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr, w0, w1 = b.process("trainer"), b.process("rollout", 0), b.process("rollout", 1)
    w0.span("generate", 0, 2, step=3)
    w1.span("generate", 0, 5, step=3)  # the straggler: train waits for it
    tr.span("train", 5.0005, 7, step=3)  # starts 0.5 ms after: within the clock tolerance
    b.write()
    cp = analysis.critical_path(store.open(b.run_dir))
    assert cp["process_id"].tolist() == [w1.process_id, tr.process_id]


def test_user_container_phase_counts_as_idle(tmp_path):
    """An `iteration` span around rollout and train is a container, not work: its process waits
    in it while another process works."""
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    it = tr.span("iteration", 0, 6, step=1)
    ro.span("rollout", 0, 4, step=1, parent=it)
    tr.span("train", 4, 6, step=1, parent=it)
    b.write()
    w = analysis.waits(store.open(b.run_dir))
    trainer = w[w["process_id"] == tr.process_id]
    assert trainer[["waited_for", "seconds"]].values.tolist() == [["rollout", 4.0]]


def test_a_containers_own_time_is_its_work_when_nothing_else_runs(tmp_path):
    """A Hugging Face Trainer's `step` holds forward and backward that no span names: alone in the
    run, that time is the step's own work, never idle or a wait for untraced work; a process
    outside any container is still idle while nothing runs, and a step with nothing but a
    container and a wait in it gives no wait at all."""
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    st = tr.span("step", 0, 10, step=0)
    tr.span("optimizer", 8, 9, step=0, parent=st)  # [0, 8] and [9, 10]: untraced work inside step
    ro.span("generate", 2, 3, step=0)  # rollout0: idle in [0, 2] and [3, 10] of step 0's window
    st = tr.span("step", 10, 12, step=1)  # a step cut short: a container and a wait, no work
    tr.span("wait", 10, 11, step=1, parent=st)
    b.write()
    w = analysis.waits(store.open(b.run_dir))
    trainer = w[w["process_id"] == tr.process_id]
    assert trainer[["step", "kind", "waited_for", "seconds"]].values.tolist() == [[0, "idle", "generate", 1.0]]
    rollout = w[w["process_id"] == ro.process_id]
    assert rollout[["step", "waited_for"]].values.tolist() == [[0, "untraced"], [0, "optimizer"]]
    assert _seconds(rollout, waited_for="untraced") == pytest.approx(8.0, abs=1e-9)
    assert 1 not in set(w["step"])


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    """Colocated, as the demo runs it: generation on a second thread of the trainer process.

    step 0 (0..6): the main thread is in rollout [0,3] and inside it in a declared wait [0.5,3]
    (waiting_for=generate); the engine thread generates [0.5,2.5] (a child of rollout) and then
    nothing runs until 3; reward [3,3.5], train [3.5,5.5], weight_sync [5.5,6].
    step 1 (6..9): the same wait [6.5,8] without waiting_for, generate [6.5,8] on the engine
    thread, then train [8,9].
    """
    b = RunBuilder(tmp_path_factory.mktemp("runs") / "run")
    tr = b.process("trainer")
    st = tr.span("step", 0, 6, step=0)
    r = tr.span("rollout", 0, 3, step=0, parent=st)
    tr.span("wait", 0.5, 3, step=0, parent=r, waiting_for="generate")
    tr.span("generate", 0.5, 2.5, step=0, parent=r, thread=2)
    tr.span("reward", 3, 3.5, step=0, parent=st)
    tr.span("train", 3.5, 5.5, step=0, parent=st)
    tr.span("weight_sync", 5.5, 6, step=0, parent=st)
    st = tr.span("step", 6, 9, step=1)
    r = tr.span("rollout", 6, 8, step=1, parent=st)
    tr.span("wait", 6.5, 8, step=1, parent=r)
    tr.span("generate", 6.5, 8, step=1, parent=r, thread=2)
    tr.span("train", 8, 9, step=1, parent=st)
    b.write()
    return store.open(b.run_dir), tr.process_id


def test_a_wait_inside_a_busy_span_counts_for_work_on_another_thread(colocated):
    con, trainer = colocated
    w = analysis.waits(con)
    declared = w[w["kind"] == "declared"]
    assert declared[["step", "process_id", "in_phase", "waited_for", "waited_for_process"]].values.tolist() == [
        [0, trainer, "rollout", "generate", trainer]
    ]
    assert declared["seconds"].iloc[0] == pytest.approx(2.5, abs=1e-9)
    measured = w[(w["kind"] == "wait_span") & (w["step"] == 1)]
    # the waiting thread's own rollout span is not the work it waits for; the engine thread's generate is
    assert measured[["in_phase", "waited_for", "waited_for_process"]].values.tolist() == [
        ["rollout", "generate", trainer]
    ]
    assert measured["seconds"].iloc[0] == pytest.approx(1.5, abs=1e-9)
    assert w[w["kind"] == "idle"].empty  # the main thread is always inside some span


def test_top_waits_say_the_work_ran_on_another_thread(colocated):
    con, _ = colocated
    top = analysis.top_waits(con, n=1)
    assert top["text"].tolist() == [
        "trainer0 in a wait inside rollout 2.50 s (42% of step 0) waiting for rollout on another thread",
        "trainer0 in a wait inside rollout 1.50 s (50% of step 1) waiting for rollout on another thread",
    ]


def test_waits_go_to_the_innermost_work(tmp_path):
    """Waiting is attributed to the deepest work running elsewhere: generate and its prefill on the
    worker, not the rollout that encloses them (also while the trainer is still in rollout itself)."""
    b = RunBuilder(tmp_path / "run")
    tr, ro, rw = b.process("trainer"), b.process("rollout"), b.process("reward")
    r = tr.span("rollout", 0, 4, step=0)
    tr.span("wait", 0.5, 4, step=0, parent=r)
    g = ro.span("generate", 0, 4, step=0, parent=r)
    ro.span("prefill", 0, 1, step=0, parent=g)
    rw.span("reward", 4, 5, step=0)  # idle over [0, 4]
    b.write()
    w = analysis.waits(store.open(b.run_dir))
    w = w[w["waited_for"] != "reward"]  # the trainer is idle in [4, 5]
    assert sorted(w.loc[w["process_id"] == tr.process_id, ["waited_for", "seconds"]].values.tolist()) == [
        ["generate", 3.0], ["prefill", 0.5]
    ]
    assert sorted(w.loc[w["process_id"] == rw.process_id, ["waited_for", "seconds"]].values.tolist()) == [
        ["generate", 3.0], ["prefill", 1.0]
    ]


def _three_chains(path):
    b = RunBuilder(path)
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(9):
        t = step * 10.0
        ro.span("rollout", t, t + 2 + step * 0.1, step=step)
        end = t + 2 + step * 0.1
        if step % 3 == 1:  # a reward between rollout and train
            ro.span("reward", end, end + 1, step=step)
            end += 1
        tr.span("train", end, end + 3, step=step)
        if step % 3 == 2:  # and a weight sync after train
            tr.span("weight_sync", end + 3, end + 3.5, step=step)
    b.write()
    return store.open(b.run_dir)


def test_common_paths_count_each_chain_over_many_steps(tmp_path):
    """Steps with three different critical paths: each chain's steps, share and median seconds."""
    out = analysis.common_paths(_three_chains(tmp_path / "run"))
    assert out["path"].tolist() == ["rollout → reward → train", "rollout → train", "rollout → train → weight_sync"]
    assert out["steps"].tolist() == [3, 3, 3] and out["share"].tolist() == pytest.approx([1 / 3] * 3)
    # median over the steps of the chain's summed seconds: steps 1, 4, 7 / 0, 3, 6 / 2, 5, 8
    assert out["seconds"].tolist() == pytest.approx([2 + 0.4 + 1 + 3, 2 + 0.3 + 3, 2 + 0.5 + 3 + 0.5])


def _top_waits_by_every_labelled_row(con, n):
    """top_waits as first written: every wait row labelled, then grouped with role and rank."""
    from rltrace.analysis import _who, summary
    from rltrace.analysis._format import process_name, seconds_text, share_text

    w = analysis.waits(con)
    keys = ["step", "process_id", "role", "rank", "in_phase", "waited_for_group"]
    g = w.groupby(keys, dropna=False).agg(seconds=("seconds", "sum"), waited_for_process=("waited_for_process", "first"))
    g = g.reset_index().rename(columns={"waited_for_group": "waited_for"})
    walls = summary.checks(con).set_index("step")
    g["share"] = g["seconds"] / g["step"].map((walls["end_ns"] - walls["start_ns"]) / 1e9)
    g = g.sort_values(["step", "seconds"], ascending=[True, False]).groupby("step").head(n)
    names = _who.processes(con, g["waited_for_process"].dropna().unique())
    short = {p: process_name(r, k) for p, r, k in zip(names["process_id"], names["role"], names["rank"])}
    g["waited_for_name"] = g["waited_for_process"].map(short)
    texts = []
    for step, pid, role, rank, in_phase, what, other_pid, other, seconds, share in zip(
        g["step"], g["process_id"], g["role"], g["rank"], g["in_phase"], g["waited_for"], g["waited_for_process"],
        g["waited_for_name"], g["seconds"], g["share"]
    ):
        where = "idle" if in_phase == "idle" else f"in a wait inside {in_phase}"
        text = f"{process_name(role, rank)} {where} {seconds_text(seconds)} ({share_text(share)} of step {step})"
        if what == "untraced":
            texts.append(text + " while no recorded phase ran anywhere")
        elif other_pid == pid:
            texts.append(text + f" waiting for {what} on another thread")
        else:
            texts.append(text + f" waiting for {what}" + (f" on {other}" if isinstance(other, str) else ""))
    g["text"] = texts
    cols = ["step", "process_id", "role", "rank", "in_phase", "waited_for", "waited_for_process", "waited_for_name",
            "seconds", "share", "text"]
    return g[cols].reset_index(drop=True)


@pytest.mark.parametrize("n", [1, 3])
def test_top_waits_equal_labelling_every_wait_row(disaggregated, colocated, tmp_path, n):
    """top_waits labels only the rows it keeps; the result is the same as labelling every wait first."""
    for con in (disaggregated[0], colocated[0], _three_chains(tmp_path / f"run{n}")):
        got, want = analysis.top_waits(con, n=n), _top_waits_by_every_labelled_row(con, n)
        assert len(got) and list(got.columns) == list(want.columns)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
