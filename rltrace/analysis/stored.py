"""What the first report of a run computes, stored in the run (`python -m rltrace.analysis.stored
RUN_DIR`, started by its last writer as it exits: `rltrace.store.last_writer`).

The first report on a run nobody compacted computes per-step summaries and per-part facts (per-step
counts, rollout windows, engine requests) and keeps them in this machine's summary cache
(`analysis._parts`); another machine, user or CI would compute them again, at several times the
cost of reading the spans. Stored once in the run's `report_cache/` folder, every report reads them
after its own cache. Each file lists the span parts it was computed from, so a part written since
(a resumed run, a killed writer's parts merged by `rltrace compact`) is read from the spans as
before: never a stale figure.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from rltrace.analysis import _parts

logger = logging.getLogger("rltrace")


def store(run_dir: Path) -> None:
    """Compute what a report over every step computes, into the run's `report_cache/` folder."""
    from rltrace import report, store as store_

    folder = Path(run_dir) / _parts.STORED
    with _parts.cache_root(folder):
        report.build(store_.open(run_dir))
    if not folder.is_dir() or not any(folder.glob("*.parquet")):  # a cache that cannot be written never fails a report
        raise OSError(f"nothing could be written in {folder}")


def main(argv: list[str]) -> int:
    """`RUN_DIR [FD]`: store; FD is the lock the last writer handed over (held until this exits)."""
    logging.basicConfig(format="%(message)s")
    t = time.monotonic()
    try:
        store(Path(argv[0]))
    except Exception as exc:
        if not Path(argv[0]).is_dir():
            return 0  # the run was removed after its last writer left (a temporary run): nothing to store, nothing to say
        logger.warning("rltrace: the run's summaries were not stored (%s: %s); the first report computes them",
                       type(exc).__name__, exc)
        return 1
    logger.info("rltrace: stored the run's summaries for reports in %.1f s", time.monotonic() - t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
