"""`python -m examples.tiny_grpo --out RUN_DIR [--steps N] [--seed S] [flags]`.

The flags are in system/cli.py, the loop in train.py."""

import sys

from examples.tiny_grpo.system.cli import main

sys.exit(main())
