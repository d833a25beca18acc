"""No rule fires on a healthy demo run, watched while it runs (limits tighter than the defaults)."""

from __future__ import annotations

import subprocess
import time

import pytest

from rltrace.alerts import Settings, Threshold, Watcher
from rltrace.cli import main as cli

from ..conftest import PYTHON, REPO, python_env


@pytest.mark.slow
def test_no_alert_on_a_healthy_demo_run(tmp_path):
    out = tmp_path / "run"
    demo = subprocess.Popen([PYTHON, "-m", "examples.tiny_grpo", "--out", str(out), "--steps", "8",
                             "--warmup-max-steps", "3"], cwd=REPO, env=python_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    settings = Settings(stall_factor=5, stall_min_s=15, heartbeat_s=30, starved_s=10, hang_factor=10, hang_min_s=30,
                        thresholds=(Threshold.parse("tis_clipfrac>0.9"),))
    watcher = Watcher(out, settings)
    raised, checks = [], 0
    try:
        while demo.poll() is None:
            time.sleep(0.5)
            if (out / "run.json").exists():
                firing, _ = watcher.check()
                raised.extend(firing)
                checks += 1
        assert demo.returncode == 0, demo.stderr.read()[-3000:]
    finally:
        demo.kill()
        demo.wait()
    assert checks >= 3  # watched while it ran (a quiet machine finishes the demo in a few seconds)
    assert raised == []
    assert cli(["watch", str(out), "--once"]) == 0
