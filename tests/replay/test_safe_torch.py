"""Dumps someone else wrote are loaded only by a torch whose weights_only loader holds (>= 2.6)."""

import pytest
import torch

from rltrace.replay import slime
from rltrace.replay.errors import ReplayError
from rltrace.replay.safe_torch import safe_torch, version_tuple


def test_versions_read_as_numbers():
    assert [version_tuple(v) for v in ("2.13.0+cpu", "2.6.0", "2.5.1", "nightly")] == [(2, 13), (2, 6), (2, 5), (0, 0)]


def test_an_old_torch_refuses_to_load_a_dump(tmp_path, monkeypatch):
    dump = tmp_path / "rollout.pt"
    torch.save({"rollout_id": 0, "samples": []}, dump)
    assert slime.read_dump(dump) == {"rollout_id": 0, "samples": []}  # the installed torch is safe
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(ReplayError, match=r"torch 2\.5\.1 cannot load files safely .*CVE-2025-32434.*torch>=2\.6"):
        slime.read_dump(dump)
    with pytest.raises(ReplayError):
        safe_torch()
