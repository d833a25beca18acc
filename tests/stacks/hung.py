"""A program that hangs the way RL jobs hang; `python hung.py MODE RANK` under RLTRACE_RUN_DIR.

collective: world 2 on gloo (MASTER_ADDR/PORT from the environment); at step 3 rank 1 skips the
  weight-sync all_reduce and waits for a batch that never comes; rank 0 blocks in all_reduce.
http URL: the rollout posts to an engine that accepted the connection and never answers.
queue: the rollout waits on a queue that nothing will ever fill.
ray: the rollout waits in ray.get on an actor call that never returns.
Prints `HUNG` when it is where it stays.
"""

import os
import queue
import sys
import time
import urllib.request

import rltrace


def hold_connections():
    """A child that keeps this process's sockets open after it is killed, as a host that vanished
    leaves its peers' connections open: gloo then blocks instead of failing at once."""
    import subprocess

    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                fds.append(int(fd))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=fds)
    print("HOLDER", child.pid, flush=True)


def wait_for_batch(step):
    if os.environ.get("HUNG_HOLD"):
        hold_connections()
    print("HUNG", flush=True)
    while True:  # the batch never comes
        time.sleep(0.05)


def collective(rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    rltrace.init(role="trainer", rank=rank)
    t = torch.ones(4)
    for step in range(6):
        with rltrace.phase("step", step=step):
            with rltrace.phase("train"):
                if step == 4:
                    wait_for_batch(step)
            if step == 3 and rank == 1:
                continue  # the conditional collective: rank 1 skips the weight sync
            with rltrace.phase("weight_sync"):
                if step == 3:
                    print("HUNG", flush=True)
                dist.all_reduce(t)


def generate(url):
    return urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=600).read()


def http(url):
    rltrace.init(role="trainer", rank=0)
    with rltrace.phase("step", step=0):
        with rltrace.phase("rollout"):
            print("HUNG", flush=True)
            generate(url)


def consume():
    rltrace.init(role="trainer", rank=0)
    batches = queue.Queue()
    with rltrace.phase("step", step=0):
        with rltrace.phase("rollout"):
            print("HUNG", flush=True)
            batches.get()


def ray_actor():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class Engine:
        def generate(self):
            time.sleep(600)  # never returns

    engine = Engine.remote()
    rltrace.init(role="trainer", rank=0)
    with rltrace.phase("step", step=0):
        with rltrace.phase("rollout"):
            print("HUNG", flush=True)
            ray.get(engine.generate.remote())


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "collective":
        collective(int(sys.argv[2]))
    elif mode == "http":
        http(sys.argv[2])
    elif mode == "queue":
        consume()
    elif mode == "ray":
        ray_actor()
    os._exit(0)
