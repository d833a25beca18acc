"""`when_imported` and `BaseInstrumentor`, in this process."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from rltrace.integrations import BaseInstrumentor, when_imported
from rltrace.integrations._load import load_instrumentors, registered


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("rlt_hookdemo")]:
        del sys.modules[name]


def test_hook_runs_after_the_module_executes_and_leaves_its_loader_alone(module_dir):
    pkg = module_dir / "rlt_hookdemo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("VALUE = 1\n")
    seen = []
    when_imported("rlt_hookdemo.core", lambda m: seen.append(m.VALUE))
    assert seen == []
    module = importlib.import_module("rlt_hookdemo.core")
    assert seen == [1]
    assert type(module.__loader__).__name__ == "SourceFileLoader" and module.__spec__.loader is module.__loader__
    when_imported("rlt_hookdemo.core", lambda m: seen.append("again"))  # already imported: runs at once
    assert seen == [1, "again"]


def test_a_failing_hook_warns_and_the_import_succeeds(module_dir):
    (module_dir / "rlt_hookdemo_b.py").write_text("X = 2\n")

    def bad(module):
        raise KeyError("Trainer.__init__ moved")

    when_imported("rlt_hookdemo_b", bad)
    with pytest.warns(RuntimeWarning, match="patching rlt_hookdemo_b failed .*Trainer.__init__ moved"):
        module = importlib.import_module("rlt_hookdemo_b")
    assert module.X == 2


class _Demo(BaseInstrumentor):
    calls: list = []

    def instrumentation_dependencies(self):
        return self.deps

    def _instrument(self, **kwargs):
        self.calls.append("instrument")

    def _uninstrument(self, **kwargs):
        self.calls.append("uninstrument")


def test_instrument_is_idempotent_and_undone():
    demo = _Demo()
    demo.deps = ("packaging >= 1",)
    assert _Demo() is demo
    assert demo.instrument() and demo.instrument()
    demo.uninstrument()
    demo.uninstrument()
    assert _Demo.calls == ["instrument", "uninstrument"]


def test_unsupported_version_warns_and_absent_library_is_skipped_quietly():
    demo = _Demo()
    demo.deps = ("packaging < 1",)
    with pytest.warns(RuntimeWarning, match=r"_Demo not applied: packaging \S+ is installed; this instrumentor supports packaging<1"):
        assert demo.instrument() is False
    demo.deps = ("no-such-distribution-xyz >= 1",)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert demo.instrument() is False
    assert not demo.is_instrumented


def test_env_var_instrumentors_follow_entry_points(monkeypatch):
    monkeypatch.setenv("RLTRACE_INSTRUMENTORS", " a.b:C , a.b:C,x:y")
    names = [value for _, value in registered()]
    assert names[-2:] == ["a.b:C", "x:y"]
    monkeypatch.setenv("RLTRACE_INSTRUMENTORS", "json:loads.__name__")  # not callable
    monkeypatch.setattr("rltrace.integrations._load.entry_points", lambda: [])
    with pytest.warns(RuntimeWarning, match="neither callable nor has an instrument"):
        assert load_instrumentors() == []


class _Deferred(BaseInstrumentor):
    target = "rlt_hookdemo_deferred"
    deps: tuple = ()
    patched: list = []

    def instrumentation_dependencies(self):
        return self.deps

    def _instrument(self, **kwargs):
        self.patched.append(sys.modules[self.target].NAME)

    def _uninstrument(self, **kwargs):
        self.patched.append("undone")


def test_with_a_target_the_check_and_patch_wait_for_its_import(module_dir):
    (module_dir / "rlt_hookdemo_deferred.py").write_text("NAME = 'lib'\n")
    demo = _Deferred()
    demo.deps = ("packaging < 1",)  # a conflict, but nothing is said until the library is used
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert demo.instrument() is True
    assert demo.patched == []
    with pytest.warns(RuntimeWarning, match="_Deferred not applied"):
        importlib.import_module("rlt_hookdemo_deferred")
    assert demo.patched == [] and not demo.is_instrumented
    demo.deps = ()
    assert demo.instrument() is True and demo.patched == ["lib"]  # already imported: patched at once
    demo.uninstrument()
    assert demo.patched == ["lib", "undone"]


def test_loading_the_hf_instrumentor_does_not_import_transformers():
    import subprocess

    from ..conftest import PYTHON, python_env

    code = ("import sys; from rltrace.integrations.hf import HFInstrumentor; HFInstrumentor().instrument(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'torch', 'pyarrow')))")
    out = subprocess.run([PYTHON, "-c", code], env=python_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
