"""Backoff between attempts: a pure function of (attempt, job id), jitter included.

The jitter is derived from a hash of the job id and attempt instead of a random number
generator, so retries spread out across jobs and the simulator stays deterministic.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``base * factor**(attempt-1)``, capped, with +/- ``jitter``."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.factor >= 1 and self.cap >= self.base):
            raise ValueError("Backoff needs base > 0, factor >= 1 and cap >= base")
        if not 0 <= self.jitter < 1:
            raise ValueError("Backoff jitter must be in [0, 1)")

    def delay(self, attempt: int, job_id: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        raw = min(self.cap, self.base * self.factor ** max(0, attempt - 1))
        digest = hashlib.blake2b(f"{job_id}:{attempt}".encode(), digest_size=8).digest()
        unit = int.from_bytes(digest, "big") / 2**64  # uniform in [0, 1)
        return raw * (1 - self.jitter + 2 * self.jitter * unit)
