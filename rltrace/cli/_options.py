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


def serving(parser: argparse.ArgumentParser) -> None:
    """The serving-capacity options, on `rltrace report` and `rltrace ui` alike (docs/analysis.md,
    "Serving capacity"); `serving_values` reads them back."""
    group = parser.add_argument_group("serving capacity (docs/analysis.md, \"Serving capacity\")")
    group.add_argument("--model", metavar="PATH", help="the model's Hugging Face config.json (or its directory), for "
                       "KV bytes per token and per state slot (default: the one rltrace.init(model=...) stored)")
    group.add_argument("--kv-dtype", metavar="DTYPE", help="the KV cache's dtype (bf16, fp16, fp8_e4m3, fp8_e5m2, "
                       "fp32, ...; default: the dtype the engines serve the model in)")
    group.add_argument("--ssm-dtype", metavar="DTYPE", help="a hybrid model's recurrent state dtype (default: the "
                       "config's mamba_ssm_dtype, else the served dtype)")
    group.add_argument("--kv-bandwidth", metavar="BYTES_PER_S", type=float,
                       help="the prefill-to-decode KV link's bandwidth B_KV (default: measured from KV-transfer records)")
    group.add_argument("--engine", choices=("vllm", "sglang"), help="the engine whose dtype defaults apply "
                       "(default: the engine the request spans name); the report says which it used")


def serving_values(args: argparse.Namespace) -> dict:
    """The options `serving` declared, as `analysis.configure_serving` takes them."""
    return {"model": args.model, "kv_dtype": args.kv_dtype, "ssm_dtype": args.ssm_dtype,
            "kv_bandwidth": args.kv_bandwidth, "engine": args.engine}
