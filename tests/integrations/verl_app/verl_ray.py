"""A Ray worker running verl's `simple_timer` (as verl's agent loops do), started by a driver that
never imports rltrace: under `rltrace run --` the worker process records the block too."""

import json
import os

import ray


@ray.remote
def agent_loop(step: int) -> dict:
    import time

    from verl.utils.profiler import simple_timer

    metrics: dict = {}
    with simple_timer("generate_sequences", metrics):
        time.sleep(0.02)
    import verl.utils.profiler.performance as perf

    traced = hasattr(perf._timer, "__wrapped__")  # the rltrace hook wraps verl's generator
    try:
        import rltrace

        rltrace.flush()  # Ray ends its workers without running atexit: write what was recorded
    except ImportError:
        pass
    return {"pid": os.getpid(), "traced": traced, **metrics}


if __name__ == "__main__":
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        print(json.dumps(ray.get(agent_loop.remote(0))))
    finally:
        ray.shutdown()
