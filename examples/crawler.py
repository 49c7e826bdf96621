"""A rate-limited crawler for several tenants, sharing the rate by weight.

Three tenants enqueue 40 pages each into their own group, with weights 1, 2 and 3. One
worker starts at most RATE fetches per second (``readyq.RateLimit``, a token bucket) and
hands the starts to the groups in proportion to their weights while all of them still have
pages waiting. The fetch is fake (a short sleep): no network.

Printed: starts per second (at most the rate) and each tenant's share of the starts while
every tenant was backlogged (close to weight / total weight).

Run: ``python examples/crawler.py [DB_FILE]`` (default: a temporary SQLite file).
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import readyq

TENANTS = {"acme": 1, "globex": 2, "initech": 3}
PAGES = 40
RATE, BURST = 50.0, 5

handlers = readyq.Handlers()


@handlers("fetch")
def fetch(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    # A fake download of 10-40 ms, the same for the same URL on every run.
    time.sleep(0.01 + (zlib.crc32(args["url"].encode()) % 30) / 1000)
    return {"status": 200, "bytes": len(args["url"]) * 100}


def main(db: Path) -> int:
    q = readyq.Queue(f"sqlite:///{db}")
    q.install()
    with q.graph() as g:
        for page in range(PAGES):  # interleaved, as tenants would submit them
            for tenant, weight in TENANTS.items():
                url = f"https://{tenant}.example/page/{page}"
                g.add("fetch", {"url": url}, group=tenant, weight=weight)
    print(f"enqueued {PAGES} pages for each of {', '.join(TENANTS)} (weights {TENANTS})")

    starts: list[tuple[float, str]] = []
    lock = threading.Lock()

    def on_event(event: str, fields: dict[str, Any]) -> None:
        if event == "claim":
            with lock:
                starts.append((time.monotonic(), fields["group"]))

    worker = readyq.Worker(
        q,
        handlers,
        limits=[readyq.Concurrency(10), readyq.RateLimit(RATE, burst=BURST)],
        poll_interval=0.005,  # notice a refilled token quickly
        lease_ttl=10,
        heartbeat_every=2,
        hooks=[on_event],
    )
    began = time.monotonic()
    worker.run(until_idle=True)
    took = time.monotonic() - began

    total = len(TENANTS) * PAGES
    counts = q.counts()
    assert counts["done"] == total, counts
    assert len(starts) == total, len(starts)

    # The token bucket: never more than BURST + RATE x elapsed starts in any window.
    times = [t for t, _ in starts]
    worst = max(
        (j - i + 1) - (times[j] - times[i]) * RATE
        for i in range(len(times))
        for j in range(i, len(times))
    )
    span = times[-1] - times[0]
    per_second = (len(times) - BURST) / span
    print(
        f"{total} pages in {took:.2f}s: {per_second:.1f} starts/s after the burst (limit {RATE:g})"
    )
    assert worst <= BURST + 1e-6, f"rate limit exceeded by {worst - BURST:.2f} starts"
    # (On an idle machine the crawler runs close to RATE; a loaded one may start fewer.)

    # Share while every tenant still had pages waiting: up to the first tenant's last start.
    order = [group for _, group in starts]
    window = min(max(i for i, g in enumerate(order) if g == t) for t in TENANTS) + 1
    weights = sum(TENANTS.values())
    print(f"share of the first {window} starts (all tenants backlogged):")
    for tenant, weight in TENANTS.items():
        got = order[:window].count(tenant)
        expect = window * weight / weights
        print(
            f"  {tenant:<8} weight {weight}: {got:>3} starts = {got / window:5.1%}"
            f" (fair {expect / window:5.1%})"
        )
        assert abs(got - expect) <= 3, (tenant, got, expect)
    print("crawler ok: rate limit held, starts shared by weight")
    q.close()
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "crawler.db"))
