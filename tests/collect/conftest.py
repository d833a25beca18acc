"""A receiver on a free loopback port, flushing often, closed after the test."""

import pytest

from rltrace.collect import Limits, Receiver


@pytest.fixture
def receiver(run_dir):
    r = Receiver(run_dir, "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    yield r
    r.close()
