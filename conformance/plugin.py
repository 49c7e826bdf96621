"""The pytest plugin: ``pytest -p readyq_conformance.plugin --pyargs readyq_conformance.suite``.

Options: ``--dburi URL`` (or env ``READYQ_DBURI``; default: a temporary SQLite file),
``--adapter module:attr`` (an Adapter subclass, or a factory called with the built-in
adapter class), ``--requirements module:Class``, ``--readyq-database fresh|given``,
``--readyq-report PATH`` (writes PATH.json and PATH.md).

Fixtures for suite tests: ``env`` (the session's database, rows deleted before each test),
``caps`` (the Requirements, probed once per session), ``clock`` (a manual clock), ``q`` (a
Queue on that clock), ``make_queue(clock=None)``. Mark a test
``@pytest.mark.requires("capability", ...)`` to run it only where the adapter declares
those capabilities.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa

import readyq

from . import report as report_mod
from .env import Env, ManualClock
from .provision import apply_adapter, open_site, redact
from .requirements import CAPABILITIES, Requirements, load

__all__ = ["SessionState"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("readyq", "readyq conformance suite")
    group.addoption(
        "--dburi",
        default=os.environ.get("READYQ_DBURI") or None,
        help="database URL to check (env READYQ_DBURI; default: a temporary SQLite file)",
    )
    group.addoption(
        "--adapter",
        default=None,
        help="module:attr of the adapter under test: an Adapter subclass, or a factory "
        "called with readyq's adapter class for the database (default: readyq's own)",
    )
    group.addoption("--requirements", default=None, help="module:Class of a Requirements subclass")
    group.addoption(
        "--readyq-database",
        default="fresh",
        choices=("fresh", "given"),
        help="fresh: create (and drop) a new database on the URL's server; "
        "given: use the URL's own database (it must hold no readyq tables)",
    )
    group.addoption(
        "--readyq-report", default=None, metavar="PATH", help="write PATH.json and PATH.md"
    )
    group.addoption(
        "--readyq-block-timeout",
        type=float,
        default=None,
        help="wall seconds after which a statement counts as blocked (default 0.6; "
        "1.5 on MySQL 8, whose shortest lock wait is 1 s)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires(*capabilities): run only where the adapter declares them"
    )
    config.addinivalue_line("markers", "core: the quick subset that catches broken adapters")
    config.addinivalue_line("markers", "sim: a short simulator run")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config._readyq_state = SessionState(config)  # type: ignore[attr-defined]


@dataclass
class TestRecord:
    nodeid: str
    module: str
    guarantee: str
    requires: tuple[str, ...]
    outcome: str = "not run"
    detail: str = ""
    note: str = ""
    seconds: float = 0.0


@dataclass
class SessionState:
    """Everything the report needs, filled in as the session runs."""

    config: pytest.Config
    env: Env | None = None
    caps: Requirements | None = None
    started: float = field(default_factory=time.time)
    info: dict[str, Any] = field(default_factory=dict)
    tests: dict[str, TestRecord] = field(default_factory=dict)
    setup_error: str | None = None

    def open(self) -> tuple[Env, Requirements]:
        if self.env is not None and self.caps is not None:
            return self.env, self.caps
        if self.setup_error is not None:
            pytest.fail(self.setup_error, pytrace=False)
        opt = self.config.getoption
        try:
            site = open_site(opt("--dburi"), opt("--readyq-database"))
        except Exception as exc:
            self.setup_error = f"cannot provision the database: {exc}"
            raise
        try:
            raw = sa.create_engine(site.url)
            try:
                adapter_cls = apply_adapter(opt("--adapter"), raw)
            finally:
                raw.dispose()
            env = Env(site)
            env.install()
            caps = load(opt("--requirements"), env.adapter)
            default = 1.5 if env.adapter.name == "mysql" else 0.6
            env.block_timeout = opt("--readyq-block-timeout") or default
            self.info.update(
                url=redact(site.given_url),
                database=redact(site.url),
                database_mode=site.mode,
                server_version=env.server_version(),
                driver=env.driver(),
                adapter=f"{adapter_cls.__module__}.{adapter_cls.__qualname__}",
                adapter_option=opt("--adapter"),
                adapter_doc=(adapter_cls.__doc__ or "").strip().splitlines()[0:1],
                isolation_level=env.adapter.isolation_level,
                readyq_version=readyq.__version__,
                sqlalchemy_version=sa.__version__,
                python=platform.python_version(),
                block_timeout_s=env.block_timeout,
            )
            caps.probe(env)
        except BaseException as exc:
            self.setup_error = f"conformance setup failed: {type(exc).__name__}: {exc}"
            site.close()
            raise
        self.env, self.caps = env, caps
        return env, caps

    def close(self) -> None:
        if self.env is not None:
            self.env.dispose()
            self.env.site.close()
            self.env = None


def _state(config: pytest.Config) -> SessionState:
    return config._readyq_state  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="session")
def readyq_session(request: pytest.FixtureRequest) -> Iterator[tuple[Env, Requirements]]:
    state = _state(request.config)
    yield state.open()
    state.close()


@pytest.fixture(scope="session")
def caps(readyq_session: tuple[Env, Requirements]) -> Requirements:
    """The adapter's declared capabilities, probed live once per session."""
    return readyq_session[1]


