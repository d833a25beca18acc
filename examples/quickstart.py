"""rltrace in one screen: a REINFORCE bandit whose four phases are recorded.

    python examples/quickstart.py runs/quickstart && rltrace info runs/quickstart

A policy over 10 arms learns which pays best. Each step samples a batch (rollout), scores it
(reward), takes a policy-gradient step (train) and copies the weights to the sampler
(weight_sync) — the loop of RL post-training, small enough to read at a glance.
"""

import sys

import numpy as np

import rltrace

ARMS, BATCH, STEPS, LR = 10, 256, 60, 4.0

rng = np.random.default_rng(0)
payout = rng.uniform(0.1, 0.9, ARMS)  # the environment: each arm's chance of reward 1
trainer_logits = np.zeros(ARMS)  # the trained policy
sampler_logits = trainer_logits.copy()  # the rollout engine's own copy of the weights

rltrace.init(sys.argv[1] if len(sys.argv) > 1 else "runs/quickstart", config={"arms": ARMS, "batch": BATCH, "lr": LR})
for step in range(STEPS):
    with rltrace.phase("step", step=step, weight_version=step):
        with rltrace.phase("rollout", batch=BATCH):
            probs = np.exp(sampler_logits) / np.exp(sampler_logits).sum()
            arms = rng.choice(ARMS, size=BATCH, p=probs)
        with rltrace.phase("reward"):
            rewards = (rng.random(BATCH) < payout[arms]).astype(float)
        with rltrace.phase("train") as train:
            advantages = rewards - rewards.mean()
            probs = np.exp(trainer_logits) / np.exp(trainer_logits).sum()
            grad = np.zeros(ARMS)
            np.add.at(grad, arms, advantages)
            grad -= probs * advantages.sum()
            trainer_logits += LR * grad / BATCH
            train.set(grad_norm=float(np.linalg.norm(grad / BATCH)))
        with rltrace.phase("weight_sync", method="copy", bytes=trainer_logits.nbytes):
            sampler_logits = trainer_logits.copy()
    rltrace.log_metrics(step, reward_mean=rewards.mean(), reward_std=rewards.std())
    rltrace.log_samples(step, [{"sample_id": i, "reward": float(r), "arm": int(a)} for i, (a, r) in enumerate(zip(arms, rewards))])
    if step % 10 == 0 or step == STEPS - 1:
        print(f"step {step:3d}  reward {rewards.mean():.3f}  (best arm pays {payout.max():.2f})")
rltrace.shutdown()
