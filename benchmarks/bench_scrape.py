"""`rltrace collect --scrape`: what one scrape costs, and what the report pays for a run's scrapes.

    python benchmarks/bench_scrape.py [--engines 8] [--scrapes 720]

The page is written by vLLM 0.34.0's own metrics code (`PrometheusStatLogger` with `--engines`
data-parallel engines, tests/collect/engine_own_metrics.py, which needs ../shared/engine_src; its
histogram buckets are stubbed to 4, so a real page is larger and parsing it costs more), served on
loopback. In the same sitting:
- parsing alone: `well_formed` + `parse` of that page (checked, then parsed: the baseline), and
  `read_page` (parsed once, where this version has it);
- one scrape: `Scraper.scrape_once`: HTTP GET on loopback, the parsing, its Parquet part(s)
  written into the run (and merged, where this version merges them);
- the report's read of the run's scrapes: `serving.scraped_metrics` + `prefix_cache_counters` on a
  fresh connection after `--scrapes` scrapes (720 = an hour at the default 5 s) while the scraper
  runs, after it closed, and after `rltrace compact`.
CPU seconds of this process (the engine's server is another process); medians.
"""

from __future__ import annotations

import argparse
import select
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rltrace import store  # noqa: E402
from rltrace.analysis.serving import prefix_cache_counters, scraped_metrics, sync_ends  # noqa: E402
from rltrace.collect import scrape  # noqa: E402
from rltrace.collect.scrape import Scraper, parse, well_formed  # noqa: E402
from rltrace.store import layout  # noqa: E402
from rltrace.store.compact import compact  # noqa: E402
from tests import engine_code  # noqa: E402


def _cpu(fn, n: int = 1) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--scrapes", type=int, default=720)
    args = p.parse_args()
    if engine_code.missing("vllm"):
        sys.exit(f"bench_scrape: {engine_code.missing('vllm')}")
    import json

    import rltrace

    engine = subprocess.Popen([sys.executable, str(REPO / "tests/collect/engine_own_metrics.py"), "vllm",
                               str(args.engines)], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([engine.stdout], [], [], 30)
        url = engine.stdout.readline().split()[1] if ready else sys.exit("bench_scrape: the engine did not start")
        events = [{"engine": e, "requests": [[1000, 400]], "kv_usage": 0.5, "running": 3, "waiting": 1}
                  for e in range(args.engines)]
        urllib.request.urlopen(urllib.request.Request(url.removesuffix("/metrics") + "/record",
                                                      data=json.dumps(events).encode(), method="POST"), timeout=10).read()
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        parse_s = statistics.median(_cpu(lambda: parse(well_formed(page)[0]), 20) for _ in range(5))
        once = getattr(scrape, "read_page", None)
        once_s = statistics.median(_cpu(lambda: once(page), 20) for _ in range(5)) if once else None
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            rltrace.init(run, role="trainer")
            with rltrace.phase("weight_sync", step=1, weight_version=1):
                pass
            rltrace.shutdown()
            scraper = Scraper(run, layout.read_manifest(run)["run_id"], [url], every=60, timeout=5)
            per = []
            for k in range(args.scrapes):
                if k % 60 == 1:  # the engines go on counting
                    urllib.request.urlopen(urllib.request.Request(
                        url.removesuffix("/metrics") + "/record", data=json.dumps(events).encode(), method="POST"),
                        timeout=10).read()
                per.append(_cpu(scraper.scrape_once))
            parts = list((run / "metrics").glob("*.parquet"))

            def read():
                con = store.open(run)
                return prefix_cache_counters(scraped_metrics(con), sync_ends(con))

            assert read()["prompt_tokens"] > 0
            live = statistics.median(_cpu(read) for _ in range(3))
            scraper.close()
            closed_parts = list((run / "metrics").glob("*.parquet"))
            closed = statistics.median(_cpu(read) for _ in range(3))
            disk = sum(f.stat().st_size for f in closed_parts)
            compact(run, grace_s=0)
            after = len(list((run / "metrics").glob("*.parquet")))
            merged = statistics.median(_cpu(read) for _ in range(3))
    finally:
        engine.kill()
        engine.wait()
    scrape_s = statistics.median(per)
    print(f"page: {len(page):,} bytes, {args.engines} engines (vLLM 0.34.0's own metrics code)")
    print("| what | CPU ms | ratio to the baseline |\n| --- | --- | --- |")
    print(f"| check the page, then parse it (well_formed + parse), baseline | {parse_s * 1e3:.2f} | 1.00 |")
    if once_s is not None:
        print(f"| parse it once (read_page) | {once_s * 1e3:.2f} | {once_s / parse_s:.2f} |")
    print(f"| one scrape (GET, parsing, its part) | {scrape_s * 1e3:.2f} | {scrape_s / parse_s:.2f} |")
    print(f"| report's read of {args.scrapes} scrapes while scraping ({len(parts):,} parts) | {live * 1e3:.0f} | |")
    print(f"| the same once the scraper closed ({len(closed_parts):,} parts, {disk / args.scrapes:,.0f} bytes "
          f"per scrape) | {closed * 1e3:.0f} | |")
    print(f"| the same after rltrace compact ({after} parts) | {merged * 1e3:.0f} | |")

if __name__ == "__main__":
    main()
