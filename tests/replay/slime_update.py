"""slime's own weight update (`UpdateWeightFromDistributed.update_weights`: pause → `flush_cache` on
every engine → send → continue) and its own SGLang engine client (`SGLangEngine.flush_cache`,
`pause_generation`, `continue_generation`), run against a loopback HTTP server standing in for SGLang.

Stand-ins, because they cannot run here: Megatron (`mpu`, the HF conversion) and SGLang's Python
package are placeholders while the two modules import; Ray's actor handles call the engine object
in this process (`.remote()` runs the method, `ray.get` returns what it returned); the process
group answers `get_rank()` with the rank the test gives and `barrier()` at once; `_send_weights`
(the NCCL broadcast) does nothing. Everything else, the order of the calls included, is slime's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.replay import slime_run

_UPDATER = "slime.backends.megatron_utils.update_weight.update_weight_from_distributed"
_ENGINE = "slime.backends.sglang_utils.sglang_engine"


class Server:
    """SGLang's HTTP endpoints that slime's weight update calls; `on_flush` runs on each /flush_cache."""

    def __init__(self, on_flush=lambda: None):
        self.calls: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                server.calls.append(self.path)
                if self.path == "/flush_cache":
                    on_flush()
                body = json.dumps({"success": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                self._answer()

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

            def log_message(self, *a):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()


class _Method:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


class Handle:
    """A Ray actor handle's surface (`handle.method.remote(...)`, resolved by `__getattr__` as Ray's
    ActorHandle does), calling slime's SGLangEngine in this process."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(getattr(self._engine, name))


@contextlib.contextmanager
def _placeholders(names: dict[str, dict]):
    """Modules that exist only while slime's two files import (taken out after, so no other test
    sees a fake Megatron, SGLang or Ray)."""
    added = []
    saved = {}
    for name, attrs in names.items():
        if name in sys.modules:
            saved[name] = sys.modules[name]
        module = types.ModuleType(name)
        module.__path__ = []
        module.__dict__.update(attrs)  # a real folder in `__path__`: its files import, its __init__ does not run
        sys.modules[name] = module
        added.append(name)
    try:
        yield
    finally:
        for name in added:
            if name in saved:
                sys.modules[name] = saved[name]
            else:
                sys.modules.pop(name, None)


def _load(name: str):
    """slime's file `name`, imported by the import system when its package is on a path (so hooks that
    wait for the module, rltrace's among them, see it), else from its file."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None):
        return sys.modules[name]
    parent = sys.modules.get(name.rpartition(".")[0])
    if parent is not None and getattr(parent, "__path__", None):
        return importlib.import_module(name)
    path = slime_run.SRC.joinpath(*name.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Slime:
    """slime's updater and engine client, loaded once per process."""

    def __init__(self):
        slime_run.Slime()  # slime's rollout modules and their stand-ins first (they own slime.utils.http_utils)
        http_utils = sys.modules["slime.utils.http_utils"]
        any_ = type("Placeholder", (), {"__init__": lambda self, *a, **k: None})
        ray_stub = {"get": lambda refs, **k: refs, "ObjectRef": any_}
        with _placeholders({
            "megatron": {}, "megatron.core": {"mpu": types.SimpleNamespace()},
            "ray": ray_stub, "ray.actor": {"ActorHandle": any_},
            "sglang": {}, "sglang.srt": {}, "sglang.srt.server_args": {"ServerArgs": any_},
            "sglang.srt.utils": {"kill_process_tree": lambda pid: None},
            "slime.backends.sglang_utils.external": {"get_server_info": lambda *a, **k: {}},
            "slime.backends.megatron_utils": {}, "slime.backends.megatron_utils.megatron_to_hf": {"convert_to_hf": None},
            "slime.backends.megatron_utils.update_weight": {
                "__path__": [str(slime_run.SRC / "slime" / "backends" / "megatron_utils" / "update_weight")]},
            "slime.backends.megatron_utils.update_weight.common": {"all_gather_param": None,
                                                                   "named_params_and_buffers": None},
            "slime.utils.distributed_utils": {"get_gloo_group": lambda: None, "init_process_group": None},
        }):
            for name, value in (("_wrap_ipv6", lambda host: host), ("get_host_info", lambda *a, **k: ("127.0.0.1", 0))):
                if not hasattr(http_utils, name):
                    setattr(http_utils, name, value)
            self.updater_module = _load(_UPDATER)
            self.engine_module = _load(_ENGINE)
        self.rank = 0
        self.updater_module.dist = types.SimpleNamespace(get_rank=lambda: self.rank, barrier=lambda group=None: None)

    def engine(self, server: Server):
        """slime's SGLangEngine client of one server (its Ray actor, without launching SGLang)."""
        engine = object.__new__(self.engine_module.SGLangEngine)
        engine.node_rank, engine.server_host, engine.server_port = 0, "127.0.0.1", server.port
        return engine

    def updater(self, engines, send=lambda pbar: None):
        """slime's UpdateWeightFromDistributed as `connect_rollout_engines` leaves it, its NCCL send replaced."""
        updater = object.__new__(self.updater_module.UpdateWeightFromDistributed)
        updater.weight_version, updater.quantization_config = 0, None
        updater.rollout_engines = [Handle(e) for e in engines]
        updater._is_pp_src_rank, updater._group_name = False, "slime-pp_0"
        updater._send_weights = send
        return updater
