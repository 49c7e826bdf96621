"""Where a drain's CPU went on this machine: the database server's processes, and the
rest of the machine (the bench's clients, and whatever else runs), per job.

A drain on two cores is often bound by CPU, not by the database's durability: this says
which side spends it. Read from Linux's ``/proc``; nothing is reported without it, or
when the server runs on another host (its CPU is not on this machine).

The server's share counts every process of its name (PostgreSQL: the postmaster and all
its backends, including the time of backends that exited; MariaDB/MySQL: the one
server process), so other clients of a shared server count too. "Rest" is the machine's
busy time minus the server's: on a shared machine it includes other work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

__all__ = ["CpuMeter", "Snapshot"]

#: Server process names (``/proc/<pid>/stat``'s comm) per SQLAlchemy backend name.
SERVER_PROCESSES = {
    "postgresql": ("postgres",),
    "mysql": ("mariadbd", "mysqld"),
    "mariadb": ("mariadbd", "mysqld"),
}

_LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1", "::1"}
#: /proc counts CPU time in clock ticks (10 ms): a window with fewer busy ticks than this
#: (a --quick drain of a few jobs, or one waiting on fsync, which counts as idle) gives no
#: split rather than a figure off by a whole tick.
MIN_BUSY_TICKS = 5
_PROC = Path("/proc")


@dataclass(frozen=True)
class Snapshot:
    """Cumulative CPU seconds at one moment: the machine's total and idle, the server's."""

    total: float
    idle: float
    server: float | None


class CpuMeter:
    """Samples the machine's and the server's CPU around a measurement."""

    def __init__(self, url: str | sa.URL) -> None:
        parsed = sa.make_url(url)
        backend = parsed.get_backend_name()
        self.enabled = (_PROC / "stat").is_file()
        #: None: no server process on this machine (SQLite runs in the clients).
        self.names: tuple[str, ...] | None = (
            SERVER_PROCESSES.get(backend) if parsed.host in _LOCAL_HOSTS else None
        )
        if backend != "sqlite" and self.names is None:
            self.enabled = False  # a remote or unknown server: its CPU is not here
        self._tick = os.sysconf("SC_CLK_TCK") if self.enabled else 100

    def sample(self) -> Snapshot | None:
        if not self.enabled:
            return None
        fields = [int(v) for v in (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        server = None if self.names is None else self._server_ticks() / self._tick
        return Snapshot(sum(fields) / self._tick, idle / self._tick, server)

    def split(self, before: Snapshot | None, after: Snapshot | None, jobs: int) -> dict[str, Any]:
        """CPU ms per job of the server and of the rest, and the machine's busy share."""
        if before is None or after is None or jobs <= 0 or after.total <= before.total:
            return {}
        busy = (after.total - before.total) - (after.idle - before.idle)
        if busy * self._tick < MIN_BUSY_TICKS:
            return {}
        server = None
        if before.server is not None and after.server is not None:
            server = max(0.0, after.server - before.server)
        rest = busy - (server or 0.0)
        return {
            "server_ms_per_job": None if server is None else server * 1000 / jobs,
            "rest_ms_per_job": max(0.0, rest) * 1000 / jobs,
            "busy": busy / (after.total - before.total),
        }

    def _server_ticks(self) -> int:
        names = self.names or ()
        ticks = 0
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # the process ended while we looked
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            if comm not in names:
                continue
            f = stat[stat.rindex(")") + 2 :].split()
            # utime, stime, and the reaped children's cutime, cstime (exited backends).
            ticks += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
        return ticks
