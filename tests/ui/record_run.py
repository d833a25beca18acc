"""A short RL-shaped run recorded with the real rltrace API, for the dashboard's tests.

    python tests/ui/record_run.py RUN_DIR --layout colocated|async [--steps 6] [--hang]

`colocated`: one process does rollout (generate per sample), reward, train (forward, backward,
optimizer) and weight_sync (CUDA-IPC-like, growing payloads) inside a `step` span, in turn; the
middle step's reward is slow and gets a real py-spy recording (rltrace.profiling); every third
batch is frozen (rltrace.replay, two samples with bad text) and step 1 is replayed twice.
`async`: a rollout process generates step s+1 while the trainer trains on step s; the trainer
waits (`wait` spans, `waiting_for="rollout"`) when no batch is ready; with `--hang` the rollout
process is killed inside a `generate` span, leaving it open (a hang).

Both log the brief's step scalars and per-sample rows (with a per-sample mismatch column).
Phases sleep for their work (a few ms), so a run takes about a second plus start-up.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import random
import time
from pathlib import Path

import numpy as np

import rltrace
import rltrace.replay
from rltrace.replay.rerun import run_entry

GROUP, SAMPLES = 4, 8  # samples per group, samples per step
MS = 1e-3
SLOW_REWARD_S = 0.7  # colocated: one reward this slow gets a py-spy recording
PROFILE = {"after": {"reward": 0.25}, "min_seconds": 0.25}  # profile a reward phase past 0.25 s
FREEZE_EVERY = 3  # colocated: freeze the batch of steps 1, 4, ... (debug replay)
ALPHABET = " abcdefghijklmnopqrstuvwxyz"


def _rollout(step: int, version: int, rng: random.Random, *, straggler: bool) -> list[dict]:
    """Generate SAMPLES answers (one `generate` span each); returns the per-sample rows."""
    rows = []
    with rltrace.phase("rollout", step=step, weight_version=version, samples=SAMPLES):
        for i in range(SAMPLES):
            length = rng.randint(8, 24) * (4 if straggler and i == SAMPLES - 1 else 1)
            start = time.time()
            with rltrace.phase("generate", sample=i, tokens=length):
                time.sleep(length * 0.25 * MS)
            rows.append(
                {
                    "sample_id": step * SAMPLES + i,
                    "group_id": step * (SAMPLES // GROUP) + i // GROUP,
                    "prompt_len": 12,
                    "response_len": length,
                    "finish_reason": "length" if length > 60 else "stop",
                    "weight_version": version,
                    "gen_start": start,
                    "gen_end": time.time(),
                    "train_rollout_logprob_abs_diff": abs(rng.gauss(0.002, 0.001)) * (1 + length / 24),
                }
            )
    return rows


def slow_verifier(seconds: float) -> None:
    """A reward model stuck on one sample: busy (py-spy sees it on the CPU), not sleeping."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


def _score(step: int, rows: list[dict], rng: random.Random, *, slow: bool = False) -> None:
    with rltrace.phase("reward", step=step):
        time.sleep(3 * MS)
        if slow:
            slow_verifier(SLOW_REWARD_S)
        for r in rows:
            r["reward"] = float(rng.random() < 0.3 + 0.05 * step)


def _train(step: int, version: int, rows: list[dict], rng: random.Random) -> int:
    """One update; logs the step scalars; returns the new weight version."""
    for r in rows:
        r["train_version"] = version
    with rltrace.phase("train", step=step, weight_version=version) as train:
        for _ in range(2):
            with rltrace.phase("forward"):
                time.sleep(4 * MS)
            with rltrace.phase("backward"):
                time.sleep(6 * MS)
        with rltrace.phase("optimizer"):
            time.sleep(2 * MS)
        train.set(grad_norm=round(1.0 / (1 + step), 4))
    rewards = [r["reward"] for r in rows]
    mean = sum(rewards) / len(rewards)
    ages = [version - r["weight_version"] for r in rows]
    rltrace.log_metrics(
        step,
        reward_mean=mean,
        reward_std=math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)),
        response_len_mean=sum(r["response_len"] for r in rows) / len(rows),
        train_rollout_logprob_abs_diff=sum(r["train_rollout_logprob_abs_diff"] for r in rows) / len(rows),
        mismatch_k3=abs(rng.gauss(1e-5, 5e-6)),
        tis_mean=1.0 + rng.gauss(0, 0.01),
        tis_clipfrac=max(0.0, rng.gauss(0.02, 0.01)),
        staleness_mean=sum(ages) / len(ages),
        staleness_max=max(ages),
        loss=1.0 / (1 + step),
        grad_norm=1.0 / (1 + step),
    )
    rltrace.log_samples(step, rows)
    return version + 1


