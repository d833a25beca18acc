"""`python -m examples.tiny_grpo --out RUN_DIR [--steps N] [--seed S] [flags]`; see train.py."""

import sys

from examples.tiny_grpo.train import main

sys.exit(main())
