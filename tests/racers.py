"""Claimer loops for the concurrency tests, importable by spawned processes."""

from __future__ import annotations

import readyq


def drain(url: str, worker: str, limit: int) -> list[tuple[str, int, int, str]]:
    """Claim and finalize until the queue is empty; returns (event, job, token, worker)."""
    events: list[tuple[str, int, int, str]] = []
    with readyq.Queue(url) as q:
        idle = 0
        while idle < 3:
            leases = q.claim(worker, limit=limit, ttl=600)
            if not leases:
                idle += 1
                continue
            idle = 0
            for lease in leases:
                events.append(("claim", lease.job_id, lease.token, worker))
                q.finalize(lease, {"by": worker})
                events.append(("finalize", lease.job_id, lease.token, worker))
    return events
