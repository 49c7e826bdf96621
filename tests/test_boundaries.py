"""The core stays vendorable: what it imports, where dialect logic lives, how SQL is built."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = sorted((ROOT / "readyq").rglob("*.py"))


def test_import_readyq_loads_no_sim_conformance_or_test_library() -> None:
    """A fresh interpreter importing readyq has none of them in sys.modules."""
    code = (
        "import sys, readyq\n"
        "bad = {'readyq_sim', 'readyq_conformance', 'sim', 'conformance', 'pytest',\n"
        "       'hypothesis', 'freezegun', 'testcontainers', '_pytest'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_core_imports_only_stdlib_and_sqlalchemy() -> None:
    """Every absolute import in readyq/ is the standard library or sqlalchemy."""
    allowed = set(sys.stdlib_module_names) | {"sqlalchemy"}
    found = set()
    for path in CORE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    assert found - allowed == set()


def test_core_uses_relative_imports_for_itself() -> None:
    """readyq never imports itself by name, so it can be copied under another package name."""
    offenders = [
        str(p.relative_to(ROOT))
        for p in CORE
        if re.search(r"^\s*(from|import) readyq\b", p.read_text(), re.MULTILINE)
    ]
    assert offenders == []


def test_only_the_dialect_package_reads_the_dialect_name() -> None:
    """Business logic never branches on the database: dialect.name appears in one module."""
    hits = [
        str(p.relative_to(ROOT))
        for p in CORE
        if re.search(r"dialect\.name|is_mariadb|server_version_info", p.read_text())
    ]
    assert hits == ["readyq/dialects/__init__.py"]


def test_lock_clauses_live_only_in_dialect_modules() -> None:
    """with_for_update and raw driver SQL (BEGIN IMMEDIATE, PRAGMA) appear only in dialects/."""
    pattern = re.compile(r"with_for_update|exec_driver_sql")
    hits = {str(p.relative_to(ROOT)) for p in CORE if pattern.search(p.read_text())}
    assert hits == {
        "readyq/dialects/postgresql.py",
        "readyq/dialects/mysql.py",
        "readyq/dialects/sqlite.py",
    }


def test_only_the_clock_module_reads_the_system_clock() -> None:
    """time.time / datetime.now / monotonic appear only in readyq/clock.py."""
    pattern = re.compile(r"time\.time|time_ns|datetime\.now|\.utcnow|time\.monotonic|date\.today")
    hits = [str(p.relative_to(ROOT)) for p in CORE if pattern.search(p.read_text())]
    assert hits == ["readyq/clock.py"]


def test_no_sql_is_built_from_strings() -> None:
    """No text()/exec_driver_sql built with f-strings, % or + : every value is bound."""
    offenders = []
    for path in CORE:
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            # An identifier (LISTEN's channel) cannot be bound; such a line says so.
            if "identifier, not a value" in lines[node.lineno - 1]:
                continue
            if name in {"text", "exec_driver_sql", "execute"} and isinstance(
                node.args[0], (ast.JoinedStr, ast.BinOp)
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_payloads_are_never_pickled_or_evaluated() -> None:
    """Job payloads are JSON: no pickle, marshal, eval or exec in the core."""
    pattern = re.compile(r"\b(pickle|marshal|eval|exec)\s*[.(]")
    hits = [str(p.relative_to(ROOT)) for p in CORE if pattern.search(p.read_text())]
    assert hits == []


@pytest.mark.parametrize("module", ["readyq", "readyq.dialects"])
def test_public_modules_declare_all(module: str) -> None:
    """The public surface is explicit."""
    mod = __import__(module, fromlist=["__all__"])
    assert mod.__all__
    assert all(hasattr(mod, name) for name in mod.__all__)
