"""TRL's GRPOTrainer traced by rltrace: a tiny Llama learns to answer with short runs of 'a'.

    python examples/trl_grpo.py --out runs/trl            # instrumented in code (instrument())
    rltrace report runs/trl

    rltrace run --run-dir runs/trl0 -- python examples/trl_grpo.py --plain    # no rltrace in the script

Everything is built in code (a 2-layer Llama from a config, a character tokenizer made with
`tokenizers`, a dataset from a dict), so it runs on CPU with no downloads in well under a minute.
`build_trainer` is what a TRL user already has; the one rltrace line is in `main`.
"""

from __future__ import annotations

import argparse
import string

# --- knobs -------------------------------------------------------------------------------------
STEPS = 12  # optimizer steps (max_steps)
BATCH = 8  # per_device_train_batch_size: completions per optimizer step
GENERATIONS = 4  # num_generations: completions per prompt (one GRPO group)
MAX_COMPLETION = 8  # max_completion_length, tokens
HIDDEN = 64  # model width; 2 layers, 4 heads: ~0.1M parameters
SEED = 0

CHARS = string.ascii_lowercase + string.digits + " .,:?!"
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]


def build_tokenizer():
    """A character-level tokenizer: one token per character, plus pad/bos/eos/unk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(CHARS))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # every character alone
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def build_model(tokenizer, seed: int = SEED, hidden: int = HIDDEN, layers: int = 2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def build_dataset(n: int = 64):
    from datasets import Dataset

    words = ["apple", "banana", "cat", "dog", "egg", "fig", "goat", "hat"]
    return Dataset.from_dict({"prompt": [f"say a: {words[i % len(words)]}?" for i in range(n)]})


# --- reward functions: TRL calls them with prompts=, completions=, completion_ids=, **columns ----
def reward_a(completions, **kwargs) -> list[float]:
    """Fraction of the characters that are 'a'."""
    return [c.count("a") / max(len(c), 1) for c in completions]


def reward_short(completion_ids, **kwargs) -> list[float]:
    """1 for a completion that ended before the length cap, else 0."""
    return [1.0 if len(ids) < MAX_COMPLETION else 0.0 for ids in completion_ids]


def build_trainer(output_dir: str, *, steps: int = STEPS, steps_per_generation: int | None = None,
                  reward_funcs=None, seed: int = SEED, hidden: int = HIDDEN, layers: int = 2,
                  max_completion: int = MAX_COMPLETION, **config):
    """The GRPOTrainer a TRL user would write, with everything built in code and CPU settings."""
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = build_tokenizer()
    args = GRPOConfig(
        output_dir=output_dir, use_cpu=True, report_to=[], bf16=False, max_steps=steps, seed=seed,
        per_device_train_batch_size=BATCH, num_generations=GENERATIONS, max_completion_length=max_completion,
        steps_per_generation=steps_per_generation, learning_rate=3e-3, logging_steps=1, save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, **config,
    )
    return GRPOTrainer(
        model=build_model(tokenizer, seed, hidden, layers), reward_funcs=reward_funcs or [reward_a, reward_short], args=args,
        train_dataset=build_dataset(), processing_class=tokenizer,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/trl", help="rltrace run directory")
    parser.add_argument("--steps", type=int, default=STEPS, help="optimizer steps")
    parser.add_argument("--steps-per-generation", type=int, default=None,
                        help="reuse one generation for this many optimizer steps (staleness)")
    parser.add_argument("--plain", action="store_true",
                        help="do not import rltrace (trace it with `rltrace run -- python examples/trl_grpo.py --plain`)")
    args = parser.parse_args(argv)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(tmp, steps=args.steps, steps_per_generation=args.steps_per_generation)
        if not args.plain:
            from rltrace.integrations.trl import instrument

            instrument(trainer, args.out, config={"example": "trl_grpo", "steps": args.steps})  # the one line
        trainer.train()
    if not args.plain:
        print(f"traced into {args.out}: `rltrace report {args.out}`")


if __name__ == "__main__":
    main()
