"""What readyq sends, for tests, importable anywhere: a pipeline observer
(``readyq_pipeline_observer``) and a recorder of the statements sent through the
driver's cursor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa


@contextlib.contextmanager
def cursor_statements(target: Any) -> Iterator[list[tuple[str, Any]]]:
    """The SQL and parameters sent through the driver's cursor on ``target`` (an engine
    or a connection) inside the block, as the driver got them. Not BEGIN or COMMIT, and
    not statements sent in a pipeline (see :class:`Recorder`)."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, sql: str, params: Any, *args: Any) -> None:
        sent.append((sql, params))

    sa.event.listen(target, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(target, "before_cursor_execute", record)


class Recorder:
    """A pipeline observer that writes down what it is told (and can refuse to go on)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.seen: list[tuple[str, Any]] = []
        #: The statements of each pipeline, as sent.
        self.statements: list[list[str]] = []

    def before(self, conn: Any, statements: Any, params: Any) -> None:
        self.seen.append(("before", [dict(p) for p in params]))
        self.statements.append(list(statements))
        if self.refuse:
            raise LookupError("refused")

    def after(self, conn: Any, statements: Any, rowcounts: list[int]) -> None:
        self.seen.append(("after", rowcounts))

    def failed(self, conn: Any, statements: Any, exc: BaseException) -> None:
        self.seen.append(("failed", type(exc).__name__))
