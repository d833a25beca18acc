"""How new weights travel from the trainer to the rollout engines: `t_W ≈ S_W / B_W + t_0`.

Paths (`--sync-method`):
- `copy` (colocated): tensor copies into the engine's own weights in the same process.
- `object_store` (Ray): the trainer `ray.put`s the weights in chunks; each worker `ray.get`s them.
- `disk`: the trainer writes a checkpoint file; each worker reads it back (`weights_only=True`).
- `gloo`: a torch.distributed broadcast from the trainer (rank 0) to every worker, chunk by chunk.

Each sync records the child phases of `weight_sync` that it has (docs/store.md): `gather`
(collecting the trainer's tensors), `transfer` (moving them: the paced send, and the receiver's
fetch), and on the engine's side `drain` (waiting for an in-flight batch) and `load` (copying
into the engine), each with `rl.bytes`.

`--slow-sync` caps the sender at `slow_sync_bandwidth` bytes/s (a `Throttle`, the only sleep in
the demo that stands for something: a slow link), so t_W grows with the bytes sent.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import torch

import rltrace

CHUNK_BYTES = 1 << 20  # weights travel in chunks of about 1 MiB (whole tensors)


def named_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a sync sends: every parameter once (tied weights are not sent twice)."""
    with rltrace.phase("gather") as span:
        named = {name: p.detach() for name, p in model.named_parameters()}
        span.set(bytes=nbytes(named))
    return named


def nbytes(named: dict[str, torch.Tensor]) -> int:
    """S_W: raw bytes of the tensors (P·b/8; no metadata)."""
    return sum(t.numel() * t.element_size() for t in named.values())


def chunked(named: dict[str, torch.Tensor], chunk_bytes: int = CHUNK_BYTES) -> list[dict[str, torch.Tensor]]:
    """Split into chunks of whole tensors of about `chunk_bytes` each."""
    chunks, current, size = [], {}, 0
    for name, tensor in named.items():
        current[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= chunk_bytes:
            chunks.append(current)
            current, size = {}, 0
    if current:
        chunks.append(current)
    return chunks


class Throttle:
    """Paces a sender to at most `bytes_per_s` (None: no limit), like a slow network link."""

    def __init__(self, bytes_per_s: float | None):
        self.bytes_per_s = bytes_per_s
        self._start = time.monotonic()
        self._sent = 0

    def pace(self, sent_bytes: int) -> None:
        """Call after sending `sent_bytes`; returns once the link would have carried them."""
        if self.bytes_per_s is None:
            return
        self._sent += sent_bytes
        ahead = self._sent / self.bytes_per_s - (time.monotonic() - self._start)
        if ahead > 0:
            time.sleep(ahead)  # --slow-sync only: the modelled link time


# --- copy (colocated) ------------------------------------------------------------------------------
def copy_into(load, named: dict[str, torch.Tensor], throttle: Throttle) -> int:
    """Copy chunk by chunk (paced) into a staging buffer, then `load(staged) -> bytes` into the engine's
    own tensors; returns bytes loaded."""
    with rltrace.phase("transfer") as span:
        staged: dict[str, torch.Tensor] = {}
        for chunk in chunked(named):
            staged.update({k: v.clone() for k, v in chunk.items()})
            throttle.pace(nbytes(chunk))
        span.set(bytes=nbytes(staged))
    return load(staged)


# --- Ray object store ---------------------------------------------------------------------------------
def put_object_store(named: dict[str, torch.Tensor], throttle: Throttle) -> list:
    """`ray.put` each chunk (one copy into shared memory); returns the object refs to hand to workers."""
    import ray

    refs = []
    with rltrace.phase("transfer") as span:
        for chunk in chunked(named):
            refs.append(ray.put({k: v.contiguous() for k, v in chunk.items()}))
            throttle.pace(nbytes(chunk))
        span.set(bytes=nbytes(named))
    return refs


def get_object_store(refs: list) -> dict[str, torch.Tensor]:
    import ray

    named = {}
    with rltrace.phase("transfer") as span:
        for chunk in ray.get(list(refs)):
            named.update(chunk)
        span.set(bytes=nbytes(named))
    return named


# --- disk ---------------------------------------------------------------------------------------------
def sync_file(folder: Path, version: int) -> Path:
    """Where version `version` is written for workers to read; built from the version, never from data."""
    return Path(folder) / f"weights_v{int(version):06d}.pt"


def write_disk(named: dict[str, torch.Tensor], folder: Path, version: int, throttle: Throttle) -> int:
    """Serialise once, write in chunks (paced), rename into place; returns the file size."""
    with rltrace.phase("transfer") as span:
        buffer = io.BytesIO()
        torch.save({k: v.contiguous() for k, v in named.items()}, buffer)
        data = buffer.getbuffer()
        path = sync_file(folder, version)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            for start in range(0, len(data), CHUNK_BYTES):
                f.write(data[start : start + CHUNK_BYTES])
                throttle.pace(min(CHUNK_BYTES, len(data) - start))
        tmp.replace(path)
        span.set(bytes=len(data))
    return len(data)


def read_disk(folder: Path, version: int) -> dict[str, torch.Tensor]:
    with rltrace.phase("transfer") as span:
        path = sync_file(folder, version)
        span.set(bytes=path.stat().st_size)
        return torch.load(path, map_location="cpu", weights_only=True)


# --- gloo broadcast --------------------------------------------------------------------------------------
def broadcast_gloo(named: dict[str, torch.Tensor], throttle: Throttle | None = None) -> int:
    """Both sides call this with tensors of the same names and shapes: rank 0 sends, the others receive
    into theirs. Returns bytes broadcast."""
    import torch.distributed as dist

    total = 0
    with rltrace.phase("transfer") as span:
        for chunk in chunked(named):
            flat = torch.cat([t.detach().reshape(-1).float() for t in chunk.values()])
            dist.broadcast(flat, src=0)
            if dist.get_rank() != 0:
                offset = 0
                for tensor in chunk.values():
                    tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                    offset += tensor.numel()
            if throttle is not None:
                throttle.pace(flat.numel() * flat.element_size())
            total += flat.numel() * flat.element_size()
        span.set(bytes=total)
    return total
