"""The tables: ``readyq_jobs`` and ``readyq_job_deps``, declared once for every dialect.

Times are ``BIGINT`` microseconds since the Unix epoch (UTC): identical precision on every
dialect (MySQL/MariaDB ``DATETIME`` silently drops fractions; SQLite has no time type), and
integer comparisons with a bound ``now`` from the :class:`~readyq.clock.Clock`.

Use :data:`metadata` as (or merge it into) Alembic's ``target_metadata`` to adopt the
tables in an application that manages its schema with Alembic.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

# Loaded now, not lazily: SQLAlchemy imports sqlalchemy.orm on first inspection of a bound
# value (our JobState enums), and a worker thread doing that while another thread imports
# it too saw a partially initialized module and died.
import sqlalchemy.orm
from sqlalchemy.dialects import mysql

from .job import JobState

__all__ = ["deps", "jobs", "metadata"]

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# Names compare exactly on every database: MySQL/MariaDB's default collation would treat
# "Key" and "key" (or "a" and "á") as one idempotency key, or one group.
_Name = sa.String(200).with_variant(mysql.VARCHAR(200, collation="utf8mb4_bin"), "mysql", "mariadb")
_Key = sa.String(255).with_variant(mysql.VARCHAR(255, collation="utf8mb4_bin"), "mysql", "mariadb")

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid (autoincrementing).
_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_STATES = ", ".join(f"'{s.value}'" for s in JobState)


# Partial indexes on PostgreSQL. Every state change rewrites the row (the state is
# indexed, so no HOT update), and PostgreSQL adds the new version to each index whose
# predicate it meets. These indexes hold only rows whose column is set (running jobs,
# finished jobs, children, cancelled dependents), and every query that uses one says
# "column < :now", "column = :id" or "column IN (...)", which implies "column IS NOT
# NULL" in any plan, even a generic one. MySQL and MariaDB have no partial indexes;
# SQLite has them but was not measured, so it keeps full ones.
def _only_set(column: str) -> dict[str, Any]:
    # DDL renders the predicate inline (CREATE INDEX takes no bound parameters).
    return {"postgresql_where": sa.column(column).is_not(None)}


jobs = sa.Table(
    "readyq_jobs",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("type", sa.String(200), nullable=False),
    sa.Column("args", sa.Text(), nullable=False),
    sa.Column("result", sa.Text()),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("container", sa.Boolean(), nullable=False, default=False),
    sa.Column("parent_id", _Id, sa.ForeignKey("readyq_jobs.id")),
    sa.Column("group_key", _Name, nullable=False),
    sa.Column("weight", sa.Float(), nullable=False),
    sa.Column("priority", sa.Integer(), nullable=False),
    sa.Column("key", _Key),
    # Open dependencies (not yet done). Decremented atomically in the finalize of each
    # dependency: the child's row lock serializes parents finishing together.
    sa.Column("pending_deps", sa.Integer(), nullable=False),
    # Children not yet terminal (containers only); the last one to finish rolls it up.
    sa.Column("open_children", sa.Integer(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("timeout_us", sa.BigInteger()),
    sa.Column("error", sa.Text()),
    # Set when the job was cancelled because job <cancelled_by> failed or was cancelled,
    # so that retrying that job revives exactly what its failure cancelled.
    sa.Column("cancelled_by", _Id),
    # Increases on every claim; every write on behalf of a lease compares it.
    sa.Column("lease_token", sa.BigInteger(), nullable=False),
    sa.Column("lease_owner", sa.String(200)),
    sa.Column("lease_expires_us", sa.BigInteger()),
    sa.Column("deadline_us", sa.BigInteger()),
    sa.Column("heartbeat_us", sa.BigInteger()),
    # The token whose holder settled the job (finalize/fail): makes retries idempotent.
    sa.Column("settled_token", sa.BigInteger()),
    sa.Column("run_after_us", sa.BigInteger(), nullable=False),
    sa.Column("created_us", sa.BigInteger(), nullable=False),
    sa.Column("started_us", sa.BigInteger()),
    sa.Column("finished_us", sa.BigInteger()),
    sa.CheckConstraint(f"state IN ({_STATES})", name="state_valid"),
    sa.CheckConstraint("weight > 0", name="weight_positive"),
    sa.CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
    # The claim: state prefix first, so done, blocked and container rows are never walked;
    # then the claim's own total order, so the scan stops after LIMIT rows.
    # Not partial: a plan of a bound state cannot be proved to match a state predicate, and
    # with stale statistics the planner then walked every ready row (tests/test_claim_plan).
    sa.Index("ix_readyq_jobs_claim", "state", "group_key", "priority", "run_after_us", "id"),
    # Idempotency keys, unique where set: most jobs have none, and a full index took a
    # NULL entry for every version of every row (enqueue, claim, finalize). Found by
    # "key IN (...)", which implies "key IS NOT NULL".
    sa.Index("uq_readyq_jobs_key", "key", unique=True, **_only_set("key")),
    sa.Index("ix_readyq_jobs_global", "state", "priority", "run_after_us", "id"),
    # The sweeper: expired leases and passed hang deadlines (both are set while running).
    sa.Index("ix_readyq_jobs_expiry", "state", "lease_expires_us", **_only_set("lease_expires_us")),
    sa.Index("ix_readyq_jobs_deadline", "state", "deadline_us", **_only_set("deadline_us")),
    sa.Index("ix_readyq_jobs_parent", "parent_id", **_only_set("parent_id")),
    sa.Index("ix_readyq_jobs_cancelled_by", "cancelled_by", **_only_set("cancelled_by")),
    # Retention (set once a job is done, failed or cancelled; a retry clears it), paged in
    # (finished_us, id) order: with id in the index, a page starts where the last ended
    # even among jobs that finished in the same microsecond (one cancel cascade).
    sa.Index("ix_readyq_jobs_finished", "state", "finished_us", "id", **_only_set("finished_us")),
)

deps = sa.Table(
    "readyq_job_deps",
    metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("readyq_jobs.id"), primary_key=True),
    sa.Column("depends_on", _Id, sa.ForeignKey("readyq_jobs.id"), primary_key=True),
    # Finalize looks up "who waits on me?": without it every finalize scans the edges.
    sa.Index("ix_readyq_job_deps_depends_on", "depends_on"),
)
