"""The rollout engines' own tracing and metrics code, loaded for tests (no GPU, no engine install).

`../shared/engine_src/` (beside the repository; `RLTRACE_ENGINE_SRC` names another place) holds
unmodified modules of vLLM 0.34.0 and SGLang 0.5.23 (its README). `load(engine)` puts one engine
on `sys.path` and stubs only what those modules import and the tests never run: the rest of the
engine (torch, fastapi, zmq, model code...) resolves to inert placeholders, a few helpers whose
value the traced code uses get their real behaviour (named in `_KNOWN`). Each engine is loaded
in its own process: both define top-level packages and set a global OTel tracer provider.
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path

VERSIONS = {"vllm": "vllm-0.34.0", "sglang": "sglang-0.5.23"}
#: third-party packages the engines import at module level that are heavy or absent here
HEAVY = ("torch", "fastapi", "zmq", "uvloop", "pybase64", "setproctitle", "transformers", "triton", "psutil",
         "orjson", "pydantic", "aiohttp", "uvicorn", "msgspec", "cbor2", "PIL", "partial_json_parser",
         "openai", "einops", "safetensors", "huggingface_hub", "sentencepiece", "tiktoken", "xgrammar",
         "outlines", "compressed_tensors", "gguf", "blake3", "cachetools", "pynvml", "ray", "starlette",
         "sse_starlette", "tqdm", "grpc_tools", "llguidance", "lark", "interegular", "datasets", "scipy",
         "sklearn", "pandas", "torchvision", "torchaudio", "flashinfer", "sgl_kernel", "decord", "soundfile")


def source_dir() -> Path:
    """Where the engines' files are (may not exist: callers skip with `missing()`)."""
    given = os.environ.get("RLTRACE_ENGINE_SRC")
    return Path(given) if given else Path(__file__).resolve().parents[2] / "shared" / "engine_src"


def missing(engine: str) -> str | None:
    """Why `engine`'s own code cannot be loaded here, or None."""
    where = source_dir() / VERSIONS[engine]
    if not (where / engine).is_dir():
        return (f"{engine}'s own tracing code is not at {where} (set RLTRACE_ENGINE_SRC to a folder holding "
                f"{VERSIONS[engine]}/{engine}/..., see shared/engine_src/README.md)")
    return None


class _StubType(type):
    """A placeholder class: any attribute is another placeholder, calling it makes an instance."""

    def __new__(mcs, name, bases, namespace, **options):  # class Foo(Placeholder, frozen=True)
        return super().__new__(mcs, name, bases, namespace)

    def __init__(cls, name, bases, namespace, **options):
        super().__init__(name, bases, namespace)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return stub_class(name)

    def __getitem__(cls, item):  # Foo[int] in annotations evaluated at import
        return cls


def stub_class(name: str) -> type:
    def _anything(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return stub_class(name)()

    return _StubType(name, (), {"__init__": lambda self, *a, **k: None, "__getattr__": _anything,
                                "__call__": lambda self, *a, **k: stub_class(name)(), "__iter__": lambda self: iter(()),
                                "__bool__": lambda self: False,
                                "__init_subclass__": classmethod(lambda cls, **options: None)})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        for folder in self.__path__:  # a module of the engine's own: `from package import module`
            if Path(folder, f"{name}.py").is_file() or Path(folder, name).is_dir():
                return importlib.import_module(f"{self.__name__}.{name}")
        value = _KNOWN.get(f"{self.__name__}.{name}") or stub_class(name)
        setattr(self, name, value)
        return value


class _Envs:
    """sglang.srt.environ.envs / vllm.envs: every variable unset (its `.get()` is None)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return types.SimpleNamespace(get=lambda: None, value=None)


class _DisaggregationMode(enum.Enum):  # sglang.srt.disaggregation.utils.DisaggregationMode's values
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


_RESOURCES = types.SimpleNamespace(trace_level=None)
#: placeholders whose value the traced code uses
_KNOWN = {
    "sglang.srt.environ.envs": _Envs(),
    "sglang.srt.runtime_context.get_resources": lambda: _RESOURCES,
    "sglang.srt.utils.get_int_env_var": lambda name, default=0: int(os.environ.get(name, default)),
    "sglang.srt.utils.get_bool_env_var": lambda name, default="false": os.environ.get(name, default).lower() in ("1", "true"),
    "sglang.srt.disaggregation.utils.DisaggregationMode": _DisaggregationMode,
    "uvloop.EventLoopPolicy": __import__("asyncio").DefaultEventLoopPolicy,  # tokenizer_manager sets it at import
    "vllm.utils.gc_utils.gc_untrack": lambda value: value,
    "vllm.logger.init_logger": __import__("logging").getLogger,
    "vllm.utils.func_utils.run_once": lambda f: f,
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stub modules for the engine's packages that are not in engine_src, and for `HEAVY`."""

    def __init__(self, engine: str, root: Path):
        self.engine, self.root = engine, root

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in HEAVY and top != self.engine:
            return None
        base = self.root.joinpath(*name.split("."))
        if top == self.engine and (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            return None  # the engine's own file
        spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
        # a folder of the engine without its __init__.py: names imported from it are placeholders,
        # its files load from disk
        spec.submodule_search_locations = [str(base)] if top == self.engine and base.is_dir() else []
        return spec

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = spec.submodule_search_locations
        return module

    def exec_module(self, module):
        pass


def load(engine: str) -> Path:
    """Make `engine`'s own modules importable in this process (see the module doc); returns its folder."""
    why = missing(engine)
    if why:
        raise RuntimeError(why)
    root = source_dir() / VERSIONS[engine]
    sys.path.insert(0, str(root))
    sys.meta_path.insert(0, _Finder(engine, root))
    return root
