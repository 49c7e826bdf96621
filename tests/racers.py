"""Claimer loops for the concurrency tests, importable by spawned processes."""

from __future__ import annotations

import readyq


def drain(
    url: str, worker: str, limit: int, groups: list[str] | None = None
) -> list[tuple[str, int, int, str]]:
    """Claim (by ranked ``groups``, if given) and finalize until the queue is empty;
    returns (event, job, token, worker)."""
    events: list[tuple[str, int, int, str]] = []
    with readyq.Queue(url) as q:
        idle = 0
        while idle < 3:
            leases = q.claim(worker, limit=limit, ttl=600, groups=groups)
            if not leases:
                idle += 1
                continue
            idle = 0
            for lease in leases:
                events.append(("claim", lease.job_id, lease.token, worker))
                q.finalize(lease, {"by": worker})
                events.append(("finalize", lease.job_id, lease.token, worker))
    return events


def drain_fused(
    url: str, worker: str, limit: int, groups: list[str] | None = None
) -> list[tuple[str, int, int, str]]:
    """Like :func:`drain`, each round's results committed with its next claim
    (``finalize_and_claim``)."""
    events: list[tuple[str, int, int, str]] = []
    with readyq.Queue(url) as q:
        leases: list[readyq.Lease] = []
        idle = 0
        while idle < 3:
            outcomes, nxt = q.finalize_and_claim(
                [(lease, {"by": worker}) for lease in leases],
                worker,
                limit=limit,
                ttl=600,
                groups=groups,
            )
            events += [("finalize", o.job_id, o.token, worker) for o in outcomes]
            assert all(isinstance(o, readyq.Outcome) for o in outcomes), outcomes
            events += [("claim", lease.job_id, lease.token, worker) for lease in nxt]
            idle = 0 if nxt else idle + 1
            leases = nxt
    return events
