"""Writes the schema-1 run beside this file (`run/`): a small run as rltrace 0.x wrote it before
span ids became integers (schema version 2). Kept with its output so that readers of newer
versions are tested on files written by the old code; it only works with that code (commit
4dfe362), so it is not run by the tests.

    python tests/store/schema1/make_run.py   # at commit 4dfe362

Two processes (a trainer and a rollout worker that continues the trainer's trace through a
carrier), three steps of nested phases, metrics and samples, one phase left open by a process
killed with SIGKILL, the trainer's parts merged by `rltrace compact`, the worker's as written, and stored summaries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = HERE / "run"

WORKER = r"""
import json, os, signal, sys, time
import rltrace
run_dir, role, carrier = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rltrace.init(run_dir, role=role, rank=0, flush_interval=0.05)
if role == "trainer":
    for step in range(3):
        with rltrace.phase("step", step=step, weight_version=step):
            with rltrace.phase("train", rl_bytes=None):
                for i in range(2):
                    with rltrace.phase("forward"):
                        time.sleep(0.002)
                    with rltrace.phase("backward"):
                        time.sleep(0.003)
            with rltrace.phase("weight_sync", bytes=1024 * (step + 1), method="nccl") as p:
                time.sleep(0.002)
                carriers = rltrace.inject()
            rltrace.log_metrics(step, loss=1.0 / (step + 1), reward_mean=0.1 * step)
            rltrace.log_samples(step, [{"sample_id": f"s{step}-{i}", "reward": 0.5, "weight_version": step,
                                        "train_version": step + 1, "response_len": 10 + i} for i in range(3)])
        rltrace.flush()
    print(json.dumps(carriers))
    rltrace.shutdown()
else:
    with rltrace.attach(carrier):
        with rltrace.phase("load", step=2):
            time.sleep(0.002)
    for step in range(3):
        with rltrace.phase("rollout", step=step):
            for i in range(3):
                with rltrace.phase("generate", sample_id=f"s{step}-{i}"):
                    time.sleep(0.001)
        with rltrace.phase("wait", waiting_for="train", step=step):
            time.sleep(0.004)
        rltrace.flush()
    hung = rltrace.start_phase("generate", step=3)
    rltrace.flush()
    time.sleep(0.3)  # the open record is written at the next export
    os.kill(os.getpid(), signal.SIGKILL)
"""


def main() -> None:
    shutil.rmtree(RUN, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    out = subprocess.run([sys.executable, "-c", WORKER, str(RUN), "trainer", "{}"], env=env, check=True,
                         capture_output=True, text=True).stdout
    carrier = out.strip().splitlines()[-1]
    from rltrace.cli.compact import write_summaries
    from rltrace import store

    store.compact(RUN, grace_s=0)  # the trainer's parts merged; the rollout worker's stay as written
    subprocess.run([sys.executable, "-c", WORKER, str(RUN), "rollout", carrier], env=env)  # ends in SIGKILL
    write_summaries(RUN)  # stored per-step summaries (span ids as text)
    (RUN / ".compact.lock").unlink()
    manifest = json.loads((RUN / "run.json").read_text())
    print("wrote", RUN, "run", manifest["run_id"], "schema", manifest["schema_version"])


if __name__ == "__main__":
    main()
