"""The docs say what the code does: generated parts must match the code."""

from __future__ import annotations

from pathlib import Path

from readyq.job import diagram

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_state_diagram_in_the_docs_is_the_transition_table() -> None:
    """docs/guarantees.md carries exactly the diagram generated from TRANSITIONS."""
    text = (DOCS / "guarantees.md").read_text()
    assert f"```mermaid\n{diagram()}\n```" in text


def test_readme_links_resolve() -> None:
    """Every docs/ page the README links to exists."""
    readme = (DOCS.parent / "README.md").read_text()
    linked = [part.split(")")[0] for part in readme.split("](docs/")[1:]]
    assert linked
    assert all((DOCS / name).exists() for name in linked), linked