@pytest.fixture
def env(readyq_session: tuple[Env, Requirements]) -> Iterator[Env]:
    """The session's database with no readyq rows; queues made in the test closed after."""
    e = readyq_session[0]
    e.site.reset()
    yield e
    e.close_queues()


@pytest.fixture
def clock() -> ManualClock:
    """A clock the test moves by hand (``clock.advance(seconds)``)."""
    return ManualClock()


@pytest.fixture
def make_queue(env: Env) -> Callable[..., readyq.Queue]:
    """``make_queue(clock=None)``: another Queue (its own engine) on the test's database."""
    return env.queue


@pytest.fixture
def q(env: Env, clock: ManualClock) -> readyq.Queue:
    """A Queue on the test's database whose time is ``clock``."""
    return env.queue(clock)


@pytest.fixture
def readyq_note(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``readyq_note(text)``: a line for this test's row in the report."""

    def note(text: str) -> None:
        rec = _state(request.config).tests.get(request.node.nodeid)
        if rec is not None:
            rec.note = text

    return note


@pytest.fixture(autouse=True)
def _readyq_requires(request: pytest.FixtureRequest) -> None:
    needed = [n for m in request.node.iter_markers("requires") for n in m.args]
    if not needed:
        return
    requirements: Requirements = request.getfixturevalue("caps")
    missing = [n for n in needed if not requirements.has(n)]
    if missing:
        pytest.skip(f"needs capability {', '.join(missing)} (not declared by the adapter)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = _state(config)
    for item in items:
        for m in item.iter_markers("requires"):
            unknown = [n for n in m.args if n not in CAPABILITIES]
            if unknown:
                raise pytest.UsageError(f"{item.nodeid}: unknown capability {unknown}")
        doc = getattr(getattr(item, "function", None), "__doc__", None) or item.name
        mod = getattr(getattr(item, "module", None), "__doc__", None) or ""
        state.tests[item.nodeid] = TestRecord(
            nodeid=item.nodeid,
            module=(mod.strip().splitlines() or [item.nodeid])[0],
            guarantee=" ".join(doc.strip().split("\n\n")[0].split()),
            requires=tuple(n for m in item.iter_markers("requires") for n in m.args),
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    state = _CURRENT.get("state")
    if state is None or report.nodeid not in state.tests:
        return
    rec = state.tests[report.nodeid]
    rec.seconds += report.duration
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        rec.outcome, rec.detail = "SKIP", str(reason).removeprefix("Skipped: ")
    elif report.failed:
        if report.when == "call":
            rec.outcome, rec.detail = "FAIL", _short(report)
        elif rec.outcome not in ("FAIL",):
            rec.outcome, rec.detail = "ERROR", f"{report.when}: {_short(report)}"
    elif report.when == "call":
        rec.outcome = "PASS"


def _short(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return " ".join(text.split())[:600]


_CURRENT: dict[str, SessionState] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _CURRENT["state"] = _state(session.config)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    data = report_mod.build(state)
    tr = terminalreporter
    tr.section("readyq conformance")
    for line in report_mod.summary_lines(data):
        tr.write_line(line)
    path = config.getoption("--readyq-report")
    if path:
        written = report_mod.write(data, path)
        tr.write_line("report: " + ", ".join(written))


def pytest_unconfigure(config: pytest.Config) -> None:
    state = getattr(config, "_readyq_state", None)
    if state is not None:
        state.close()
    _CURRENT.pop("state", None)