def _sync(step: int, version: int, *, method: str) -> None:
    nbytes = (1 + step % 3) * 50_000_000
    with rltrace.phase("weight_sync", step=step, weight_version=version, bytes=nbytes, method=method):
        time.sleep(2 * MS + nbytes / 25e9)


def _text(tokens: np.ndarray) -> str:
    return "".join(ALPHABET[t % len(ALPHABET)] for t in tokens)


def _freeze(step: int, version: int, rows: list[dict], rng: random.Random) -> None:
    """Freeze the step's batch (debug replay): tokens, both engines' log-probs, text with two bad samples."""
    samples = []
    for i, r in enumerate(rows):
        response = np.array([rng.randrange(1, 27) for _ in range(r["response_len"])], np.int64)
        text = _text(response)
        if i == 1:  # a loop at the end of the answer
            text = text[:4] + "abc" * 8
        if i == 2:  # the chat template leaks into the answer
            text = text[:3] + "<|im_end|>" + text[3:]
        rollout = np.array([-abs(rng.gauss(1.0, 0.5)) for _ in response], np.float32)
        train = rollout + np.array([rng.gauss(0, 2e-3) for _ in response], np.float32)
        samples.append({
            "sample_id": r["sample_id"], "group_id": r["group_id"], "reward": r["reward"], "weight_version": version,
            "finish_reason": r["finish_reason"], "prompt_tokens": np.arange(1, 13, dtype=np.int64),
            "response_tokens": response, "loss_mask": np.ones(len(response), np.int8), "rollout_log_probs": rollout,
            "train_log_probs": train, "prompt_text": "reverse the digits 12345", "response_text": text,
        })
    rltrace.replay.freeze(step, samples, batch_meta={"weight_version": version, "max_response_len": 60},
                          trigger="every_n", reason=f"every {FREEZE_EVERY} steps")


def recompute(batch) -> dict:
    """Replay entry: the training forward again (here: the stored train log-probs, bit for bit)."""
    return {"log_probs": [np.asarray(lp, np.float32) for lp in batch["train_log_probs"]]}


def colocated(run_dir: str, steps: int) -> None:
    rltrace.init(run_dir, role="actor", rank=0, run_name="colocated-sync", profile=PROFILE,
                 config={"layout": "colocated", "steps": steps})
    rng, version = random.Random(0), 0
    for step in range(steps):
        with rltrace.phase("step", step=step, weight_version=version):
            rows = _rollout(step, version, rng, straggler=step == steps - 2)
            _score(step, rows, rng, slow=step == steps // 2)
            if step % FREEZE_EVERY == 1:
                _freeze(step, version, rows, rng)
            version = _train(step, version, rows, rng)
            _sync(step, version, method="ipc")
    rltrace.replay.flush()
    rltrace.shutdown()
    run_entry(run_dir, 1, f"{Path(__file__).resolve()}:recompute", repeat=2, label="train forward again")


def _rollout_worker(run_dir: str, steps: int, batches, versions, hang: bool) -> None:
    rltrace.init(run_dir, role="rollout", rank=0)
    batches.put(None)  # started: the trainer's first wait is for rollout, not for process start-up
    rng, version = random.Random(1), 0
    for step in range(steps):
        while not versions.empty():
            version = versions.get()
        rows = _rollout(step, version, rng, straggler=step == 2)
        batches.put((step, rows))
    if hang:
        with rltrace.phase("generate", step=steps, weight_version=version):
            rltrace.flush()  # the open-span record reaches the store, then the process dies
            os._exit(0)
    rltrace.shutdown()


def disaggregated_async(run_dir: str, steps: int, hang: bool) -> None:
    rltrace.init(run_dir, role="trainer", rank=0, run_name="disaggregated-async",
                 config={"layout": "disaggregated", "mode": "async", "steps": steps})
    ctx = mp.get_context("spawn")
    batches, versions = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=_rollout_worker, args=(run_dir, steps, batches, versions, hang))
    worker.start()
    if batches.get(timeout=120) is not None:
        raise RuntimeError("the rollout worker sent a batch before its start-up signal")
    rng, version = random.Random(2), 0
    for _ in range(steps):
        with rltrace.phase("wait", waiting_for="rollout") as wait:
            step, rows = batches.get(timeout=120)
            wait.set(step=step)
        _score(step, rows, rng)
        version = _train(step, version, rows, rng)
        _sync(step, version, method="disk")
        versions.put(version)
    worker.join(timeout=120)
    rltrace.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--layout", choices=("colocated", "async"), default="colocated")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--hang", action="store_true", help="async: leave a generate span open (killed rollout process)")
    args = p.parse_args()
    if args.layout == "colocated":
        colocated(args.run_dir, args.steps)
    else:
        disaggregated_async(args.run_dir, args.steps, args.hang)


if __name__ == "__main__":
    main()
