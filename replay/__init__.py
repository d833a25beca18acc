"""Debug replay: freeze sampled batches into Parquet, rerun reward and train forward on them, diff.

    rltrace.replay.freeze(step, samples, batch_meta={"weight_version": v, "tokenizer": tok})
    batch = rltrace.replay.load("runs/exp1", step)     # tensors back with their dtype and shape

Then `rltrace replay list|show|run|diff|compare|decompose RUN_DIR ...`; see docs/replay.md.
"""

from rltrace.replay.batch import FrozenBatch, load
from rltrace.replay.errors import ReplayError, SlimeDumpError, TokenizerMismatchError
from rltrace.replay.flags import TextRules, sample_flags
from rltrace.replay.freezer import FreezePolicy, Freezer, flush, freeze
from rltrace.replay.tokenizer import tokenizer_identity

__all__ = [
    "freeze",
    "flush",
    "Freezer",
    "FreezePolicy",
    "load",
    "FrozenBatch",
    "tokenizer_identity",
    "sample_flags",
    "TextRules",
    "ReplayError",
    "TokenizerMismatchError",
    "SlimeDumpError",
]
