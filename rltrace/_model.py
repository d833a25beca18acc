"""A model's Hugging Face `config.json`, read once for everyone who needs its cache geometry.

`rltrace.init(model=...)` stores it with the run (a zero-length span, `MODEL_SPAN`, whose
attributes hold the config's text), `rltrace report --model PATH` reads it for one report, and
`rltrace.analysis.cache_geometry` computes bytes per token and per state slot from it. Nothing
here imports rltrace beyond `_config` and `_paths`: the API, the CLI and the analyses all may use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rltrace._config import RltraceConfigError

MODEL_SPAN = "rltrace.model"  # name of the span `init(model=...)` records
CONFIG_ATTR = "rl.model.config"  # its attribute holding the config's JSON text
SOURCE_ATTR = "rl.model.source"  # ... and where the config came from
MAX_BYTES = 4 * 2**20  # a config.json is a few kB; anything this large is not one


def read_config(model: Any) -> tuple[dict, str]:
    """(the config as a dict, where it came from) for `model`: a path to a `config.json`, a
    directory holding one, a dict, or an object with `to_dict()` (a transformers config).

    Raises `RltraceConfigError` saying what to pass instead when it is none of these.
    """
    if isinstance(model, dict):
        return _checked(model, "the dict given"), "dict"
    to_dict = getattr(model, "to_dict", None)
    if callable(to_dict) and not isinstance(model, (str, os.PathLike)):
        return _checked(to_dict(), type(model).__name__), f"{type(model).__name__} object"
    if not isinstance(model, (str, os.PathLike)):
        raise RltraceConfigError(f"model must be a path to a Hugging Face config.json (or its directory), a dict or a "
                                 f"transformers config, got {type(model).__name__}")
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        if path.exists() or path.is_symlink():
            from rltrace._paths import missing

            raise RltraceConfigError(f"model: {missing(path)}")
        raise RltraceConfigError(f"model: {path} does not exist; pass the model's config.json or the directory "
                                 "holding it")
    if path.stat().st_size > MAX_BYTES:
        raise RltraceConfigError(f"model: {path} is larger than {MAX_BYTES // 2**20} MB: not a config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RltraceConfigError(f"model: {path} is not readable JSON ({exc})") from None
    except RecursionError:
        raise RltraceConfigError(f"model: {path} is nested too deeply to be a config.json") from None
    return _checked(data, str(path)), str(path.resolve())


def _checked(data: Any, where: str) -> dict:
    if not isinstance(data, dict):
        raise RltraceConfigError(f"model: {where} is not a JSON object (a Hugging Face config.json is one)")
    try:
        return json.loads(json.dumps(data, default=str))  # plain JSON values only
    except (TypeError, ValueError) as exc:
        raise RltraceConfigError(f"model: {where} cannot be stored as JSON ({exc})") from None
    except RecursionError:
        raise RltraceConfigError(f"model: {where} is nested too deeply to be a config.json") from None


def to_text(config: dict) -> str:
    """The config as stored in the run: compact JSON with sorted keys."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))
