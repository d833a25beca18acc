"""A tiny Hugging Face Trainer run on CPU: a 2-layer Llama from a config, a tokenizer built in
code, a dataset from a dict. No download. Used by the tests, in process and as a script.

    python hf_train.py [--callback RUN_DIR] [--raise-at STEP] [--steps N]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Trainer, TrainingArguments

WORDS = "the a cat dog sat ran on under mat log fast slow".split()


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<s>", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def dataset(tok, n: int = 16) -> Dataset:
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(6)) for i in range(n)]
    ids = [tok(t)["input_ids"] for t in texts]
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


class FailingTrainer(Trainer):
    """Raises inside the loss at optimizer step `raise_at`, like a loss that turned NaN."""

    raise_at: int | None = None

    def compute_loss(self, model, inputs, *args, **kwargs):
        if self.raise_at is not None and self.state.global_step == self.raise_at:
            raise RuntimeError("loss is NaN")
        return super().compute_loss(model, inputs, *args, **kwargs)


def make_trainer(*, steps: int = 3, callbacks=(), raise_at: int | None = None, output_dir: str | None = None,
                 eval_steps: int | None = None, save_steps: int | None = None) -> Trainer:
    """`eval_steps`: evaluate on 4 held-out texts every that many steps; `save_steps`: checkpoint so often."""
    torch.manual_seed(0)
    tok = tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                         pad_token_id=tok.pad_token_id)
    args = TrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="hf_train_"), max_steps=steps,
        per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=1, learning_rate=1e-3,
        report_to=[], save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, eval_strategy="steps" if eval_steps else "no",
        eval_steps=eval_steps, per_device_eval_batch_size=2,
    )
    trainer = FailingTrainer(model=LlamaForCausalLM(config), args=args, train_dataset=dataset(tok),
                             eval_dataset=dataset(tok, 4) if eval_steps else None, processing_class=tok,
                             callbacks=list(callbacks))
    trainer.raise_at = raise_at
    return trainer


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--callback", metavar="RUN_DIR")
    parser.add_argument("--raise-at", type=int)
    parser.add_argument("--steps", type=int, default=3)
    opts = parser.parse_args()
    callbacks = []
    if opts.callback:
        from rltrace.integrations.hf import RltraceCallback

        callbacks.append(RltraceCallback(opts.callback))
    make_trainer(steps=opts.steps, callbacks=callbacks, raise_at=opts.raise_at).train()
    print("trained")
