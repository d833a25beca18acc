import sys
from pathlib import Path

import pytest

import rltrace

sys.path.insert(0, str(Path(__file__).parent))  # tiny.py, slime_dumps.py, entries.py


@pytest.fixture(autouse=True)
def _end_run():
    yield
    rltrace.shutdown()
