"""A small instrumented loop the profiling tests run as a real process.

    python program.py RUN_DIR slow    # reward phases; step 6 runs slow_verifier for 1.5 s
    python program.py RUN_DIR hang    # a rollout-worker thread blocks in its generate phase
    python program.py RUN_DIR torch   # train phases doing tensor work (for torch.profiler windows)
    python program.py RUN_DIR brief   # a reward phase that ends the moment its py-spy capture starts

Profiling is configured by the environment (RLTRACE_PROFILE_SLOW, RLTRACE_HANG_TIMEOUT, ...).
"""

import subprocess
import sys
import threading
import time

import rltrace

SLOW_STEP = 6


def slow_verifier(seconds: float) -> int:
    """CPU-bound on purpose: the frame the py-spy profile must name."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        for i in range(1000):
            total += i * i
    return total


def wait_for_engine(engine_ready: threading.Event) -> None:
    """Blocks forever: the frame the hang dump must show."""
    engine_ready.wait()


def slow(steps: int = 9) -> None:
    for step in range(steps):
        with rltrace.phase("reward", step=step):
            slow_verifier(1.5 if step == SLOW_STEP else 0.03)


def hang() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\ndef stuck_child():\n    time.sleep(600)\nstuck_child()"]
    )

    def worker() -> None:
        with rltrace.phase("rollout", step=0), rltrace.phase("generate"):
            wait_for_engine(threading.Event())

    threading.Thread(target=worker, name="rollout-worker", daemon=True).start()
    try:
        time.sleep(600)  # the test kills this process once the dump is stored
    finally:
        child.kill()


def torch_loop(steps: int = 5) -> None:
    import torch

    x = torch.randn(128, 128)
    for step in range(steps):
        with rltrace.phase("train", step=step):
            for _ in range(20):
                x = torch.tanh(x @ x)


def brief() -> None:
    from rltrace.profiling import watchdog_of

    watchdog = watchdog_of(rltrace.current_run())
    with rltrace.phase("reward", step=0):
        deadline = time.monotonic() + 10
        while watchdog._recording is None and time.monotonic() < deadline:
            time.sleep(0.005)  # the phase ends as soon as py-spy is launched


if __name__ == "__main__":
    rltrace.init(sys.argv[1], role="trainer")
    {"slow": slow, "hang": hang, "torch": torch_loop, "brief": brief}[sys.argv[2]]()
    rltrace.shutdown()
    print("loop finished", flush=True)
