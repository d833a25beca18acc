"""Runnable examples: `quickstart.py` (the API in one screen) and `tiny_grpo` (the demo RL run)."""
