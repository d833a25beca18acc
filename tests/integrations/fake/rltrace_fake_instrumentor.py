"""Test instrumentors for `rltrace run`: one that works, one that fails when applied."""

from rltrace.integrations import BaseInstrumentor, when_imported


def _patch(module) -> None:
    import rltrace

    original = module.work

    def work(n):
        with rltrace.phase("fake_work", step=abs(n)):
            return original(n)

    module.work = work


class FakeInstrumentor(BaseInstrumentor):
    def _instrument(self, **kwargs):
        when_imported("rltrace_fake_lib", _patch)

    def _uninstrument(self, **kwargs):
        pass


def broken():
    raise RuntimeError("this instrumentor is broken")
