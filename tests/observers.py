"""A pipeline observer for tests (``readyq_pipeline_observer``), importable anywhere."""

from __future__ import annotations

from typing import Any


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
