"""Demo runs shared by the tests of this folder: each configuration runs once per session.

A run is a subprocess from the repo root (`python -m examples.tiny_grpo`), as a user starts it,
with a fixed seed. Ray starts cost 10-30 s on a loaded 2-core machine, so the Ray runs are few
and every test that can reads the same one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ..conftest import PYTHON, REPO, built_once, python_env

FAST_WARMUP = ("--warmup-max-steps", "3")  # runs that test plumbing, not learning, skip most of the warm-up

#: name -> (demo flags, expected exit code)
RUNS = {
    "colocated": (("--steps", "24", "--seed", "0"), 0),  # reward 0.31 -> 0.71 (first and last 5 steps)
    "hang": (("--steps", "5", "--hang-after", "2", "--hang-timeout", "6", *FAST_WARMUP), 3),
    "slow_reward": (("--steps", "3", "--slow-reward", "0.05", *FAST_WARMUP), 0),
    "straggler": (("--steps", "3", "--straggler", *FAST_WARMUP), 0),
    "slow_sync": (("--steps", "3", "--slow-sync", "--slow-sync-bandwidth", "2e6", *FAST_WARMUP), 0),
    "bad_template": (("--steps", "2", "--seed", "1", "--bad-template", "--freeze-every", "1", *FAST_WARMUP), 0),
    "bf16": (("--steps", "2", "--seed", "1", "--rollout-precision", "bf16", "--freeze-every", "1", *FAST_WARMUP), 0),
    "ray_async": (("--placement", "disaggregated", "--mode", "async", "--steps", "8", "--max-staleness", "3",
                   *FAST_WARMUP), 0),
    "ray_sync_hang": (("--placement", "disaggregated", "--sync-method", "gloo", "--steps", "6", "--hang-after", "3",
                       "--hang-timeout", "8", *FAST_WARMUP), 3),
}


def run_demo(out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "examples.tiny_grpo", "--out", str(out), *args],
        cwd=REPO,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,  # callers assert the exit code (3 is expected for a hang)
    )


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """`demo(name)` -> (run dir, finished process) of the configuration `RUNS[name]`, run once a
    session for every worker (`built_once`)."""
    done: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}

    def build(name: str, folder: Path) -> None:
        args, code = RUNS[name]
        proc = run_demo(folder / "run", *args)
        assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
        (folder / "stdout.txt").write_text(proc.stdout)
        (folder / "stderr.txt").write_text(proc.stderr)

    def get(name: str) -> tuple[Path, subprocess.CompletedProcess]:
        if name not in done:
            folder = built_once(tmp_path_factory, f"demo-{name}", lambda f: build(name, f))
            args, code = RUNS[name]
            proc = subprocess.CompletedProcess(["examples.tiny_grpo", *args], code,
                                               (folder / "stdout.txt").read_text(), (folder / "stderr.txt").read_text())
            done[name] = folder / "run", proc
        return done[name]

    return get
