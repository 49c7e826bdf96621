"""The CI configuration: the workflow, tox, .ci/run and the README agree on what runs."""

from __future__ import annotations

import configparser
import itertools
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
CI_RUN = ROOT / ".ci" / "run"
TEST_COMMAND = ROOT / ".ci" / "test-command"
TOX_INI = ROOT / "tox.ini"
README = ROOT / "README.md"

SERVER_IMAGES = [
    "postgres:13",
    "postgres:15",
    "postgres:17",
    "mysql:8.0",
    "mysql:8.4",
    "mariadb:10.11",
    "mariadb:11.4",
]
TOX_ENVS = {
    "py311-sqlite",
    "py312-sqlite",
    "py313-sqlite",
    "py312-postgresql",
    "py312-mariadb",
    "py312-mysql",
    "lint",
    "typing",
}


def load_workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def workflow_triggers() -> dict[str, Any]:
    """``on:`` is YAML 1.1's boolean true to PyYAML, so look under both keys."""
    data = load_workflow()
    triggers = data.get("on", data.get(True))
    assert isinstance(triggers, dict)
    return triggers


def backends_matrix() -> list[dict[str, Any]]:
    include = load_workflow()["jobs"]["backends"]["strategy"]["matrix"]["include"]
    assert isinstance(include, list)
    return include


def all_steps() -> list[dict[str, Any]]:
    return [step for job in load_workflow()["jobs"].values() for step in job["steps"]]


def expand_tox_env(spec: str) -> list[str]:
    """Expand tox's generative names: ``py3{11,12}-sqlite`` is py311-sqlite, py312-sqlite."""
    parts = re.split(r"(\{[^}]*\})", spec)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(combo) for combo in itertools.product(*choices)]


def load_tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(TOX_INI.read_text())
    return parser


def test_workflow_parses_as_yaml_with_lint_sqlite_and_backends_jobs():
    """ci.yml is valid YAML and defines the lint, sqlite and backends jobs."""
    assert {"lint", "sqlite", "backends"} <= set(load_workflow()["jobs"])


def test_every_workflow_job_has_runs_on_and_steps():
    """Each job names its runner and has a non-empty list of steps."""
    for name, job in load_workflow()["jobs"].items():
        assert job.get("runs-on"), name
        assert isinstance(job.get("steps"), list), name
        assert job["steps"], name


def test_every_workflow_action_is_pinned_to_a_version_tag():
    """Every ``uses:`` names an action at a version tag such as ``@v4``, never a branch."""
    uses = [step["uses"] for step in all_steps() if "uses" in step]
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@v\d+(\.\d+){0,2}", ref), ref


def test_workflow_runs_nightly_and_on_demand():
    """The workflow has a cron schedule and can be started by hand."""
    triggers = workflow_triggers()
    assert triggers["schedule"][0]["cron"]
    assert "workflow_dispatch" in triggers


@pytest.mark.parametrize("image", SERVER_IMAGES)
def test_backends_matrix_includes_server_image(image):
    """The backends matrix runs the suite against each supported server version."""
    assert image in [entry["image"] for entry in backends_matrix()]


def test_backends_matrix_maps_each_image_to_its_backend():
    """postgres images test postgresql, mysql images mysql, mariadb images mariadb."""
    expected = {"postgres": "postgresql", "mysql": "mysql", "mariadb": "mariadb"}
    for entry in backends_matrix():
        assert entry["backend"] == expected[entry["image"].split(":")[0]], entry


def test_backends_job_requires_the_backend_it_tests():
    """A server job fails rather than skips when its database is missing."""
    job = load_workflow()["jobs"]["backends"]
    assert job["env"]["READYQ_REQUIRE_BACKENDS"] == "${{ matrix.backend }}"
    assert job["services"]["db"]["image"] == "${{ matrix.image }}"


def test_backends_job_runs_the_backend_marked_tests():
    """The server jobs run ``pytest -n 2 -m backend``."""
    runs = [step.get("run", "") for step in load_workflow()["jobs"]["backends"]["steps"]]
    assert "python -m pytest -n 2 -m backend" in runs


def test_sqlite_job_covers_python_311_312_313():
    """The SQLite job runs on every supported Python."""
    matrix = load_workflow()["jobs"]["sqlite"]["strategy"]["matrix"]
    assert matrix["python-version"] == ["3.11", "3.12", "3.13"]


def test_ci_run_is_executable():
    """.ci/run can be started directly."""
    assert os.access(CI_RUN, os.X_OK)


def test_ci_run_is_strict_bash():
    """.ci/run is a bash script that stops at the first failing command."""
    lines = CI_RUN.read_text().splitlines()
    assert lines[0] in ("#!/usr/bin/env bash", "#!/bin/bash")
    assert "set -euo pipefail" in lines


def test_ci_run_executes_the_test_command_file():
    """.ci/run runs the command kept in .ci/test-command rather than a copy of it."""
    code = [line.split("#")[0] for line in CI_RUN.read_text().splitlines()]
    assert any("bash .ci/test-command" in line for line in code)


def test_test_command_is_a_single_line():
    """.ci/test-command holds exactly one command line."""
    assert len(TEST_COMMAND.read_text().strip().splitlines()) == 1


def test_tox_ini_lists_every_env():
    """tox.ini parses and its env_list expands to the SQLite, server, lint and typing envs."""
    specs = load_tox()["tox"]["env_list"].split()
    assert {env for spec in specs for env in expand_tox_env(spec)} == TOX_ENVS


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb", "mysql"])
def test_tox_env_requires_its_backend(backend):
    """Each backend factor sets READYQ_REQUIRE_BACKENDS to that backend."""
    setenv = [line.strip() for line in load_tox()["testenv"]["setenv"].splitlines()]
    assert f"{backend}: READYQ_REQUIRE_BACKENDS = {backend}" in setenv


def test_tox_passes_database_settings_through():
    """tox hands READYQ_*, HYPOTHESIS_PROFILE and CI from the caller to the tests."""
    passenv = load_tox()["testenv"]["passenv"].split()
    assert {"READYQ_*", "HYPOTHESIS_PROFILE", "CI"} <= set(passenv)


def test_readme_second_command_is_the_ci_test_command():
    """The README's first sh block's second command is exactly .ci/test-command."""
    assert README.exists(), "README.md is missing"
    block = re.search(r"^```sh[ \t]*\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    assert block, "README.md has no ```sh fenced block"
    commands = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) >= 2, commands
    assert commands[1] == TEST_COMMAND.read_text().strip()
