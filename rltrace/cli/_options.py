"""Options that several commands share, declared once."""

from __future__ import annotations

import argparse

SKIP_CORRUPT_HINT = " (rerun with --skip-corrupt to skip it)"


def skip_corrupt(parser: argparse.ArgumentParser) -> None:
    """`--skip-corrupt`, on every command that reads a run: without it a damaged part stops the
    command with a one-line error naming the file; with it each damaged part is named on stderr and
    the command goes on without it."""
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="skip damaged part files (each named on stderr) instead of stopping at the first")
