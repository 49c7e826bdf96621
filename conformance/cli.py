"""``readyq conformance``: run the conformance suite against a database URL.

Exit status is pytest's: 0 when every guarantee holds, 1 when any fails, 2-4 on usage or
internal errors, 5 when no test was selected.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

__all__ = ["main"]

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="readyq conformance",
        description="Check that a database (and a dialect adapter) keeps readyq's guarantees.",
        epilog="Arguments after -- go to pytest, e.g. -- -k fencing -x",
    )
    p.add_argument("--url", help="database URL (default: a temporary SQLite file)")
    p.add_argument(
        "--adapter",
        help="module:attr of the adapter under test (an Adapter subclass, or a factory "
        "called with readyq's adapter class); default: readyq's own",
    )
    p.add_argument("--requirements", help="module:Class of a Requirements subclass")
    p.add_argument("--report", metavar="PATH", help="write the report as PATH.json and PATH.md")
    p.add_argument(
        "--database",
        choices=("fresh", "given"),
        default="fresh",
        help="fresh (default): create and drop a new database on the URL's server; "
        "given: use the URL's own, empty database",
    )
    p.add_argument("--core", action="store_true", help="only the quick core subset")
    p.add_argument("-q", "--quiet", action="store_true", help="less pytest output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(argv) if argv is not None else None
    extra: list[str] = []
    if args_in is not None and "--" in args_in:
        cut = args_in.index("--")
        args_in, extra = args_in[:cut], args_in[cut + 1 :]
    args = _parser().parse_args(args_in)
    import pytest

    cmd = [SUITE, "-p", "readyq_conformance.plugin", "-p", "no:cacheprovider", "-rfEs"]
    cmd += ["--readyq-database", args.database]
    if args.url:
        cmd += ["--dburi", args.url]
    if args.adapter:
        cmd += ["--adapter", args.adapter]
    if args.requirements:
        cmd += ["--requirements", args.requirements]
    if args.report:
        cmd += ["--readyq-report", args.report]
    if args.core:
        cmd += ["-m", "core"]
    if args.quiet:
        cmd.append("-q")
    return int(pytest.main(cmd + extra))
