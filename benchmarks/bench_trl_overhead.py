"""What `rltrace.integrations.trl.instrument` costs a TRL GRPOTrainer step: instrumented vs plain.

    python benchmarks/bench_trl_overhead.py [--rounds 6] [--steps 5] [--hidden 256 --layers 4 --completion 32]

Two GRPOTrainers built identically (examples/trl_grpo.py: tiny Llama, CPU), one instrumented
(tracing, samples, rollout log-probs, mismatch metrics; no frozen batches), one plain. They
train in alternating rounds of `--steps` optimizer steps in this one process (plain, traced,
traced, plain, ...), each round from the same seed, so both do the same work and drift of the
machine hits both alike. Per step (on_step_begin -> on_step_end, which holds TRL's generation,
scoring, loss, backward and optimizer step) the CPU time of the whole process is measured (every
thread, so rltrace's background writers count) and the wall time. torch runs on one thread so
CPU time is not inflated by spinning workers. Reported: median and mean per variant and the
ratios (goal: CPU < 1.02), and whether both variants computed bit-identical losses (the hooks
must never change training).

In isolation: the rltrace work of one such step without TRL around it (the same spans, rollout
log-prob recorder calls, mismatch sums, sample rows, TRL's ~30 logged numbers and the sample
rows written), timed in CPU time including the background writes (a flush ends the timing), as a
fraction of the plain step's median CPU time. The machine's load blurs this one much less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per variant")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per round")
    parser.add_argument("--hidden", type=int, default=None, help="model width (default: the example's, 64)")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--completion", type=int, default=None, help="max_completion_length (default: the example's, 8)")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import TrainerCallback

    import rltrace
    from examples import trl_grpo
    from rltrace.integrations.trl import instrument

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.cpu, self.wall, self.losses = [], [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self._t = (time.process_time(), time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.cpu.append(time.process_time() - self._t[0])
            self.wall.append(time.perf_counter() - self._t[1])

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    with tempfile.TemporaryDirectory() as tmp:
        trainers, timers = {}, {}
        for name in ("plain", "traced"):
            trainer = trl_grpo.build_trainer(f"{tmp}/{name}", steps=args.steps, hidden=args.hidden or trl_grpo.HIDDEN,
                                             layers=args.layers, max_completion=args.completion or trl_grpo.MAX_COMPLETION)
            trainer.args.log_level = "error"
            if name == "traced":
                instrument(trainer, f"{tmp}/run")
            timers[name] = StepTimer()
            trainer.add_callback(timers[name])
            trainers[name] = trainer
        order = ["plain", "traced"]
        for r in range(args.rounds * 2):
            name = order[(r + r // 2) % 2]  # plain, traced, traced, plain, plain, traced, ...
            trainer = trainers[name]
            transformers.set_seed(r // 2)
            trainer.train()
        rltrace.shutdown()

    isolated = isolated_step_cpu(trl_grpo, 200, args.completion or trl_grpo.MAX_COMPLETION)
    skip = 1  # the first step of each round warms up caches
    rows = {}
    for name, timer in timers.items():
        keep = [i for i in range(len(timer.cpu)) if i % args.steps >= skip]
        cpu = [timer.cpu[i] for i in keep]
        wall = [timer.wall[i] for i in keep]
        rows[name] = (statistics.median(cpu), statistics.fmean(cpu), statistics.median(wall), statistics.fmean(wall), len(cpu))
    size = f"hidden {args.hidden or trl_grpo.HIDDEN}, {args.layers} layers, {args.completion or trl_grpo.MAX_COMPLETION} tokens"
    table = Table(title=f"TRL GRPOTrainer step ({size}), {args.rounds} rounds x {args.steps} steps per variant (first step of each round dropped)")
    for col in ("variant", "steps", "CPU median ms", "CPU mean ms", "wall median ms", "wall mean ms"):
        table.add_column(col, justify="right" if col != "variant" else "left")
    for name, (cm, ca, wm, wa, n) in rows.items():
        table.add_row(name, str(n), f"{cm * 1e3:.1f}", f"{ca * 1e3:.1f}", f"{wm * 1e3:.1f}", f"{wa * 1e3:.1f}")
    p, t = rows["plain"], rows["traced"]
    table.add_row("ratio traced/plain", "", f"{t[0] / p[0]:.4f}", f"{t[1] / p[1]:.4f}", f"{t[2] / p[2]:.4f}", f"{t[3] / p[3]:.4f}")
    console = Console()
    console.print(table)
    console.print(f"in isolation: {isolated * 1e3:.3f} ms CPU per step = {isolated / p[0]:.2%} of the plain step's "
                  f"median CPU time ({p[0] * 1e3:.1f} ms)")
    same = timers["plain"].losses == timers["traced"].losses
    console.print(f"losses bit-identical between variants: {'yes' if same else 'NO'} "
                  f"({len(timers['plain'].losses)} logged steps each)")


def isolated_step_cpu(trl_grpo, n: int, completion: int) -> float:
    """CPU seconds of the rltrace work one instrumented step does, measured without TRL."""
    import torch

    import rltrace
    from rltrace.integrations import _trl_batch as tb

    b, t, v = trl_grpo.BATCH, completion, len(trl_grpo.build_tokenizer())
    scores = [torch.randn(b, v) for _ in range(t + 1)]
    prompt = torch.randint(0, v, (b, 12))
    sequences = torch.cat([prompt, torch.randint(0, v, (b, t))], dim=1)
    train, rollout = torch.randn(b, t) - 3, torch.randn(b, t) - 3
    mask, ids = torch.ones(b, t, dtype=torch.long), torch.arange(b)
    rewards = torch.rand(b, 2)
    logs = {f"trl/metric_{i}": float(i) for i in range(28)}
    gen = tb.Generation(step=0, gen_start=1.0, gen_end=2.0, prompt_ids=prompt.tolist(),
                        completion_ids=sequences[:, 12:].tolist(), rewards_per_func=rewards)
    with tempfile.TemporaryDirectory() as tmp:
        rltrace.init(f"{tmp}/iso")
        start = time.process_time()
        for step in range(n):
            with rltrace.phase("rollout", step=step, weight_version=step, samples=b):
                with rltrace.phase("generate", step=step, weight_version=step):
                    rec = tb.LogprobRecorder()
                    for k in range(t):
                        rec(sequences[:, : 12 + k], scores[k])
                    logps = rec.finish(sequences)
                with rltrace.phase("reward", step=step, weight_version=step):
                    for name in ("reward_a", "reward_short"):
                        with rltrace.phase(name, reward_function=name):
                            pass
                rows = tb.sample_rows(gen, first_id=step * b, first_group=step * b // 4, group_size=4,
                                      process_slice=slice(0, b), func_names=["a", "short"],
                                      weights=torch.ones(2), eos_ids={2}, )
                padded = tb.padded(logps, t, "cpu")
            handle = rltrace.start_phase("train", step=step, weight_version=step)
            sums = tb.StepSums()
            sums.add(train, padded, mask, 2.0, ids)
            ids.tolist()
            handle.end()
            rltrace.log_metrics(step, **sums.metrics())
            per_sample = sums.per_sample()
            for row in rows:
                row["train_version"], row["logprob_abs_diff"] = step, per_sample[row["sample_id"] - step * b]
            rltrace.log_samples(step, rows)
            rltrace.log_metrics(step, **logs)
        rltrace.flush()
        elapsed = time.process_time() - start
        rltrace.shutdown()
    return elapsed / n


if __name__ == "__main__":
    main()
