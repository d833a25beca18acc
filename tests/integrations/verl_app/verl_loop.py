"""A verl driver loop shaped like `RayPPOTrainer.fit`, on verl's real timers (CPU: no workers).

Run under `rltrace run -- python verl_loop.py`; it never imports rltrace. Each block sleeps a
known time so the test can compare spans with verl's own `timing_raw`.
"""

import json
import sys
import time

from verl.utils.debug import marked_timer  # what ray_trainer.py imports
from verl.utils.profiler import simple_timer

SLEEP = {"gen": 0.03, "reward": 0.01, "old_log_prob": 0.01, "ref": 0.005, "adv": 0.002, "update_actor": 0.02,
         "update_weights": 0.008, "my_custom_block": 0.004}


class Trainer:
    def __init__(self, tracking=None):
        self.global_steps = 0
        self.tracking = tracking  # verl.utils.tracking.Tracking: log what RayPPOTrainer.fit logs about time

    def fit(self, steps: int) -> list[dict]:
        timings = []
        self.global_steps += 1  # "we start from step 1"
        for _ in range(steps):
            timing_raw: dict[str, float] = {}
            with marked_timer("start_profile", timing_raw):
                pass
            with marked_timer("step", timing_raw):
                with marked_timer("gen", timing_raw, color="red"):
                    time.sleep(SLEEP["gen"])
                with marked_timer("reward", timing_raw, color="yellow"):
                    time.sleep(SLEEP["reward"])
                for name in ("old_log_prob", "ref", "adv", "update_actor", "update_weights"):
                    with marked_timer(name, timing_raw):
                        time.sleep(SLEEP[name])
                with simple_timer("my_custom_block", timing_raw):
                    time.sleep(SLEEP["my_custom_block"])
            timings.append({"global_steps": self.global_steps, **timing_raw})
            if self.tracking is not None:
                self.tracking.log(data=compute_timing_metrics(batch=_batch(), timing_raw=timing_raw), step=self.global_steps)
            self.global_steps += 1
        return timings


def _batch():
    """A 4-sample batch of 4-token prompts and 6-token responses (what verl's timing metrics read)."""
    import torch
    from verl import DataProto

    return DataProto.from_dict(tensors={"responses": torch.zeros(4, 6, dtype=torch.long),
                                        "attention_mask": torch.ones(4, 10, dtype=torch.long)})


def compute_timing_metrics(batch, timing_raw):
    from verl.trainer.ppo.metric_utils import compute_timing_metrics as verl_timing_metrics

    return verl_timing_metrics(batch, timing_raw)


if __name__ == "__main__":
    print(json.dumps(Trainer().fit(int(sys.argv[1]) if len(sys.argv) > 1 else 3)))
