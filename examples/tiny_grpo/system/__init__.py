"""The demo's machinery around the loop: what `train.py` imports but a reader need not read first.

- `cli.py`: the flags (`Config`), their checks, `--out`, and `main` (`python -m examples.tiny_grpo`).
- `tokenizer.py`: vocabulary and chat template; `engine.py`: the KV-cached rollout engine (a
  miniature vLLM); `worker.py`: the rollout side (prompts -> engine -> samples, the async producer).
- `placement.py`: where the rollout runs (a thread of the trainer, or Ray actors) and how weights
  reach it; `weight_sync.py`: the transfer paths; `ray_actors.py`, `ray_driver.py`: Ray.
- `faults.py`: the slow reward fault (the others are flags of the worker and the weight sync).
- `display.py`: what the demo prints.
"""
